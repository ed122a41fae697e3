"""Rotation under load: the example mTLS pair at a steady request rate through 3 leaf rotations
of both pods and one full CA rotation (prepare, activate, re-key, retire); failed requests.

    .venv/bin/python -m bench.bench_rotation [--rate 50] [--leaf-rotations 3]

The signer, a shim for one node and the pair (examples/mtls) run as child processes on a fresh
devcluster. Each leaf rotation is an emergency re-key of both pods (`podcert shim rotate`); it is
timed from the command to the new leaf on disk and to the server first seeing the client's new
serial. The CA rotation is timed from `ca prepare` to both trust files holding two roots, and
from `ca retire` to one. The client's own summary gives requests made and failed; target 0.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from devcluster import cluster
from devcluster.stack import Stack, wait_for
from podcert.client.rest import JSON


def rotate_both(stack: Stack, pods: dict[str, JSON]) -> tuple[float, float]:
    """Re-key both pods; seconds to the last new leaf on disk, and to the server seeing the
    client's new certificate."""
    start = time.monotonic()
    new = {name: stack.rekey(name, pod)[1] for name, pod in pods.items()}
    on_disk = time.monotonic() - start
    stack.wait_server_sees(new["web"], 30)
    return on_disk, time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=50.0, help="client requests per second")
    parser.add_argument("--leaf-rotations", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="podcert-bench-") as tmp:
        root = Path(tmp) / "cluster"
        cluster.up(root)
        stack = Stack(root, Path(tmp) / "work")
        try:
            stack.start_signer()
            stack.start_shim()
            pods = stack.create_pods()
            for pod in pods.values():
                stack.wait_identity(pod)
            stack.start_pair(pods, rate=args.rate)
            began = time.monotonic()
            print(f"{'step':<28} {'new leaves on disk':>18} {'server sees client':>18}")
            for i in range(args.leaf_rotations):
                disk, seen = rotate_both(stack, pods)
                print(f"{f'leaf rotation {i + 1}':<28} {disk:>17.2f}s {seen:>17.2f}s", flush=True)

            start = time.monotonic()
            stack.ca("prepare")
            wait_for(lambda: all(stack.trust_roots(p) == 2 for p in pods.values()), 30, "2 roots")
            print(f"{'CA prepared -> 2 roots':<28} {time.monotonic() - start:>17.2f}s")
            stack.ca("activate")
            disk, seen = rotate_both(stack, pods)
            print(f"{'CA activated, leaves re-keyed':<28} {disk:>17.2f}s {seen:>17.2f}s")
            start = time.monotonic()
            stack.ca("retire", "--force")
            wait_for(lambda: all(stack.trust_roots(p) == 1 for p in pods.values()), 30, "1 root")
            print(f"{'CA retired -> 1 root':<28} {time.monotonic() - start:>17.2f}s")
            disk, seen = rotate_both(stack, pods)
            print(f"{'leaf rotation on new CA':<28} {disk:>17.2f}s {seen:>17.2f}s")
            # A few more seconds of load on the final credentials before counting.
            time.sleep(2)  # load on the final credentials: a pause, not a wait for something
            elapsed = time.monotonic() - began

            summary = stack.stop_pair()
            client = summary.get("client", {})
            ok, failed = int(client.get("ok", 0)), int(client.get("failed", 0))
            print(
                f"\nrequests: {ok + failed} in {elapsed:.0f} s ({(ok + failed) / elapsed:.0f}/s), "
                f"failed: {failed} (target 0)"
            )
            for error, times in dict(client.get("errors") or {}).items():
                print(f"  {times} x {error}")
        finally:
            stack.stop()
            cluster.down(root)


if __name__ == "__main__":
    main()
