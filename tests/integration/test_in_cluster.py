"""The signer in-cluster, for real, and the example pair beside it. podcert's
image and the examples' image (built and checked by test_image's build, cached) are imported into
the real node's containerd; `manifests/examples/mtls` is applied as shipped (server-side apply of
exactly what `kubectl apply -k` applies: the signer's base and the pair; the image references
are the shipped ones, which the node now holds), so the signer's 2 replicas run with their
ServiceAccount, RBAC, PDB, probes and the `restricted` Pod Security level, and the pair's pods
get their credentials from the real kubelet, issued by that in-cluster signer through its
admission webhook. The client (`web`) calls the server (`api`) by its Service's name,
`https://api.shop.svc:8443/`, 50 times a second over the pod network; deleting the leader pod
fails over without one failed request; `podcert audit` is clean afterwards.

The node runs with Services (`devcluster.network`): kube-proxy in iptables mode and CoreDNS
beside the kubelet, the pods' nameserver. The `kubernetes` Service (the API server on loopback)
is still a DNAT of `devcluster.incluster`'s; the API server calls webhooks at their endpoints
(`--enable-aggregator-routing`), though from the host their cluster IPs now answer too.

The signer's audit log is an emptyDir in each replica, gone with its pod: the test follows each
replica's file on the node as a node log agent does, and audits what it shipped."""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from cryptography import x509
from kubernetes import client

from devcluster import imagebuild, images, incluster, kube, nodes
from devcluster.identities import Paths
from devcluster.testing import DevCluster, Kubelet, eventually, running
from podcert.client.rest import ApiError, Rest, path_of
from tests.integration.kubelet_helpers import BUNDLE, KEEP_RUNNING, certificates_in
from tests.integration.test_chart import kustomize
from tests.integration.test_manifests import _PATHS, CLUSTER_SCOPED, MANIFESTS

# Each test's setup may build and import both images and start the node with its Services.
pytestmark = pytest.mark.timeout(600)

SIGNER = "podcert.dev/workload"
NAMESPACE = "podcert-system"
SHOP = "shop"
NODE = "node-real"
# Where a replica's audit log (its `audit` emptyDir) lies on the node, under its pod's folder.
AUDIT_LOG = Path("volumes/kubernetes.io~empty-dir/audit/audit.jsonl")
# The pair's files, in the SPIFFE Filesystem Delivery layout (manifests/examples/mtls/pair.yaml).
PAIR_BUNDLE, PAIR_TRUST = "credential-bundle.pem", "cluster.local.trust-bundle.pem"


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
def devcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A control plane of this module's own, fresh as an operator's cluster would be: the
    session's carries earlier modules' leftovers (pods bound to nodes whose kubelets are gone,
    Services and pods named as the example pair's in `shop`), which a Deployment's pods could be
    scheduled beside or mistaken for."""
    with running(tmp_path_factory.mktemp("devcluster-incluster")) as handle:
        yield handle


@pytest.fixture(scope="module")
def real_kubelet(devcluster: DevCluster) -> Iterator[Kubelet]:
    """The real node with Services: kube-proxy and the cluster DNS beside its kubelet (this
    module's own, in place of conftest's plain one)."""
    reason = nodes.real_node_unavailable()
    if reason:
        pytest.fail(f"cannot run a real node on this machine: {reason}")
    state = nodes.start(
        devcluster.root, NODE, services=True, progress=lambda line: print(line, flush=True)
    )
    kubelet = Kubelet(devcluster.root, state)
    try:
        yield kubelet
    finally:
        kubelet.stop()


@pytest.fixture(scope="module")
def in_cluster(
    devcluster: DevCluster, real_kubelet: Kubelet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rest]:
    imagebuild.build(lambda line: print(line, flush=True), examples=True)
    folder = tmp_path_factory.mktemp("image")
    for image, name in ((imagebuild.IMAGE, "podcert"), (imagebuild.EXAMPLES_IMAGE, "examples")):
        archive = imagebuild.save(image, folder / f"{name}.tar")
        incluster.load_image(real_kubelet.state, archive)
        archive.unlink()
    docs = kustomize(MANIFESTS / "examples" / "mtls")  # the signer's base, then the pair
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
            for namespace in (SHOP, NAMESPACE):
                eventually(
                    functools.partial(namespace_gone, rest, namespace),
                    timeout=120,
                    interval=0.5,
                    what=f"{namespace} gone",
                )


def namespace_gone(rest: Rest, namespace: str = NAMESPACE) -> bool:
    try:
        rest.request("GET", path_of("v1", "namespaces", None, namespace))
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


class AuditLogShipper:
    """What a node log agent does with the signer's audit log: open each replica's file on the
    node while its pod runs and read it to its end, which an open file keeps readable after the
    kubelet removes the pod's emptyDir (so a deleted leader's last checkpoint, written as it
    stops, is shipped too)."""

    def __init__(self, kubelet: Kubelet, folder: Path) -> None:
        self.kubelet, self.folder = kubelet, folder
        self.files: dict[str, IO[bytes]] = {}

    def follow(self, pods: list[dict[str, Any]]) -> None:
        for pod in pods:
            name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
            if name not in self.files:
                self.files[name] = (self.kubelet.root / "pods" / uid / AUDIT_LOG).open("rb")

    def ship(self) -> list[Path]:
        """Each followed replica's log as read so far, one file each."""
        shipped = []
        for name, source in self.files.items():
            copy = self.folder / f"{name}.jsonl"
            with copy.open("ab") as out:
                out.write(source.read())
            shipped.append(copy)
        return shipped

    def close(self) -> None:
        for source in self.files.values():
            source.close()


