"""Time from pod creation to its credential bundle on disk: N pods bound to one node at once.

    .venv/bin/python -m bench.bench_time_to_credential [--pods 200] [--threads 8]
        [--shim-workers W]

On a fresh devcluster: `podcert signer` and `podcert shim` (serving node-a) run as child
processes with their real identities. One warm-up pod is created and waited for (start-up costs
are not the figure); then N pods with a podCertificate volume are created through a small thread
pool, each stamped with the monotonic clock just before its create call (creationTimestamp only
has whole seconds). The main thread polls every pod's credentialbundle.pem under the shim's root
until it exists. Reported: p50/p95/p99/max of (file seen - create call started). Target (DESIGN.md
section 5): p99 <= 2 s. Also printed: where the time goes, per stage, from the components' own
JSON logs, and the CPU seconds each process (control plane, signer, shim, this benchmark) used.

The helpers here (devcluster session, pod creation, percentiles, RSS, CPU) are shared by the other
benchmarks of this folder.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devcluster import cluster, identities, kube, planestate, processes
from devcluster.stack import BUNDLE, SIGNER_NAMESPACE, Stack
from podcert.client.rest import JSON, ApiError, Rest, path_of

TARGET_P99 = 2.0
POLL = 0.01  # seconds between two looks at the files still missing


# --- shared by the benchmarks of this folder ---------------------------------------------------


def exit_on_sigterm() -> None:
    """SIGTERM ends the benchmark like Ctrl-C does: through every `finally`, so nothing stays."""

    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def devcluster(prefix: str) -> Iterator[tuple[Path, Path]]:
    """A fresh devcluster under a temporary folder: (cluster root, work folder). Always down."""
    exit_on_sigterm()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        root, work = Path(tmp) / "cluster", Path(tmp) / "work"
        work.mkdir()
        try:
            cluster.up(root)
            yield root, work
        finally:
            cluster.down(root)


def pod_body(
    namespace: str,
    name: str,
    node: str,
    volumes: Sequence[dict[str, Any]],
    service_account: str = "default",
    image: str = "registry.invalid/app:1",
    command: Sequence[str] = (),
) -> JSON:
    """A pod bound to `node` that mounts `volumes` (as devcluster.kube.create_pod builds it). A
    real node runs `image` (one of devcluster.images: no registry is reachable) with `command`."""
    mounts = [{"name": v["name"], "mountPath": f"/var/run/{v['name']}"} for v in volumes]
    container: dict[str, Any] = {
        "name": "app",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "volumeMounts": mounts,
        **({"command": list(command)} if command else {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "serviceAccountName": service_account,
            "automountServiceAccountToken": False,
            "containers": [container],
            "volumes": list(volumes),
        },
    }


@dataclass
class Created:
    """What a concurrent pod creation recorded, filled in by the pool's threads."""

    started: dict[str, float] = field(default_factory=dict)  # pod name -> monotonic, pre-call
    wall: dict[str, float] = field(default_factory=dict)  # pod name -> time.time(), pre-call
    uids: dict[str, str] = field(default_factory=dict)  # pod name -> UID, once created
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self) -> list[tuple[str, str, float]]:
        with self.lock:
            return [(n, uid, self.started[n]) for n, uid in self.uids.items()]


def create_pods(
    rest: Rest,
    namespace: str,
    names: Sequence[str],
    node: str,
    volumes: Sequence[dict[str, Any]],
    threads: int,
    created: Created | None = None,
    image: str = "registry.invalid/app:1",
    command: Sequence[str] = (),
) -> Created:
    """Create the pods through a pool of `threads`; returns when all calls are done."""
    out = created or Created()
    path = path_of("v1", "pods", namespace)

    def one(name: str) -> None:
        body = pod_body(namespace, name, node, volumes, image=image, command=command)
        wall, started = time.time(), time.monotonic()
        try:
            pod = rest.request("POST", path, body=body)
        except ApiError as err:
            with out.lock:
                out.errors.append(f"{name}: {err}")
            return
        with out.lock:
            out.started[name] = started
            out.wall[name] = wall
            out.uids[name] = str(pod["metadata"]["uid"])

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, names))
    return out


