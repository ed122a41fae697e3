"""The pod tests build, in one place: the API object as a test hands it to a parser, a fake or
the API server. Each test file sets only what it is about (its namespace, a UID, a phase, the
containers of a security test); the shape of a pod is written here once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

JSON = dict[str, Any]


def pod_object(
    name: str,
    volumes: Sequence[JSON] = (),
    *,
    namespace: str | None = None,
    uid: str | None = None,
    node: str = "node-a",
    service_account: str = "default",
    annotations: dict[str, str] | None = None,
    phase: str | None = None,
    containers: list[JSON] | None = None,
    security: JSON | None = None,
) -> JSON:
    """A pod bound to `node`. Metadata the API server sets (namespace on a create, UID) only
    when given; `containers` default to one that mounts every volume under /var/run/<name>;
    no ServiceAccount token is mounted (the tests' pods need none)."""
    meta: JSON = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if uid is not None:
        meta["uid"] = uid
    if annotations is not None:
        meta["annotations"] = annotations
    if containers is None:
        mounts = [{"name": v["name"], "mountPath": f"/var/run/{v['name']}"} for v in volumes]
        containers = [{"name": "app", "image": "registry.invalid/app:1", "volumeMounts": mounts}]
    spec: JSON = {
        "nodeName": node,
        "serviceAccountName": service_account,
        "automountServiceAccountToken": False,
        "containers": containers,
        "volumes": list(volumes),
    }
    if security is not None:
        spec["securityContext"] = security
    pod: JSON = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    if phase is not None:
        pod["status"] = {"phase": phase}
    return pod