@pytest.fixture(scope="module")
def audit_logs(
    real_kubelet: Kubelet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AuditLogShipper]:
    shipper = AuditLogShipper(real_kubelet, tmp_path_factory.mktemp("audit-logs"))
    try:
        yield shipper
    finally:
        shipper.close()


def test_the_shipped_deployment_runs_two_ready_replicas(in_cluster: Rest) -> None:
    pods = two_ready_replicas(in_cluster)
    for pod in pods:
        spec = pod["spec"]
        assert spec["nodeName"] == NODE
        assert spec["serviceAccountName"] == "podcert-signer"
        [container] = spec["containers"]
        assert container["image"] == imagebuild.IMAGE
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert spec["securityContext"]["runAsUser"] == 65532
    names = {p["metadata"]["name"] for p in pods}
    assert eventually(lambda: leader(in_cluster) in names, timeout=60, what="a leader")
    # The leader's RBAC at run time: it set its own webhook's caBundle (the in-cluster CA).
    assert webhook_ca(in_cluster)


def webhook_ca(rest: Rest) -> bytes:
    webhook = rest.request(
        "GET",
        path_of(
            "admissionregistration.k8s.io/v1",
            "validatingwebhookconfigurations",
            None,
            "podcert-signer",
        ),
    )
    return base64.b64decode(webhook["webhooks"][0]["clientConfig"].get("caBundle") or "")


