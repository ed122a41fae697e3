"""Faults: the signer and the shim as real processes against a real API server that is
restarted mid-burst or expires their watches, and a shim that is SIGKILLed mid-write, runs out of
disk space, or runs 3 minutes ahead of the API server's clock.

Everything here runs on a PRIVATE devcluster (its own etcd and kube-apiserver, started by the
module): restarting the session's shared API server would disturb the other modules. One signer
with its own signer name serves the module; each test runs its own shim for its own node.
"""

from __future__ import annotations

import datetime as dt
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from bundles import formats
from devcluster import cluster, kube, processes
from devcluster.identities import Paths
from devcluster.testing import DevCluster, eventually, running
from kubelet_shim.kube import request_rotation
from podcert.api.volumes import PLUGIN_DIR
from podcert.client.rest import JSON, Rest, path_of
from tests.integration.conftest import StartShim, StartSigner
from tests.integration.fault_helpers import (
    KillSwitch,
    compact_etcd,
    compacted,
    create_through_outage,
    credential,
    etcd_revision,
    fill,
    issued_leaf,
    layout,
    leaf_of,
    log_size,
    messages,
    outcome,
    pod_body,
    read,
    requests_of,
    sample,
    server_now,
    small_filesystem,
    spki,
    swapped_but_unlinked,
)
from tests.integration.shim_helpers import certificate_volume, signer_roots

SIGNER = "faults.podcert.dev/test"
SIGNER_NAMESPACE = "podcert-faults"
BUNDLE = "credentialbundle.pem"
BURST = 60
KILL_ROUNDS = 12


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A devcluster of this module's own, free to be restarted and compacted."""
    with running(tmp_path_factory.mktemp("faults-devcluster")) as handle:
        yield handle


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def signer(start_signer: StartSigner, private: DevCluster, work: Path) -> processes.Signer:
    return start_signer(SIGNER, namespace=SIGNER_NAMESPACE, cluster=private, workdir=work)


@pytest.fixture
def rest(private: DevCluster) -> Rest:
    return Rest(private.admin)


@pytest.fixture
def ns(private: DevCluster) -> str:
    name = private.namespace("faults")
    kube.ensure_service_account(private.admin, name, "default")
    return name


