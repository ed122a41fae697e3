"""One trust domain across two clusters: an operator's offline root vouches for both.

Two devclusters (two API servers, each with its etcd), each with its own podcert signer and its
own intermediate, both intermediates signed by one root the operator keeps offline (made here
with `cryptography`, as any CA would sign: the CSR `podcert signer ca prepare --upstream
offline` writes, back as the chain `ca import` takes). Both signers serve trust domain
`shared.test`, so each cluster publishes the operator's root alone as its trust bundle.

A pod on a shim node in cluster A and a pod on a shim node in cluster B each run the example
server and the example client (bundles' TLS through aiohttp): A calls B and B calls A with
mutual TLS, each verifying the other against its own cluster's trust bundle (the shared root)
and authorizing the other's SPIFFE ID. Then A's CA rotates on its own (prepare, the root signs
the new CSR, import, activate, the pod re-keyed, retire) and B's after it, while both clients
keep calling: the clients' counters must show 0 failed calls, and `podcert audit` is clean in
both clusters. B's new intermediate is signed for 3 days only, so B's signer must say that its
successor is due (`ca status`, `podcert status`, the gauge, an Event on the CA Secret) while A,
30 days from its end, says nothing. docs/two-clusters.md is the operator's version of this.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes import client

from devcluster import kube, processes
from devcluster.identities import Paths
from devcluster.testing import DevCluster, eventually, running
from tests.integration.conftest import StartShim, StartSigner
from tests.integration.interop_helpers import (
    Files,
    last_json,
    python_client,
    python_client_flags,
    python_server,
)

SIGNER = "twoclusters.podcert.dev/workload"
TRUST_DOMAIN = "shared.test"
NAMESPACE = "podcert-twoclusters"
TIMEOUT = 120  # shared cores: two control planes, two signers, two shims


# --- the operator's offline root ---------------------------------------------------------


@dataclass(frozen=True)
class OfflineRoot:
    """The operator's CA: a self-signed root that signs each cluster's intermediate CSR."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def make(cls) -> OfflineRoot:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Corp Offline Root")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=1), critical=True)
            .add_extension(_ca_usage(), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    def sign(self, csr_pem: bytes, days: int = 30) -> bytes:
        """The chain `ca import` takes: the signed intermediate, then this root. The CSR's
        requested extensions are copied, as `openssl x509 -req -copy_extensions copy` would."""
        csr = x509.load_pem_x509_csr(csr_pem)
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(csr.subject)
            .issuer_name(self.cert.subject)
            .public_key(csr.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
        )
        for ext in csr.extensions:
            builder = builder.add_extension(ext.value, critical=ext.critical)
        cert = builder.sign(self.key, hashes.SHA256())
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in (cert, self.cert))

    @property
    def der(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.DER)


def _ca_usage() -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=False,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )


# --- one cluster's side --------------------------------------------------------------------


