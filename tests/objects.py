"""The pod tests build, in one place: the API object as a test hands it to a parser, a fake or
the API server. Each test file sets only what it is about (its namespace, a UID, a phase, the
containers of a security test); the shape of a pod is written here once. And what a pod's
projected volume holds, as the shim's storage tests hand it to a writer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubelet_shim.storage import FileSpec

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


# --- what a projected volume holds ---------------------------------------------------------------

KEY_MODE = 0o600  # a file that holds a private key
PUBLIC_MODE = 0o644  # a certificate or a trust bundle


def volume_payload(tag: str, **extra: bytes) -> dict[str, FileSpec]:
    """A volume's files as a storage takes them: a key-bearing credential at the top and a trust
    file one directory down, their bytes marked with `tag` (so two versions differ), and `extra`
    public files."""
    files = {
        "credential.pem": FileSpec(b"KEY " + tag.encode() + b"\nCERT " + tag.encode(), KEY_MODE),
        "ca/trust.pem": FileSpec(b"CA " + tag.encode(), PUBLIC_MODE),
    }
    files.update({name: FileSpec(data, PUBLIC_MODE) for name, data in extra.items()})
    return files


def volume_contents(files: Mapping[str, FileSpec]) -> dict[str, bytes]:
    """What reading a volume written with `files` gives back."""
    return {path: spec.data for path, spec in files.items()}
