"""A re-key storm: every kubelet of a cluster restarts at once (a rolling upgrade done fast), and
each projection on each node asks for a certificate again. How fast does the signer drain it, is
it fair between nodes, is every request answered exactly once, and does it stay healthy and
within its memory limit while it does?

    .venv/bin/python -m bench.bench_storm [--requests 20000] [--nodes 200] [--workers 8]
        [--no-peer] [--peer PATH] [--profile DIR]

On a fresh devcluster 1.37: `--requests` pods spread evenly over `--nodes` nodes and one pending
PodCertificateRequest each, made as its pod's node (through NodeRestriction), all before the
signer starts, as a restart of every kubelet leaves them. Then `podcert signer --workers W` as
shipped (its ServiceAccount, leader election, the fsynced audit log, INFO logs) drains them,
while:

- a watch stamps each request's terminal condition: the drain rate over the 10-90 % window, and
  for each node the moment its last request was settled (from the signer's exec): fairness is
  the slowest node's last over the fastest node's last (1.0: every node done together);
- `/healthz` is asked every 0.2 s: how many answers were not 200, and the longest time without a
  200;
- the signer's peak RSS (VmHWM) against the shipped limit (`manifests/signer/deployment.yaml`);
- "answered once": every request ends with exactly one terminal condition, and the audit log
  holds exactly one decision per request.

Unless `--no-peer`, the Go signer of `bench.peer` then drains a storm of the same size on a fresh
devcluster of its own (it reconciles every request in the cluster), for the rate ratio, timed by
the same watch. The Go signer has no /healthz here and no audit log.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import yaml

from bench import peer
from bench.bench_issuance import PCRS, compiled, load, make_requests, podcert_signer, py_spy
from bench.bench_time_to_credential import rss_mib
from devcluster import cluster, kube
from podcert.api.requests import outcome as pcr_outcome
from podcert.client.rest import Rest, path_of

REPO: Final = Path(__file__).resolve().parents[1]
PROBE_EVERY: Final = 0.2  # seconds between /healthz probes and RSS samples


class StormWatch:
    """Every request of a namespace settled, by a watch started before the signer: when, on
    which node, and how. A request settled twice (a second terminal status) is counted too."""

    def __init__(self, root: Path, namespace: str, count: int) -> None:
        self.rest = Rest(kube.admin_client(root))
        self.path = path_of(PCRS, "podcertificaterequests", namespace)
        self.version = self.rest.request("GET", self.path)["metadata"]["resourceVersion"]
        self.count = count
        self.start = time.monotonic()
        self.settled: dict[str, float] = {}  # request name -> settled at (s from start)
        self.node_last: dict[str, float] = {}  # node -> its last settlement (s from start)
        self.outcomes: Counter[str] = Counter()
        self.resettled = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while len(self.settled) < self.count:
            for event in self.rest.watch(self.path, self.version, timeout_seconds=60):
                obj = event["object"]
                self.version = obj["metadata"]["resourceVersion"]
                settled = pcr_outcome(obj)
                if not settled:
                    continue
                name, at = obj["metadata"]["name"], time.monotonic() - self.start
                if name in self.settled:
                    self.resettled += 1
                    continue
                self.settled[name] = at
                self.outcomes[settled] += 1
                node = obj["spec"]["nodeName"]
                self.node_last[node] = max(self.node_last.get(node, 0.0), at)
                if len(self.settled) >= self.count:
                    return

    def wait(self, timeout: float) -> None:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"only {len(self.settled)} of {self.count} settled")

    def rate(self) -> float:
        return drain_rate(list(self.settled.values()))

    def fairness(self) -> float:
        return fairness(self.node_last)


def drain_rate(times: list[float]) -> float:
    """Settlements per second between the 10 % and the 90 % mark of `times`."""
    times = sorted(times)
    cut = len(times) // 10
    low, high = times[cut], times[len(times) - cut - 1]
    return (len(times) - 2 * cut - 1) / max(high - low, 1e-3)


def fairness(node_last: dict[str, float]) -> float:
    """The slowest node's last settlement over the fastest node's (1.0: all done together)."""
    lasts = node_last.values()
    return max(lasts) / max(min(lasts), 1e-3)


class Probe:
    """/healthz every PROBE_EVERY seconds while the drain runs, from its first 200 on (before
    it, the process is still starting): answers that were not 200 since, and the longest time
    between two 200s. Lighter than `bench_scale.Watcher`'s back-to-back probes, which would
    take CPU from the drain being timed."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/healthz"
        self.failed = 0
        self.asked = 0
        self.longest_gap = 0.0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        last_ok: float | None = None
        while not self._stop.wait(PROBE_EVERY):
            try:
                with urllib.request.urlopen(self.url, timeout=2) as resp:  # noqa: S310
                    ok = resp.status == 200
            except OSError:
                ok = False
            now = time.monotonic()
            if last_ok is None:  # starting
                last_ok = now if ok else None
                continue
            self.asked += 1
            if ok:
                self.longest_gap = max(self.longest_gap, now - last_ok)
                last_ok = now
            else:
                self.failed += 1

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)


@dataclass(frozen=True)
class Drain:
    side: str
    rate: float
    seconds: float  # exec to the last settlement
    fairness: float
    outcomes: dict[str, int]
    resettled: int
    peak_rss_mib: float | None = None
    healthz_failed: int | None = None
    healthz_asked: int | None = None
    longest_gap_s: float | None = None
    decisions_logged: Counter[int] | None = None  # entries per request -> how many requests


