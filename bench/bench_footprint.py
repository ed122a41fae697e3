"""Footprint: the shim's RSS at N projections; the signer's RSS sampled across 10,000 issuances.

    .venv/bin/python -m bench.bench_footprint [--projections 1000] [--issuances 10000]

On a fresh devcluster, the signer and a shim for node-a run as child processes; RSS is VmRSS of
the process itself from /proc/<pid>/status (VmHWM is its peak).

1. Shim: `--projections` pods on node-a, one podCertificate source each; RSS once ready with no
   pod, then once every projection is fresh. Target (DESIGN.md section 5): < 150 MB.
2. Signer: the shim is stopped; requests are made in batches of `--batch` (default 1,000) as four
   nodes would make them (pods bound to node-0..3, one PodCertificateRequest each, created by the
   node's own identity through a thread pool). After each batch is settled (the signer's own
   podcert_signer_requests counter) its RSS is sampled; then the batch's requests and pods are
   deleted, as the API server's request cleaner and pod churn would, so the objects alive stay
   bounded and growth means a leak rather than a bigger cache (`--keep` keeps everything, to see
   what the caches cost). Target: flat after warm-up, read here as the last sample within 5 % of
   the sample after `--warmup` batches.
"""

from __future__ import annotations

import argparse
import base64
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.bench_restart import populate
from bench.bench_time_to_credential import (
    create_pods,
    devcluster,
    metric_total,
    pid_of,
    prepare_namespace,
    rss_mib,
    wait_until,
)
from devcluster import kube, processes
from devcluster.stack import Stack
from podcert.api import keys
from podcert.client.rest import JSON, ApiError, Rest, path_of

PCRS = "certificates.k8s.io/v1"
NODES = 4
SHIM_TARGET_MB = 150.0
FLAT_TOLERANCE = 0.05


def issued(signer: processes.Signer) -> int:
    """Requests the signer settled (every outcome), from its own counter."""
    return int(metric_total(signer.metrics(), "podcert_signer_requests_total"))


def reached(signer: processes.Signer, count: int) -> Callable[[], bool]:
    return lambda: issued(signer) >= count


@dataclass(frozen=True)
class Batch:
    index: int
    created: float  # seconds to create the pods and requests
    settled: float  # seconds from the last create to the last settled request
    rss: float  # MiB after the batch settled
    outcomes: int  # settled requests so far (all outcomes)


class Requester:
    """Makes batches of pods and PodCertificateRequests as nodes node-0..node-3."""

    def __init__(self, root: Path, signer_name: str, threads: int) -> None:
        self.root = root
        self.signer_name = signer_name
        self.threads = threads
        self.admin = Rest(kube.admin_client(root))
        self.nodes: dict[str, tuple[Rest, str]] = {}
        for i in range(NODES):
            name = f"node-{i}"
            rest = Rest(kube.api_client(kube.node_kubeconfig(root, name)))
            node = self.admin.request("GET", path_of("v1", "nodes", None, name))
            self.nodes[name] = (rest, str(node["metadata"]["uid"]))
        # One key for every request: the benchmark measures the signer, not key generation.
        self.csr = base64.b64encode(keys.stub_csr(keys.generate("ECDSAP256"))).decode()

    def batch(self, namespace: str, count: int) -> None:
        prepare_namespace(self.root, namespace)
        sa = self.admin.request("GET", path_of("v1", "serviceaccounts", namespace, "default"))
        volume = kube.pod_certificate_volume(self.signer_name)
        by_node = {
            n: [f"p{i}" for i in range(count) if i % NODES == k] for k, n in enumerate(self.nodes)
        }
        pods: list[tuple[str, str, str]] = []  # (node, pod name, pod uid)
        for node, names in by_node.items():
            created = create_pods(self.admin, namespace, names, node, [volume], self.threads)
            if created.errors:
                raise RuntimeError(f"pod creation failed: {created.errors[:3]}")
            pods += [(node, name, uid) for name, uid in created.uids.items()]
        sa_uid = str(sa["metadata"]["uid"])

        def request(item: tuple[str, str, str]) -> JSON:
            node, name, uid = item
            rest, node_uid = self.nodes[node]
            body = {
                "apiVersion": PCRS,
                "kind": "PodCertificateRequest",
                "metadata": {"generateName": f"{name}-"},
                "spec": {
                    "signerName": self.signer_name,
                    "podName": name,
                    "podUID": uid,
                    "serviceAccountName": "default",
                    "serviceAccountUID": sa_uid,
                    "nodeName": node,
                    "nodeUID": node_uid,
                    "stubPKCS10Request": self.csr,
                },
            }
            path = path_of(PCRS, "podcertificaterequests", namespace)
            deadline = time.monotonic() + 30
            while True:
                try:
                    return rest.request("POST", path, body=body)
                except ApiError as err:
                    # NodeRestriction reads pods from an informer: a pod created a moment ago
                    # may not be there yet (a retryable 5xx/409).
                    if err.status not in (409, 500) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)

        with ThreadPoolExecutor(self.threads) as pool:
            list(pool.map(request, pods))

    def delete(self, namespace: str) -> None:
        """Delete the batch's requests and pods at once (grace 0: no kubelet runs here)."""
        self.admin.request("DELETE", path_of(PCRS, "podcertificaterequests", namespace))
        self.admin.request(
            "DELETE", path_of("v1", "pods", namespace), query={"gracePeriodSeconds": 0}
        )


