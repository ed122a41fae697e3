"""The shipped ValidatingAdmissionPolicy warns, on the real API server, about a pod
whose podCertificate key the kubelet would leave readable by others in the pod, and stays quiet
for one whose key stays private. It warns and audits; it never refuses.

Pods are bound to a Node object with no kubelet, so nothing runs them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import kube
from devcluster.testing import DevCluster, eventually
from podcert.client.rest import Rest, path_of
from tests.objects import pod_object

POLICY_FILE = (
    Path(__file__).resolve().parents[2] / "manifests" / "signer" / "key-permissions-policy.yaml"
)
POLICY = "podcert-key-permissions"
NODE = "node-key-permissions"  # a Node object only: no kubelet runs these pods


@pytest.fixture(scope="module")
def policy(devcluster: DevCluster) -> Iterator[None]:
    docs = [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d]
    kube.apply(devcluster.admin, docs)
    kube.ensure_node(devcluster.admin, NODE)
    try:
        yield
    finally:
        kube.delete(devcluster.admin, docs)


@pytest.fixture(scope="module")
def namespace(devcluster: DevCluster, policy: None) -> str:
    ns = devcluster.namespace("keymode")
    kube.ensure_service_account(devcluster.admin, ns, "default")  # the controller's may lag
    # The policy reaches the API server's admission cache within moments: wait for its first
    # warning (on a dry run) before any test counts on it.
    eventually(
        lambda: any(POLICY in w for w in create(devcluster, ns, pod("probe"), dry_run=True)),
        timeout=15,
        what=f"{POLICY} to warn",
    )
    return ns


def pod(
    name: str,
    *,
    default_mode: int | None = None,
    security: dict[str, Any] | None = None,
    containers: list[dict[str, Any]] | None = None,
    source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    projected: dict[str, Any] = {
        "sources": [
            {
                "podCertificate": source
                or {
                    "signerName": "keymode.podcert.dev/test",
                    "keyType": "ECDSAP256",
                    "credentialBundlePath": "credentialbundle.pem",
                }
            }
        ]
    }
    if default_mode is not None:
        projected["defaultMode"] = default_mode
    volumes = [{"name": "identity", "projected": projected}]
    return pod_object(name, volumes, node=NODE, containers=containers, security=security or {})


def create(
    devcluster: DevCluster, namespace: str, body: dict[str, Any], *, dry_run: bool = False
) -> list[str]:
    """POST the pod as the admin and return the API server's Warning headers (it must be
    admitted: the policy only warns)."""
    api = devcluster.admin
    serialized = api.param_serialize(
        method="POST",
        resource_path=f"/api/v1/namespaces/{namespace}/pods",
        query_params=[("dryRun", "All")] if dry_run else [],
        header_params={"Accept": "application/json", "Content-Type": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*serialized)
    data = response.read()
    assert response.status == 201, data[:500]
    if not dry_run:
        assert json.loads(data)["metadata"]["uid"]
    return list(response.getheaders().getlist("Warning"))


def ours(warnings: list[str]) -> list[str]:
    return [w for w in warnings if POLICY in w]


def test_a_pod_with_the_default_0644_key_is_admitted_with_a_warning(
    devcluster: DevCluster, namespace: str
) -> None:
    (warning,) = ours(create(devcluster, namespace, pod("default-mode")))

    assert "podCertificate volume identity (defaultMode 0644) is readable by users" in warning
    assert "set defaultMode: 0600" in warning
    found = Rest(devcluster.admin).request("GET", path_of("v1", "pods", namespace, "default-mode"))
    assert found["spec"]["volumes"][0]["projected"]["defaultMode"] == 0o644  # the kubelet's mode


def test_a_pod_with_default_mode_0600_is_admitted_without_a_warning(
    devcluster: DevCluster, namespace: str
) -> None:
    assert ours(create(devcluster, namespace, pod("private", default_mode=0o600))) == []


APP = {"name": "app", "image": "registry.invalid/app:1"}

SHAPES = [
    pytest.param(
        pod("p", default_mode=0o640),
        "identity (defaultMode 0640) is readable",
        id="0640 warns: the root group reads it",
    ),
    pytest.param(
        pod("p", default_mode=0o604),
        "identity (defaultMode 0604) is readable",
        id="0604 warns: others read it",
    ),
    pytest.param(pod("p", default_mode=0o400), None, id="0400 is private"),
    pytest.param(
        pod("p", security={"runAsUser": 1000}),
        None,
        id="one pod-level runAsUser makes the kubelet write 0600 whatever defaultMode says",
    ),
    pytest.param(
        pod(
            "p",
            containers=[
                {**APP, "securityContext": {"runAsUser": 1000}},
                {**APP, "name": "sidecar", "securityContext": {"runAsUser": 1000}},
            ],
        ),
        None,
        id="the same runAsUser on every container is one user too",
    ),
    pytest.param(
        pod(
            "p",
            security={"runAsUser": 1000},
            containers=[APP, {**APP, "name": "sidecar", "securityContext": {"runAsUser": 2000}}],
        ),
        "identity (defaultMode 0644) is readable",
        id="two users in the pod leave the key at defaultMode",
    ),
    pytest.param(
        pod(
            "p", containers=[{**APP, "securityContext": {"runAsUser": 1000}}, {**APP, "name": "b"}]
        ),
        "identity (defaultMode 0644) is readable",
        id="a container without runAsUser leaves the key at defaultMode",
    ),
    pytest.param(
        pod("p", default_mode=0o600, security={"fsGroup": 2000}),
        "identity is readable by group 2000",
        id="fsGroup warns even with 0600: the kubelet makes the key 0640 for that group",
    ),
    pytest.param(
        pod(
            "p",
            source={
                "signerName": "keymode.podcert.dev/test",
                "keyType": "ECDSAP256",
                "certificateChainPath": "chain.pem",
            },
        ),
        None,
        id="a chain-only source projects no key",
    ),
]


@pytest.mark.parametrize(("body", "warning"), SHAPES)
def test_the_policy_follows_what_the_kubelet_writes(
    devcluster: DevCluster, namespace: str, body: dict[str, Any], warning: str | None
) -> None:
    warnings = ours(create(devcluster, namespace, body, dry_run=True))

    if warning is None:
        assert warnings == []
    else:
        (found,) = warnings
        assert warning in found
