"""Issue 16, part 0: the signer in-cluster, for real. podcert's image (built and checked by
test_image's build, cached) is imported into the real node's containerd; `manifests/signer` is
applied as shipped (server-side apply of exactly what `kubectl apply -k` applies; the image
reference is the shipped one, which the node now holds), so the Deployment's 2 replicas run with
their ServiceAccount, RBAC, PDB, probes and the `restricted` Pod Security level. The real kubelet
then projects a pod's credential issued by that in-cluster signer, through its admission webhook
reached at its Service; deleting the leader pod fails over.

The devcluster runs no kube-proxy: `devcluster.incluster` gives the pods the kubernetes Service's
address (a DNAT rule to the API server's loopback port), and the API server calls webhooks at
their endpoints (`--enable-aggregator-routing`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography import x509

from devcluster import imagebuild, images, incluster, kube
from devcluster.testing import DevCluster, Kubelet, eventually
from podcert.rest import ApiError, Rest, path_of
from tests.integration.kubelet_helpers import BUNDLE, KEEP_RUNNING, certificates_in
from tests.integration.test_chart import kustomize
from tests.integration.test_manifests import _PATHS, CLUSTER_SCOPED, MANIFESTS

SIGNER = "podcert.dev/workload"
NAMESPACE = "podcert-system"


def _path(doc: dict[str, Any]) -> str:
    gv, plural = _PATHS[doc["kind"]]
    ns = None if doc["kind"] in CLUSTER_SCOPED else doc["metadata"]["namespace"]
    return path_of(gv, plural, ns, doc["metadata"]["name"])


def server_side_apply(rest: Rest, docs: list[dict[str, Any]]) -> None:
    """What `kubectl apply --server-side -k` sends: one apply patch per object."""
    for doc in docs:
        rest.request(
            "PATCH",
            _path(doc),
            query={"fieldManager": "kubectl", "force": "true"},
            body=doc,
            content_type="application/apply-patch+yaml",
        )


def signer_pods(rest: Rest) -> list[dict[str, Any]]:
    found = rest.request(
        "GET",
        path_of("v1", "pods", NAMESPACE),
        query={"labelSelector": "app.kubernetes.io/name=podcert-signer"},
    )
    return [p for p in found["items"] if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def leader(rest: Rest) -> str | None:
    """The pod holding the signer's Lease (its identity is `<hostname>_<pid>`)."""
    try:
        lease = rest.request(
            "GET", path_of("coordination.k8s.io/v1", "leases", NAMESPACE, "podcert-signer")
        )
    except ApiError:
        return None
    holder = (lease.get("spec") or {}).get("holderIdentity") or ""
    return holder.rsplit("_", 1)[0] or None


@pytest.fixture(scope="module")
def in_cluster(
    devcluster: DevCluster, real_kubelet: Kubelet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rest]:
    imagebuild.build(lambda line: print(line, flush=True), examples=False)
    archive = imagebuild.save(imagebuild.IMAGE, tmp_path_factory.mktemp("image") / "podcert.tar")
    incluster.load_image(real_kubelet.state, archive)
    archive.unlink()
    docs = kustomize(MANIFESTS / "signer")
    rest = Rest(devcluster.admin)
    incluster.schedulable(rest, real_kubelet.name)
    with incluster.api_server_for_pods(devcluster.state):
        server_side_apply(rest, docs)
        try:
            yield rest
        finally:
            for doc in reversed(docs):
                with contextlib.suppress(ApiError):
                    rest.request("DELETE", _path(doc))
            # Later modules use podcert-system too: it must be gone, not terminating.
            eventually(
                lambda: namespace_gone(rest), timeout=120, interval=0.5, what="podcert-system gone"
            )


def namespace_gone(rest: Rest) -> bool:
    try:
        rest.request("GET", path_of("v1", "namespaces", None, NAMESPACE))
    except ApiError as err:
        return err.status == 404
    return False


def two_ready_replicas(rest: Rest) -> list[dict[str, Any]]:
    def probe() -> list[dict[str, Any]] | None:
        found = signer_pods(rest)
        return found if len(found) == 2 and all(ready(p) for p in found) else None

    pods: list[dict[str, Any]] = eventually(
        probe, timeout=180, interval=0.5, what="2 ready signer replicas (readiness: /readyz)"
    )
    return pods


def test_the_shipped_deployment_runs_two_ready_replicas(in_cluster: Rest) -> None:
    pods = two_ready_replicas(in_cluster)
    for pod in pods:
        spec = pod["spec"]
        assert spec["nodeName"] == "node-real"
        assert spec["serviceAccountName"] == "podcert-signer"
        [container] = spec["containers"]
        assert container["image"] == imagebuild.IMAGE
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert spec["securityContext"]["runAsUser"] == 65532
    names = {p["metadata"]["name"] for p in pods}
    assert eventually(lambda: leader(in_cluster) in names, timeout=60, what="a leader")
    # The leader's RBAC at run time: it set its own webhook's caBundle (the in-cluster CA).
    webhook = in_cluster.request(
        "GET",
        path_of(
            "admissionregistration.k8s.io/v1",
            "validatingwebhookconfigurations",
            None,
            "podcert-signer",
        ),
    )
    assert webhook["webhooks"][0]["clientConfig"].get("caBundle")


def credential_pod(devcluster: DevCluster, name: str) -> tuple[str, str]:
    namespace = devcluster.namespace("incluster")
    pod = devcluster.pod(
        namespace,
        name,
        node="node-real",
        image=images.BUSYBOX_IMAGE,
        command=KEEP_RUNNING,
        volumes=[kube.pod_certificate_volume(SIGNER, trust_bundle_signer=True)],
    )
    return namespace, pod.metadata.uid


def issued_to(kubelet: Kubelet, uid: str, namespace: str) -> list[x509.Certificate]:
    chain = eventually(
        lambda: certificates_in(kubelet, uid, BUNDLE) or None,
        timeout=120,
        interval=0.5,
        what="the real kubelet to write the credential the in-cluster signer issued",
    )
    san = chain[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    assert uris == [f"spiffe://cluster.local/ns/{namespace}/sa/default"]
    return chain


def test_the_real_kubelet_projects_a_credential_from_the_in_cluster_signer(
    in_cluster: Rest, devcluster: DevCluster, real_kubelet: Kubelet
) -> None:
    two_ready_replicas(in_cluster)
    namespace, uid = credential_pod(devcluster, "app")
    issued_to(real_kubelet, uid, namespace)


def test_deleting_the_leader_pod_fails_over(
    in_cluster: Rest, devcluster: DevCluster, real_kubelet: Kubelet
) -> None:
    two_ready_replicas(in_cluster)
    first = leader(in_cluster)
    assert first
    in_cluster.request("DELETE", path_of("v1", "pods", NAMESPACE, first))

    def new_leader() -> str | None:
        now = leader(in_cluster)
        return now if now and now != first else None

    second = eventually(new_leader, timeout=90, interval=0.5, what="another replica to lead")
    assert second != first
    namespace, uid = credential_pod(devcluster, "after-failover")
    issued_to(real_kubelet, uid, namespace)
