"""Issuance throughput against the API server's own status-write ceiling, in one run.

    .venv/bin/python -m bench.bench_issuance [--requests 2000] [--workers 1 2 4 8]
                                             [--rounds 3] [--pin]

On a fresh devcluster: N pods spread over several nodes, one pending PodCertificateRequest each
(made as the node). The ceiling is a minimal writer that only PUTs precomputed certificates into
status, with the same client, the same identity (the signer's ServiceAccount and RBAC) and the
same number of threads; then `podcert signer --workers W`, as shipped (leader election, audit
log, INFO logs), settles a fresh batch. Both are timed by the same watch over the steady state
(10%-90% of the batch) and give requests/second; the ratio is signer / ceiling. Each worker
count runs `--rounds` ceiling/signer pairs back to back and reports the medians, because a
shared two-core VM drifts by +-20% from one minute to the next. CPU milliseconds per request
of every process show where the time goes.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import os
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from bench.bench_time_to_credential import component_pids, cpu_of
from devcluster import cluster, kube, processes
from podcert.api import keys
from podcert.rest import JSON, ApiError, Rest, load_client, path_of
from signer import ca, certs, model, objects
from signer.csr import parse_public_key

PCRS = "certificates.k8s.io/v1"
NODES = 4


def make_requests(root: Path, namespace: str, signer: str, count: int) -> list[JSON]:
    """`count` pods over NODES nodes and one PCR each, created by each pod's node."""
    admin = kube.admin_client(root)
    kube.ensure_namespace(admin, namespace)
    node_apis = {
        f"node-{i}": Rest(kube.api_client(kube.node_kubeconfig(root, f"node-{i}")))
        for i in range(NODES)
    }
    rest = Rest(admin)
    nodes = {n: rest.request("GET", path_of("v1", "nodes", None, n)) for n in node_apis}
    kube.ensure_service_account(admin, namespace, "default")
    sa = rest.request("GET", path_of("v1", "serviceaccounts", namespace, "default"))
    key = keys.generate("ECDSAP256")  # one key: the bench measures the signer, not keygen
    csr = base64.b64encode(keys.stub_csr(key)).decode()
    volume = kube.pod_certificate_volume(signer)

    def pod(i: int) -> Any:
        return kube.create_pod(
            admin, namespace, f"p{i}", node=f"node-{i % NODES}", volumes=[volume]
        )

    def one(i: int, pod: Any) -> JSON:
        node = f"node-{i % NODES}"
        body = {
            "apiVersion": PCRS,
            "kind": "PodCertificateRequest",
            "metadata": {"generateName": f"p{i}-"},
            "spec": {
                "signerName": signer,
                "podName": pod.metadata.name,
                "podUID": pod.metadata.uid,
                "serviceAccountName": "default",
                "serviceAccountUID": sa["metadata"]["uid"],
                "nodeName": node,
                "nodeUID": nodes[node]["metadata"]["uid"],
                "stubPKCS10Request": csr,
            },
        }
        path = path_of(PCRS, "podcertificaterequests", namespace)
        for _ in range(50):
            try:
                return node_apis[node].request("POST", path, body=body)
            except ApiError as err:
                # NodeRestriction reads pods from an informer: a pod created a moment ago may
                # not be there yet (the API server says so with a 500 / retryable error).
                if err.status not in (409, 500):
                    raise
                time.sleep(0.1)
        raise RuntimeError(f"could not create the request for pod {i}")

    with ThreadPoolExecutor(8) as pool:
        pods = list(pool.map(pod, range(count)))
        return list(pool.map(one, range(count), pods))


