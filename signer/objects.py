"""Translate the pods, nodes, ServiceAccounts and Services the signer reads into its model.

Pure: the controller hands in what it read and keeps what comes out. Hostile or broken objects
become `ObjectError` naming the field, never a KeyError or TypeError. (Requests need no
translation: they are decoded typed, `podcert.api.requests`.)

The signer caches every pod, node and ServiceAccount of the cluster, so those three are also read
from shapes (`PodShape`...: the few fields the signer needs, decoded from a list page or a watch
event with everything else skipped), and their values share what repeats between objects
(namespaces, node and account names, phases, label sets) instead of holding a copy each.

A pod's labels are the one field a tenant can make as large as the pod itself (Kubernetes bounds
each label, not their number), so a cached pod is bounded whatever its labels: it holds them
only while their JSON is at most `LABELS_KEPT` bytes. A shape reads them as raw JSON and measures
that before decoding, so a larger map is never built at all; the pod then holds None, "not
kept", and the one decision that reads labels (`dnsNames.services`) reads that pod live (into
this shape, its labels whole) for itself only (`signer.issue.fresh.Bindings.read`). The bound
decides only where labels come from, never what a decision sees.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import msgspec

from signer import model

JSON = dict[str, Any]


class ObjectError(ValueError):
    """An API object lacks a field the signer needs, or has it with the wrong type."""


def _str(obj: Mapping[str, Any], path: str, *, required: bool = True) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    if node is None and not required:
        return ""
    if not isinstance(node, str) or (required and not node):
        raise ObjectError(f"{path}: expected a non-empty string, got {type(node).__name__}")
    return node


# --- shapes: what the signer's caches decode of each object -------------------------------------


class _Meta(msgspec.Struct, frozen=True, gc=False):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""  # the API's spelling: msgspec matches fields by name


class _PodMeta(_Meta, frozen=True, gc=False):
    # Raw: measured before it is decoded (`_labels`), and never decoded when over the bound.
    labels: msgspec.Raw = msgspec.Raw(b"null")
    deletionTimestamp: str | None = None


class _PodSpec(msgspec.Struct, frozen=True, gc=False):
    nodeName: str = ""
    serviceAccountName: str = ""


class _PodStatus(msgspec.Struct, frozen=True, gc=False):
    phase: str = ""


class PodShape(msgspec.Struct, frozen=True, gc=False):
    metadata: _PodMeta = _PodMeta()
    spec: _PodSpec = _PodSpec()
    status: _PodStatus = _PodStatus()


class NodeShape(msgspec.Struct, frozen=True, gc=False):
    metadata: _Meta = _Meta()


class ServiceAccountShape(msgspec.Struct, frozen=True, gc=False):
    metadata: _Meta = _Meta()


Shape = PodShape | NodeShape | ServiceAccountShape


def key_of(obj: Mapping[str, Any] | Shape) -> tuple[str, str] | None:
    """(namespace, name) of an object, a dict or a shape; None without both."""
    if isinstance(obj, Mapping):
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping):
            return None
        namespace, name = meta.get("namespace"), meta.get("name")
    else:
        namespace, name = obj.metadata.namespace, obj.metadata.name
    if isinstance(namespace, str) and isinstance(name, str) and namespace and name:
        return sys.intern(namespace), name
    return None


def name_of(obj: Mapping[str, Any] | Shape) -> str | None:
    if isinstance(obj, Mapping):
        name = (obj.get("metadata") or {}).get("name")
        return name if isinstance(name, str) else None
    return obj.metadata.name or None


# --- the cached values ---------------------------------------------------------------------------

LABELS_KEPT: Final = 2048
"""The largest label map a cached pod holds, in bytes of JSON as the API server writes it (the
labels of the workloads seen in practice take a few hundred). A larger one is not kept: read
live when a decision needs it."""
_NO_LABELS: Final[Mapping[str, str]] = MappingProxyType({})
_LABEL_SETS_MAX: Final = 1 << 16
_label_sets: dict[tuple[tuple[str, str], ...], Mapping[str, str]] = {}
_LABELS: Final = msgspec.json.Decoder(dict[str, str] | None)


def labels_size(labels: Mapping[str, str]) -> int:
    """The bytes of `labels` as JSON without spaces (`{"k":"v",...}`), as the API server writes
    them: a label's key and value never need escaping."""
    return 1 + sum(len(k) + len(v) + 6 for k, v in labels.items()) if labels else 2


def _labels(raw: object, *, whole: bool = False) -> Mapping[str, str] | None:
    """A pod's labels as a read-only mapping, or None when they are over `LABELS_KEPT` and not
    `whole` (raw JSON that long is not even decoded). Label sets that fit are shared, one mapping
    per distinct set (the pods of a ReplicaSet share theirs); the table of known sets is emptied
    when it grows past a bound, never grown without one: mappings already handed out stay valid,
    later pods just share afresh. A `whole` set over the bound is the caller's alone."""
    if isinstance(raw, msgspec.Raw):
        if len(raw) > LABELS_KEPT and not whole:
            return None
        try:
            raw = _LABELS.decode(raw)
        except msgspec.DecodeError as err:
            raise ObjectError(f"metadata.labels: {err}") from None
    if not isinstance(raw, Mapping) or not raw:
        return _NO_LABELS
    labels = {str(k): str(v) for k, v in raw.items()}
    if labels_size(labels) > LABELS_KEPT:
        return MappingProxyType(labels) if whole else None
    items = tuple(sorted(labels.items()))
    found = _label_sets.get(items)
    if found is None:
        if len(_label_sets) >= _LABEL_SETS_MAX:
            _label_sets.clear()
        found = MappingProxyType({sys.intern(k): sys.intern(v) for k, v in items})
        _label_sets[items] = found
    return found