def podcert(cluster: DevCluster, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """`python -m podcert ARGS` as the cluster's admin (the kubeconfig flag follows the verb)."""
    kubeconfig = f"--kubeconfig={Paths(cluster.root.resolve()).admin_kubeconfig}"
    done = subprocess.run(
        [sys.executable, "-m", "podcert", *args, kubeconfig],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=processes.REPO,
    )
    if ok:
        assert done.returncode == 0, f"podcert {' '.join(args[:3])}: {done.stderr[-2000:]}"
    return done


def ca(cluster: DevCluster, action: str, *more: str) -> str:
    return podcert(cluster, "signer", "ca", action, f"--namespace={NAMESPACE}", *more).stdout


def import_from(cluster: DevCluster, root: OfflineRoot, work: Path, days: int = 30) -> str:
    """The operator's round: prepare in the cluster, sign the CSR with the root (for `days`),
    import it. Returns the new generation's id (prepared: published, not signing yet)."""
    csr = work / "podcert.csr"
    said = ca(
        cluster,
        "prepare",
        "--upstream=offline",
        f"--trust-domain={TRUST_DOMAIN}",
        f"--csr-out={csr}",
    )
    gen = said.split()[0]
    chain = work / f"{gen}.chain.pem"
    chain.write_bytes(root.sign(csr.read_bytes(), days))
    ca(cluster, "import", f"--id={gen}", f"--chain={chain}")
    return gen


def policy(work: Path) -> Path:
    path = work / "policy.yaml"
    path.write_text(
        f"signers:\n  - name: {SIGNER}\n    trustDomain: {TRUST_DOMAIN}\n"
        '    allow:\n      - namespaces: ["tc-*"]\n'
    )
    return path


@dataclass
class Side:
    """One cluster: its signer, its shim node, and one pod there holding a podcert identity."""

    name: str
    cluster: DevCluster
    work: Path
    signer: processes.Signer
    shim: processes.Shim
    namespace: str = ""
    pod: str = ""
    files: Files | None = None

    @property
    def spiffe_id(self) -> str:
        return f"spiffe://{TRUST_DOMAIN}/ns/{self.namespace}/sa/{self.pod}"

    @property
    def identity(self) -> Files:
        assert self.files is not None
        return self.files

    def start_pod(self) -> None:
        self.namespace = self.cluster.namespace("tc")
        self.pod = f"app-{self.name}"
        volume = kube.pod_certificate_volume(SIGNER, trust_bundle_signer=True)
        made = self.cluster.pod(
            self.namespace, self.pod, node=self.shim_node, service_account=self.pod,
            volumes=[volume],
        )  # fmt: skip
        self.files = Files(self.shim.volume_dir(made.metadata.uid))

    @property
    def shim_node(self) -> str:
        return f"tc-node-{self.name}"

    def issuer(self) -> x509.Certificate | None:
        """The intermediate that signed the pod's current leaf (None before it has one)."""
        try:
            chain = x509.load_pem_x509_certificates(self.identity.credential.read_bytes())
        except (OSError, ValueError):
            return None
        return chain[1] if len(chain) > 1 else None

    def trust(self) -> set[bytes]:
        try:
            roots = x509.load_pem_x509_certificates(self.identity.trust.read_bytes())
        except (OSError, ValueError):
            return set()
        return {r.public_bytes(serialization.Encoding.DER) for r in roots}

    def active_intermediate(self) -> x509.Certificate:
        secret = kube_secret(self.cluster)
        return x509.load_pem_x509_certificates(secret["tls.crt"])[0]

    def rekey(self) -> None:
        podcert(
            self.cluster, "shim", "rotate", f"--namespace={self.namespace}", f"--pod={self.pod}"
        )

    def audit(self) -> dict[str, Any]:
        done = podcert(
            self.cluster, "audit", f"--root={self.shim.root}",
            f"--audit-log={self.work / 'audit.jsonl'}", f"--namespace={self.namespace}",
            "--signer-name", SIGNER, "-o", "json", ok=False,
        )  # fmt: skip
        report: dict[str, Any] = json.loads(done.stdout)
        report["exit"] = done.returncode
        return report


def kube_secret(cluster: DevCluster) -> dict[str, bytes]:
    secret = client.CoreV1Api(cluster.admin).read_namespaced_secret("podcert-ca", NAMESPACE)
    return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}


@pytest.fixture(scope="module")
def root() -> OfflineRoot:
    return OfflineRoot.make()


@pytest.fixture(scope="module")
def cluster_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """The second cluster: a control plane of its own beside the session's."""
    with running(tmp_path_factory.mktemp("cluster-b")) as handle:
        yield handle


def start_side(
    name: str,
    cluster: DevCluster,
    start_signer: StartSigner,
    start_shim: StartShim,
    work: Path,
    root: OfflineRoot,
) -> Side:
    """A signer with the operator's intermediate active and its own first root retired, then
    a shim node and a pod whose first leaf comes from that intermediate."""
    signer = start_signer(
        SIGNER,
        namespace=NAMESPACE,
        cluster=cluster,
        workdir=work,
        policy=policy(work),
        audit_log=work / "audit.jsonl",
        audit_checkpoint_every=1,
    )
    gen = import_from(cluster, root, work)
    ca(cluster, "activate", f"--id={gen}")
    ca(cluster, "retire", "--force")  # podcert's own first root leaves the bundles
    shim = start_shim(f"tc-node-{name}", cluster=cluster, workdir=work)
    side = Side(name, cluster, work, signer, shim)
    side.start_pod()
    eventually(
        lambda: side.trust() == {root.der} and side.issuer() is not None,
        timeout=TIMEOUT,
        what=f"cluster {name}'s pod holding the operator's root alone and a leaf",
    )
    return side


@pytest.fixture(scope="module")
def sides(
    devcluster: DevCluster,
    cluster_b: DevCluster,
    start_signer: StartSigner,
    start_shim: StartShim,
    root: OfflineRoot,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Side, Side]:
    a = start_side("a", devcluster, start_signer, start_shim, tmp_path_factory.mktemp("a"), root)
    b = start_side("b", cluster_b, start_signer, start_shim, tmp_path_factory.mktemp("b"), root)
    return a, b


@dataclass
class Caller:
    """One direction's example client, running until stopped; its summary at the end."""

    proc: processes.Process

    def stop(self) -> dict[str, Any]:
        self.proc.stop()
        summary = last_json(self.proc.output())
        assert summary is not None, self.proc.output()[-2000:]
        return summary