class Observer:
    """Times issued requests in a namespace by a watch, the same way for both writers: the
    steady state between the 10% and the 90% mark of the batch, so neither side's start-up
    (the signer lists every pod first) nor the last stragglers count. The CPU time each
    process used between those two marks is sampled too. Only Issued counts toward the rate:
    a request denied or failed is settled (the watch stops waiting for it) but reported apart,
    so a signer that denies fast cannot look like one that issues fast."""

    def __init__(self, root: Path, namespace: str, count: int, pids: dict[str, int]) -> None:
        self.rest = Rest(kube.admin_client(root))
        self.path = path_of(PCRS, "podcertificaterequests", namespace)
        self.version = self.rest.request("GET", self.path)["metadata"]["resourceVersion"]
        self.count = count
        self.marks = (count // 10, count - count // 10)
        self.pids = pids
        self.settled: set[str] = set()
        self.outcomes: Counter[str] = Counter()
        self.times: list[float] = []
        self.cpu: list[dict[str, float]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while len(self.settled) < self.count:
            for event in self.rest.watch(self.path, self.version, timeout_seconds=60):
                obj = event["object"]
                self.version = obj["metadata"]["resourceVersion"]
                name = obj["metadata"]["name"]
                outcome = objects.outcome(obj)
                if outcome and name not in self.settled:
                    self.settled.add(name)
                    self.outcomes[outcome] += 1
                    if outcome == "Issued" and self.outcomes["Issued"] in self.marks:
                        self.times.append(time.monotonic())
                        self.cpu.append(cpu_of(self.pids))
                    if len(self.settled) >= self.count:
                        return

    def result(self, timeout: float = 600.0) -> Phase:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"only {len(self.settled)} of {self.count} settled")
        denied, failed = self.outcomes["Denied"], self.outcomes["Failed"]
        if len(self.times) < len(self.marks):
            raise RuntimeError(
                f"only {self.outcomes['Issued']} of {self.count} issued "
                f"({denied} denied, {failed} failed): no steady issuance to time"
            )
        issued = self.marks[1] - self.marks[0]
        first, last = self.cpu
        cpu_ms = {
            name: (last[name] - first[name]) * 1000 / issued for name in last if name in first
        }
        return Phase(
            issued / max(self.times[1] - self.times[0], 1e-3), cpu_ms, denied=denied, failed=failed
        )


@dataclass(frozen=True)
class Phase:
    rate: float  # requests issued per second
    cpu_ms: dict[str, float]  # CPU milliseconds per issued request, by process
    denied: int = 0  # requests of the batch denied instead (not in the rate)
    failed: int = 0  # ... and failed


def ceiling(
    root: Path, namespace: str, pcrs: list[JSON], workers: int, pids: dict[str, int]
) -> Phase:
    """A writer that only PUTs a precomputed certificate into status, with `workers` threads,
    as the signer's own ServiceAccount: the API server authenticates, authorizes (RBAC, and
    `sign` on the signer name) and schedules it exactly as it does the signer."""
    bundle = ca.new_ca("bench", dt.datetime.now(dt.UTC))
    issuer = ca.issuing_ca(bundle)
    now = dt.datetime.now(dt.UTC)
    first = objects.request_from(pcrs[0])
    plan = model.LeafPlan(
        public_key=parse_public_key(first).public_key,
        spiffe_id="spiffe://bench/ns/x/sa/y",
        dns_names=(),
        not_before=certs.truncate_to_second(now - dt.timedelta(minutes=1)),
        not_after=certs.truncate_to_second(now + dt.timedelta(hours=2)),
        begin_refresh_at=certs.truncate_to_second(now + dt.timedelta(hours=1)),
    )
    chain = certs.sign_leaf(plan, issuer, certs.random_serial())
    signer = objects.request_from(pcrs[0]).signer_name
    identity = processes.install_signer_identity(root, f"{namespace}-writer", [signer], namespace)
    rest = Rest(load_client(identity))

    def put(pcr: JSON) -> None:
        body = objects.issued_status(pcr, chain, plan, now)
        body.update({"apiVersion": PCRS, "kind": "PodCertificateRequest"})
        meta = pcr["metadata"]
        rest.request(
            "PUT",
            path_of(PCRS, "podcertificaterequests", meta["namespace"], meta["name"]) + "/status",
            body=body,
        )

    observer = Observer(root, namespace, len(pcrs), pids)
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(put, pcrs))
    return observer.result()