def kept(pod: model.Pod | None) -> model.Pod | None:
    """`pod` as a cache keeps it: without its labels when they are over `LABELS_KEPT`."""
    if pod is None or pod.labels is None or labels_size(pod.labels) <= LABELS_KEPT:
        return pod
    return msgspec.structs.replace(pod, labels=None)


def _required(value: object, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise ObjectError(f"{path}: expected a non-empty string, got {type(value).__name__}")
    return value


def pod_from(obj: Mapping[str, Any] | PodShape, *, whole: bool = False) -> model.Pod:
    """The signer's view of a pod; its labels None when over `LABELS_KEPT`, unless `whole`
    (a live read for one decision, never kept)."""
    if isinstance(obj, PodShape):
        shaped = obj.metadata
        return model.Pod(
            namespace=sys.intern(_required(shaped.namespace, "namespace")),
            name=_required(shaped.name, "name"),
            uid=_required(shaped.uid, "uid"),
            node_name=sys.intern(obj.spec.nodeName),
            service_account_name=sys.intern(obj.spec.serviceAccountName or "default"),
            phase=sys.intern(obj.status.phase or "Pending"),
            deleting=bool(shaped.deletionTimestamp),
            labels=_labels(shaped.labels, whole=whole),
        )
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    return model.Pod(
        namespace=sys.intern(_str(meta, "namespace")),
        name=_str(meta, "name"),
        uid=_str(meta, "uid"),
        node_name=sys.intern(_str(spec, "nodeName", required=False)),
        service_account_name=sys.intern(
            _str(spec, "serviceAccountName", required=False) or "default"
        ),
        phase=sys.intern(_str(status, "phase", required=False) or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        labels=_labels(meta.get("labels"), whole=whole),
    )


def node_from(obj: Mapping[str, Any] | NodeShape) -> model.Node:
    if isinstance(obj, NodeShape):
        return model.Node(
            name=sys.intern(_required(obj.metadata.name, "name")),
            uid=_required(obj.metadata.uid, "uid"),
        )
    meta = obj.get("metadata") or {}
    return model.Node(name=sys.intern(_str(meta, "name")), uid=_str(meta, "uid"))


def service_account_from(obj: Mapping[str, Any] | ServiceAccountShape) -> model.ServiceAccount:
    if isinstance(obj, ServiceAccountShape):
        shaped = obj.metadata
        return model.ServiceAccount(
            namespace=sys.intern(_required(shaped.namespace, "namespace")),
            name=sys.intern(_required(shaped.name, "name")),
            uid=_required(shaped.uid, "uid"),
        )
    meta = obj.get("metadata") or {}
    return model.ServiceAccount(
        namespace=sys.intern(_str(meta, "namespace")),
        name=sys.intern(_str(meta, "name")),
        uid=_str(meta, "uid"),
    )


# --- Services: what gives a pod its DNS names --------------------------------------------------

ROUTING_SERVICE_TYPES: Final = frozenset({"ClusterIP", "NodePort", "LoadBalancer"})
"""The Service types whose name leads to the pods their selector picks (a headless Service is a
ClusterIP one with clusterIP None: its name resolves to the pods themselves). An ExternalName
Service's name is a CNAME to somewhere else, whatever selector it carries; a type this list does
not know gives no name either."""


class _ServiceSpec(msgspec.Struct, frozen=True, gc=False):
    type: Any = "ClusterIP"  # the API server's default, stored on every Service it admits
    selector: Any = None


class ServiceShape(msgspec.Struct, frozen=True, gc=False):
    """What the signer reads of a Service: its key, version, type and selector (annotations,
    ports and the rest are skipped unread)."""

    metadata: _Meta = _Meta()
    spec: _ServiceSpec = _ServiceSpec()


def service_selector(obj: ServiceShape) -> Mapping[str, str] | None:
    """The selector by which a Service gives its DNS name to pods, or None when it gives its
    name to none: a type that does not route to its pods (`ROUTING_SERVICE_TYPES`), or no
    selector (its endpoints are managed by hand), or one that is not a map of strings."""
    spec = obj.spec
    if spec.type not in ROUTING_SERVICE_TYPES or not isinstance(spec.selector, Mapping):
        return None
    selector = spec.selector
    if not selector or not all(isinstance(v, str) for v in selector.values()):
        return None
    return {str(k): v for k, v in selector.items()}


def service_names(
    services: Mapping[str, Mapping[str, str]],
    namespace: str,
    labels: Mapping[str, str],
    cluster_domain: str,
) -> frozenset[str]:
    """DNS names of every Service (name -> selector) in `namespace` whose selector selects the pod.

    A Service without a selector selects nothing (its endpoints are managed by hand).
    """
    names: set[str] = set()
    for service, selector in services.items():
        if selector and all(labels.get(k) == v for k, v in selector.items()):
            names.add(f"{service}.{namespace}.svc")
            names.add(f"{service}.{namespace}.svc.{cluster_domain}")
    return frozenset(names)
