"""The shim's one adapter to the Kubernetes API: every read and write the node agent makes.

It speaks as the node (system:node:<name>), so what it may do is what the Node authorizer and
NodeRestriction allow: list/watch pods and PodCertificateRequests only with a spec.nodeName field
selector, get its Node and the ServiceAccounts of its pods, create requests for pods bound to it,
list/watch ClusterTrustBundles, create Events. Nodes may NOT delete PodCertificateRequests
(NodeRestriction refuses the operation); that needs the optional second, non-node identity.

A request's name is fixed by what it asks for (`request_name`: the pod's UID, the source, the
key), not left to generateName, so a create cannot become two requests: one applied twice by
something between (a proxy, a client that resends) or sent again after its answer was lost
meets 409 AlreadyExists, and `create_pcr` adopts the request it finds under that name once it
has checked it is this node's request for the same pod, source and key.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

import msgspec
from cryptography import x509

from podcert.api import keys
from podcert.api.events import ObjectRef, event_body
from podcert.api.pods import WorkKey
from podcert.api.requests import STUB_CSR, KeyForm, Read, RequestError, Spec, parse_request
from podcert.api.times import format_micro_time
from podcert.api.versions import group_version
from podcert.client.discovery import Unserved, certificates_versions, key_form
from podcert.client.rest import JSON, REQUESTS, ApiError, Rest, path_of

log = logging.getLogger("podcert.shim")

_S = TypeVar("_S", bound=msgspec.Struct)

COMPONENT = "podcert-shim"
# The emergency-rotation annotation: credentials issued before this instant are re-keyed then.
ROTATE_ANNOTATION = "podcert.dev/rotate-before"
# A request's name: this much of its pod's name, "-", then DIGEST hex digits of what it asks
# for; a DNS subdomain of 63 characters at most, as the names generateName makes.
NAME_PREFIX: Final = 38
DIGEST: Final = 24


class ForeignRequest(ApiError):
    """409: a request of that name exists and is not this node's for that pod, source and key
    (never by chance: the name holds 96 bits of a digest of the key); a new key is the way on."""


# --- what the agent decodes of its objects -------------------------------------------------
# Lists and watch events are decoded straight into these shapes: the rest of each object
# (managedFields, containers, the subject key, ...) is skipped unread. The callbacks get the same
# dict layout as the API's objects, with only these fields.


class _Meta(msgspec.Struct, frozen=True):
    namespace: str = ""
    name: str = ""
    uid: str = ""
    resourceVersion: str = ""
    annotations: dict[str, str] | None = None


class _PodSpec(msgspec.Struct, frozen=True):
    nodeName: str = ""
    serviceAccountName: str = ""
    # Kept raw: `podcert.api.pods.parse_pod` checks their shape, and says what is wrong.
    volumes: list[Any] | None = None


class _PodStatus(msgspec.Struct, frozen=True):
    phase: str = ""


class PodShape(msgspec.Struct, frozen=True):
    """What `state.pod_from` reads of a pod: a quarter of a small pod's decoded size."""

    metadata: _Meta = _Meta()
    spec: _PodSpec = _PodSpec()
    status: _PodStatus = _PodStatus()


def _meta(meta: _Meta) -> JSON:
    out: JSON = {
        "namespace": meta.namespace,
        "name": meta.name,
        "uid": meta.uid,
        "resourceVersion": meta.resourceVersion,
    }
    if meta.annotations:
        out["annotations"] = meta.annotations
    return out


def pod_object(shape: PodShape) -> JSON:
    spec = shape.spec
    return {
        "metadata": _meta(shape.metadata),
        "spec": {
            "nodeName": spec.nodeName,
            "serviceAccountName": spec.serviceAccountName,
            "volumes": spec.volumes or [],
        },
        "status": {"phase": shape.status.phase},
    }


@dataclass(frozen=True)
class PodRef:
    """Enough of a pod to name it in a request, an ownerReference and an Event."""

    namespace: str
    name: str
    uid: str


