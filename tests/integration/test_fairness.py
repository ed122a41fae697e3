"""One node must not starve the others. Against the real API server, with
nodes' own identities: a node that floods the signer with requests for its own pod does not
hold back another node's request (the fair queue), and the policy's per-node rate limit holds
a flooding node near its rate while other nodes are served at once.

Every settlement is timed by a watch started before the requests, so the order and the times
asserted are those the API server saw, not those of a polling loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devcluster import processes
from devcluster.testing import DevCluster
from podcert.api import keys
from podcert.api.requests import outcome
from podcert.client.rest import JSON, ApiError, Rest, path_of
from tests.integration.helpers import PCRS, make_pod, pcr_spec

FLOOD = 400  # requests node A makes for its own pod
RATE, BURST = 20.0, 20  # the rate-limit test's per-node limit
RATE_FLOOD = 200  # requests node A makes under that limit: about 9 s of issuance


@dataclass(frozen=True)
class Settled:
    name: str
    outcome: str
    at: float  # time.monotonic() when the watch delivered it


class Settlements:
    """Every request of a namespace that settles, in the order the watch delivers them."""

    def __init__(self, devcluster: DevCluster, namespace: str) -> None:
        self.rest = Rest(devcluster.admin)
        self.path = path_of(PCRS, "podcertificaterequests", namespace)
        self.version = self.rest.request("GET", self.path)["metadata"]["resourceVersion"]
        self.order: list[Settled] = []
        self._seen: set[str] = set()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for event in self.rest.watch(self.path, self.version, timeout_seconds=30):
                    obj = event["object"]
                    self.version = obj["metadata"]["resourceVersion"]
                    if event["type"] == "BOOKMARK":
                        continue
                    name, settled = obj["metadata"]["name"], outcome(obj)
                    if settled is None or name in self._seen:
                        continue
                    with self._cond:
                        self._seen.add(name)
                        self.order.append(Settled(name, settled, time.monotonic()))
                        self._cond.notify_all()
                    if self._stop.is_set():
                        return
            except ApiError:
                if self._stop.wait(0.2):
                    return

    def wait(
        self, done: Callable[[list[Settled]], bool], timeout: float, what: str
    ) -> list[Settled]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not done(self.order):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"timed out after {timeout}s waiting for {what}; "
                        f"{len(self.order)} settled so far"
                    )
                self._cond.wait(left)
            return list(self.order)

    def close(self) -> None:
        self._stop.set()


def flood(devcluster: DevCluster, pod: Any, signer: str, count: int) -> list[JSON]:
    """`count` requests for `pod`, created as its node from 8 threads, as fast as they go."""
    spec = pcr_spec(devcluster, pod, signer, keys.generate("ECDSAP256"))
    node = Rest(devcluster.node(pod.spec.node_name))
    path = path_of(PCRS, "podcertificaterequests", pod.metadata.namespace)
    body = {
        "apiVersion": PCRS,
        "kind": "PodCertificateRequest",
        "metadata": {"generateName": "flood-"},
        "spec": spec,
    }

    def one(_: int) -> JSON:
        deadline = time.monotonic() + 30
        while True:
            try:
                return node.request("POST", path, body=body)
            except ApiError as err:
                # NodeRestriction reads pods from an informer: a pod made a moment ago may not
                # be there yet (a retryable 500); generateName may collide (409).
                if err.status not in (409, 500) or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(count)))


def lone_request(devcluster: DevCluster, pod: Any, signer: str, name: str) -> JSON:
    """One request made by `pod`'s node, under a fixed name."""
    spec = pcr_spec(devcluster, pod, signer, keys.generate("ECDSAP256"))
    body = {
        "apiVersion": PCRS,
        "kind": "PodCertificateRequest",
        "metadata": {"name": name},
        "spec": spec,
    }
    path = path_of(PCRS, "podcertificaterequests", pod.metadata.namespace)
    return Rest(devcluster.node(pod.spec.node_name)).request("POST", path, body=body)


def start_signer(
    devcluster: DevCluster, work: Path, signer: str, namespace: str, *extra: str
) -> processes.Signer:
    return processes.signer(
        devcluster.root, work, [signer], namespace=namespace, extra=list(extra)
    ).start()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    return tmp_path