def signer_phase(
    root: Path, work: Path, signer: str, namespace: str, count: int, workers: int
) -> Phase:
    """`podcert signer --workers W` as shipped (leader election, audit log, INFO logs);
    its start-up is left out."""
    proc = processes.signer(
        root,
        work,
        [signer],
        namespace=f"{namespace}-signer",
        extra=[f"--workers={workers}", f"--audit-log={work / namespace / 'audit.jsonl'}"],
    )
    proc.start()
    observer = Observer(root, namespace, count, component_pids(root, ("signer", proc)))
    try:
        return observer.result()
    finally:
        if not proc.running:
            print(proc.output()[-2000:])
        proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument(
        "--rounds", type=int, default=3, help="ceiling/signer pairs per worker count (median)"
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="kube-apiserver and etcd on CPU 0, this benchmark and the signer on CPU 1",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="podcert-bench-") as tmp:
        root = Path(tmp) / "cluster"
        state = cluster.up(root)
        if args.pin:
            pin(state)
        try:
            print(f"requests per batch: {args.requests}, nodes: {NODES}, rounds: {args.rounds}")
            print(
                f"{'workers':>7} {'round':>5} {'ceiling/s':>9} {'signer/s':>8} {'ratio':>5}"
                "   CPU ms/request (ceiling | signer run)"
            )
            for workers in args.workers:
                tops, gots, ratios = [], [], []
                for r in range(args.rounds):
                    top, got = one_round(
                        root, Path(tmp), f"w{workers}-r{r}", args.requests, workers, r
                    )
                    tops.append(top.rate)
                    gots.append(got.rate)
                    ratios.append(got.rate / top.rate)
                    print(
                        f"{workers:>7} {r + 1:>5} {top.rate:>9.0f} {got.rate:>8.0f}"
                        f" {ratios[-1]:>5.2f}   {show_cpu(top.cpu_ms)} | {show_cpu(got.cpu_ms)}"
                        f"{show_not_issued(top, got)}",
                        flush=True,
                    )
                print(
                    f"{workers:>7} {'median':>5} {median(tops):>9.0f} {median(gots):>8.0f}"
                    f" {median(ratios):>5.2f}",
                    flush=True,
                )
        finally:
            cluster.down(root)


def one_round(
    root: Path, work: Path, ns: str, count: int, workers: int, index: int
) -> tuple[Phase, Phase]:
    """A fresh batch for each side, then the two runs back to back, in alternating order so
    drift of the VM hits both sides alike; then the batches are deleted. Each side has its own
    signer name, so the signer never touches the writer's batch."""
    signer = f"bench.podcert.dev/w{workers}"
    pcrs = make_requests(root, f"{ns}-ceiling", f"{signer}-ceiling", count)
    make_requests(root, f"{ns}-signer", signer, count)

    def run_ceiling() -> Phase:
        return ceiling(root, f"{ns}-ceiling", pcrs, workers, component_pids(root))

    def run_signer() -> Phase:
        return signer_phase(root, work, signer, f"{ns}-signer", count, workers)

    if index % 2:
        got, top = run_signer(), run_ceiling()
    else:
        top, got = run_ceiling(), run_signer()
    for side in ("ceiling", "signer"):
        clear(root, f"{ns}-{side}")
    return top, got


def clear(root: Path, namespace: str) -> None:
    """Delete a batch's pods and requests, so the cluster (and the pod list every signer run
    starts with) does not grow from one round to the next."""
    rest = Rest(kube.admin_client(root))
    now = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
    for gv, resource in (("v1", "pods"), (PCRS, "podcertificaterequests")):
        rest.request("DELETE", path_of(gv, resource, namespace), body=now)


def pin(state: cluster.State) -> None:
    """Give the control plane and the clients a core each, as separate machines would: on a
    shared pair of cores every millisecond a client spends is taken from the API server, and
    the ratio then measures CPU competition more than how close the signer comes to the API
    server's ceiling. Threads started later inherit their creator's set."""
    for pid, cpus in ((state.apiserver_pid, {0}), (state.etcd_pid, {0}), (os.getpid(), {1})):
        for task in Path(f"/proc/{pid}/task").iterdir():
            os.sched_setaffinity(int(task.name), cpus)


def show_not_issued(top: Phase, got: Phase) -> str:
    """The requests that ended other than Issued, by side; empty when every one was issued."""
    parts = [
        f"{side}: {phase.denied} denied, {phase.failed} failed"
        for side, phase in (("ceiling", top), ("signer", got))
        if phase.denied or phase.failed
    ]
    return f"   NOT ISSUED {'; '.join(parts)}" if parts else ""


def show_cpu(cpu_ms: dict[str, float]) -> str:
    short = {"kube-apiserver": "api", "etcd": "etcd", "bench": "bench", "signer": "signer"}
    return " ".join(f"{short.get(k, k)} {v:.2f}" for k, v in sorted(cpu_ms.items()))


if __name__ == "__main__":
    main()