class ShimApi(Protocol):
    """What the agent needs from the API (ShimKube here, a fake in the unit tests)."""

    node_name: str
    key_form: KeyForm  # how this API server takes the subject key (`discover` finds out)

    def list_pods(self) -> tuple[list[JSON], str]: ...
    def watch_pods(self, resource_version: str) -> Iterator[JSON]: ...
    def list_pcrs(self) -> tuple[list[Read], str]: ...
    def watch_pcrs(self, resource_version: str) -> Iterator[JSON]: ...  # objects: Read
    def list_trust_bundles(self) -> tuple[list[JSON], str]: ...
    def watch_trust_bundles(self, resource_version: str) -> Iterator[JSON]: ...
    def node_uid(self) -> str: ...
    def service_account_uid(self, namespace: str, name: str) -> str: ...
    def create_pcr(self, namespace: str, body: JSON) -> JSON: ...
    def delete_pcr(self, namespace: str, name: str, uid: str) -> bool: ...
    def record_event(
        self, pod: PodRef, kind: str, reason: str, message: str, now: dt.datetime
    ) -> None: ...


class ShimKube:
    def __init__(self, rest: Rest, node_name: str, cleanup: Rest | None = None) -> None:
        self.rest = rest
        self.node_name = node_name
        # A non-node identity allowed to delete requests of pods that are gone; without it the
        # garbage collector removes them through their ownerReference to the pod.
        self.cleanup = cleanup
        self.pcr_version = "v1"
        self.ctb_version = "v1"
        self.key_form: KeyForm = STUB_CSR
        self._node_uid: str | None = None

    # --- discovery -------------------------------------------------------------------------

    def discover(self) -> str:
        """certificates.k8s.io/v1 where served, else v1beta1 (1.35 and 1.36), and the form the
        key goes in there: the stub CSR on v1 and 1.36, the key with its proof on 1.35. Raises
        podcert.client.discovery.Unserved when the server serves no requests or trust bundles."""
        self.pcr_version, ctb = certificates_versions(self.rest, trust_bundles=True)
        self.ctb_version = ctb or "v1"
        self.key_form = key_form(self.rest, self.pcr_version)
        return self.pcr_version

    def _pcrs(self, namespace: str | None = None, name: str = "") -> str:
        return path_of(group_version(self.pcr_version), "podcertificaterequests", namespace, name)

    @property
    def _on_node(self) -> str:
        return f"spec.nodeName={self.node_name}"

    # --- watches: the Node authorizer insists on the field selector --------------------------

    def list_pods(self) -> tuple[list[JSON], str]:
        return self._shaped_list(path_of("v1", "pods"), PodShape, pod_object)

    def watch_pods(self, resource_version: str) -> Iterator[JSON]:
        return self._shaped_watch(path_of("v1", "pods"), resource_version, PodShape, pod_object)

    def list_pcrs(self) -> tuple[list[Read], str]:
        """The node's requests, typed (`podcert.client.rest.REQUESTS`). A relist decodes every
        request of the node while the old cache is still held: a few hundred at most."""
        items, version = self.rest.list(
            self._pcrs(), REQUESTS, query={"fieldSelector": self._on_node}
        )
        return list(items), version

    def watch_pcrs(self, resource_version: str) -> Iterator[JSON]:
        """Events whose objects are typed requests, as `list_pcrs` gives them."""
        return self.rest.watch(
            self._pcrs(), resource_version, shape=REQUESTS, fieldSelector=self._on_node
        )

    def list_trust_bundles(self) -> tuple[list[JSON], str]:
        return self._list(path_of(group_version(self.ctb_version), "clustertrustbundles"))

    def watch_trust_bundles(self, resource_version: str) -> Iterator[JSON]:
        path = path_of(group_version(self.ctb_version), "clustertrustbundles")
        return self.rest.watch(path, resource_version)

    def _shaped_list(
        self, path: str, shape: type[_S], convert: Callable[[_S], JSON]
    ) -> tuple[list[JSON], str]:
        """The node's objects at `path`, a page at a time, each decoded into `shape`."""
        items, version = self.rest.list(path, shape, query={"fieldSelector": self._on_node})
        return [convert(item) for item in items], version

    def _shaped_watch(
        self, path: str, version: str, shape: type[_S], convert: Callable[[_S], JSON]
    ) -> Iterator[JSON]:
        events = self.rest.watch(path, version, shape=shape, fieldSelector=self._on_node)
        for event in events:
            yield {"type": event["type"], "object": convert(event["object"])}

    def _list(self, path: str, field_selector: str = "") -> tuple[list[JSON], str]:
        query = {"fieldSelector": field_selector} if field_selector else {}
        body = self.rest.request("GET", path, query=query)
        return list(body.get("items") or []), str(body["metadata"]["resourceVersion"])

    # --- what a request is made of ---------------------------------------------------------

    def node_uid(self) -> str:
        if self._node_uid is None:
            node = self.rest.get(path_of("v1", "nodes", None, self.node_name))
            if node is None:
                raise ApiError(404, "NotFound", f"node {self.node_name} does not exist")
            self._node_uid = str(node["metadata"]["uid"])
        return self._node_uid

    def service_account_uid(self, namespace: str, name: str) -> str:
        found = self.rest.get(path_of("v1", "serviceaccounts", namespace, name))
        if found is None:
            raise ApiError(404, "NotFound", f"service account {namespace}/{name} does not exist")
        return str(found["metadata"]["uid"])

    def create_pcr(self, namespace: str, body: JSON) -> JSON:
        """Create the request `body` names, or adopt the one already under that name when it is
        this node's request for the same pod, source and key (a create applied before, its
        answer lost). Raises ForeignRequest for a namesake that is not, else ApiError."""
        body = {
            **body,
            "apiVersion": group_version(self.pcr_version),
            "kind": "PodCertificateRequest",
        }
        try:
            try:
                return self.rest.request("POST", self._pcrs(namespace), body=body)
            except ApiError as err:
                if err.status != 409 or err.reason != "AlreadyExists":
                    raise
            return self._adopt(namespace, body)
        except ApiError:
            # A recreated Node has a new UID; ask again next time instead of repeating a stale one.
            self._node_uid = None
            raise

    def _adopt(self, namespace: str, body: JSON) -> JSON:
        name = str(body["metadata"]["name"])
        # A list by name on this node: what the Node authorizer allows without waiting for its
        # graph to learn of the request (a get may be refused until it has).
        found = self.rest.request(
            "GET",
            self._pcrs(namespace),
            query={"fieldSelector": f"{self._on_node},metadata.name={name}"},
        )
        for existing in found.get("items") or []:
            if same_request(existing, body):
                log.info(
                    "adopted the request a lost answer left",
                    extra={"namespace": namespace, "request": name},
                )
                return dict(existing)
        raise ForeignRequest(
            409,
            "AlreadyExists",
            f"request {namespace}/{name} exists and is not this node's for this key",
        )

    def delete_pcr(self, namespace: str, name: str, uid: str) -> bool:
        """Delete a request of a pod that is gone; False when this shim may not (no cleanup
        identity, or it lacks the permission). The UID precondition spares a newer namesake."""
        if self.cleanup is None:
            return False
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        try:
            self.cleanup.request("DELETE", self._pcrs(namespace, name), body=body)
        except ApiError as err:
            if err.status in (404, 409):
                return True  # already gone, or replaced by a namesake that is not ours to delete
            if err.status in (401, 403):
                log.warning(
                    "may not delete request: %s",
                    err.message,
                    extra={"namespace": namespace, "request": name},
                )
                return False
            raise
        return True

    # --- events ----------------------------------------------------------------------------

    def record_event(
        self, pod: PodRef, kind: str, reason: str, message: str, now: dt.datetime
    ) -> None:
        """A core/v1 Event on the pod, as the kubelet records them. Best effort."""
        event = event_body(
            ObjectRef("v1", "Pod", pod.namespace, pod.name, pod.uid),
            event_type=kind,
            reason=reason,
            message=message,
            now=now,
            component=COMPONENT,
            suffix=uuid.uuid4().hex[:12],
            instance=self.node_name,
        )
        try:
            self.rest.request("POST", path_of("v1", "events", pod.namespace), body=event)
        except ApiError as err:
            log.warning(
                "could not record event %s: %s",
                reason,
                err,
                extra={"namespace": pod.namespace, "pod": pod.name},
            )


