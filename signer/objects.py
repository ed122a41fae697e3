"""Translate API objects (plain JSON dicts) into the signer's model, and outcomes into status.

Pure: the controller hands in what it read and writes what comes out. Hostile or broken objects
become `ObjectError` naming the field, never a KeyError or TypeError.

The signer caches every pod, node and ServiceAccount of the cluster, so those three are also read
from shapes (`PodShape`...: the few fields the signer needs, decoded from a list page or a watch
event with everything else skipped), and their values share what repeats between objects
(namespaces, node and account names, phases, label sets) instead of holding a copy each.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import msgspec

from podcert.api import requests
from podcert.api.requests import outcome as outcome
from podcert.api.times import format_time
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


def signer_name_of(pcr: Mapping[str, Any]) -> str | None:
    """spec.signerName of a request as stored, or None when it has none (never raises)."""
    spec = pcr.get("spec")
    name = spec.get("signerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) else None


def request_from(pcr: Mapping[str, Any]) -> model.Request:
    """The signer's view of a request, read by `podcert.api.requests`; every field the API
    server always sets must be there (a request without one is denied as InvalidRequest)."""
    try:
        parsed = requests.parse_request(pcr)
    except requests.RequestError as err:
        raise ObjectError(str(err)) from None
    missing = requests.missing_field(parsed)
    if missing is not None:
        raise ObjectError(f"{missing}: expected a non-empty string")
    spec = parsed.spec
    return model.Request(
        namespace=parsed.namespace,
        name=parsed.name,
        uid=parsed.uid,
        signer_name=spec.signer_name,
        pod_name=spec.pod_name,
        pod_uid=spec.pod_uid,
        service_account_name=spec.service_account_name,
        service_account_uid=spec.service_account_uid,
        node_name=spec.node_name,
        node_uid=spec.node_uid,
        max_expiration_seconds=spec.max_expiration_seconds,
        stub_csr=spec.stub_pkcs10_request,
        pkix_public_key=spec.pkix_public_key,
        proof_of_possession=spec.proof_of_possession,
        user_annotations=dict(spec.unverified_user_annotations),
        created=parsed.created,
    )


# --- shapes: what the signer's caches decode of each object -------------------------------------


class _Meta(msgspec.Struct, frozen=True, gc=False):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""  # the API's spelling: msgspec matches fields by name


class _PodMeta(_Meta, frozen=True, gc=False):
    labels: dict[str, str] | None = None
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

_NO_LABELS: Final[Mapping[str, str]] = MappingProxyType({})
_LABEL_SETS_MAX: Final = 1 << 16
_label_sets: dict[tuple[tuple[str, str], ...], Mapping[str, str]] = {}


def _labels(raw: object) -> Mapping[str, str]:
    """One shared, read-only mapping per distinct label set (the pods of a ReplicaSet share
    theirs). The table of known sets is emptied when it grows past a bound, never grown without
    one: mappings already handed out stay valid, later pods just share afresh."""
    if not isinstance(raw, Mapping) or not raw:
        return _NO_LABELS
    items = tuple(sorted((str(k), str(v)) for k, v in raw.items()))
    found = _label_sets.get(items)
    if found is None:
        if len(_label_sets) >= _LABEL_SETS_MAX:
            _label_sets.clear()
        found = MappingProxyType({sys.intern(k): sys.intern(v) for k, v in items})
        _label_sets[items] = found
    return found


def _required(value: object, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise ObjectError(f"{path}: expected a non-empty string, got {type(value).__name__}")
    return value


def pod_from(obj: Mapping[str, Any] | PodShape) -> model.Pod:
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
            labels=_labels(shaped.labels),
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
        labels=_labels(meta.get("labels")),
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


def _condition(kind: str, reason: str, message: str, now: dt.datetime, generation: Any) -> JSON:
    cond: JSON = {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message[:32000],
        "lastTransitionTime": format_time(now),
    }
    if isinstance(generation, int):
        cond["observedGeneration"] = generation
    return cond


def issued_status(
    pcr: Mapping[str, Any], chain_pem: str, plan: model.LeafPlan, now: dt.datetime
) -> JSON:
    """The object to PUT to /status for an issued request: fields equal the leaf's."""
    generation = (pcr.get("metadata") or {}).get("generation")
    return {
        **pcr,
        "status": {
            "certificateChain": chain_pem,
            "notBefore": format_time(plan.not_before),
            "notAfter": format_time(plan.not_after),
            "beginRefreshAt": format_time(plan.begin_refresh_at),
            "conditions": [
                _condition("Issued", "Issued", f"issued for {plan.spiffe_id}", now, generation)
            ],
        },
    }


def settled_status(
    pcr: Mapping[str, Any], kind: str, reason: str, message: str, now: dt.datetime
) -> JSON:
    """The object to PUT to /status for a Denied or Failed request."""
    generation = (pcr.get("metadata") or {}).get("generation")
    return {**pcr, "status": {"conditions": [_condition(kind, reason, message, now, generation)]}}


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
