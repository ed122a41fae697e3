"""Translate API objects (plain JSON dicts) into the signer's model, and outcomes into status.

Pure: the controller hands in what it read and writes what comes out. Hostile or broken objects
become `ObjectError` naming the field, never a KeyError or TypeError.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

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


def pod_from(obj: Mapping[str, Any]) -> model.Pod:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    labels = meta.get("labels") or {}
    return model.Pod(
        namespace=_str(meta, "namespace"),
        name=_str(meta, "name"),
        uid=_str(meta, "uid"),
        node_name=_str(spec, "nodeName", required=False),
        service_account_name=_str(spec, "serviceAccountName", required=False) or "default",
        phase=_str(status, "phase", required=False) or "Pending",
        deleting=bool(meta.get("deletionTimestamp")),
        labels=dict(labels) if isinstance(labels, Mapping) else {},
    )


def node_from(obj: Mapping[str, Any]) -> model.Node:
    meta = obj.get("metadata") or {}
    return model.Node(name=_str(meta, "name"), uid=_str(meta, "uid"))


def service_account_from(obj: Mapping[str, Any]) -> model.ServiceAccount:
    meta = obj.get("metadata") or {}
    return model.ServiceAccount(
        namespace=_str(meta, "namespace"), name=_str(meta, "name"), uid=_str(meta, "uid")
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
