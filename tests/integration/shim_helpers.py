"""Running `podcert shim` as a real child process with a node identity, and reading what it wrote.

The shim is a `devcluster.processes.Process` like the signer; these helpers add its readiness
probe, its metrics, the files under its root, and the cluster objects its tests need
(ClusterTrustBundles, the optional clean-up identity, events on pods).
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from devcluster import kube, processes
from devcluster.testing import DevCluster, eventually
from podcert.api.requests import outcome as outcome
from podcert.client.rest import JSON, ApiError, Rest, path_of

PCRS = "certificates.k8s.io/v1"
Shim = processes.Shim


def shim(devcluster: DevCluster, workdir: Path, node: str, **kwargs: Any) -> Shim:
    """`podcert shim` as `node` (not started); see devcluster.processes.shim."""
    return processes.shim(devcluster.root, workdir, node, **kwargs)


def cleanup_identity(devcluster: DevCluster, namespace: str) -> Path:
    """A ServiceAccount allowed to delete podcertificaterequests (nodes may not): the shim's
    optional clean-up identity. Returns its kubeconfig."""
    name = f"podcert-shim-cleanup-{namespace}"
    kube.ensure_namespace(devcluster.admin, namespace)
    kube.apply(
        devcluster.admin,
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": name},
                "rules": [
                    {
                        "apiGroups": ["certificates.k8s.io"],
                        "resources": ["podcertificaterequests"],
                        "verbs": ["delete"],
                    }
                ],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": name,
                },
                "subjects": [
                    {
                        "kind": "ServiceAccount",
                        "name": "podcert-shim-cleanup",
                        "namespace": namespace,
                    }
                ],
            },
        ],
    )
    return devcluster.service_account_kubeconfig(namespace, "podcert-shim-cleanup")


@contextlib.contextmanager
def running_shim(
    devcluster: DevCluster, workdir: Path, node: str, signer_namespace: str, root: Path
) -> Iterator[Shim]:
    """`podcert shim` as `node` with the clean-up identity of the signer's namespace, started
    and waited ready for the block, stopped after it (a module fixture's body)."""
    cleanup = cleanup_identity(devcluster, signer_namespace)
    proc = shim(devcluster, workdir, node, root=root, cleanup_kubeconfig=cleanup)
    proc.start()
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@contextlib.contextmanager
def published_roots(
    devcluster: DevCluster, signer_namespace: str, bundle: str, signer_name: str
) -> Iterator[bytes]:
    """The signer's roots as they are now, put by hand into ClusterTrustBundle `bundle`
    (linked to `signer_name`) for the block, deleted after it. A copy: it does not follow the
    CA as the bundles the signer publishes do."""
    pem = signer_roots(devcluster, signer_namespace)
    put_trust_bundle(devcluster, bundle, pem, signer_name=signer_name)
    try:
        yield pem
    finally:
        delete_trust_bundle(devcluster, bundle)


def signer_roots(devcluster: DevCluster, namespace: str) -> bytes:
    """The signer's root certificates (PEM) from its CA Secret."""
    found = Rest(devcluster.admin).request("GET", path_of("v1", "secrets", namespace, "podcert-ca"))
    return base64.b64decode(found["data"]["ca.crt"])


def put_trust_bundle(
    devcluster: DevCluster,
    name: str,
    pem: bytes,
    *,
    signer_name: str | None = None,
    labels: dict[str, str] | None = None,
) -> JSON:
    """Create or replace a ClusterTrustBundle as admin (who may `attest` for any signer)."""
    rest = Rest(devcluster.admin)
    spec: dict[str, Any] = {"trustBundle": pem.decode()}
    if signer_name is not None:
        spec["signerName"] = signer_name
    body: JSON = {
        "apiVersion": PCRS,
        "kind": "ClusterTrustBundle",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }
    path = path_of(PCRS, "clustertrustbundles")
    try:
        return rest.request("POST", path, body=body)
    except ApiError as err:
        if err.status != 409:
            raise
    current = rest.request("GET", path_of(PCRS, "clustertrustbundles", None, name))
    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    return rest.request("PUT", path_of(PCRS, "clustertrustbundles", None, name), body=body)


def delete_trust_bundle(devcluster: DevCluster, name: str) -> None:
    Rest(devcluster.admin).request("DELETE", path_of(PCRS, "clustertrustbundles", None, name))


def requests_of(devcluster: DevCluster, namespace: str, pod_uid: str | None = None) -> list[JSON]:
    items = Rest(devcluster.admin).request(
        "GET", path_of(PCRS, "podcertificaterequests", namespace)
    )["items"]
    return [i for i in items if pod_uid is None or i["spec"]["podUID"] == pod_uid]


def pod_events(devcluster: DevCluster, pod: Any) -> list[JSON]:
    items: list[JSON] = Rest(devcluster.admin).request(
        "GET",
        path_of("v1", "events", pod.metadata.namespace),
        query={"fieldSelector": f"involvedObject.uid={pod.metadata.uid}"},
    )["items"]
    return items


def wait_for_event(devcluster: DevCluster, pod: Any, reason: str, timeout: float = 10.0) -> JSON:
    def probe() -> JSON | None:
        return next((e for e in pod_events(devcluster, pod) if e["reason"] == reason), None)

    return eventually(probe, timeout=timeout, what=f"event {reason} on {pod.metadata.name}")


def certificate_volume(
    signer_name: str,
    *,
    name: str = "identity",
    key_type: str = "ECDSAP256",
    split: bool = False,
    trust: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A projected volume: one podCertificate source (a credential bundle, or separate key and
    chain files when `split`), then an optional clusterTrustBundle source writing trust.pem."""
    cert: dict[str, Any] = {"signerName": signer_name, "keyType": key_type}
    if split:
        cert.update(keyPath="tls.key", certificateChainPath="tls.crt")
    else:
        cert["credentialBundlePath"] = "credentialbundle.pem"
    sources: list[dict[str, Any]] = [{"podCertificate": cert}]
    if trust is not None:
        sources.append({"clusterTrustBundle": {**trust, "path": "trust.pem"}})
    return {"name": name, "projected": {"sources": sources}}


def trust_volume(volume: str = "trust", **trust: Any) -> dict[str, Any]:
    """A projected volume holding only a clusterTrustBundle source (file trust.pem)."""
    return {
        "name": volume,
        "projected": {"sources": [{"clusterTrustBundle": {**trust, "path": "trust.pem"}}]},
    }