def shipped_limit_mib() -> float:
    """The signer container's memory limit in manifests/signer/deployment.yaml."""
    doc = yaml.safe_load((REPO / "manifests" / "signer" / "deployment.yaml").read_text())
    [container] = [
        c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == "signer"
    ]
    text = container["resources"]["limits"]["memory"]
    found = re.fullmatch(r"(\d+)Mi", text)
    if found is None:
        raise RuntimeError(f"the shipped limit {text!r} is not in Mi")
    return float(found[1])


def decisions_per_request(lines: list[str]) -> Counter[int]:
    """How many decision entries an audit log's lines hold per request, as a histogram:
    {1: 20000} when every request was answered once (checkpoint lines are not decisions)."""
    per_request: Counter[str] = Counter()
    for line in lines:
        entry = json.loads(line)
        if "decision" in entry:
            per_request[f"{entry['namespace']}/{entry['name']}"] += 1
    return Counter(per_request.values())


def podcert_drain(root: Path, work: Path, args: argparse.Namespace) -> Drain:
    namespace, signer = "storm-podcert", "bench.podcert.dev/storm-podcert"
    make_requests(root, namespace, signer, args.requests, args.nodes)
    watch = StormWatch(root, namespace, args.requests)
    proc = podcert_signer(root, work, signer, namespace, args.workers)
    proc.start()
    assert proc.proc is not None
    probe = Probe(proc.metrics_port)
    spy = None
    try:
        spy = py_spy(proc.proc.pid, args.profile / "storm.txt") if args.profile else None
        watch.wait(args.timeout)
        seconds = time.monotonic() - watch.start
        probe.stop()
        rss = rss_mib(proc.proc.pid, "VmHWM")
    finally:
        probe.stop()
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its samples on SIGINT
            spy.wait(60)
        if not proc.running:
            print(proc.output()[-2000:])
        proc.stop()
    logged = decisions_per_request((work / namespace / "audit.jsonl").read_text().splitlines())
    drain = Drain(
        "podcert",
        watch.rate(),
        seconds,
        watch.fairness(),
        dict(watch.outcomes),
        watch.resettled,
        peak_rss_mib=rss,
        healthz_failed=probe.failed,
        healthz_asked=probe.asked,
        longest_gap_s=probe.longest_gap,
        decisions_logged=logged,
    )
    print(show(drain), flush=True)
    return drain


def peer_drain(root: Path, work: Path, args: argparse.Namespace, binary: Path) -> Drain:
    namespace, signer = "storm-peer", "bench.podcert.dev/storm-peer"
    make_requests(root, namespace, signer, args.requests, args.nodes)
    watch = StormWatch(root, namespace, args.requests)
    proc = peer.Peer.for_cluster(binary, root, work, signer, args.workers)
    proc.start()
    try:
        watch.wait(args.timeout)
        seconds = time.monotonic() - watch.start
    finally:
        proc.stop()
    drain = Drain(
        "peer", watch.rate(), seconds, watch.fairness(), dict(watch.outcomes), watch.resettled
    )
    print(show(drain), flush=True)
    return drain


def show(drain: Drain) -> str:
    parts = [
        f"{drain.side:>8}: {drain.rate:.0f}/s (10-90 %), drained in {drain.seconds:.1f} s",
        f"fairness {drain.fairness:.2f}",
        f"outcomes {drain.outcomes}",
        f"settled twice {drain.resettled}",
    ]
    if drain.peak_rss_mib is not None:
        parts.append(f"peak RSS {drain.peak_rss_mib:.0f} MiB of {shipped_limit_mib():.0f}")
    if drain.healthz_asked is not None:
        parts.append(
            f"/healthz {drain.healthz_failed} of {drain.healthz_asked} not 200, longest gap "
            f"{drain.longest_gap_s:.2f} s"
        )
    if drain.decisions_logged is not None:
        parts.append(f"audit entries per request {dict(drain.decisions_logged)}")
    return "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for one drain")
    parser.add_argument("--peer", type=Path, help="the Go signer's module")
    parser.add_argument("--no-peer", action="store_true", help="leave the Go signer out")
    parser.add_argument("--profile", type=Path, help="py-spy podcert's drain into this folder")
    args = parser.parse_args()
    binary = None if args.no_peer else peer.ensure(peer.source(args.peer))
    compiled(REPO)
    print(
        f"storm: {args.requests} requests over {args.nodes} nodes, {args.workers} workers, "
        f"load average {load()}",
        flush=True,
    )
    drains = [on_fresh_cluster(lambda root, work: podcert_drain(root, work, args))]
    if binary is not None:
        drains.append(on_fresh_cluster(lambda root, work: peer_drain(root, work, args, binary)))
        print(f"podcert / Go signer, drain rate: {drains[0].rate / drains[1].rate:.2f}")
    print(f"load average at the end: {load()}")


def on_fresh_cluster(drain: Callable[[Path, Path], Drain]) -> Drain:
    """Each side on a devcluster of its own: deleting tens of thousands of objects takes the
    API server longer than making a new cluster, and the Go signer reconciles every request
    it can see."""
    with tempfile.TemporaryDirectory(prefix="podcert-storm-") as tmp:
        root = Path(tmp) / "cluster"
        cluster.up(root)
        try:
            return drain(root, Path(tmp))
        finally:
            cluster.down(root)


if __name__ == "__main__":
    main()
