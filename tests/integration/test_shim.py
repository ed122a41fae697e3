"""The node shim as a real process with a node identity, against the real API
server and the podcert signer. The shim serves its own nodes (shim-node-*), so pods other test
modules leave on node-a are not its business."""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from kubernetes import client

from bundles import formats
from bundles.authz import allow_workloads
from devcluster import processes
from devcluster.identities import Paths
from devcluster.testing import DevCluster, eventually
from kubelet_shim.kube import ROTATE_ANNOTATION, request_rotation
from podcert.api import keys
from podcert.client.rest import JSON, ApiError, Rest, path_of
from tests.integration.conftest import StartSigner
from tests.integration.helpers import create_pcr, pcr_spec
from tests.integration.kubelet_helpers import ca, folder_source, spiffe_volume
from tests.integration.shim_helpers import (
    Shim,
    certificate_volume,
    delete_trust_bundle,
    outcome,
    pod_events,
    published_roots,
    put_trust_bundle,
    requests_of,
    running_shim,
    shim,
    trust_volume,
    wait_for_event,
)
from tests.unit.test_bundles_source import Link

SIGNER = "shim.podcert.dev/test"
SIGNER_NAMESPACE = "podcert-shim"
NODE_A = "shim-node-a"
NODE_B = "shim-node-b"
ROOTS_BUNDLE = "shim.podcert.dev:test:roots"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shim")


@pytest.fixture(scope="module")
def signer(start_signer: StartSigner, work: Path) -> processes.Signer:
    return start_signer(SIGNER, namespace=SIGNER_NAMESPACE, workdir=work)


@pytest.fixture(scope="module")
def roots(devcluster: DevCluster, signer: processes.Signer) -> Iterator[bytes]:
    """The signer's roots, also in a hand-made signer-linked ClusterTrustBundle."""
    with published_roots(devcluster, SIGNER_NAMESPACE, ROOTS_BUNDLE, SIGNER) as pem:
        yield pem


@pytest.fixture(scope="module")
def shim_a(
    devcluster: DevCluster, work: Path, signer: processes.Signer, roots: bytes
) -> Iterator[Shim]:
    with running_shim(devcluster, work, NODE_A, SIGNER_NAMESPACE, work / "root-a") as proc:
        yield proc


@pytest.fixture
def ns(devcluster: DevCluster) -> str:
    return devcluster.namespace("shim")


def read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def leaf_of(path: Path) -> x509.Certificate | None:
    data = read(path)
    return formats.load_credential(data).leaf if data else None


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def roots_in(path: Path) -> frozenset[bytes] | None:
    data = read(path)
    if data is None:
        return None
    if not data.strip():
        return frozenset()
    return frozenset(
        c.public_bytes(serialization.Encoding.DER) for c in x509.load_pem_x509_certificates(data)
    )


def der_of(pem: bytes) -> frozenset[bytes]:
    return frozenset(
        c.public_bytes(serialization.Encoding.DER) for c in x509.load_pem_x509_certificates(pem)
    )