def caller(side: Side, url: str, server_id: str, log: Path) -> Caller:
    args = python_client_flags(
        side.identity, url, server_id, rate=10, reload_interval=0.5, duration=3600
    )
    return Caller(processes.Process(args=args, log=log, module="examples.mtls.client").start())


def rotate_alone(side: Side, other: Side, root: OfflineRoot, days: int = 30) -> str:
    """One cluster's CA rotation under the same root, the other cluster left alone; the new
    generation's id."""
    other_issuer = other.active_intermediate()
    before = side.active_intermediate()
    gen = import_from(side.cluster, root, side.work / "rotation", days)
    assert side.trust() == {root.der}  # the same root: nothing new for any pod to learn
    ca(side.cluster, "activate", f"--id={gen}")
    new = side.active_intermediate()
    assert new != before
    side.rekey()
    eventually(lambda: side.issuer() == new, timeout=TIMEOUT, what=f"{side.name}'s leaf from {gen}")
    ca(side.cluster, "retire", "--force")
    assert other.active_intermediate() == other_issuer  # the other cluster did not move
    return gen


def successor_gauge(side: Side) -> float | None:
    with urllib.request.urlopen(
        f"http://127.0.0.1:{side.signer.metrics_port}/metrics", timeout=5
    ) as answer:
        text = answer.read().decode()
    for line in text.splitlines():
        if line.startswith("podcert_signer_ca_upstream_successor_due "):
            return float(line.split()[1])
    return None


def successor_events(side: Side) -> list[str]:
    events = client.CoreV1Api(side.cluster.admin).list_namespaced_event(
        NAMESPACE, field_selector="reason=UpstreamCASuccessorDue"
    )
    return [
        str(e.message)
        for e in events.items
        if e.involved_object.kind == "Secret" and e.involved_object.name == "podcert-ca"
    ]


def test_pods_in_two_clusters_call_each_other_through_each_clusters_own_rotation(
    sides: tuple[Side, Side], root: OfflineRoot, tmp_path: Path
) -> None:
    a, b = sides
    # Two intermediates, one root: neither cluster holds the other's intermediate.
    assert a.active_intermediate() != b.active_intermediate()
    for side in sides:
        side.active_intermediate().verify_directly_issued_by(root.cert)
        (side.work / "rotation").mkdir()
    with (
        python_server(a.identity, tmp_path / "server-a.log", allow_id=b.spiffe_id) as url_a,
        python_server(b.identity, tmp_path / "server-b.log", allow_id=a.spiffe_id) as url_b,
    ):
        # Once each way first: both directions work before anything rotates.
        for side, url, other in ((a, url_b, b), (b, url_a, a)):
            once = python_client(side.identity, url, other.spiffe_id)
            assert once["failed"] == 0 and once["ok"] > 0, (side.name, once)
        a_to_b = caller(a, url_b, b.spiffe_id, tmp_path / "client-a.log")
        b_to_a = caller(b, url_a, a.spiffe_id, tmp_path / "client-b.log")
        try:
            first = {s.name: s.issuer() for s in sides}
            rotate_alone(a, b, root)
            # B's new intermediate lasts 3 days: within the 7 days in which only the operator
            # can bring its successor, which every face of the signer must now say.
            short = rotate_alone(b, a, root, days=3)
            assert all(s.issuer() != first[s.name] for s in sides)
            assert all(s.trust() == {root.der} for s in sides)
        finally:
            summaries = {"a->b": a_to_b.stop(), "b->a": b_to_a.stop()}
    print(json.dumps(summaries))  # the pair's counters, for the report
    for direction, summary in summaries.items():
        assert summary["failed"] == 0, (direction, summary["errors"])
        assert summary["ok"] > 0, (direction, summary)
        # Each client met the other side's leaf from before and after its cluster's rotation.
        assert len(summary["server_serials"]) >= 2, (direction, summary)
    warned = f"imported intermediate {short} ends in 2d 23h"
    assert f"URGENT: {warned}" in ca(b.cluster, "status")
    shown = podcert(b.cluster, "status", f"--namespace={NAMESPACE}", "-o", "json").stdout
    assert json.loads(shown)["ca"]["nextStep"].startswith(warned)
    assert eventually(lambda: successor_gauge(b) == 1.0, timeout=60, what="B's gauge at 1")
    [event] = eventually(lambda: successor_events(b), timeout=60, what="B's Event")
    assert event.startswith(warned) and "prepare and import its successor" in event
    # A's 30-day intermediate is far from its end: nothing said there.
    assert successor_gauge(a) == 0.0 and successor_events(a) == []
    assert "imported intermediate" not in ca(a.cluster, "status")
    for side in sides:
        report = side.audit()
        assert report["exit"] == 0, (side.name, json.dumps(report.get("findings"))[:3000])
