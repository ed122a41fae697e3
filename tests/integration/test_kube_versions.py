"""The devcluster of an older minor (1.35, 1.36) is a whole cluster that serves
pod certificates at certificates.k8s.io/v1beta1 only, and its hollow kubelet, switched on by the
same feature gates, projects podcert's credential. `make controlplane` builds both minors.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client import ApiException

from bundles import formats
from devcluster import build, cluster, kube, nodes, processes
from devcluster.testing import eventually
from podcert.client.rest import Rest

SIGNER = "test.podcert.dev/versions"
POLICY = f"""
signers:
  - name: {SIGNER}
    trustDomain: versions.test
    keyTypes: [ECDSAP256]
    allow:
      - namespaces: ["*"]
        serviceAccounts: ["*"]
"""


def _default_service_account(api: client.ApiClient, namespace: str) -> object | None:
    try:
        return client.CoreV1Api(api).read_namespaced_service_account("default", namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


@pytest.mark.parametrize("version", ["1.35", "1.36"])
def test_an_older_minor_is_a_whole_cluster_serving_pod_certificates_at_v1beta1(
    version: str, tmp_path: Path
) -> None:
    root = tmp_path / "cluster"
    cluster.up(root, kube_version=version)
    try:
        with kube.admin_client(root) as api:
            rest = Rest(api)
            assert rest.request("GET", "/version")["gitVersion"] == build.release(version)
            beta = {
                r["name"]
                for r in rest.request("GET", "/apis/certificates.k8s.io/v1beta1")["resources"]
            }
            assert {
                "podcertificaterequests",
                "podcertificaterequests/status",
                "clustertrustbundles",
            } <= beta
            ga = {
                r["name"] for r in rest.request("GET", "/apis/certificates.k8s.io/v1")["resources"]
            }
            assert "podcertificaterequests" not in ga
            kube.ensure_namespace(api, "apps")
            eventually(
                lambda: _default_service_account(api, "apps"),
                timeout=30,
                what="the controller-manager to make the default ServiceAccount",
            )

            node = nodes.start(root, "hollow", hollow=True)
            found = client.CoreV1Api(api).read_node("hollow")
            assert found.status.node_info.kubelet_version == build.release(version)

            signer = processes.signer(
                root,
                tmp_path,
                [SIGNER],
                namespace="podcert-versions",
                extra=[f"--policy={_policy(tmp_path)}"],
            ).start()
            try:
                signer.wait_ready(60)
                volume = kube.pod_certificate_volume(SIGNER, trust_bundle_signer=True)
                pod = kube.create_pod(api, "apps", "app", node="hollow", volumes=[volume])
                folder = (
                    node.root
                    / "pods"
                    / pod.metadata.uid
                    / "volumes"
                    / "kubernetes.io~projected"
                    / "identity"
                )
                started = time.monotonic()
                bundle = eventually(
                    lambda: _read(folder / "credentialbundle.pem"),
                    timeout=60,
                    what="the credential",
                )
                credential = formats.load_credential(bundle)
                roots = formats.load_trust_bundle(_read(folder / "trust-bundle.pem") or b"")
                formats.verify_chain(credential, roots, dt.datetime.now(dt.UTC))
                assert str(credential.spiffe_id) == "spiffe://versions.test/ns/apps/sa/default"
                print(
                    f"{version}: credential on disk {time.monotonic() - started:.2f}s after the pod"
                )
            finally:
                signer.stop()
    finally:
        cluster.down(root)


def _policy(folder: Path) -> Path:
    path = folder / "policy.yaml"
    path.write_text(POLICY)
    return path


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes() or None
    except OSError:
        return None
