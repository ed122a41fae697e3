"""Trust bundles, CA rotation under live mTLS, leader failover."""

from __future__ import annotations

import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from bundles.formats import Credential, TrustBundle, load_trust_bundle
from bundles.source import build_contexts
from devcluster import processes
from devcluster.identities import Paths
from devcluster.testing import DevCluster, eventually
from podcert.client.rest import JSON, Rest, path_of
from signer.authority import trustbundles
from tests.integration.conftest import StartSigner
from tests.integration.helpers import condition, make_pod, request_as_node, settled

CTBS = "certificates.k8s.io/v1"


def bundles_for(devcluster: DevCluster, signer: str) -> list[JSON]:
    listing = Rest(devcluster.admin).request(
        "GET",
        path_of(CTBS, "clustertrustbundles"),
        query={"fieldSelector": f"spec.signerName={signer}"},
    )
    items: list[JSON] = listing["items"]
    return items


def published_roots(devcluster: DevCluster, signer: str) -> TrustBundle | None:
    items = bundles_for(devcluster, signer)
    if not items:
        return None
    return load_trust_bundle("".join(i["spec"]["trustBundle"] for i in items).encode())


def ca_command(devcluster: DevCluster, namespace: str, *args: str) -> str:
    kubeconfig = Paths(devcluster.root.resolve()).admin_kubeconfig
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "podcert",
            "signer",
            f"--kubeconfig={kubeconfig}",
            f"--namespace={namespace}",
            "ca",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def rotating(start_signer: StartSigner) -> Any:
    return start_signer("rot.podcert.dev/main", namespace="podcert-rot")


def test_the_signer_publishes_its_roots_and_repairs_a_deleted_bundle(
    devcluster: DevCluster, rotating: Any
) -> None:
    signer = "rot.podcert.dev/main"
    roots = eventually(lambda: published_roots(devcluster, signer), what="a published bundle")
    assert len(roots.roots) == 1
    # A live bundle (keeping the label selectors before the standard use) and a preview twin.
    bundle, preview = sorted(bundles_for(devcluster, signer), key=lambda b: b["metadata"]["name"])
    assert bundle["metadata"]["name"] == "rot.podcert.dev:main:roots"
    assert bundle["metadata"]["labels"][trustbundles.TRUST_DOMAIN_LABEL] == "cluster.local"
    assert bundle["metadata"]["labels"]["k8s.spiffe.io/canarying"] == "live"
    assert preview["metadata"]["name"] == "rot.podcert.dev:main:roots-preview"
    assert preview["metadata"]["labels"]["k8s.spiffe.io/canarying"] == "preview"
    assert preview["spec"]["trustBundle"] == bundle["spec"]["trustBundle"]

    def live() -> JSON | None:
        return next(
            (
                b
                for b in bundles_for(devcluster, signer)
                if b["metadata"]["name"].endswith(":roots")
            ),
            None,
        )

    Rest(devcluster.admin).request(
        "DELETE", path_of(CTBS, "clustertrustbundles", None, bundle["metadata"]["name"])
    )
    started = time.monotonic()
    back = eventually(live, timeout=5.0, what="the bundle back")
    assert time.monotonic() - started < 5.0
    assert back["spec"]["trustBundle"] == bundle["spec"]["trustBundle"]
    # ... and nothing is rewritten when nothing changed.
    version = back["metadata"]["resourceVersion"]
    _, pcr = request_as_node(
        devcluster, make_pod(devcluster, devcluster.namespace("rot"), "p", signer), signer
    )
    settled(devcluster, pcr)
    assert (live() or {})["metadata"]["resourceVersion"] == version


@dataclass
class Peer:
    """One side of the mTLS pair: its current credential, trust read from the cluster."""

    credential: Credential
    trust: TrustBundle
    lock: threading.Lock = field(default_factory=threading.Lock)

    def contexts(self) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        with self.lock:
            return build_contexts(self.credential, self.trust)

    def update(
        self, credential: Credential | None = None, trust: TrustBundle | None = None
    ) -> None:
        with self.lock:
            self.credential = credential or self.credential
            self.trust = trust or self.trust


def handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> None:
    """A full mutual TLS handshake in memory (no sockets), both sides verifying."""
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    cli = client.wrap_bio(c_in, c_out, server_side=False)
    done = {"s": False, "c": False}
    for _ in range(20):
        for name, side, out, peer_in in (("c", cli, c_out, s_in), ("s", srv, s_out, c_in)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
            data = out.read()
            if data:
                peer_in.write(data)
        if all(done.values()):
            assert srv.getpeercert(binary_form=True) and cli.getpeercert(binary_form=True)
            return
    raise AssertionError("handshake did not complete")


def credential(devcluster: DevCluster, pod: Any, signer: str) -> Credential:
    key, pcr = request_as_node(devcluster, pod, signer)
    done = settled(devcluster, pcr)
    assert condition(done).type == "Issued"
    chain = tuple(x509.load_pem_x509_certificates(done["status"]["certificateChain"].encode()))
    return Credential(key=key, chain=chain)


def test_full_ca_rotation_with_zero_failed_handshakes(
    devcluster: DevCluster, rotating: Any
) -> None:
    signer, ns = "rot.podcert.dev/main", devcluster.namespace("rot")
    server_pod = make_pod(devcluster, ns, "server", signer, service_account="server")
    client_pod = make_pod(devcluster, ns, "client", signer, service_account="client")
    trust = eventually(lambda: published_roots(devcluster, signer))
    server = Peer(credential(devcluster, server_pod, signer), trust)
    client = Peer(credential(devcluster, client_pod, signer), trust)

    stop, counts, errors = threading.Event(), {"ok": 0}, []

    def traffic() -> None:
        while not stop.is_set():
            try:
                handshake(server.contexts()[0], client.contexts()[1])
                counts["ok"] += 1
            except Exception as err:  # every failure is the finding
                errors.append(repr(err))

    worker = threading.Thread(target=traffic)
    worker.start()
    try:
        # prepare: the new root is published next to the old; pods learn it.
        ca_command(devcluster, "podcert-rot", "prepare")
        both = eventually(
            lambda: (b := published_roots(devcluster, signer)) and len(b.roots) == 2 and b,
            what="two roots published",
        )
        server.update(trust=both)
        client.update(trust=both)
        # activate: new leaves chain to the new root; the old one is still trusted.
        ca_command(devcluster, "podcert-rot", "activate")
        status = ca_command(devcluster, "podcert-rot", "status")
        assert "retired" in status and "active" in status

        old_issuer = server.credential.chain[1].public_key()

        def rotated(pod: Any) -> Credential | None:
            fresh = credential(devcluster, pod, signer)
            return fresh if fresh.chain[1].public_key() != old_issuer else None

        server.update(credential=eventually(lambda: rotated(server_pod), what="new server leaf"))
        client.update(credential=eventually(lambda: rotated(client_pod), what="new client leaf"))
        # retire: every leaf has been re-issued, so the old root leaves the trust bundle.
        ca_command(devcluster, "podcert-rot", "retire", "--force")
        only_new = eventually(
            lambda: (b := published_roots(devcluster, signer)) and len(b.roots) == 1 and b,
            what="the old root withdrawn",
        )
        assert only_new.roots[0] != trust.roots[0]
        server.update(trust=only_new)
        client.update(trust=only_new)
        before = counts["ok"]
        eventually(lambda: counts["ok"] > before + 20, what="handshakes on the new CA alone")
    finally:
        stop.set()
        worker.join()
    assert errors == []
    assert counts["ok"] > 50


def test_a_standby_takes_over_when_the_leader_is_killed(
    devcluster: DevCluster, tmp_path: Path
) -> None:
    signer, namespace = "ha.podcert.dev/main", "podcert-ha"
    lease = ["--lease-duration=6", "--renew-deadline=4", "--retry-period=1"]
    replicas = [
        processes.signer(
            devcluster.root,
            tmp_path / f"r{i}",
            [signer],
            namespace=namespace,
            extra=[*lease, f"--identity=replica-{i}"],
        ).start()
        for i in range(2)
    ]
    rest = Rest(devcluster.admin)
    lease_path = path_of("coordination.k8s.io/v1", "leases", namespace, "podcert-signer")
    try:
        for replica in replicas:
            replica.wait_ready()
        holder = eventually(
            lambda: (rest.get(lease_path) or {}).get("spec", {}).get("holderIdentity")
        )
        leader = replicas[int(holder.rsplit("-", 1)[1])]
        standby = replicas[1 - replicas.index(leader)]

        ns = devcluster.namespace("ha")
        pods = [make_pod(devcluster, ns, f"p{i}", signer) for i in range(60)]
        pcrs = [request_as_node(devcluster, pod, signer)[1] for pod in pods[:30]]
        leader.kill()
        killed_at = time.monotonic()
        pcrs += [request_as_node(devcluster, pod, signer)[1] for pod in pods[30:]]

        new_holder = eventually(
            lambda: (
                (h := (rest.get(lease_path) or {}).get("spec", {}).get("holderIdentity"))
                and h != holder
                and h
            ),
            timeout=20,
            what="a new lease holder",
        )
        took_over = time.monotonic() - killed_at
        assert new_holder == standby.args[-1].split("=", 1)[1]
        assert took_over < 6 + 5, f"standby took {took_over:.1f}s"
        outcomes = [condition(settled(devcluster, p, timeout=20)).type for p in pcrs]
        assert outcomes == ["Issued"] * 60
    finally:
        for replica in replicas:
            replica.stop()
