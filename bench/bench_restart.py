"""Restart cost: stop the shim (SIGTERM) while it serves N fresh projections, start it again.

    .venv/bin/python -m bench.bench_restart [--pods 1000] [--sources 1]

On a fresh devcluster: the signer and a shim for node-a run as child processes. `--pods` pods on
node-a each mount one projected volume with `--sources` podCertificate sources for the signer
(default 1,000 x 1 = 1,000 projections); the benchmark waits until the shim's metrics show every
projection fresh. Then the shim gets SIGTERM and a new shim process starts on the same root.
Reported: PodCertificateRequests created by the restart (counted both in the API and in the new
process's podcert_shim_requests_total; target 0, DESIGN.md section 5), volumes it rewrote, the
time to /readyz (caches synced) and to every projection fresh again (credentials adopted from
disk), and how long the SIGTERM'd shim took to exit.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.bench_time_to_credential import (
    create_pods,
    devcluster,
    metric_total,
    prepare_namespace,
    wait_until,
)
from devcluster import processes
from devcluster.stack import Stack
from podcert.client.rest import Rest, path_of

PCRS = "certificates.k8s.io/v1"


def volume(signer_name: str, sources: int) -> dict[str, Any]:
    """One projected volume with `sources` podCertificate sources for the signer."""
    return {
        "name": "identity",
        "projected": {
            "sources": [
                {
                    "podCertificate": {
                        "signerName": signer_name,
                        "keyType": "ECDSAP256",
                        "credentialBundlePath": f"credentialbundle-{j}.pem",
                    }
                }
                for j in range(sources)
            ]
        },
    }


def fresh(shim: processes.Shim) -> int:
    return int(metric_total(shim.metrics(), "podcert_shim_projections", state="fresh"))


def count_pcrs(rest: Rest, namespace: str) -> int:
    listing = rest.request("GET", path_of(PCRS, "podcertificaterequests", namespace))
    return len(listing.get("items") or [])


@dataclass
class Populated:
    pods: int
    projections: int
    seconds: float  # first create call -> every projection fresh


def populate(
    stack: Stack, rest: Rest, pods: int, sources: int, threads: int, timeout: float
) -> Populated:
    """Create the pods and wait until the running shim shows every projection fresh."""
    assert stack.shim is not None
    shim = stack.shim
    started = time.monotonic()
    created = create_pods(
        rest,
        stack.namespace,
        [f"p{i}" for i in range(pods)],
        stack.node,
        [volume(stack.signer_name, sources)],
        threads,
    )
    if created.errors:
        raise SystemExit(f"pod creation failed ({len(created.errors)}): {created.errors[:3]}")
    wanted = pods * sources
    wait_until(lambda: fresh(shim) >= wanted, timeout, f"{wanted} fresh projections", 0.25)
    return Populated(pods, wanted, time.monotonic() - started)


def new_shim(stack: Stack, name: str) -> processes.Shim:
    """Another shim process for the stack's node and root (its own log and metrics port)."""
    return processes.shim(
        stack.root, stack.work, stack.node, root=stack.work / "node", log_name=name
    )


def data_links(root: Path) -> dict[Path, str]:
    """Every volume's `..data` symlink target: a rewrite of the volume changes it."""
    return {link: str(link.readlink()) for link in root.glob("pods/*/volumes/*/*/..data")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--sources", type=int, default=1, help="podCertificate sources per pod")
    parser.add_argument("--threads", type=int, default=8, help="concurrent pod create calls")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after (seconds)")
    args = parser.parse_args()

    with devcluster("podcert-bench-restart-") as (root, work):
        stack = Stack(root, work, namespace="restart")
        rest = prepare_namespace(root, stack.namespace)
        second: processes.Shim | None = None
        try:
            stack.start_signer()
            first = stack.start_shim()
            setup = populate(stack, rest, args.pods, args.sources, args.threads, args.timeout)
            print(
                f"{setup.pods} pods x {args.sources} sources = {setup.projections} projections "
                f"fresh {setup.seconds:.1f}s after the first pod create"
            )
            before = count_pcrs(rest, stack.namespace)
            links = data_links(first.root)

            stopping = time.monotonic()
            code = first.stop(timeout=30.0)
            stopped = time.monotonic() - stopping

            second = new_shim(stack, "restarted")
            launched = time.monotonic()
            second.start()
            second.wait_ready(timeout=args.timeout)
            ready = time.monotonic() - launched
            wanted = setup.projections
            shim = second
            wait_until(lambda: fresh(shim) >= wanted, args.timeout, "all projections fresh", 0.02)
            all_fresh = time.monotonic() - launched
            metrics = second.metrics()
            created = metric_total(metrics, "podcert_shim_requests_total")
            writes = metric_total(metrics, "podcert_shim_volume_writes_total")
            after = count_pcrs(rest, stack.namespace)
            rewritten = sum(1 for k, v in data_links(first.root).items() if links.get(k) != v)
        finally:
            if second is not None:
                second.stop()
            stack.stop()

    print(f"SIGTERM -> old shim exited (code {code}): {stopped:.2f}s")
    print(
        f"restart: /readyz after {ready:.2f}s, all {wanted} projections fresh after "
        f"{all_fresh:.2f}s (process start included)"
    )
    print(
        f"PodCertificateRequests in the API: {before} before, {after} after "
        f"(+{after - before}); podcert_shim_requests_total of the new process: {created:.0f}"
    )
    print(
        f"volumes rewritten by the restart: {rewritten} of {len(links)} "
        f"(podcert_shim_volume_writes: {writes:.0f})"
    )
    new = max(after - before, int(created))
    print(f"target 0 new requests: {'met' if new == 0 else 'MISSED'}")
    if new:
        sys.exit(1)


if __name__ == "__main__":
    main()
