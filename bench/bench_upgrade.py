"""A whole cluster upgrade under traffic: Kubernetes 1.35 -> 1.36 -> 1.37 in
place, the control plane first and then the nodes one by one, each time, while pods hold podcert
credentials and the example mTLS pair calls at 50 requests a second.

    flock /tmp/podcert-real-node.lock .venv/bin/python -m bench.bench_upgrade \\
        [--hollow-nodes 4] [--pods-per-node 10] [--rate 50] [--no-real-node]
        [--signer-wheel WHEEL] [--json out.json]

On a fresh devcluster of 1.35 (devcluster.upgrade_traffic says what runs and what is checked):
two signer replicas, a shim node, the real kubelet's node (containerd; hence the lock),
`--hollow-nodes` hollow kubelets, `--pods-per-node` pods on each node and the pair (its server on
the real node, re-keyed by each of that kubelet's restarts; its client on the shim node).

Printed: each step's duration; for each kubelet restart its re-key storm (requests created, all
issued, how long the restart took, when the last of them was issued and when every pod's new
files were on disk, from the restart's start); then the invariants: every pod holding a valid
credential after each step and all along where its files outlive a restart, no request Denied or
Failed (the requests as listed all along, and both audit logs), none decided twice, the pair's
failed calls, and `podcert audit` of each node. Exit 0 when every one holds.

`--signer-wheel releases/0.1.0/podcert-0.1.0-py3-none-any.whl` runs the signers of that release
(the wheel unpacked, first on their PYTHONPATH): what the same upgrade does under it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from devcluster import cluster, nodes
from devcluster.upgrade_traffic import Report, Shape, Upgrade


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def verdicts(report: Report) -> dict[str, bool]:
    client = report.pair.get("client", {})
    return {
        "every pod valid after each step": all(not s.invalid for s in report.steps),
        "no gap where files outlive a restart": not report.gaps,
        "no request Denied or Failed": all(o == "Issued" for o in report.outcomes.values())
        and set(report.decisions) <= {"issued"},
        "no request decided twice": not report.answered_twice,
        "the pair: 0 failed calls": client.get("failed") == 0 and client.get("ok", 0) > 0,
        "podcert audit clean on every node": all(c == 0 for c, _ in report.audits.values()),
    }


def show(report: Report, span: float) -> None:
    print(f"\n{'step':<34} {'s':>6}  re-key storm")
    for step in report.steps:
        storm = step.storm
        extra = (
            f"{storm.created} requests ({storm.issued} issued); restart {storm.restart_seconds:.1f}"
            f" s, last issued at {storm.last_issued_seconds:.1f} s, files at "
            f"{storm.files_seconds:.1f} s"
            if storm
            else ", ".join(f"{n}: {f}" for n, f in step.forms.items())
        )
        print(f"{step.name:<34} {step.seconds:>6.1f}  {extra}")
        for pod, why in step.invalid.items():
            print(f"    INVALID {pod}: {why}")
    client, server = report.pair.get("client", {}), report.pair.get("server", {})
    made = client.get("ok", 0) + client.get("failed", 0)
    print(
        f"\n{report.pods} pods, {len(report.outcomes)} requests "
        f"({dict(sorted((str(o), n) for o, n in _count(report.outcomes.values()).items()))}), "
        f"audit log decisions {dict(report.decisions)}"
    )
    print(
        f"pair: {made} calls in {span:.0f} s ({made / span:.0f}/s), failed {client.get('failed')}; "
        f"server certificates seen by the client {len(client.get('server_serials', []))}, "
        f"client certificates seen by the server {len(server.get('client_serials', []))}"
    )
    for error, times in dict(client.get("errors") or {}).items():
        print(f"  {times} x {error}")
    for t, pod, why in report.gaps[:20]:
        print(f"  gap at {t:.1f} s: {pod}: {why}")
    for node, (code, tail) in report.audits.items():
        print(f"podcert audit {node}: exit {code}" + (f"\n{tail}" if code else ""))
    for name, ok in verdicts(report).items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")


def _count(values: Any) -> dict[Any, int]:
    out: dict[Any, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hollow-nodes", type=int, default=4)
    parser.add_argument("--pods-per-node", type=int, default=10)
    parser.add_argument("--rate", type=float, default=50.0, help="the pair's calls per second")
    parser.add_argument(
        "--no-real-node",
        action="store_true",
        help="no real kubelet (the pair's server on the shim)",
    )
    parser.add_argument(
        "--signer-wheel",
        type=Path,
        help="run the signers from this release's wheel (e.g. releases/0.1.0/*.whl)",
    )
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args()
    real = not args.no_real_node
    if real and (reason := nodes.real_node_unavailable()):
        print(
            f"cannot run a real node here: {reason} (--no-real-node runs without)", file=sys.stderr
        )
        return 2
    with tempfile.TemporaryDirectory(prefix="podcert-bench-upgrade-") as tmp:
        release = None
        if args.signer_wheel:
            release = Path(tmp) / "signer-release"
            with zipfile.ZipFile(args.signer_wheel) as wheel:
                wheel.extractall(release)
        shape = Shape(
            hollow_nodes=args.hollow_nodes,
            pods_per_node=args.pods_per_node,
            real_node=real,
            rate=args.rate,
            signer_release=release,
        )
        root = Path(tmp) / "cluster"
        run = Upgrade(root, Path(tmp) / "work", shape, say)
        try:
            run.start()
            began = time.monotonic()
            run.run()
            span = time.monotonic() - began
            report = run.finish()
        finally:
            run.stop()
            for node in list(run.kubelets):
                nodes.stop(root, node)
            cluster.down(root)
    show(report, span)
    if args.json:
        args.json.write_text(json.dumps(dataclasses.asdict(report), indent=2, default=str))
    return 0 if all(verdicts(report).values()) else 1


if __name__ == "__main__":
    sys.exit(main())
