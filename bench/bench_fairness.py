"""One node floods the signer; how long do the other nodes wait? FIFO queue against fair queue.

    .venv/bin/python -m bench.bench_fairness [--flood 1500] [--others 4] [--interval 0.25]
        [--workers 4] [--threads 8] [--modes fifo fair limit] [--rate-limit 50:100]

On a fresh devcluster, for each mode in turn, a fresh signer name, namespace and `podcert
signer` process (as its ServiceAccount, leader election on, no audit log):

- fifo:  `--no-fair-queue`, the queue as it was (one FIFO);
- fair:  as shipped (workers take turns between nodes, then namespaces);
- limit: as shipped plus the policy's per-node rate limit (`--rate-limit` RPS:BURST).

Node `flood` makes `--flood` requests for its own pod, as fast as `--threads` create calls go
(as the node, through NodeRestriction). From the flood's first create call until the whole
flood is settled, each of the `--others` nodes makes one request for its own pod every
`--interval` seconds. A watch started beforehand times every settlement. Reported: the other
nodes' latency (create call started -> settlement seen by the watch) p50 / p99 / max, and the
flood's throughput (settled per second between its 10% and 90% marks) and duration (first
create call -> last settlement).
"""

from __future__ import annotations

import argparse
import base64
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.bench_time_to_credential import devcluster, percentile, prepare_namespace
from devcluster import kube, processes
from podcert.api import keys
from podcert.api.requests import outcome
from podcert.client.rest import ApiError, Rest, path_of

PCRS = "certificates.k8s.io/v1"
FLOOD_NODE = "flood"


