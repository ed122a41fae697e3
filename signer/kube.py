"""The signer's one adapter to the Kubernetes API: every read and write it makes goes here.

PodCertificateRequests are decoded from each list page, watch event and read straight into the
typed `podcert.api.requests.PodCertificateRequest` (an object that is not one into `Unreadable`,
never an error for the rest of the page). Most events are the signer's own status writes coming
back; managedFields, as large as the spec and read by no one here, are skipped unread. The
status PUT carries only what the status subresource reads: the request's name, namespace, UID
and resourceVersion (the guard) and the new status. The API server keeps spec, the rest of
metadata and managedFields from the stored object, so sending them back would only cost both
sides CPU on every write.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from podcert.api import requests
from podcert.api.events import ObjectRef, event_body
from podcert.api.versions import group_version, key_fallback
from podcert.client.discovery import certificates_versions, serves
from podcert.client.rest import JSON, REQUESTS, ApiError, Rest, path_of

log = logging.getLogger("podcert.signer")

T = TypeVar("T")


class KeyNotServed(Exception):
    """No version the API server serves shows the request's key (`SignerKube.keyed_pcr`)."""


class SignerKube:
    def __init__(self, rest: Rest, component: str = "podcert-signer") -> None:
        self.rest = rest
        self.component = component
        self.pcr_version = "v1"
        self.ctb_version = "v1"
        # Whether the version that shows a key the v1 view lacks (v1beta1) serves requests:
        # learned at discovery, asked again before any answer rests on it.
        self.fallback_served = False

    # --- discovery -------------------------------------------------------------------------

    def discover(self, *, trust_bundles: bool = True) -> str:
        """certificates.k8s.io/v1 where served, else v1beta1 (1.35/1.36 clusters). Raises
        podcert.client.discovery.Unserved when no version serves requests (or, with `trust_bundles`,
        ClusterTrustBundles); the signer reads the key in either form, so needs no more."""
        self.pcr_version, ctb = certificates_versions(self.rest, trust_bundles=trust_bundles)
        self.ctb_version = ctb or self.ctb_version
        fallback = key_fallback(self.pcr_version)
        if fallback is not None:
            self.fallback_served = serves(self.rest, fallback)
            log.info(
                "requests whose %s view holds no key (made by 1.35 kubelets) %s",
                group_version(self.pcr_version),
                f"are read through {group_version(fallback)}"
                if self.fallback_served
                else f"are denied KeyNotServed: {group_version(fallback)} serves no requests",
            )
        return self.pcr_version

    def _pcrs(self, namespace: str | None = None, name: str = "") -> str:
        return path_of(group_version(self.pcr_version), "podcertificaterequests", namespace, name)

    # --- PodCertificateRequests ------------------------------------------------------------

    def list_pcrs(self, signer_name: str) -> tuple[Iterator[requests.Read], str]:
        """Paged: requests live 15 minutes, so a busy cluster holds a great many."""
        return self.rest.list(
            self._pcrs(), REQUESTS, query={"fieldSelector": f"spec.signerName={signer_name}"}
        )

    def watch_pcrs(self, signer_name: str, resource_version: str) -> Iterator[JSON]:
        """The watch of every request of the signer name, each object as `list_pcrs` gives it.
        Most events are the signer's own status writes: decoded without managedFields."""
        return self.rest.watch(
            self._pcrs(),
            resource_version,
            shape=REQUESTS,
            fieldSelector=f"spec.signerName={signer_name}",
        )

    def get_pcr(self, namespace: str, name: str) -> requests.Read | None:
        return self.rest.get_as(self._pcrs(namespace, name), REQUESTS)

    def keyed_pcr(self, pcr: requests.PodCertificateRequest) -> requests.Read | None:
        """`pcr`, whose view here holds no key, read through the version that shows one: on a
        1.37 server, v1beta1 for a 1.35 node's request (pkixPublicKey + proofOfPossession, which
        v1 cannot show). `pcr` itself where this version shows every form (v1beta1); None when
        the request is gone. Raises KeyNotServed when no served version shows the key: that
        answer is checked against discovery first (a server may have started or stopped
        serving v1beta1 since it was learned), as is a 404, which a version no longer served
        answers too. Only key-less views come here: the common request costs nothing more."""
        fallback = key_fallback(self.pcr_version)
        if fallback is None:
            return pcr
        unserved = KeyNotServed(f"{group_version(fallback)} serves no podcertificaterequests")
        if not self.fallback_served:
            self.fallback_served = serves(self.rest, fallback)
            if not self.fallback_served:
                raise unserved
        path = path_of(group_version(fallback), "podcertificaterequests", pcr.namespace, pcr.name)
        found = self.rest.get_as(path, REQUESTS)
        if found is None:
            self.fallback_served = serves(self.rest, fallback)
            if not self.fallback_served:
                raise unserved
        return found

    def write_status(self, target: requests.Metadata, status: requests.Status) -> None:
        """PUT /status of the request `target` names, guarded by its resourceVersion: a lost
        race is a 409, never a clobber. The answer (the whole object, also seen in the watch)
        is not decoded."""
        body = {
            "apiVersion": group_version(self.pcr_version),
            "kind": "PodCertificateRequest",
            "metadata": {
                "name": target.name,
                "namespace": target.namespace,
                "uid": target.uid,
                "resourceVersion": target.resource_version,
            },
            "status": status,
        }
        path = self._pcrs(target.namespace, target.name) + "/status"
        self.rest.write("PUT", path, body=body)

    # --- facts -----------------------------------------------------------------------------

    def get_as(self, resource: str, namespace: str | None, name: str, shape: type[T]) -> T | None:
        """One core/v1 object (a pod, node or ServiceAccount) read live and decoded as `shape`,
        as the caches decode it (a pod's labels raw, its annotations and the rest never
        decoded): a live read costs the object's bytes, not a tenant's labels built twice.
        None when it does not exist."""
        return self.rest.get_as(path_of("v1", resource, namespace, name), shape)

    def list_all(self, resource: str, shape: type[T]) -> tuple[Iterator[T], str]:
        """Every object of a core/v1 resource (pods, nodes, serviceaccounts, services) across
        namespaces, paged, each decoded as `shape` (the fields the caches keep, nothing else)."""
        return self.rest.list(path_of("v1", resource), shape)

    def watch_all(self, resource: str, resource_version: str, shape: type[Any]) -> Iterator[JSON]:
        return self.rest.watch(path_of("v1", resource), resource_version, shape=shape)

    def list_in(self, resource: str, namespace: str, shape: type[T]) -> Iterator[T]:
        """The objects of one namespace, read live, each decoded as `shape`."""
        return self.rest.list(path_of("v1", resource, namespace), shape)[0]

    # --- events ----------------------------------------------------------------------------

    def record_event(
        self, target: requests.Metadata, reason: str, message: str, now: dt.datetime, kind: str
    ) -> None:
        """A core/v1 Event on the request `target` names (what `kubectl describe` shows).
        Best effort."""
        namespace = target.namespace or "default"
        about = ObjectRef(
            api_version=group_version(self.pcr_version),
            kind="PodCertificateRequest",
            namespace=namespace,
            name=target.name or "pcr",
            uid=target.uid,
            resource_version=target.resource_version or None,
        )
        event = event_body(
            about,
            event_type=kind,
            reason=reason,
            message=message,
            now=now,
            component=self.component,
            suffix=uuid.uuid4().hex[:12],
        )
        try:
            self.rest.request("POST", path_of("v1", "events", namespace), body=event)
        except ApiError as err:
            log.warning(
                "could not record event %s: %s",
                reason,
                err,
                extra={"namespace": namespace, "request": target.name},
            )

    def record_secret_event(
        self, namespace: str, name: str, reason: str, message: str, now: dt.datetime
    ) -> None:
        """A Warning Event on the Secret `namespace/name` (the CA Secret: what the operator acts
        on); `kubectl -n NAMESPACE get events` lists it. Best effort."""
        about = ObjectRef(api_version="v1", kind="Secret", namespace=namespace, name=name, uid="")
        event = event_body(
            about,
            event_type="Warning",
            reason=reason,
            message=message,
            now=now,
            component=self.component,
            suffix=uuid.uuid4().hex[:12],
        )
        try:
            self.rest.request("POST", path_of("v1", "events", namespace), body=event)
        except ApiError as err:
            log.warning("could not record event %s: %s", reason, err)

    # --- the CA Secret ---------------------------------------------------------------------

    def read_secret(self, namespace: str, name: str) -> tuple[dict[str, bytes], str] | None:
        """(decoded data, resourceVersion) or None when the Secret does not exist."""
        found = self.rest.get(path_of("v1", "secrets", namespace, name))
        if found is None:
            return None
        raw = found.get("data") or {}
        data = {k: base64.b64decode(v) for k, v in raw.items() if isinstance(v, str)}
        return data, str(found["metadata"]["resourceVersion"])

    def create_secret(
        self, namespace: str, name: str, data: Mapping[str, bytes], labels: Mapping[str, str]
    ) -> bool:
        """Create the Secret; False when it already exists (another replica was first)."""
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "type": "Opaque",
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        try:
            self.rest.request("POST", path_of("v1", "secrets", namespace), body=body)
        except ApiError as err:
            if err.status == 409:
                return False
            raise
        return True

    def list_secret(self, namespace: str, name: str) -> tuple[list[JSON], str]:
        """List one Secret by name (RBAC can then limit list/watch to that name)."""
        body = self.rest.request(
            "GET",
            path_of("v1", "secrets", namespace),
            query={"fieldSelector": f"metadata.name={name}"},
        )
        return list(body.get("items") or []), str(body["metadata"]["resourceVersion"])

    def watch_secret(self, namespace: str, name: str, resource_version: str) -> Iterator[JSON]:
        return self.rest.watch(
            path_of("v1", "secrets", namespace),
            resource_version,
            fieldSelector=f"metadata.name={name}",
        )

    # --- ClusterTrustBundles ---------------------------------------------------------------

    def _ctbs(self, name: str = "") -> str:
        return path_of(group_version(self.ctb_version), "clustertrustbundles", None, name)

    def list_trust_bundles(self, signer_name: str) -> tuple[list[JSON], str]:
        body = self.rest.request(
            "GET", self._ctbs(), query={"fieldSelector": f"spec.signerName={signer_name}"}
        )
        return list(body.get("items") or []), str(body["metadata"]["resourceVersion"])

    def watch_trust_bundles(self, signer_name: str, resource_version: str) -> Iterator[JSON]:
        return self.rest.watch(
            self._ctbs(), resource_version, fieldSelector=f"spec.signerName={signer_name}"
        )

    def put_trust_bundle(self, body: JSON, existing: JSON | None) -> JSON:
        """Create the bundle, or replace `existing` (guarded by its resourceVersion)."""
        doc = {
            **body,
            "apiVersion": group_version(self.ctb_version),
            "kind": "ClusterTrustBundle",
        }
        if existing is None:
            return self.rest.request("POST", self._ctbs(), body=doc)
        meta = {**doc["metadata"], "resourceVersion": existing["metadata"]["resourceVersion"]}
        return self.rest.request("PUT", self._ctbs(meta["name"]), body={**doc, "metadata": meta})

    def delete_trust_bundle(self, name: str) -> None:
        try:
            self.rest.request("DELETE", self._ctbs(name))
        except ApiError as err:
            if err.status != 404:
                raise

    def replace_secret(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, bytes],
        resource_version: str,
        labels: Mapping[str, str],
    ) -> str:
        """Replace the Secret's data if it is still at `resource_version` (409 otherwise)."""
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": dict(labels),
                "resourceVersion": resource_version,
            },
            "type": "Opaque",
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        out = self.rest.request("PUT", path_of("v1", "secrets", namespace, name), body=body)
        return str(out["metadata"]["resourceVersion"])

    # --- our own ValidatingWebhookConfiguration (its caBundle) -----------------------------

    def _webhook_configs(self, name: str = "") -> str:
        return path_of(
            "admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", None, name
        )

    def list_webhook_configuration(self, name: str) -> tuple[list[JSON], str]:
        """List one configuration by name (RBAC can then limit list/watch to that name)."""
        body = self.rest.request(
            "GET", self._webhook_configs(), query={"fieldSelector": f"metadata.name={name}"}
        )
        return list(body.get("items") or []), str(body["metadata"]["resourceVersion"])

    def watch_webhook_configuration(self, name: str, resource_version: str) -> Iterator[JSON]:
        return self.rest.watch(
            self._webhook_configs(), resource_version, fieldSelector=f"metadata.name={name}"
        )

    def replace_webhook_configuration(self, body: JSON) -> JSON:
        """PUT the configuration as read and changed: its resourceVersion makes a concurrent
        change (a `kubectl apply`) a 409, never a clobber."""
        doc = {
            **body,
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
        }
        return self.rest.request("PUT", self._webhook_configs(body["metadata"]["name"]), body=doc)