def request_name(pod: PodRef, source: WorkKey, signer_name: str, public_der: bytes) -> str:
    """The name of the request for `source` (a pod's podCertificate source) with the key whose
    SubjectPublicKeyInfo is `public_der`: the same inputs, the same name, so a create sent or
    applied twice meets its own first copy. The pod's name leads, as with the kubelet's
    generateName, cut so the whole stays within 63 characters and a DNS subdomain."""
    digest = hashlib.sha256()
    for part in (source.pod_uid, source.volume, str(source.source_index), signer_name):
        digest.update(part.encode() + b"\0")
    digest.update(public_der)
    prefix = pod.name[:NAME_PREFIX].rstrip("-.")
    return f"{prefix}-{digest.hexdigest()[:DIGEST]}" if prefix else digest.hexdigest()[:DIGEST]


def same_request(existing: object, body: JSON) -> bool:
    """Whether `existing` (an API object) asks what `body` asks: the same spec, the same key
    (a stub CSR is signed anew at each attempt, so keys are compared, not CSRs)."""
    try:
        found, ours = parse_request(existing).spec, parse_request({**body, "status": {}}).spec
        return _facts(found) == _facts(ours) and _public_key(found) == _public_key(ours)
    except (RequestError, ValueError):
        return False


def _facts(spec: Spec) -> tuple[object, ...]:
    return (
        spec.signer_name,
        spec.pod_name,
        spec.pod_uid,
        spec.service_account_name,
        spec.service_account_uid,
        spec.node_name,
        spec.node_uid,
        spec.max_expiration_seconds,
        dict(spec.unverified_user_annotations or {}),
    )