class Observer:
    """When each request of a namespace settled (monotonic seconds), by a watch."""

    def __init__(self, rest: Rest, namespace: str) -> None:
        self.rest = rest
        self.path = path_of(PCRS, "podcertificaterequests", namespace)
        self.version = rest.request("GET", self.path)["metadata"]["resourceVersion"]
        self.settled: dict[str, float] = {}
        self.outcomes: dict[str, str] = {}
        self.cond = threading.Condition()
        self.stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                for event in self.rest.watch(self.path, self.version, timeout_seconds=60):
                    obj = event["object"]
                    self.version = obj["metadata"]["resourceVersion"]
                    if event["type"] == "BOOKMARK":
                        continue
                    name, settled = obj["metadata"]["name"], outcome(obj)
                    if settled is not None and name not in self.settled:
                        with self.cond:
                            self.settled[name] = time.monotonic()
                            self.outcomes[name] = settled
                            self.cond.notify_all()
            except ApiError:
                self.stop.wait(0.2)

    def wait_for(self, names: Sequence[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(n in self.settled for n in names):
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sum(1 for n in names if n not in self.settled)
                    raise TimeoutError(f"{missing} of {len(names)} requests never settled")
                self.cond.wait(min(left, 1.0))


class Node:
    """One node's identity and the spec of a request for its own pod."""

    def __init__(self, root: Path, admin: Rest, namespace: str, name: str, signer: str) -> None:
        self.name = name
        self.rest = Rest(kube.api_client(kube.node_kubeconfig(root, name)))
        self.path = path_of(PCRS, "podcertificaterequests", namespace)
        pod = kube.create_pod(
            kube.admin_client(root),
            namespace,
            f"pod-{name}",
            node=name,
            volumes=[kube.pod_certificate_volume(signer)],
        )
        node = admin.request("GET", path_of("v1", "nodes", None, name))
        sa = admin.request("GET", path_of("v1", "serviceaccounts", namespace, "default"))
        key = keys.generate("ECDSAP256")  # one key: the bench measures the signer, not keygen
        self.spec = {
            "signerName": signer,
            "podName": pod.metadata.name,
            "podUID": pod.metadata.uid,
            "serviceAccountName": "default",
            "serviceAccountUID": sa["metadata"]["uid"],
            "nodeName": name,
            "nodeUID": node["metadata"]["uid"],
            "stubPKCS10Request": base64.b64encode(keys.stub_csr(key)).decode(),
        }

    def request(self, name: str = "", prefix: str = "") -> str:
        """Create one request; returns its name."""
        meta = {"name": name} if name else {"generateName": prefix}
        body = {"apiVersion": PCRS, "kind": "PodCertificateRequest", "metadata": meta}
        body["spec"] = self.spec
        for _ in range(100):
            try:
                return str(self.rest.request("POST", self.path, body=body)["metadata"]["name"])
            except ApiError as err:
                # NodeRestriction reads pods from an informer: a pod created a moment ago may
                # not be there yet (a retryable 500); generateName may collide (409).
                if err.status not in (409, 500):
                    raise
                time.sleep(0.1)
        raise RuntimeError(f"{self.name}: could not create a request")


@dataclass(frozen=True)
class Result:
    mode: str
    others: list[float]  # latencies, seconds
    flood_rate: float  # settled per second, 10%-90%
    flood_seconds: float  # first create call -> last settled
    create_seconds: float  # first create call -> last create call returned
    outcomes: dict[str, int]


def run_mode(root: Path, work: Path, mode: str, args: argparse.Namespace) -> Result:
    signer = f"{mode}.bench.podcert.dev/fairness"
    namespace = f"fairness-{mode}"
    admin = prepare_namespace(root, namespace)
    flooder = Node(root, admin, namespace, FLOOD_NODE, signer)
    others = [Node(root, admin, namespace, f"other-{i}", signer) for i in range(args.others)]
    extra = [f"--workers={args.workers}"]
    if mode == "fifo":
        extra.append("--no-fair-queue")
    if mode == "limit":
        rate, burst = args.rate_limit.split(":")
        policy = work / f"policy-{mode}.yaml"
        policy.write_text(
            f"signers:\n  - name: {signer}\n"
            f"    rateLimit: {{perNode: {{requestsPerSecond: {rate}, burst: {burst}}}}}\n"
        )
        extra.append(f"--policy={policy}")
    proc = processes.signer(root, work, [signer], namespace=f"podcert-{mode}", extra=extra)
    proc.start()
    try:
        proc.wait_ready(60)
        observer = Observer(admin, namespace)
        flood_names: list[str] = []
        other_started: dict[str, float] = {}
        stop = threading.Event()
        begun = time.monotonic()

        def make_flood() -> None:
            with ThreadPoolExecutor(args.threads) as pool:
                flood_names.extend(
                    pool.map(lambda _: flooder.request(prefix="flood-"), range(args.flood))
                )

        def make_others(node: Node) -> None:
            for i in range(1_000_000):
                started = time.monotonic()
                name = node.request(name=f"{node.name}-{i}")
                other_started[name] = started
                if stop.wait(args.interval):
                    return

        creator = threading.Thread(target=make_flood, daemon=True)
        creator.start()
        askers = [threading.Thread(target=make_others, args=(n,), daemon=True) for n in others]
        for asker in askers:
            asker.start()
        creator.join()
        created = time.monotonic()
        observer.wait_for(flood_names, timeout=900)
        stop.set()
        for asker in askers:
            asker.join(30)
        observer.wait_for(list(other_started), timeout=60)
        observer.stop.set()
    finally:
        if not proc.running:
            print(proc.output()[-2000:])
        proc.stop()
    times = sorted(observer.settled[n] for n in flood_names)
    low, high = len(times) // 10, len(times) - len(times) // 10 - 1
    counts: dict[str, int] = {}
    for kind in observer.outcomes.values():
        counts[kind] = counts.get(kind, 0) + 1
    return Result(
        mode=mode,
        others=[observer.settled[n] - t for n, t in other_started.items()],
        flood_rate=(high - low) / max(times[high] - times[low], 1e-3),
        flood_seconds=times[-1] - begun,
        create_seconds=created - begun,
        outcomes=counts,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flood", type=int, default=1500, help="requests the flooding node makes")
    parser.add_argument("--others", type=int, default=4, help="other nodes, one request each")
    parser.add_argument(
        "--interval", type=float, default=0.25, help="seconds between an other node's requests"
    )
    parser.add_argument("--workers", type=int, default=4, help="signer workers")
    parser.add_argument("--threads", type=int, default=8, help="the flood's concurrent creates")
    parser.add_argument(
        "--modes", nargs="+", default=["fifo", "fair", "limit"], choices=["fifo", "fair", "limit"]
    )
    parser.add_argument(
        "--rate-limit", default="50:100", help="the limit mode's per-node RPS:BURST"
    )
    args = parser.parse_args()
    print(
        f"flood: {args.flood} requests from 1 node ({args.threads} create threads); "
        f"{args.others} other nodes, one request each every {args.interval}s; "
        f"signer --workers={args.workers}; limit mode: {args.rate_limit} per node"
    )
    print(
        f"{'mode':>6} {'others':>6} {'p50 s':>7} {'p99 s':>7} {'max s':>7}"
        f" {'flood/s':>8} {'flood s':>8} {'created s':>9}  outcomes"
    )
    with devcluster("podcert-bench-fairness-") as (root, work):
        for mode in args.modes:
            r = run_mode(root, work, mode, args)
            print(
                f"{r.mode:>6} {len(r.others):>6} {percentile(r.others, 50):>7.3f}"
                f" {percentile(r.others, 99):>7.3f} {max(r.others):>7.3f}"
                f" {r.flood_rate:>8.0f} {r.flood_seconds:>8.1f} {r.create_seconds:>9.1f}"
                f"  {show(r.outcomes)}",
                flush=True,
            )


def show(counts: dict[str, Any]) -> str:
    return " ".join(f"{k} {v}" for k, v in sorted(counts.items()))


if __name__ == "__main__":
    main()