def test_a_new_pod_gets_its_credential_and_roots_within_2s(
    devcluster: DevCluster, shim_a: Shim, roots: bytes, ns: str
) -> None:
    started = time.monotonic()
    pod = devcluster.pod(
        ns,
        "web",
        node=NODE_A,
        volumes=[
            certificate_volume(SIGNER, trust={"signerName": SIGNER, "labelSelector": {}}),
            certificate_volume(SIGNER, name="split", split=True, key_type="ED25519"),
        ],
    )
    bundle_volume = shim_a.volume_dir(pod.metadata.uid)
    split_volume = shim_a.volume_dir(pod.metadata.uid, "split")
    bundle = eventually(lambda: read(bundle_volume / "credentialbundle.pem"), timeout=5)
    elapsed = time.monotonic() - started
    assert elapsed < 2.0, f"credential bundle on disk after {elapsed:.2f}s"
    print(f"credential bundle on disk {elapsed:.3f}s after the pod was created")

    # One PKCS#8 key block first, then the chain, leaf first; the key is the leaf's.
    assert bundle.startswith(b"-----BEGIN PRIVATE KEY-----\n")
    credential = formats.load_credential(bundle)
    trusted = formats.load_trust_bundle(
        eventually(lambda: read(bundle_volume / "trust.pem"), timeout=5)
    )
    assert der_of(formats.dump_trust_bundle(trusted)) == der_of(roots)
    formats.verify_chain(credential, trusted, dt.datetime.now(dt.UTC))

    # The kubelet's atomic-writer layout, with exact modes.
    assert (bundle_volume / "credentialbundle.pem").readlink() == Path(
        "..data/credentialbundle.pem"
    )
    assert (bundle_volume / "..data").is_symlink()
    assert mode(bundle_volume / "credentialbundle.pem") == 0o600
    assert mode(bundle_volume / "trust.pem") == 0o644

    # Separate key and chain files: key 0600, chain 0644, the key type the pod asked for.
    key = eventually(lambda: read(split_volume / "tls.key"), timeout=5)
    chain = (split_volume / "tls.crt").read_bytes()
    split = formats.load_credential_files(key, chain)
    assert isinstance(split.key, ed25519.Ed25519PrivateKey)
    assert (mode(split_volume / "tls.key"), mode(split_volume / "tls.crt")) == (0o600, 0o644)

    # One request per source, made for this node, owned by the pod.
    pcrs = requests_of(devcluster, ns, pod.metadata.uid)
    assert len(pcrs) == 2
    for pcr in pcrs:
        assert pcr["spec"]["nodeName"] == NODE_A
        assert pcr["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": pod.metadata.uid}
        ]


def test_100_forced_rotations_never_show_a_torn_or_mismatched_credential(
    devcluster: DevCluster, shim_a: Shim, ns: str
) -> None:
    pod = devcluster.pod(ns, "busy", node=NODE_A, volumes=[certificate_volume(SIGNER)])
    path = shim_a.volume_dir(pod.metadata.uid) / "credentialbundle.pem"
    eventually(lambda: leaf_of(path), timeout=5)

    stop = threading.Event()
    reads, missing, bad = [0], [0], []

    def reader() -> None:
        while not stop.is_set():
            data = read(path)
            if data is None:
                missing[0] += 1
                continue
            try:
                formats.load_credential(data)  # raises unless whole and the key fits the leaf
            except formats.BundleError as err:
                bad.append(f"{type(err).__name__}: {err}")
            reads[0] += 1

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    rest = Rest(devcluster.admin)
    public_keys = set()
    started = time.monotonic()
    try:
        for _ in range(100):
            before = leaf_of(path)
            assert before is not None
            public_keys.add(_spki(before))
            request_rotation(rest, ns, "busy", dt.datetime.now(dt.UTC))
            eventually(lambda b=before: leaf_of(path) not in (None, b), timeout=5, interval=0.002)
        after = leaf_of(path)
        assert after is not None
        public_keys.add(_spki(after))
    finally:
        stop.set()
        thread.join(5)
    elapsed = time.monotonic() - started
    print(f"100 forced rotations in {elapsed:.2f}s; the reader read {reads[0]} times")

    assert bad == [], bad[:3]
    assert missing[0] == 0, f"the bundle was missing {missing[0]} times"
    assert reads[0] > 100
    assert len(public_keys) == 101, "every rotation must use a new key"
    pcrs = requests_of(devcluster, ns, pod.metadata.uid)
    assert len(pcrs) == 101 and all(outcome(p) == "Issued" for p in pcrs)