def _public_key(spec: Spec) -> bytes:
    if spec.stub_pkcs10_request:
        return keys.spki_der(x509.load_der_x509_csr(spec.stub_pkcs10_request).public_key())
    return spec.pkix_public_key or b""


def pcr_body(
    pod: PodRef,
    *,
    name: str,
    signer_name: str,
    service_account: str,
    service_account_uid: str,
    node_name: str,
    node_uid: str,
    max_expiration_seconds: int,
    key_fields: Mapping[str, str],
    user_annotations: Mapping[str, str],
) -> JSON:
    """A PodCertificateRequest named `name` (`request_name`), owned by its pod (so the garbage
    collector takes it with the pod). `key_fields` carry the subject key
    (`podcert.api.requests.key_fields`)."""
    spec: dict[str, Any] = {
        "signerName": signer_name,
        "podName": pod.name,
        "podUID": pod.uid,
        "serviceAccountName": service_account,
        "serviceAccountUID": service_account_uid,
        "nodeName": node_name,
        "nodeUID": node_uid,
        "maxExpirationSeconds": max_expiration_seconds,
        **key_fields,
    }
    if user_annotations:
        spec["unverifiedUserAnnotations"] = dict(user_annotations)
    return {
        "metadata": {
            "name": name,
            "namespace": pod.namespace,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
            ],
        },
        "spec": spec,
    }


# --- operators: `podcert shim rotate` ----------------------------------------------------------


def request_rotation(rest: Rest, namespace: str, pod_name: str, before: dt.datetime) -> None:
    """Set the emergency-rotation annotation on one pod (merge patch: nothing else changes)."""
    stamp = format_micro_time(before)
    rest.request(
        "PATCH",
        path_of("v1", "pods", namespace, pod_name),
        body={"metadata": {"annotations": {ROTATE_ANNOTATION: stamp}}},
        content_type="application/merge-patch+json",
    )


def pods_of_service_account(rest: Rest, namespace: str, service_account: str) -> list[str]:
    body = rest.request("GET", path_of("v1", "pods", namespace))
    return sorted(
        str(pod["metadata"]["name"])
        for pod in body.get("items") or []
        if ((pod.get("spec") or {}).get("serviceAccountName") or "default") == service_account
    )


def request_makers(rest: Rest, namespace: str) -> dict[str, list[str]] | None:
    """Per pod name in `namespace`, the managedFields managers of its PodCertificateRequests
    (who made them: the shim's client or a kubelet); None when the caller may not list them,
    or the server serves none."""
    try:
        version, _ = certificates_versions(rest)
        body = rest.request(
            "GET", path_of(group_version(version), "podcertificaterequests", namespace)
        )
    except Unserved:
        return None
    except ApiError as err:
        if err.status == 403:
            return None
        raise
    out: dict[str, list[str]] = {}
    for item in body.get("items") or []:
        pod = str((item.get("spec") or {}).get("podName", ""))
        for field in (item.get("metadata") or {}).get("managedFields") or []:
            manager = (field or {}).get("manager")
            if isinstance(manager, str):
                out.setdefault(pod, []).append(manager)
                break
    return out