def in_background(target: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def prepare_namespace(root: Path, namespace: str) -> Rest:
    """The namespace and its default ServiceAccount (no controller-manager creates it here)."""
    admin = kube.admin_client(root)
    kube.ensure_namespace(admin, namespace)
    kube.ensure_service_account(admin, namespace, "default")
    return Rest(admin)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def rss_mib(pid: int, field_name: str = "VmRSS") -> float:
    """Resident set size (or VmHWM, its peak) of a process, from /proc/<pid>/status, in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(rf"^{field_name}:\s+(\d+) kB$", status, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no {field_name} in /proc/{pid}/status")
    return int(found.group(1)) / 1024


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_of(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError):
            out[name] = cpu_seconds(pid)
    return out


def component_pids(root: Path, *procs: tuple[str, processes.Process | None]) -> dict[str, int]:
    """Pids of the control plane, of these child processes and of this benchmark."""
    state = planestate.read_state(identities.Paths(root.resolve()))
    pids = {"bench": os.getpid()}
    if state is not None:
        pids.update({"kube-apiserver": state.apiserver_pid, "etcd": state.etcd_pid})
    for name, proc in procs:
        if proc is not None and proc.proc is not None:
            pids[name] = proc.proc.pid
    return pids


def print_cpu(before: dict[str, float], after: dict[str, float], wall: float) -> None:
    used = {n: after[n] - before[n] for n in after if n in before}
    parts = ", ".join(f"{n} {s:.2f}" for n, s in sorted(used.items(), key=lambda x: -x[1]))
    total = sum(used.values())
    print(
        f"CPU seconds in those {wall:.2f}s: {parts}; total {total:.2f} "
        f"({total / wall:.2f} of {os.cpu_count()} cores)"
    )


def pid_of(proc: processes.Process) -> int:
    if proc.proc is None or proc.proc.poll() is not None:
        raise RuntimeError(f"process {proc.args[:1]} is not running:\n{proc.output()[-2000:]}")
    return proc.proc.pid


def metric_total(text: str, metric: str, **labels: str) -> float:
    """Sum of every series of `metric` in Prometheus text whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, _, rest = line.partition("{")
        if name.split(" ", 1)[0] != metric:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', rest.rpartition("}")[0])) if rest else {}
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_until(
    probe: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# --- this benchmark ----------------------------------------------------------------------------


def time_to_credential(
    stack: Stack, rest: Rest, names: Sequence[str], threads: int, timeout: float
) -> tuple[dict[str, float], list[str], Created]:
    """Create the pods concurrently; seconds from each create call to its bundle on disk."""
    assert stack.shim is not None
    volume = kube.pod_certificate_volume(stack.signer_name)
    created = Created()
    creator = in_background(
        lambda: create_pods(rest, stack.namespace, names, stack.node, [volume], threads, created)
    )
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while True:
        pending = [(n, uid, t0) for n, uid, t0 in created.snapshot() if n not in seen]
        for name, uid, started in pending:
            if (stack.shim.volume_dir(uid) / BUNDLE).exists():
                seen[name] = time.monotonic() - started
        if not creator.is_alive() and len(seen) + len(created.errors) >= len(names):
            break
        if time.monotonic() > deadline:
            break
        time.sleep(POLL)
    creator.join()
    missing = [n for n in names if n not in seen]
    return seen, missing, created


def _log_times(path: Path, message: str, key: str) -> dict[str, tuple[float, JSON]]:
    """`key` -> (unix time, line) of the first JSON log line whose msg starts with `message`."""
    out: dict[str, tuple[float, JSON]] = {}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        if not line.startswith("{"):
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if str(entry.get("msg", "")).startswith(message) and key in entry:
            at = dt.datetime.fromisoformat(entry["time"]).timestamp()
            out.setdefault(str(entry[key]), (at, entry))
    return out


def breakdown(created: Created, work: Path, node: str) -> None:
    """Where the time goes, from the components' own JSON logs (millisecond wall-clock stamps):
    create call -> shim's request created -> signer's status written -> shim's volume written."""
    shim_log = work / f"shim-{node}.log"
    requested = _log_times(shim_log, "requested a certificate", "pod")
    published = _log_times(shim_log, "published volume", "pod")
    issued = _log_times(work / f"signer-{SIGNER_NAMESPACE}.log", "issued serial", "request")
    stages: dict[str, list[float]] = {"request": [], "issue": [], "write": []}
    for name, wall in created.wall.items():
        if name not in requested or name not in published:
            continue
        at_request, entry = requested[name]
        at_issue = issued.get(str(entry.get("request")), (None, {}))[0]
        if at_issue is None:
            continue
        stages["request"].append(at_request - wall)
        stages["issue"].append(at_issue - at_request)
        stages["write"].append(published[name][0] - at_issue)
    if not stages["request"]:
        print("breakdown: no matching log lines")
        return
    labels = {
        "request": "create call -> shim created the request",
        "issue": "request created -> signer wrote the status",
        "write": "status written -> shim published the volume",
    }
    print(f"where the time goes (from the logs, n={len(stages['request'])}):")
    for stage, values in stages.items():
        print(
            f"  {labels[stage]:<46} p50 {percentile(values, 50):.3f}s  "
            f"p99 {percentile(values, 99):.3f}s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--threads", type=int, default=8, help="concurrent pod create calls")
    parser.add_argument("--timeout", type=float, default=120.0, help="give up after (seconds)")
    parser.add_argument(
        "--shim-workers", type=int, default=None, help="`podcert shim --workers` (default: its own)"
    )
    args = parser.parse_args()

    with devcluster("podcert-bench-ttc-") as (root, work):
        stack = Stack(root, work, namespace="ttc")
        rest = prepare_namespace(root, stack.namespace)
        try:
            stack.start_signer()
            stack.start_shim(*([f"--workers={args.shim_workers}"] if args.shim_workers else []))
            warm, missing, _ = time_to_credential(stack, rest, ["warm-up"], 1, 30.0)
            if missing:
                raise SystemExit("the warm-up pod got no credential in 30 s")
            print(f"warm-up pod: {warm['warm-up']:.2f}s (not counted)")
            names = [f"p{i}" for i in range(args.pods)]
            pids = component_pids(root, ("shim", stack.shim), ("signer", stack.signer))
            cpu_before = cpu_of(pids)
            started = time.monotonic()
            seen, missing, created = time_to_credential(
                stack, rest, names, args.threads, args.timeout
            )
            took = time.monotonic() - started
            cpu_after = cpu_of(pids)
        finally:
            stack.stop()
        figures = list(seen.values())
        starts = list(created.started.values())
        spread = max(starts) - min(starts) if starts else 0.0
        workers = args.shim_workers or "default"
        print(
            f"{args.pods} pods on one node, shim workers {workers}, {args.threads} create threads, "
            "polled every "
            f"{POLL * 1000:.0f} ms; create calls spread over {spread:.2f}s; all credentials "
            f"on disk {took:.2f}s after the first create"
        )
        if missing:
            print(f"MISSING: {len(missing)} pods got no credential in {args.timeout:.0f}s")
        if figures:
            p99 = percentile(figures, 99)
            print(
                "pod create -> credential bundle on disk: "
                f"p50 {percentile(figures, 50):.3f}s  p95 {percentile(figures, 95):.3f}s  "
                f"p99 {p99:.3f}s  max {max(figures):.3f}s  (n={len(figures)})"
            )
            verdict = "met" if p99 <= TARGET_P99 and not missing else "MISSED"
            print(f"target p99 <= {TARGET_P99:.0f}s: {verdict}")
            breakdown(created, work, stack.node)
        print_cpu(cpu_before, cpu_after, took)
        if missing:
            sys.exit(1)


if __name__ == "__main__":
    main()