def test_with_its_clock_moved_past_begin_refresh_at_the_shim_rekeys_once(
    devcluster: DevCluster, work: Path, ns: str
) -> None:
    """The first signer asks for refresh early (~10% of 24 h), the second late (~90%): with the
    shim's clock 12 h ahead the first certificate is due and its replacement is not, so exactly
    one refresh happens, with a new key, and no loop."""
    clock_signer, clock_ns = "shim.podcert.dev/clock", "podcert-shim-clock"
    node, root = "shim-node-clock", work / "root-clock"

    def signer_with(fraction: float) -> processes.Signer:
        return processes.signer(
            devcluster.root,
            work,
            [clock_signer],
            namespace=clock_ns,
            extra=[f"--refresh-fraction={fraction}"],
        ).start()

    early, first = signer_with(0.1), shim(devcluster, work, node, root=root, log_name="clock-1")
    try:
        early.wait_ready()
        first.start().wait_ready()
        pod = devcluster.pod(ns, "clocked", node=node, volumes=[certificate_volume(clock_signer)])
        path = first.volume_dir(pod.metadata.uid) / "credentialbundle.pem"
        old = eventually(lambda: leaf_of(path), timeout=5)
    finally:
        first.stop()
        early.stop()
    [issued] = requests_of(devcluster, ns, pod.metadata.uid)
    begin = dt.datetime.fromisoformat(issued["status"]["beginRefreshAt"])
    assert begin < dt.datetime.now(dt.UTC) + dt.timedelta(hours=5)

    late = signer_with(0.9)
    ahead = shim(
        devcluster,
        work,
        node,
        root=root,
        log_name="clock-2",
        extra=["--clock-offset-seconds=43200", "--refresh-jitter-seconds=0"],
    )
    try:
        late.wait_ready()
        ahead.start().wait_ready()
        new = eventually(lambda: leaf_of(path) not in (None, old) and leaf_of(path), timeout=5)
        assert _spki(new) != _spki(old), "a refresh uses a new key"
        eventually(
            lambda: (
                ahead.sample("podcert_shim_projections", signer_name=clock_signer, state="fresh")
                == 1
            ),
            timeout=5,
        )
        assert ahead.sample("podcert_shim_requests_total", reason="refresh") == 1
    finally:
        ahead.stop()
        late.stop()
    pcrs = requests_of(devcluster, ns, pod.metadata.uid)
    assert len(pcrs) == 2 and all(outcome(p) == "Issued" for p in pcrs)


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Everything under `folder`: file contents, directories, link targets."""
    return {
        str(p.relative_to(folder)): (
            f"link -> {p.readlink()}" if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes()
        )
        for p in sorted(folder.rglob("*"))
    }


def rotate_command(devcluster: DevCluster, namespace: str, pod: str) -> None:
    """`podcert shim rotate` as an operator would run it."""
    admin = Paths(devcluster.root.resolve()).admin_kubeconfig
    done = subprocess.run(
        [
            *(sys.executable, "-m", "podcert", "shim", "rotate"),
            *(f"--kubeconfig={admin}", f"--namespace={namespace}", f"--pod={pod}"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_a_volume_folder_replaced_by_a_link_gets_nothing_written_outside(
    devcluster: DevCluster, work: Path, ns: str
) -> None:
    """With a pod's volume folder replaced by a link to a folder outside, neither
    `podcert shim rotate` nor the normal refresh (after a restart, the clock 6 h ahead) writes
    there; an Event on the pod says why, and the pod next to it keeps being served. Two signers
    as in the clock test: the first asks for refresh at 10% (+-10%) of 24 h, the second at 90%."""
    link_signer, link_ns = "shim.podcert.dev/links", "podcert-shim-links"
    node, root = "shim-node-links", work / "root-links"
    outside = work / "outside-links"
    outside.mkdir()
    (outside / "credentialbundle.pem").write_bytes(b"somebody else's file\n")
    before = snapshot(outside)

    def signer_with(fraction: float) -> processes.Signer:
        return processes.signer(
            devcluster.root,
            work,
            [link_signer],
            namespace=link_ns,
            extra=[f"--refresh-fraction={fraction}"],
        ).start()

    def unsafe_events(pod: Any) -> list[JSON]:
        return [e for e in pod_events(devcluster, pod) if e["reason"] == "UnsafeVolumeDirectory"]

    early, first = signer_with(0.1), shim(devcluster, work, node, root=root, log_name="links-1")
    try:
        early.wait_ready()
        first.start().wait_ready()
        victim, bystander = (
            devcluster.pod(ns, name, node=node, volumes=[certificate_volume(link_signer)])
            for name in ("victim", "bystander")
        )
        volume = first.volume_dir(victim.metadata.uid)
        served = first.volume_dir(bystander.metadata.uid) / "credentialbundle.pem"
        eventually(lambda: leaf_of(volume / "credentialbundle.pem"), timeout=5)
        old = eventually(lambda: leaf_of(served), timeout=5)

        shutil.rmtree(volume)
        volume.symlink_to(outside, target_is_directory=True)
        rotate_command(devcluster, ns, "victim")
        [event] = eventually(lambda: unsafe_events(victim), timeout=10)
        assert event["type"] == "Warning" and "is a symbolic link" in event["message"]
        assert event["source"]["component"] == "podcert-shim"
        # The re-key was asked for and issued, and is kept for after the repair, not written.
        eventually(
            lambda: (
                [outcome(p) for p in requests_of(devcluster, ns, victim.metadata.uid)]
                == ["Issued", "Issued"]
            ),
            timeout=10,
        )
        assert snapshot(outside) == before

        # Other pods are still served, new ones included.
        newcomer = devcluster.pod(
            ns, "newcomer", node=node, volumes=[certificate_volume(link_signer)]
        )
        eventually(
            lambda: leaf_of(first.volume_dir(newcomer.metadata.uid) / "credentialbundle.pem"),
            timeout=5,
        )
        assert leaf_of(served) == old
        assert first.running and first._get("/healthz")[0] == 200
        assert snapshot(outside) == before
    finally:
        first.stop()
        early.stop()

    late = signer_with(0.9)
    ahead = shim(
        devcluster,
        work,
        node,
        root=root,
        log_name="links-2",
        extra=["--clock-offset-seconds=21600", "--refresh-jitter-seconds=0"],
    )
    try:
        late.wait_ready()
        ahead.start().wait_ready()
        # The bystander's and the newcomer's credentials are due and refreshed; the victim's
        # volume is refused again (the new process tells again) and nothing is asked for it.
        eventually(lambda: leaf_of(served) not in (None, old), timeout=10)
        eventually(lambda: len(unsafe_events(victim)) == 2, timeout=10)
        eventually(
            lambda: ahead.sample("podcert_shim_requests_total", reason="refresh") == 2,
            timeout=10,
        )
        assert len(requests_of(devcluster, ns, victim.metadata.uid)) == 2
        assert ahead.running and ahead._get("/healthz")[0] == 200
    finally:
        ahead.stop()
        late.stop()
    assert snapshot(outside) == before
    assert volume.is_symlink()
    assert '"level": "error"' not in ahead.output()
    assert "Traceback" not in first.output() + ahead.output()


def _spki(cert: x509.Certificate) -> bytes:
    return cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def test_cluster_trust_bundle_changes_reach_the_file_within_5s(
    devcluster: DevCluster, shim_a: Shim, ns: str
) -> None:
    signer_name = "shim.podcert.dev/trust"
    prefix = f"shim.podcert.dev:trust:{ns}-"
    one, two, three = (trustme.CA() for _ in range(3))

    def pem(ca: trustme.CA) -> bytes:
        return ca.cert_pem.bytes()

    gold = {"podcert.dev/tier": "gold"}
    put_trust_bundle(devcluster, prefix + "one", pem(one), signer_name=signer_name, labels=gold)
    pod = devcluster.pod(
        ns,
        "trusting",
        node=NODE_A,
        volumes=[
            trust_volume(signerName=signer_name, labelSelector={"matchLabels": gold}),
            trust_volume("named", name=prefix + "two", optional=True),
        ],
    )
    by_signer = shim_a.volume_dir(pod.metadata.uid, "trust") / "trust.pem"
    by_name = shim_a.volume_dir(pod.metadata.uid, "named") / "trust.pem"
    eventually(lambda: roots_in(by_signer) == der_of(pem(one)), timeout=5)
    eventually(lambda: roots_in(by_name) == frozenset(), timeout=5)  # optional and absent

    latencies: list[float] = []

    def expect(path: Path, wanted: frozenset[bytes]) -> None:
        started = time.monotonic()
        eventually(lambda: roots_in(path) == wanted, timeout=5, interval=0.01)
        latencies.append(time.monotonic() - started)

    try:
        put_trust_bundle(devcluster, prefix + "two", pem(two), signer_name=signer_name, labels=gold)
        expect(by_signer, der_of(pem(one) + pem(two)))
        expect(by_name, der_of(pem(two)))
        put_trust_bundle(
            devcluster, prefix + "one", pem(three), signer_name=signer_name, labels=gold
        )
        expect(by_signer, der_of(pem(three) + pem(two)))
        delete_trust_bundle(devcluster, prefix + "two")
        expect(by_signer, der_of(pem(three)))
        expect(by_name, frozenset())
    finally:
        for suffix in ("one", "two"):
            with contextlib.suppress(ApiError):
                delete_trust_bundle(devcluster, prefix + suffix)
    print("trust file followed bundle changes in " + ", ".join(f"{s:.3f}s" for s in latencies))
    assert max(latencies) < 5.0


def test_restart_with_50_fresh_credentials_on_disk_makes_no_new_request(
    devcluster: DevCluster, signer: processes.Signer, work: Path, ns: str
) -> None:
    node, root = "shim-node-restart", work / "root-restart"
    first = shim(devcluster, work, node, root=root, log_name="restart-1").start()
    try:
        first.wait_ready()
        pods = [
            devcluster.pod(ns, f"p{i}", node=node, volumes=[certificate_volume(SIGNER)])
            for i in range(50)
        ]
        paths = [first.volume_dir(p.metadata.uid) / "credentialbundle.pem" for p in pods]
        eventually(lambda: all(p.exists() for p in paths), timeout=30)
    finally:
        first.stop()
    files = {path: path.read_bytes() for path in paths}
    names = {p["metadata"]["name"] for p in requests_of(devcluster, ns)}
    assert len(names) == 50

    second = shim(devcluster, work, node, root=root, log_name="restart-2").start()
    try:
        second.wait_ready()
        # Every projection adopted from disk and fresh, as the new process reports it.
        eventually(
            lambda: (
                second.sample("podcert_shim_projections", signer_name=SIGNER, state="fresh") == 50
            ),
            timeout=15,
        )
        assert second.sample("podcert_shim_requests_total") == 0
        assert second.sample("podcert_shim_volume_writes_total", result="ok") == 0
    finally:
        second.stop()
    assert {p["metadata"]["name"] for p in requests_of(devcluster, ns)} == names
    assert {path: path.read_bytes() for path in paths} == files


def test_a_denied_request_leaves_an_event_no_request_loop_and_the_older_credential(
    devcluster: DevCluster, shim_a: Shim, work: Path, ns: str
) -> None:
    deny_signer, deny_ns = "shim.podcert.dev/deny", "podcert-shim-deny"
    allowing = processes.signer(devcluster.root, work, [deny_signer], namespace=deny_ns).start()
    try:
        allowing.wait_ready()
        pod = devcluster.pod(ns, "refused", node=NODE_A, volumes=[certificate_volume(deny_signer)])
        path = shim_a.volume_dir(pod.metadata.uid) / "credentialbundle.pem"
        older = eventually(lambda: read(path), timeout=5)
    finally:
        allowing.stop()

    # The same signer (same CA) comes back with a policy that allows nobody.
    policy = work / "deny-policy.yaml"
    policy.write_text(f"signers:\n  - name: {deny_signer}\n    allow: []\n")
    denying = processes.signer(
        devcluster.root, work, [deny_signer], namespace=deny_ns, extra=[f"--policy={policy}"]
    ).start()
    try:
        denying.wait_ready()
        rest = Rest(devcluster.admin)
        request_rotation(rest, ns, "refused", dt.datetime.now(dt.UTC))
        event = wait_for_event(devcluster, pod, "CertificateDenied")
        assert event["type"] == "Warning"
        assert event["source"]["component"] == "podcert-shim"
        assert "PolicyDenied" in event["message"] or "denied" in event["message"]

        # Ask again: a terminal answer is not re-asked. A pod created afterwards on the same
        # node getting its credential shows the shim has handled the earlier update too.
        request_rotation(rest, ns, "refused", dt.datetime.now(dt.UTC))
        probe = devcluster.pod(ns, "probe", node=NODE_A, volumes=[certificate_volume(SIGNER)])
        eventually(
            lambda: read(shim_a.volume_dir(probe.metadata.uid) / "credentialbundle.pem"),
            timeout=5,
        )
        eventually(
            lambda: (
                shim_a.sample("podcert_shim_projections", signer_name=deny_signer, state="denied")
                == 1
            ),
            timeout=5,
        )
    finally:
        denying.stop()
    pcrs = requests_of(devcluster, ns, pod.metadata.uid)
    assert sorted(outcome(p) or "" for p in pcrs) == ["Denied", "Issued"], "no request loop"
    assert [e["reason"] for e in pod_events(devcluster, pod)].count("CertificateDenied") == 1
    assert read(path) == older, "the older credential stays in place"
    assert formats.load_credential(older).not_after > dt.datetime.now(dt.UTC)


def test_a_deleted_pod_loses_its_files_and_its_pending_requests(
    devcluster: DevCluster, shim_a: Shim, ns: str
) -> None:
    unserved = "shim.podcert.dev/nobody-answers"
    pod = devcluster.pod(
        ns,
        "doomed",
        node=NODE_A,
        volumes=[certificate_volume(SIGNER), certificate_volume(unserved, name="waiting")],
    )
    uid = pod.metadata.uid
    eventually(lambda: read(shim_a.volume_dir(uid) / "credentialbundle.pem"), timeout=5)

    def pending() -> list[str]:
        return [
            p["metadata"]["name"]
            for p in requests_of(devcluster, ns, uid)
            if outcome(p) is None and p["spec"]["signerName"] == unserved
        ]

    eventually(pending, timeout=5)
    # The issued request is left to the garbage collector, which follows its ownerReference.
    issued = [p for p in requests_of(devcluster, ns, uid) if outcome(p) == "Issued"]
    assert [p["metadata"]["ownerReferences"][0]["uid"] for p in issued] == [uid]
    started = time.monotonic()
    # What the kubelet does once the containers are gone (nothing here runs them).
    client.CoreV1Api(devcluster.admin).delete_namespaced_pod("doomed", ns, grace_period_seconds=0)
    eventually(lambda: not (shim_a.root / "pods" / uid).exists(), timeout=5)
    eventually(lambda: not pending(), timeout=5)
    print(f"files and pending request gone {time.monotonic() - started:.3f}s after deletion")
    # The devcluster's controller-manager runs the garbage collector: it takes the issued one.
    eventually(
        lambda: not requests_of(devcluster, ns, uid),
        timeout=60,
        what="the garbage collector to delete the issued request",
    )


def test_node_b_cannot_obtain_a_credential_for_a_pod_on_node_a(
    devcluster: DevCluster, shim_a: Shim, work: Path, ns: str
) -> None:
    pod = devcluster.pod(ns, "victim", node=NODE_A, volumes=[certificate_volume(SIGNER)])
    eventually(lambda: read(shim_a.volume_dir(pod.metadata.uid) / "credentialbundle.pem"))
    node_b = devcluster.node(NODE_B)
    core = client.CoreV1Api(devcluster.admin)
    b = core.read_node(NODE_B)

    # A request naming node-a, or naming itself, for node-a's pod: NodeRestriction refuses both.
    for overrides in ({}, {"nodeName": NODE_B, "nodeUID": b.metadata.uid}):
        spec = pcr_spec(devcluster, pod, SIGNER, keys.generate("ECDSAP256"), **overrides)
        with pytest.raises(ApiError) as refused:
            create_pcr(node_b, ns, spec)
        assert refused.value.status == 403, refused.value

    # node-b cannot even see node-a's pods.
    with pytest.raises(ApiError) as hidden:
        Rest(node_b).request(
            "GET", path_of("v1", "pods"), query={"fieldSelector": f"spec.nodeName={NODE_A}"}
        )
    assert hidden.value.status == 403

    # A shim holding node-b's identity but claiming to serve node-a gets nowhere.
    root = work / "root-impostor"
    impostor = shim(
        devcluster,
        work,
        NODE_A,
        root=root,
        kubeconfig=devcluster.node_kubeconfig(NODE_B),
        log_name="impostor",
    ).start()
    try:
        eventually(lambda: "403" in impostor.output(), timeout=10, what="a 403 in the log")
        assert not impostor.ready()
    finally:
        impostor.stop()
    assert not (root / "pods").exists()
    assert len(requests_of(devcluster, ns, pod.metadata.uid)) == 1  # shim-node-a's own


def test_rotate_command_rekeys_every_pod_of_a_service_account(
    devcluster: DevCluster, shim_a: Shim, ns: str
) -> None:
    pods = {
        name: devcluster.pod(
            ns, name, node=NODE_A, service_account=sa, volumes=[certificate_volume(SIGNER)]
        )
        for name, sa in (("api-0", "api"), ("api-1", "api"), ("batch-0", "batch"))
    }
    paths = {n: shim_a.volume_dir(p.metadata.uid) / "credentialbundle.pem" for n, p in pods.items()}
    leaves = {n: eventually(lambda p=p: leaf_of(p), timeout=5) for n, p in paths.items()}

    admin = Paths(devcluster.root.resolve()).admin_kubeconfig
    done = subprocess.run(
        [
            *(sys.executable, "-m", "podcert", "shim", "rotate"),
            *(f"--kubeconfig={admin}", f"--namespace={ns}", "--service-account=api"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("re-key") == 2

    for name in ("api-0", "api-1"):
        eventually(lambda n=name: leaf_of(paths[n]) not in (None, leaves[n]), timeout=5)
    core = client.CoreV1Api(devcluster.admin)
    untouched = core.read_namespaced_pod("batch-0", ns)
    assert ROTATE_ANNOTATION not in (untouched.metadata.annotations or {})
    assert leaf_of(paths["batch-0"]) == leaves["batch-0"]


def test_metrics_health_and_logs_hold_no_key_material(shim_a: Shim) -> None:
    text = shim_a.metrics()
    assert shim_a.sample("podcert_shim_projections", signer_name=SIGNER, state="fresh") >= 1
    for state in ("not_yet_issued", "overdue_for_refresh", "expired", "denied", "failed"):
        assert f'signer_name="{SIGNER}",state="{state}"' in text
    assert shim_a.sample("podcert_shim_requests_total", signer_name=SIGNER, reason="initial") >= 1
    assert shim_a.sample("podcert_shim_request_outcomes_total", outcome="Issued") >= 1
    assert 'podcert_build_info{component="shim"' in text
    assert "process_resident_memory_bytes" in text
    assert "_created" not in text
    assert shim_a._get("/healthz")[0] == 200
    assert "PRIVATE KEY" not in text
    log = shim_a.output()
    assert '"level": "error"' not in log
    assert "PRIVATE KEY" not in log
    # No line of any key we wrote shows up in the log either.
    for pod_dir in (shim_a.root / "pods").iterdir():
        for bundle in pod_dir.glob("volumes/*/*/credentialbundle.pem"):
            body = bundle.read_text().split("-----END PRIVATE KEY-----")[0].splitlines()[1:]
            assert not any(line in log for line in body if len(line) > 16)


def test_an_unwritable_root_is_an_error_not_a_crash(
    devcluster: DevCluster, signer: processes.Signer, work: Path
) -> None:
    """Kept small: the file-system failure modes are unit-tested against the storage itself."""
    root = work / "broken-root"
    root.mkdir()
    (root / "pods").write_text("a file where the pods directory should be\n")  # even root fails
    proc = shim(devcluster, work, "shim-node-broken", root=root, log_name="broken").start()
    try:
        proc.wait_ready()
        ns = devcluster.namespace("shim-broken")
        devcluster.pod(ns, "p", node="shim-node-broken", volumes=[certificate_volume(SIGNER)])
        eventually(lambda: "cannot write volume" in proc.output(), timeout=10)
        assert proc.running and proc._get("/healthz")[0] == 200
        assert proc.sample("podcert_shim_volume_writes_total", result="error") >= 1
    finally:
        proc.stop()


def test_a_federated_trust_domain_whose_bundle_goes_leaves_the_folder_source_in_seconds(
    devcluster: DevCluster, shim_a: Shim, ns: str
) -> None:
    """De-federation end to end: a partner's bundle, labelled as the standard says, reaches the
    pod's `partner.test.trust-bundle.pem` (an optional source) and a folder source trusts that
    trust domain; the bundle deleted, the shim empties the file within seconds and the source's
    next load drops the trust domain."""
    td, partner = "cluster.local", trustme.CA()
    name = f"shim.podcert.dev:test:{ns}-partner"
    labels = {
        "k8s.spiffe.io/canarying": "live",
        "k8s.spiffe.io/workload-trust-domain": td,
        "k8s.spiffe.io/peer-trust-domain": "partner.test",
    }
    pem = partner.cert_pem.bytes()
    put_trust_bundle(devcluster, name, pem, signer_name=SIGNER, labels=labels)
    try:
        pod = devcluster.pod(
            ns,
            "federating",
            node=NODE_A,
            volumes=[spiffe_volume(SIGNER, td, federated=["partner.test"])],
        )
        directory = shim_a.volume_dir(pod.metadata.uid, "spiffe")
        partner_file = directory / "partner.test.trust-bundle.pem"
        eventually(lambda: roots_in(partner_file) == der_of(pem), timeout=5)
        source = eventually(lambda: folder_source(directory), timeout=5)
        assert source.trust_domains == (td, "partner.test")

        started = time.monotonic()
        delete_trust_bundle(devcluster, name)
        eventually(lambda: roots_in(partner_file) == frozenset(), timeout=5, interval=0.01)
        emptied = time.monotonic() - started
        assert source.refresh()
        assert source.trust_domains == (td,)
        print(f"de-federation: the partner's file empty {emptied:.3f}s after its bundle went")
    finally:
        with contextlib.suppress(ApiError):
            delete_trust_bundle(devcluster, name)


def test_the_spiffe_layout_and_a_preview_root_then_promoted_reach_the_pods_that_select_them(
    devcluster: DevCluster, shim_a: Shim, ns: str
) -> None:
    """The shim writes the standard's folder with the names the pod asks for, and follows the
    signer's canarying: `ca prepare --preview` reaches the pod selecting `preview` only,
    `ca promote` then the pod selecting `live` too; a folder source on each keeps verifying the
    other across it. Last in this module: it leaves the signer with a prepared CA."""
    td = "cluster.local"
    pods = {
        channel: devcluster.pod(
            ns,
            channel,
            node=NODE_A,
            service_account=channel,
            volumes=[spiffe_volume(SIGNER, td, channel=channel, federated=["gone.test"])],
        )
        for channel in ("live", "preview")
    }
    folders = {c: shim_a.volume_dir(p.metadata.uid, "spiffe") for c, p in pods.items()}
    own = f"{td}.trust-bundle.pem"
    for directory in folders.values():
        eventually(lambda d=directory: read(d / own), timeout=5)  # type: ignore[misc]
        assert read(directory / "gone.test.trust-bundle.pem") == b""
    sources = {
        c: eventually(lambda d=d: folder_source(d), timeout=5, what=f"{c}'s folder")  # type: ignore[misc]
        for c, d in folders.items()
    }
    before = roots_in(folders["live"] / own)
    assert before and roots_in(folders["preview"] / own) == before
    assert sources["live"].trust_domains == (td,)

    def talk() -> None:
        Link(
            sources["live"].server_context(allow_workloads(ns, "preview", trust_domain=td)),
            sources["preview"].client_context(allow_workloads(ns, "live", trust_domain=td)),
        )

    talk()
    ca(devcluster, SIGNER_NAMESPACE, "prepare", "--preview")
    grown = eventually(
        lambda: (r := roots_in(folders["preview"] / own)) and len(r) > len(before) and r,
        timeout=5,
        what="the preview root in the preview pod's file",
    )
    (new_root,) = grown - before
    # The live pod's bundle is the signer's live bundle, which does not hold it.
    assert new_root not in der_of(live_bundle(devcluster).encode())
    assert roots_in(folders["live"] / own) == before
    assert sources["preview"].refresh() and sources["live"].refresh() is False
    talk()

    ca(devcluster, SIGNER_NAMESPACE, "promote")
    eventually(
        lambda: roots_in(folders["live"] / own) == grown,
        timeout=5,
        what="the promoted root in the live pod's file",
    )
    assert sources["live"].refresh()
    talk()


def live_bundle(devcluster: DevCluster) -> str:
    found = Rest(devcluster.admin).request(
        "GET", path_of("certificates.k8s.io/v1", "clustertrustbundles", name=ROOTS_BUNDLE)
    )
    assert found["metadata"]["labels"]["k8s.spiffe.io/canarying"] == "live"
    return str(found["spec"]["trustBundle"])