@pytest.fixture
def start_shim(
    start_shim: StartShim, private: DevCluster, work: Path, signer: processes.Signer
) -> Iterator[StartShim]:
    """Shims of the private cluster (waited ready), each stopped when its test ends."""
    started: list[processes.Shim] = []

    def start(node: str, **kwargs: Any) -> processes.Shim:
        proc = start_shim(node, cluster=private, workdir=work, **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def make_pod(rest: Rest, ns: str, name: str, node: str) -> JSON:
    body = pod_body(ns, name, node, [certificate_volume(SIGNER)])
    create_through_outage(rest, body, time.monotonic() + 30)
    pod: JSON = rest.request("GET", path_of("v1", "pods", ns, name))
    return pod


def bundle_path(shim: processes.Shim, pod: JSON) -> Path:
    return shim.volume_dir(pod["metadata"]["uid"]) / BUNDLE


def requests_by_pod(rest: Rest, ns: str) -> dict[str, list[JSON]]:
    by_pod: dict[str, list[JSON]] = {}
    for pcr in requests_of(rest, ns):
        by_pod.setdefault(pcr["spec"]["podName"], []).append(pcr)
    return by_pod


def issued_after(rest: Rest, ns: str, pod_name: str, serial: int, moment: dt.datetime) -> bool:
    """True when the request that produced the leaf `serial` was created at or after `moment`
    (creationTimestamp has whole seconds, hence the floor)."""
    for pcr in requests_by_pod(rest, ns).get(pod_name, []):
        leaf = issued_leaf(pcr)
        if leaf is not None and leaf.serial_number == serial:
            created = dt.datetime.fromisoformat(pcr["metadata"]["creationTimestamp"])
            return created >= moment.replace(microsecond=0)
    return False


def _writing(volume: Path) -> bool:
    return layout(volume).writing


def _logged(proc: processes.Process, since: int, message: str) -> bool:
    return message in messages(proc, since)


def issued_count(signer: processes.Signer) -> float:
    """Requests the signer settled as Issued (one status write each)."""
    return sample(
        signer.metrics(), "podcert_signer_requests_total", signer_name=SIGNER, outcome="Issued"
    )


def errors_logged(proc: processes.Process, since: int = 0) -> list[str]:
    return messages(proc, since, level="error")


# --- 1. kube-apiserver restarted in the middle of a burst -----------------------------------


def test_api_server_restart_mid_burst_issues_one_credential_per_pod_and_leaves_nothing_pending(
    private: DevCluster,
    signer: processes.Signer,
    start_shim: StartShim,
    rest: Rest,
    ns: str,
) -> None:
    node = "fault-node-burst"
    shim = start_shim(node)
    signer_mark = log_size(signer)
    issued_before = issued_count(signer)
    bundles = shim.root / "pods"
    pattern = f"*/volumes/{PLUGIN_DIR}/identity/{BUNDLE}"

    names = [f"burst-{i:02d}" for i in range(BURST)]
    created: list[str] = []
    retried: list[int] = []
    failed: list[BaseException] = []

    def burst() -> None:
        deadline = time.monotonic() + 120
        try:
            for name in names:
                body = pod_body(ns, name, node, [certificate_volume(SIGNER)])
                retried.append(create_through_outage(Rest(private.admin), body, deadline))
                created.append(name)
        except BaseException as err:
            failed.append(err)

    creator = threading.Thread(target=burst, name="burst", daemon=True)
    creator.start()
    eventually(lambda: len(created) >= BURST // 2, timeout=30, what="half of the burst created")
    at_restart = len(created), len(list(bundles.glob(pattern)))
    started = time.monotonic()
    cluster.restart_apiserver(private.root)
    back = time.monotonic()
    creator.join(120)
    assert not failed, failed
    assert len(created) == BURST

    eventually(
        lambda: len(list(bundles.glob(pattern))) == BURST,
        timeout=90,
        interval=0.1,
        what=f"{BURST} credential bundles on disk",
    )
    all_written = time.monotonic()

    # Exactly one request per pod, every one Issued, none pending; the file holds its leaf.
    pods = rest.request("GET", path_of("v1", "pods", ns))["items"]
    by_pod = requests_by_pod(rest, ns)
    assert sorted(by_pod) == sorted(names)
    assert {name: len(pcrs) for name, pcrs in by_pod.items() if len(pcrs) != 1} == {}
    assert [p["metadata"]["name"] for ps in by_pod.values() for p in ps if outcome(p) is None] == []
    assert {outcome(p) for ps in by_pod.values() for p in ps} == {"Issued"}
    for pod in pods:
        on_disk = leaf_of(bundle_path(shim, pod))
        issued = issued_leaf(by_pod[pod["metadata"]["name"]][0])
        assert on_disk is not None and issued is not None and on_disk == issued

    # One status write per request (the API server refuses a second on a settled one, and a
    # 409 after a lost answer is re-read, not re-signed), one request per pod from the shim.
    eventually(
        lambda: issued_count(signer) - issued_before == BURST,
        timeout=10,
        what="the signer's count of issued requests",
    )
    assert sample(shim.metrics(), "podcert_shim_requests_total") == BURST
    assert shim.sample("podcert_shim_projections", signer_name=SIGNER, state="fresh") == BURST

    # Both recovered by themselves: still running, and the outage was no error to either.
    assert signer.running and shim.running
    assert errors_logged(signer, signer_mark) == []
    assert errors_logged(shim) == []
    in_flight = at_restart[0] - at_restart[1]
    print(
        f"burst of {BURST} pods: API server restarted with {at_restart[0]} created and "
        f"{in_flight} of them still without a bundle; down for {back - started:.1f}s; "
        f"{sum(retried)} pod creations retried through the outage; all {BURST} bundles on "
        f"disk {all_written - back:.1f}s after it was back"
    )


# --- 2. watch expiry (410 Gone) after etcd compaction ---------------------------------------


def test_watch_expiry_after_etcd_compaction_makes_signer_and_shim_relist_and_carry_on(
    private: DevCluster,
    signer: processes.Signer,
    start_shim: StartShim,
    rest: Rest,
    ns: str,
) -> None:
    node = "fault-node-expiry"
    shim = start_shim(node)
    before = make_pod(rest, ns, "before", node)
    kept = eventually(lambda: read(bundle_path(shim, before)), timeout=10)
    signer_mark, shim_mark = log_size(signer), log_size(shim)

    # Compact everything up to now; the API server's watch cache alone would still serve old
    # resourceVersions, so restart it: its cache is rebuilt above the compacted revision and
    # every watch resumed from before answers 410 Gone.
    revision = etcd_revision(private.state)
    compact_etcd(private.state, revision)
    assert compacted(private.state, revision - 1)
    started = time.monotonic()
    cluster.restart_apiserver(private.root)
    after = make_pod(rest, ns, "after", node)  # likely before the reflectors are back

    reflectors: list[tuple[processes.Process, int, list[str]]] = [
        (signer, signer_mark, [f"pcrs[{SIGNER}]", "pods", "nodes", "serviceaccounts", "ca-secret"]),
        (shim, shim_mark, ["podcertificaterequests", "pods", "clustertrustbundles"]),
    ]

    for proc, mark, names in reflectors:
        for name in names:
            line = f"{name}: watch expired (410 Gone); relisting"
            eventually(partial(_logged, proc, mark, line), timeout=30, what=line)
    relisted_at = time.monotonic()

    eventually(lambda: leaf_of(bundle_path(shim, after)), timeout=30)
    later = make_pod(rest, ns, "later", node)  # created after every relist
    eventually(lambda: leaf_of(bundle_path(shim, later)), timeout=10)
    done = time.monotonic()

    by_pod = requests_by_pod(rest, ns)
    assert {name: [outcome(p) for p in pcrs] for name, pcrs in by_pod.items()} == {
        "before": ["Issued"],  # a relist is no reason to ask again
        "after": ["Issued"],
        "later": ["Issued"],
    }
    assert read(bundle_path(shim, before)) == kept
    assert errors_logged(signer, signer_mark) == []
    assert errors_logged(shim, shim_mark) == []
    print(
        f"compacted etcd at revision {revision}; both relisted {relisted_at - started:.1f}s "
        f"after the restart began; new pods' bundles on disk {done - started:.1f}s after it"
    )


# --- 3. the shim SIGKILLed in the middle of writing a bundle --------------------------------


def test_sigkill_mid_write_leaves_a_whole_credential_and_the_next_start_completes_the_rotation(
    private: DevCluster,
    signer: processes.Signer,
    start_shim: StartShim,
    rest: Rest,
    ns: str,
    work: Path,
) -> None:
    node, root = "fault-node-kill", work / "root-kill"
    shim = start_shim(node, root=root, log_name="kill")
    pod = make_pod(rest, ns, "victim", node)
    path = bundle_path(shim, pod)
    volume = path.parent
    eventually(lambda: leaf_of(path), timeout=10)
    admin = Paths(private.root.resolve()).admin_kubeconfig
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    outcomes: list[str] = []
    started = time.monotonic()

    for round_ in range(KILL_ROUNDS):
        old = leaf_of(path)
        assert old is not None
        eventually(lambda: layout(volume).clean, timeout=10, what="a settled volume")
        # Even rounds: kill at the first sight of the new version being written; odd rounds:
        # at a random moment in the 80 ms after the rotation was asked for (it takes ~40 ms).
        on_write = round_ % 2 == 0
        timer = 5.0 if on_write else rng.uniform(0.0, 0.08)
        writing = partial(_writing, volume) if on_write else None
        before = dt.datetime.now(dt.UTC)
        switch = KillSwitch(shim, timer, writing).arm()
        if round_ == 0:  # the operator's way once, the annotation it sets afterwards
            stamp = before.isoformat().replace("+00:00", "Z")
            subprocess.run(
                [
                    *(sys.executable, "-m", "podcert", "shim", "rotate", f"--kubeconfig={admin}"),
                    *(f"--namespace={ns}", "--pod=victim", f"--before={stamp}"),
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )
        else:
            request_rotation(rest, ns, "victim", before)
        kill = switch.wait()

        # Whatever the moment, the files hold one whole credential: the old one or the new.
        found = layout(volume)
        current = credential(path)  # raises unless key and chain are whole and match
        assert current is not None
        new = current.leaf != old
        if new:
            issued = {issued_leaf(p) for p in requests_by_pod(rest, ns)["victim"]}
            assert current.leaf in issued, "the new credential is one the signer issued"
        if found.writing:
            moment = "mid-write, " + ("new version swapped in" if new else "old version in place")
        else:
            moment = "after the write" if new else "before the write"
        trigger = "write seen" if kill.trigger == "condition" else kill.trigger
        outcomes.append(f"{trigger} {kill.after * 1000:.0f} ms: {moment}")

        # The next start completes the rotation: a credential issued after `before`.
        shim = start_shim(node, root=root, log_name="kill")

        def rotated(old_serial: int = old.serial_number, since: dt.datetime = before) -> bool:
            leaf = leaf_of(path)
            return (
                leaf is not None
                and leaf.serial_number != old_serial
                and issued_after(rest, ns, "victim", leaf.serial_number, since)
                and layout(volume).clean
            )

        eventually(rotated, timeout=30, what=f"round {round_}: the rotation completed")
    elapsed = time.monotonic() - started

    # Every request the killed shims left behind was still settled by the signer.
    def settled() -> list[JSON] | None:
        pcrs = requests_by_pod(rest, ns)["victim"]
        return pcrs if all(outcome(p) for p in pcrs) else None

    pcrs = eventually(settled, timeout=10)
    assert {outcome(p) for p in pcrs} == {"Issued"}
    # At most two requests a round, so no request loop: the one completing the rotation, and
    # the one a kill orphaned before its credential was written or, when the kill came after
    # the write, the one the restart makes because a credential found on disk is dated by its
    # notBefore (backdated 60 s), which is before the rotate-before instant.
    assert len(pcrs) <= 1 + 2 * KILL_ROUNDS
    assert "credential on disk is unusable" not in shim.output(), "a torn credential was seen"
    assert "volume unreadable" not in shim.output()
    print(f"{KILL_ROUNDS} kill rounds (seed {seed}) in {elapsed:.1f}s, {len(pcrs)} requests:")
    print("\n".join(f"  {i}: {line}" for i, line in enumerate(outcomes)))
    assert any("mid-write" in line for line in outcomes), "no kill landed mid-write"


def test_a_first_write_killed_between_its_swap_and_its_link_is_completed_by_the_next_start(
    private: DevCluster,
    signer: processes.Signer,
    start_shim: StartShim,
    rest: Rest,
    ns: str,
    work: Path,
) -> None:
    """The kill lands after `..data` names the new version but before `credentialbundle.pem`
    links to it, so the pod sees no file. The next start finds the content current and does not
    write it again; it must still finish the write (found by this module: it did not)."""
    node, root = "fault-node-swap", work / "root-swap"
    caught: tuple[JSON, str] | None = None
    attempts = 0
    while caught is None and attempts < 12:  # the window is one fsync: about every other try
        attempts += 1
        shim = start_shim(node, root=root, log_name="swap")
        body = pod_body(ns, f"fresh-{attempts}", node, [certificate_volume(SIGNER)])
        pod = rest.request("POST", path_of("v1", "pods", ns), body=body)
        volume = bundle_path(shim, pod).parent
        KillSwitch(shim, 3.0, partial(swapped_but_unlinked, volume, BUNDLE)).arm().wait()
        if swapped_but_unlinked(volume, BUNDLE):
            caught = pod, layout(volume).live or ""
    if caught is None:  # unlucky: make the same state by hand from a whole first write
        shim = start_shim(node, root=root, log_name="swap")
        eventually(lambda: read(volume / BUNDLE), timeout=10)
        shim.kill()
        (volume / BUNDLE).unlink()
        caught = pod, layout(volume).live or ""
    pod, version = caught
    assert read(volume / BUNDLE) is None, "the pod cannot see its credential"

    shim = start_shim(node, root=root, log_name="swap")
    found = eventually(lambda: credential(volume / BUNDLE), timeout=10, what="the link restored")
    assert (volume / BUNDLE).readlink() == Path("..data") / BUNDLE
    assert layout(volume).live == version, "finished in place, not written again"
    assert layout(volume).clean
    [pcr] = requests_by_pod(rest, ns)[pod["metadata"]["name"]]
    assert found.leaf == issued_leaf(pcr)
    print(f"SIGKILL between the swap and the link after {attempts} attempt(s); restored on restart")


def test_a_rotation_asked_while_the_signer_is_down_also_replaces_the_key_then_pending(
    private: DevCluster,
    start_shim: StartShim,
    rest: Rest,
    ns: str,
    work: Path,
) -> None:
    """An operator re-keys during a signer outage: the request made before the rotate-before
    instant is issued after it, yet its key predates it, so it is replaced in turn (found by this
    module: the shim compared the instant with when it saw the issuance, and kept the key)."""
    late_signer, node = "faults.podcert.dev/late", "fault-node-late"
    shim = start_shim(node, log_name="late")
    body = pod_body(ns, "waiting", node, [certificate_volume(late_signer)])
    pod = rest.request("POST", path_of("v1", "pods", ns), body=body)
    path = bundle_path(shim, pod)
    [pending] = eventually(lambda: requests_by_pod(rest, ns).get("waiting"), timeout=10)
    assert outcome(pending) is None, "nobody serves the signer yet"
    name = pending["metadata"]["name"]

    before = dt.datetime.now(dt.UTC)
    request_rotation(rest, ns, "waiting", before)
    proc = processes.signer(private.root, work, [late_signer], namespace="podcert-faults-late")
    try:
        proc.start().wait_ready()

        def issued_pending() -> x509.Certificate | None:
            [pcr] = [p for p in requests_of(rest, ns) if p["metadata"]["name"] == name]
            return issued_leaf(pcr)

        first = eventually(issued_pending, timeout=10, what="the pending request issued")

        def replaced() -> x509.Certificate | None:  # the first may be on disk for mere ms
            leaf = leaf_of(path)
            return leaf if leaf is not None and leaf != first else None

        second = eventually(replaced, timeout=10, what="the key from before the rotation replaced")
    finally:
        proc.stop()
    pcrs = requests_by_pod(rest, ns)["waiting"]
    assert len(pcrs) == 2 and {outcome(p) for p in pcrs} == {"Issued"}
    assert issued_after(rest, ns, "waiting", second.serial_number, before)
    assert spki(second) != spki(first)
    assert shim.sample("podcert_shim_requests_total", reason="forced") == 1


# --- 4. no space left while writing a bundle ------------------------------------------------


def test_no_space_left_keeps_the_previous_bundle_reports_the_failure_and_recovers(
    private: DevCluster,
    signer: processes.Signer,
    start_shim: StartShim,
    rest: Rest,
    ns: str,
    work: Path,
) -> None:
    mount = work / "small-root"
    with small_filesystem(mount) as kind:
        shim = start_shim("fault-node-full", root=mount, log_name="full")
        try:
            pod = make_pod(rest, ns, "cramped", "fault-node-full")
            path = bundle_path(shim, pod)
            old = eventually(lambda: read(path), timeout=10)
            old_leaf = formats.load_credential(old).leaf

            filler = fill(mount)
            request_rotation(rest, ns, "cramped", dt.datetime.now(dt.UTC))
            failing = time.monotonic()
            eventually(
                lambda: shim.sample("podcert_shim_volume_writes_total", result="error") >= 2,
                timeout=15,
                what="two failed writes",
            )
            # Reported: an error line naming the cause (and the path, never the content).
            reported = [m for m in errors_logged(shim) if "no space left on device" in m]
            assert reported, errors_logged(shim)
            assert "PRIVATE KEY" not in shim.output()
            # The previous bundle is whole, unchanged and readable; no half version is left.
            assert read(path) == old
            formats.load_credential(old)
            assert layout(path.parent).clean
            assert shim.sample("podcert_shim_projections", signer_name=SIGNER, state="fresh") == 1
            # The new certificate was issued once; retries write it, they do not ask again.
            pcrs = requests_by_pod(rest, ns)["cramped"]
            assert len(pcrs) == 2

            filler.unlink()
            freed = time.monotonic()
            failed = shim.sample("podcert_shim_volume_writes_total", result="error")
            eventually(lambda: (leaf_of(path) or old_leaf) != old_leaf, timeout=60)
            recovered = time.monotonic()
            assert shim.sample("podcert_shim_projections", signer_name=SIGNER, state="fresh") == 1
        finally:
            shim.stop()
        written = leaf_of(path)
        pcrs = requests_by_pod(rest, ns)["cramped"]
        assert len(pcrs) == 2 and {outcome(p) for p in pcrs} == {"Issued"}
        assert written in {issued_leaf(p) for p in pcrs} and written != old_leaf
        assert layout(path.parent).clean
    print(
        f"on a {kind}: {failed:.0f} writes failed over {freed - failing:.1f}s, the old bundle "
        f"intact throughout; the new one landed {recovered - freed:.1f}s after space returned"
    )


# --- 5. the shim's clock 3 minutes ahead of the API server's --------------------------------


def test_shim_clock_three_minutes_ahead_gets_valid_credentials_and_does_not_rekey(
    private: DevCluster,
    signer: processes.Signer,
    start_shim: StartShim,
    rest: Rest,
    ns: str,
) -> None:
    node, skew = "fault-node-skew", dt.timedelta(minutes=3)
    shim = start_shim(node, extra=[f"--clock-offset-seconds={int(skew.total_seconds())}"])
    assert "clock shifted by +180s" in shim.output()
    first = make_pod(rest, ns, "ahead-1", node)
    started = time.monotonic()
    leaf = eventually(lambda: leaf_of(bundle_path(shim, first)), timeout=10)
    took = time.monotonic() - started

    # Valid by the API server's clock (and by the shim's), and it chains to the signer's roots.
    server = dt.datetime.fromisoformat(server_now(rest, ns, "clock-probe"))
    assert leaf.not_valid_before_utc <= server < leaf.not_valid_after_utc
    assert server - leaf.not_valid_before_utc < dt.timedelta(minutes=5)
    assert leaf.not_valid_after_utc > server + skew
    trusted = formats.load_trust_bundle(signer_roots(private, SIGNER_NAMESPACE))
    held = credential(bundle_path(shim, first))
    assert held is not None
    formats.verify_chain(held, trusted, server)
    [pcr] = requests_by_pod(rest, ns)["ahead-1"]
    begin_refresh = dt.datetime.fromisoformat(pcr["status"]["beginRefreshAt"])
    assert begin_refresh > server + skew, "the refresh point is not due even on the shim's clock"

    # No re-keying loop: a pod created afterwards is served, and the first still has only its
    # one request and the same key.
    second = make_pod(rest, ns, "ahead-2", node)
    eventually(lambda: leaf_of(bundle_path(shim, second)), timeout=10)
    eventually(
        lambda: shim.sample("podcert_shim_projections", signer_name=SIGNER, state="fresh") == 2,
        timeout=5,
    )
    by_pod = requests_by_pod(rest, ns)
    assert {name: len(pcrs) for name, pcrs in by_pod.items()} == {"ahead-1": 1, "ahead-2": 1}
    assert sample(shim.metrics(), "podcert_shim_requests_total") == 2
    assert shim.sample("podcert_shim_requests_total", reason="initial") == 2
    now_leaf = leaf_of(bundle_path(shim, first))
    assert now_leaf is not None and spki(now_leaf) == spki(leaf)
    assert not [m for m in messages(shim) if "Overdue" in m or "Expired" in m]
    print(
        f"shim {skew.total_seconds():.0f}s ahead: credential in {took:.2f}s, valid from "
        f"{leaf.not_valid_before_utc:%d %H:%M:%S} to {leaf.not_valid_after_utc:%d %H:%M:%S} "
        f"(API server at {server:%d %H:%M:%S}); refresh from {begin_refresh:%d %H:%M:%S}; "
        "one request per pod"
    )
