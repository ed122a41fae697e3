"""Issuance throughput against the API server's own status-write ceiling, in one run.

    .venv/bin/python -m bench.bench_issuance [--requests 2000] [--workers 1 2 4 8]

On a fresh devcluster: N pods spread over several nodes, one pending PodCertificateRequest each
(made as the node). The ceiling is a minimal writer that only PUTs precomputed certificates into
status, with the same client and the same number of threads; then `podcert signer` settles a
fresh batch with --workers W. Both figures are requests/second; the ratio is signer / ceiling.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from devcluster import cluster, kube, processes
from kubelet_shim import keys
from podcert.rest import JSON, ApiError, Rest, path_of
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
    """Times settled requests in a namespace by a watch, the same way for both writers: from the
    first settled request to the last, so start-up costs of either side are left out."""

    def __init__(self, root: Path, namespace: str, count: int) -> None:
        self.rest = Rest(kube.admin_client(root))
        self.path = path_of(PCRS, "podcertificaterequests", namespace)
        self.version = self.rest.request("GET", self.path)["metadata"]["resourceVersion"]
        self.count = count
        self.settled: set[str] = set()
        self.first = self.last = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while len(self.settled) < self.count:
            for event in self.rest.watch(self.path, self.version, timeout_seconds=60):
                obj = event["object"]
                self.version = obj["metadata"]["resourceVersion"]
                name = obj["metadata"]["name"]
                if objects.outcome(obj) and name not in self.settled:
                    self.last = time.monotonic()
                    self.first = self.first or self.last
                    self.settled.add(name)
                    if len(self.settled) >= self.count:
                        return

    def rate(self, timeout: float = 600.0) -> float:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"only {len(self.settled)} of {self.count} settled")
        return (self.count - 1) / max(self.last - self.first, 1e-3)


def ceiling(root: Path, namespace: str, pcrs: list[JSON], workers: int) -> float:
    """Requests/second of a writer that only PUTs a precomputed certificate into status."""
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
    rest = Rest(kube.admin_client(root))

    def put(pcr: JSON) -> None:
        body = objects.issued_status(pcr, chain, plan, now)
        body.update({"apiVersion": PCRS, "kind": "PodCertificateRequest"})
        meta = pcr["metadata"]
        rest.request(
            "PUT",
            path_of(PCRS, "podcertificaterequests", meta["namespace"], meta["name"]) + "/status",
            body=body,
        )

    observer = Observer(root, namespace, len(pcrs))
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(put, pcrs))
    return observer.rate()


def signer_rate(
    root: Path, work: Path, signer: str, namespace: str, count: int, workers: int
) -> float:
    """Requests/second of `podcert signer --workers W` (its start-up is left out)."""
    proc = processes.signer(
        root,
        work,
        [signer],
        namespace=f"bench-signer-{workers}",
        extra=[f"--workers={workers}", "--no-leader-elect", "--log-level=WARNING"],
    )
    observer = Observer(root, namespace, count)
    proc.start()
    try:
        return observer.rate()
    finally:
        if not proc.running:
            print(proc.output()[-2000:])
        proc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="podcert-bench-") as tmp:
        root = Path(tmp) / "cluster"
        cluster.up(root)
        try:
            print(f"requests per batch: {args.requests}, nodes: {NODES}")
            print(f"{'workers':>7} {'ceiling/s':>10} {'signer/s':>9} {'ratio':>6}")
            for workers in args.workers:
                signer = f"bench.podcert.dev/w{workers}"
                a = make_requests(root, f"ceil-{workers}", signer, args.requests)
                top = ceiling(root, f"ceil-{workers}", a, workers)
                make_requests(root, f"sign-{workers}", signer, args.requests)
                got = signer_rate(
                    root, Path(tmp), signer, f"sign-{workers}", args.requests, workers
                )
                print(f"{workers:>7} {top:>10.0f} {got:>9.0f} {got / top:>6.2f}", flush=True)
        finally:
            cluster.down(root)


if __name__ == "__main__":
    main()
