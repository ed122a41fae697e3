"""Client CPU per status-sized PUT through `podcert.client.rest.Rest`.

    .venv/bin/python -m bench.bench_rest                       # 1 and 4 threads, 3 rounds
    .venv/bin/python -m bench.bench_rest --tree /tmp/old       # also another checkout's Rest
        # (git archive <commit> | tar -x -C /tmp/old), rounds alternating between the two

On a fresh devcluster, each thread PUTs its own ConfigMap of about 4 KB (the size of a
PodCertificateRequest with its status; the answer is as large) as the admin, unconditionally
(no resourceVersion), `--puts` times after a warm-up. The figure is the client process's CPU
(every thread, `time.process_time`) over the timed PUTs, per PUT: what the client spends, not
how fast the API server answers (the rate is printed too, but moves with the API server's CPU
on shared cores). Each measurement runs in a fresh interpreter whose `podcert` comes from the
tree measured, built the way the components build theirs: `Rest(load_client(kubeconfig))`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "default"


def measure(kubeconfig: Path, threads: int, puts: int, warmup: int) -> dict[str, float]:
    """In this interpreter: `threads` threads, each `warmup` then `puts` PUTs of its own
    ConfigMap; (client CPU ms per PUT, PUTs per second) over the timed ones."""
    from podcert.client.rest import Rest, load_client, path_of

    print(f"podcert from {sys.modules['podcert'].__file__}", file=sys.stderr)
    rest = Rest(load_client(kubeconfig))
    names = [f"bench-rest-{i}" for i in range(threads)]
    bodies = []
    for name in names:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"bench": "rest"}},
            "data": {"pem": "A" * 4000},
        }
        if rest.get(path_of("v1", "configmaps", NAMESPACE, name)) is None:
            rest.request("POST", path_of("v1", "configmaps", NAMESPACE), body=body)
        bodies.append(body)
    start = threading.Barrier(threads + 1)
    done = threading.Barrier(threads + 1)

    def run(name: str, body: dict[str, object]) -> None:
        path = path_of("v1", "configmaps", NAMESPACE, name)
        for _ in range(warmup):
            rest.request("PUT", path, body=body)
        start.wait()
        for _ in range(puts):
            rest.request("PUT", path, body=body)
        done.wait()

    workers = [
        threading.Thread(target=run, args=(name, body), daemon=True)
        for name, body in zip(names, bodies, strict=True)
    ]
    for worker in workers:
        worker.start()
    start.wait()
    cpu0, wall0 = time.process_time(), time.monotonic()
    done.wait()
    cpu1, wall1 = time.process_time(), time.monotonic()
    total = puts * threads
    return {"cpu_ms": (cpu1 - cpu0) * 1000 / total, "rate": total / (wall1 - wall0)}


def one(tree: Path, kubeconfig: Path, threads: int, puts: int, warmup: int) -> dict[str, float]:
    """`measure` in a fresh interpreter importing podcert from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, __file__, "--measure", str(kubeconfig)]
        + [str(n) for n in (threads, puts, warmup)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    assert done.stderr.startswith(f"podcert from {tree}/"), done.stderr
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--puts", type=int, default=1000, help="timed PUTs per thread")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", type=Path, help="another checkout to compare with")
    parser.add_argument("--cluster", type=Path, help="a devcluster folder to start or reuse")
    parser.add_argument("--keep", action="store_true", help="leave the devcluster running")
    args = parser.parse_args(argv)

    from bench.bench_scale import a_cluster
    from devcluster.identities import Paths

    trees = {"this tree": REPO} | ({str(args.tree): args.tree.resolve()} if args.tree else {})
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    with a_cluster(args.cluster, args.keep) as root:
        kubeconfig = Paths(root.resolve()).admin_kubeconfig
        for round_ in range(args.rounds):
            for threads in args.threads:
                order = list(trees.items())
                for label, tree in order if round_ % 2 == 0 else order[::-1]:
                    got = one(tree, kubeconfig, threads, args.puts, args.warmup)
                    results.setdefault((label, threads), []).append(got)
                    print(
                        f"round {round_ + 1}, {threads} thread(s), {label}: "
                        f"{got['cpu_ms']:.3f} ms CPU/PUT, {got['rate']:.0f} PUT/s",
                        flush=True,
                    )
    print("\nmedians:")
    for (label, threads), runs in results.items():
        cpu = statistics.median(r["cpu_ms"] for r in runs)
        rate = statistics.median(r["rate"] for r in runs)
        spread = ", ".join(f"{r['cpu_ms']:.3f}" for r in runs)
        print(f"  {label}, {threads} thread(s): {cpu:.3f} ms CPU/PUT ({spread}), {rate:.0f} PUT/s")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:  # one measurement, run by `one` with PYTHONPATH=tree
        path, *numbers = sys.argv[2:]
        print(json.dumps(measure(Path(path), *map(int, numbers))))
        raise SystemExit(0)
    raise SystemExit(main())