@pytest.mark.parametrize(
    ("queue_flag", "fair"),
    [
        pytest.param("--fair-queue", True, id="fair queue: the lone request goes among the first"),
        pytest.param("--no-fair-queue", False, id="FIFO: the lone request waits for the flood"),
    ],
)
def test_a_flooding_node_does_not_hold_back_another_nodes_request(
    devcluster: DevCluster, work: Path, queue_flag: str, fair: bool
) -> None:
    """Node A has made FLOOD requests for its own pod, then node B makes one, before the
    signer comes up: its queue starts with the flood ahead of B's request (B's name sorts
    last, and the list the signer starts from is in name order). The fair queue serves B
    among the first; the old FIFO serves it after the whole flood, which is what shows that
    this test can tell them apart."""
    tag = "fair" if fair else "fifo"
    signer = f"{tag}.podcert.dev/flood"
    ns = devcluster.namespace(f"flood-{tag}")
    flooded = make_pod(devcluster, ns, "flooded", signer, node=f"{tag}-node-a")
    other = make_pod(devcluster, ns, "other", signer, node=f"{tag}-node-b")
    settlements = Settlements(devcluster, ns)
    proc: processes.Signer | None = None
    try:
        flood(devcluster, flooded, signer, FLOOD)
        lone = lone_request(devcluster, other, signer, "zzz-lone")["metadata"]["name"]
        proc = start_signer(devcluster, work, signer, f"podcert-{tag}", queue_flag)
        proc.wait_ready(60)
        order = settlements.wait(
            lambda seen: any(s.name == lone for s in seen), 120, "node B's request"
        )
        position = next(i for i, s in enumerate(order) if s.name == lone)
        assert order[position].outcome == "Issued"
        if fair:
            # Served in the first round; a few of A's may be in the workers' hands already.
            assert position < 10, f"B's request settled after {position} of A's"
        else:
            assert position >= FLOOD * 3 // 4, f"FIFO settled B's request {position}th"
        everything = settlements.wait(lambda seen: len(seen) > FLOOD, 120, "the whole flood")
        assert {s.outcome for s in everything} == {"Issued"}, "the flood is not denied either"
    finally:
        settlements.close()
        if proc is not None:
            proc.stop()


def test_the_per_node_rate_limit_holds_a_flooding_node_and_not_the_others(
    devcluster: DevCluster, work: Path
) -> None:
    signer = "ratelimit.podcert.dev/flood"
    policy = work / "policy.yaml"
    policy.write_text(
        f"signers:\n  - name: {signer}\n"
        f"    rateLimit: {{perNode: {{requestsPerSecond: {RATE}, burst: {BURST}}}}}\n"
    )
    ns = devcluster.namespace("ratelimit")
    flooded = make_pod(devcluster, ns, "flooded", signer, node="ratelimit-node-a")
    other = make_pod(devcluster, ns, "other", signer, node="ratelimit-node-b")
    proc = start_signer(devcluster, work, signer, "podcert-ratelimit", f"--policy={policy}")
    settlements = Settlements(devcluster, ns)
    try:
        proc.wait_ready()
        creator = threading.Thread(target=flood, args=(devcluster, flooded, signer, RATE_FLOOD))
        creator.start()
        # Node B asks once node A's flood is under way and its burst is spent.
        settlements.wait(lambda seen: len(seen) >= BURST, 60, "node A's burst")
        asked = time.monotonic()
        lone = lone_request(devcluster, other, signer, "zzz-lone")["metadata"]["name"]
        order = settlements.wait(
            lambda seen: any(s.name == lone for s in seen), 30, "node B's request"
        )
        b = next(s for s in order if s.name == lone)
        assert b.outcome == "Issued"
        assert b.at - asked < 5.0, f"node B waited {b.at - asked:.1f}s behind node A's limit"
        a_so_far = sum(1 for s in order if s.name != lone)
        assert a_so_far <= RATE_FLOOD // 2, f"{a_so_far} of A's settled already: not limited"
        creator.join(120)

        everything = settlements.wait(
            lambda seen: len(seen) > RATE_FLOOD, 120, "the whole rate-limited flood"
        )
        a = [s for s in everything if s.name != lone]
        assert {s.outcome for s in a} == {"Issued"}, "held back, never denied"
        # The token bucket's promise, checked at every issuance: no more than the burst plus
        # the rate times the time since the first (with a little room for watch delivery).
        first = a[0].at
        for count, s in enumerate(a, start=1):
            allowed = BURST + RATE * (s.at - first)
            assert count <= allowed * 1.1 + 3, f"{count} issued {s.at - first:.2f}s in"
        # ... and near the rate once the burst is gone, not far below it.
        steady = (len(a) - BURST - 1) / (a[-1].at - a[BURST].at)
        assert 0.75 * RATE <= steady <= 1.25 * RATE, f"{steady:.1f}/s against {RATE}/s"
        assert sample(proc, "podcert_signer_rate_limited_total", signer) >= RATE_FLOOD // 2
    finally:
        settlements.close()
        proc.stop()


def sample(proc: processes.Signer, metric: str, signer: str) -> float:
    for line in proc.metrics().splitlines():
        if line.startswith(metric + "{") and f'signer_name="{signer}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0