def credential_pod(devcluster: DevCluster, name: str) -> tuple[str, str]:
    namespace = devcluster.namespace("incluster")
    volume = kube.pod_certificate_volume(SIGNER, trust_bundle_signer=True)
    volume["projected"]["defaultMode"] = 0o600  # busybox runs as root: the key is root's alone
    pod = devcluster.pod(
        namespace,
        name,
        node=NODE,
        image=images.BUSYBOX_IMAGE,
        command=KEEP_RUNNING,
        volumes=[volume],
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


# --- the example pair -----------------------------------------------------------------------------


def pair_pod(rest: Rest, app: str) -> dict[str, Any] | None:
    """The one pod of the pair's Deployment `app`, once its container runs (the kubelet starts
    it only after projecting its credential), None until then."""
    found = rest.request("GET", path_of("v1", "pods", SHOP), query={"labelSelector": f"app={app}"})
    pods = [p for p in found["items"] if not p["metadata"].get("deletionTimestamp")]
    statuses = [s for p in pods for s in (p.get("status") or {}).get("containerStatuses") or []]
    if len(pods) != 1 or not statuses or not all("running" in s["state"] for s in statuses):
        return None
    pod: dict[str, Any] = pods[0]
    return pod


def pod_log(devcluster: DevCluster, pod: dict[str, Any]) -> str:
    """pods/log, as `kubectl logs` reads it."""
    text: str = client.CoreV1Api(devcluster.admin).read_namespaced_pod_log(
        pod["metadata"]["name"], SHOP
    )
    return text


def stop_client(devcluster: DevCluster, pod: dict[str, Any]) -> dict[str, Any]:
    """Delete the client's pod while following its log (`kubectl logs -f`): on SIGTERM it
    finishes what is in flight and prints its counts, the log's last line. Its Deployment
    starts another, whose counts begin at zero."""
    core = client.CoreV1Api(devcluster.admin)
    name = pod["metadata"]["name"]
    stream: Any = core.read_namespaced_pod_log(
        name, SHOP, follow=True, _preload_content=False, _request_timeout=120
    )
    try:
        core.delete_namespaced_pod(name, SHOP)
        lines = stream.read().decode().splitlines()
    finally:
        stream.release_conn()
    print(f"client {name}:", *lines[-5:], sep="\n  ", flush=True)
    counts: dict[str, Any] = json.loads(lines[-1])
    return counts


def serial_of(kubelet: Kubelet, uid: str) -> str:
    """The serial of the pod's certificate, as the example pair logs it (lowercase hex)."""
    return format(certificates_in(kubelet, uid, PAIR_BUNDLE)[0].serial_number, "x")


@pytest.fixture(scope="module")
def mtls_pair(in_cluster: Rest, devcluster: DevCluster, real_kubelet: Kubelet) -> dict[str, Any]:
    """The pair up and talking: both pods running, the server's log naming a request from web.
    The first client started with the pair and counted whatever failed before the server
    listened and its Service had an endpoint: it is stopped here (its counts are returned), and
    the client its Deployment starts next counts from a pair already up."""
    api = eventually(
        lambda: pair_pod(in_cluster, "api"), timeout=240, interval=0.5, what="the api pod running"
    )
    web = eventually(
        lambda: pair_pod(in_cluster, "web"), timeout=120, interval=0.5, what="the web pod running"
    )
    caller = f"first request from spiffe://cluster.local/ns/{SHOP}/sa/web"
    eventually(
        lambda: caller in pod_log(devcluster, api),
        timeout=60,
        interval=0.5,
        what="a request from web in the server's log",
    )
    first = stop_client(devcluster, web)

    def next_client() -> dict[str, Any] | None:
        pod = pair_pod(in_cluster, "web")
        return pod if pod and pod["metadata"]["uid"] != web["metadata"]["uid"] else None

    second = eventually(next_client, timeout=120, interval=0.5, what="the next web pod running")
    # It talks: the server logs its first request, under its own certificate's serial.
    uid = second["metadata"]["uid"]
    eventually(
        lambda: f"serial {serial_of(real_kubelet, uid)}" in pod_log(devcluster, api),
        timeout=60,
        interval=0.5,
        what="the next client's first request in the server's log",
    )
    return {"api": api, "web": second, "first": first, "talking_since": time.monotonic()}


def test_the_example_pair_talks_mutual_tls_through_the_service_name(
    mtls_pair: dict[str, Any], in_cluster: Rest, devcluster: DevCluster, real_kubelet: Kubelet
) -> None:
    # Credentials the real kubelet projected, from the in-cluster signer (in each pod's trust
    # bundle, which the kubelet took from that signer's ClusterTrustBundle).
    for app in ("api", "web"):
        uid = mtls_pair[app]["metadata"]["uid"]
        chain = certificates_in(real_kubelet, uid, PAIR_BUNDLE)
        roots = certificates_in(real_kubelet, uid, PAIR_TRUST)
        assert chain[-1].issuer in {r.subject for r in roots}, app
        san = chain[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
            f"spiffe://cluster.local/ns/{SHOP}/sa/{app}"
        ]
        if app == "api":  # the Service's name, asked for in the pod's userAnnotations
            assert "api.shop.svc" in san.get_values_for_type(x509.DNSName)
    # The first client's requests went through the Service's name, over the pod network (its
    # failures: connections refused before the server listened).
    first = mtls_pair["first"]
    assert first["ok"] > 0, first
    assert first["server_serials"] == [serial_of(real_kubelet, mtls_pair["api"]["metadata"]["uid"])]


def test_the_host_reaches_the_webhook_at_its_cluster_ip(in_cluster: Rest) -> None:
    """What the API server would do without `--enable-aggregator-routing`: a TLS handshake with
    the webhook at its Service's cluster IP, from the host, through kube-proxy's rules."""
    two_ready_replicas(in_cluster)
    service = in_cluster.request("GET", path_of("v1", "services", NAMESPACE, "podcert-signer"))
    context = ssl.create_default_context(cadata=webhook_ca(in_cluster).decode())
    with (
        socket.create_connection((service["spec"]["clusterIP"], 443), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="podcert-signer.podcert-system.svc") as tls,
    ):
        assert tls.version()


def test_deleting_the_leader_pod_fails_over_while_the_pair_talks(
    in_cluster: Rest,
    devcluster: DevCluster,
    real_kubelet: Kubelet,
    mtls_pair: dict[str, Any],
    audit_logs: AuditLogShipper,
) -> None:
    audit_logs.follow(two_ready_replicas(in_cluster))
    first = leader(in_cluster)
    assert first
    deleted = time.monotonic()
    in_cluster.request("DELETE", path_of("v1", "pods", NAMESPACE, first))

    def new_leader() -> str | None:
        now = leader(in_cluster)
        return now if now and now != first else None

    second = eventually(new_leader, timeout=90, interval=0.5, what="another replica to lead")
    assert second != first
    namespace, uid = credential_pod(devcluster, "after-failover")
    issued_to(real_kubelet, uid, namespace)
    two_ready_replicas(in_cluster)  # the Deployment's replacement too
    failover = time.monotonic() - deleted
    # The client talked all along, on its schedule of 50 a second, and not one request failed.
    counts = stop_client(devcluster, mtls_pair["web"])
    talked = time.monotonic() - mtls_pair["talking_since"]
    print(f"failover {failover:.1f} s; the client talked {talked:.1f} s: {counts}", flush=True)
    assert counts["failed"] == 0, counts
    assert counts["ok"] >= 10 * talked, counts


def test_podcert_audit_is_clean_afterwards(
    in_cluster: Rest, devcluster: DevCluster, real_kubelet: Kubelet, audit_logs: AuditLogShipper
) -> None:
    """`podcert audit` of the node's projections, the cluster's requests and trust bundles, and
    every replica's audit log (the deleted leader's too): exit 0, no finding."""
    audit_logs.follow(two_ready_replicas(in_cluster))
    shipped = audit_logs.ship()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "podcert",
            "audit",
            f"--kubeconfig={Paths(devcluster.root.resolve()).admin_kubeconfig}",
            f"--root={real_kubelet.root}",
            *(f"--audit-log={path}" for path in shipped),
            f"--node={NODE}",  # the session's cluster holds other modules' pods too
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    report = json.loads(done.stdout)
    print(json.dumps(report["inputs"], indent=1), flush=True)
    assert done.returncode == 0, (report["findings"], done.stderr)
    assert report["findings"] == []
    assert len(report["auditLogs"]) == len(shipped) >= 3
    assert all(log["anchored"] for log in report["auditLogs"]), report["auditLogs"]