def shim_footprint(stack: Stack, rest: Rest, projections: int, threads: int) -> None:
    assert stack.shim is not None
    pid = pid_of(stack.shim)
    idle = rss_mib(pid)
    setup = populate(stack, rest, projections, 1, threads, 600.0)
    rss, peak = rss_mib(pid), rss_mib(pid, "VmHWM")
    verdict = "met" if rss < SHIM_TARGET_MB else "MISSED"
    print(f"shim RSS: {idle:.1f} MiB ready with no pod")
    print(
        f"shim RSS at {setup.projections} fresh projections: {rss:.1f} MiB (peak VmHWM "
        f"{peak:.1f} MiB; target < {SHIM_TARGET_MB:.0f} MB: {verdict})"
    )


def signer_footprint(
    stack: Stack, issuances: int, batch: int, warmup: int, threads: int, keep: bool, budget: float
) -> None:
    assert stack.signer is not None
    signer = stack.signer
    pid = pid_of(signer)
    requester = Requester(stack.root, stack.signer_name, threads)
    base = issued(signer)
    print(f"signer RSS before the batches: {rss_mib(pid):.1f} MiB ({base} requests settled)")
    print(f"{'batch':>5} {'issued':>7} {'create s':>8} {'settle s':>8} {'RSS MiB':>8}")
    samples: list[Batch] = []
    started = time.monotonic()
    for index in range(issuances // batch):
        namespace = f"fp-{index}"
        t0 = time.monotonic()
        requester.batch(namespace, batch)
        t1 = time.monotonic()
        wanted = base + (index + 1) * batch
        wait_until(reached(signer, wanted), 300.0, f"batch {index} settled", 0.1)
        t2 = time.monotonic()
        sample = Batch(index, t1 - t0, t2 - t1, rss_mib(pid), issued(signer) - base)
        samples.append(sample)
        print(
            f"{index + 1:>5} {sample.outcomes:>7} {sample.created:>8.1f} {sample.settled:>8.1f} "
            f"{sample.rss:>8.1f}",
            flush=True,
        )
        if not keep:
            requester.delete(namespace)
        if time.monotonic() - started > budget and index + 1 < issuances // batch:
            print(f"STOPPED EARLY: the {budget:.0f}s budget is spent after {index + 1} batches")
            break
    text = signer.metrics()
    total = metric_total(text, "podcert_signer_requests_total")
    good = metric_total(text, "podcert_signer_requests_total", outcome="Issued")
    print(
        f"settled {total - base:.0f} requests in this phase; {total - good:.0f} of all "
        f"{total:.0f} settled were not issued; peak VmHWM {rss_mib(pid, 'VmHWM'):.1f} MiB"
    )
    if len(samples) > warmup:
        after = [s.rss for s in samples[max(warmup - 1, 0) :]]
        ref, last = after[0], after[-1]
        growth = (last - ref) / ref
        if keep:
            kept = (len(after) - 1) * batch
            per = (last - ref) * 1024 / kept if kept else 0.0
            verdict = (
                f"{per:.2f} KiB per pod + request kept (caches of live objects; the flat "
                "target is judged without --keep)"
            )
        else:
            verdict = "flat: met" if growth <= FLAT_TOLERANCE else "GROWS: missed"
        print(
            f"signer RSS after warm-up ({warmup} batches): {ref:.1f} -> {last:.1f} MiB "
            f"({growth:+.1%}; range {min(after):.1f}..{max(after):.1f}) - {verdict}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--projections", type=int, default=1000)
    parser.add_argument("--issuances", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=2, help="batches before the reference")
    parser.add_argument("--threads", type=int, default=8, help="concurrent create calls")
    parser.add_argument("--keep", action="store_true", help="do not delete settled batches")
    parser.add_argument(
        "--budget", type=float, default=900.0, help="stop adding batches after (seconds)"
    )
    args = parser.parse_args()

    with devcluster("podcert-bench-footprint-") as (root, work):
        stack = Stack(root, work, namespace="footprint")
        rest = prepare_namespace(root, stack.namespace)
        try:
            stack.start_signer()
            stack.start_shim()
            shim_footprint(stack, rest, args.projections, args.threads)
            assert stack.shim is not None
            stack.shim.stop()
            signer_footprint(
                stack,
                args.issuances,
                args.batch,
                args.warmup,
                args.threads,
                args.keep,
                args.budget,
            )
        finally:
            stack.stop()


if __name__ == "__main__":
    main()
