"""The shim at 110 pods per node, in a cluster of Kubernetes' published size.

    .venv/bin/python -m bench.bench_scale_shim --pods 20000 --cluster /tmp/scale --keep
    .venv/bin/python -m bench.bench_scale_shim --pods 150000 --nodes 5000 --namespaces 150 \\
        --cluster /tmp/scale --keep

The cluster is loaded (or topped up) as `bench.bench_scale` loads it. Then one more Node,
`scale-shim`, gets 110 pods (the kubelet's default maximum), each with one projected volume holding
a podCertificate source and a clusterTrustBundle source (the signer's roots), and `podcert signer`
runs as shipped (`bench_scale.signer_args`) until ready. Then `podcert shim` runs as that node's
own identity (`system:node:scale-shim`, as `devcluster.processes.shim` starts it) with its default
flags, its RSS sampled every 20 ms and its /healthz polled every 10 ms (`bench_scale.Watcher`):

1. start: process start -> /readyz, and -> all 110 credential bundles and trust files on disk;
   then `--steady` seconds of nothing;
2. churn elsewhere: `--churn` pods are created on the other nodes, then labelled (a merge patch
   each), then deleted, as fast as the loader goes, while a probe pod is created on the shim's node
   every `--probe-every` seconds (a clusterTrustBundle source only, so no signer is involved):
   create call -> trust file on disk is the shim's watch handling, and its CPU over the churn shows
   what the other nodes' pods cost it;
3. a new root: a second ClusterTrustBundle for the signer name is created, then deleted; each time
   all 110 trust files are rewritten at once (start -> the last one on disk);
4. a forced re-key of all 110 at once: the annotation `podcert shim rotate` sets, patched on
   every pod through 8 connections; start -> all 110 new credentials on disk, the requests made;
5. relist: kube-apiserver is restarted (1-2 minutes at 150k pods); the shim's watches break, or
   resume into 410 Gone and list again. RSS peak and after, the longest /healthz, and the wait from
   the API server answering again to the shim handling a new pod (probes every second).

Every phase reports the shim's peak RSS and its longest /healthz answer, and the longest answer of
an idle reference server (podcert's health server in a process doing nothing else) over the same
window: what the machine adds. `--nice -10` runs the signer, the shim, the reference and the
pollers ahead of the rest of a shared machine, so that what is left is their own. The end gives
the shim's VmHWM, against the DaemonSet's memory limit (manifests/shim/daemonset.yaml, charts/
podcert values: 192Mi).
`--tree PATH` runs the shim from another checkout, to measure before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from bench.bench_scale import (
    SIGNER,
    Client,
    Watcher,
    a_cluster,
    create_share,
    load,
    log_has,
    signer_args,
)
from bench.bench_scale import wait_ready as wait_readyz
from bench.bench_time_to_credential import cpu_seconds, metric_total, rss_mib
from devcluster import cluster, kube, pki, processes
from devcluster.stack import BUNDLE, TRUST, identity_volume
from devcluster.supervise import end, free_port
from kubelet_shim.kube import ROTATE_ANNOTATION
from podcert.api.times import format_micro_time
from podcert.api.volumes import volume_dir
from podcert.client.rest import JSON, ApiError, Rest, path_of

NODE = "scale-shim"
NAMESPACE = "scale-shim"  # the node's 110 pods
PROBES = "scale-shim-probe"  # the probe pods, on the same node
CHURN = "scale-churn"  # pods created, changed and deleted on the other nodes
VOLUME = "identity"
EXTRA_BUNDLE = f"{SIGNER.replace('/', ':')}:bench-extra"
CTBS = "certificates.k8s.io/v1"
# The shim's reflectors log this when a watch breaks or ends in 410 Gone.
WATCH_BROKE = r"(pods|podcertificaterequests|clustertrustbundles): watch (expired|failed)"
POLL = 0.02
DELETE_NOW = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}


# --- the node's pods ---------------------------------------------------------------------------


def pod(namespace: str, name: str, volume: JSON) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "scale-shim"}},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "app",
                    "image": "registry.invalid/app:1",
                    "volumeMounts": [{"name": VOLUME, "mountPath": "/var/run/identity"}],
                }
            ],
            "volumes": [volume],
        },
    }


def trust_only() -> JSON:
    """The probe pods' volume: the signer's roots only, which the shim writes without a request."""
    source = {"signerName": SIGNER, "labelSelector": {}, "path": TRUST}
    return {"name": VOLUME, "projected": {"sources": [{"clusterTrustBundle": source}]}}


def force_delete_all(root: Path, namespace: str, threads: int = 8) -> int:
    """Every pod of a namespace, deleted at once: no kubelet would confirm a graceful delete."""
    rest = Rest(kube.admin_client(root))
    names = [p["metadata"]["name"] for p in rest.list(path_of("v1", "pods", namespace))[0]]
    local = threading.local()

    def one(name: str) -> None:
        client = getattr(local, "client", None) or Client(root)
        local.client = client
        client.call("DELETE", path_of("v1", "pods", namespace, name), DELETE_NOW)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, names))
    return len(names)


def create_node_pods(root: Path, count: int) -> list[str]:
    """`count` fresh pods on the shim's node (those of a previous run are deleted first); their
    UIDs."""
    admin = kube.admin_client(root)
    for namespace in (NAMESPACE, PROBES, CHURN):
        kube.ensure_namespace(admin, namespace)
        kube.ensure_service_account(admin, namespace, "default")
    for namespace in (NAMESPACE, PROBES):
        force_delete_all(root, namespace)
    kube.ensure_node(admin, NODE)
    volume = identity_volume(SIGNER)
    stamp = time.strftime("%H%M%S")
    client = Client(root)
    uids = []
    for i in range(count):
        name = f"app-{stamp}-{i:03d}"
        status, out = client.call(
            "POST", path_of("v1", "pods", NAMESPACE), pod(NAMESPACE, name, volume)
        )
        if status != 201:
            raise RuntimeError(f"pod {name}: {status} {out[:300]!r}")
        uids.append(str(kube_json(out)["metadata"]["uid"]))
    return uids


def kube_json(data: bytes) -> JSON:
    out: JSON = json.loads(data)
    return out


# --- the files, as the pods see them -----------------------------------------------------------


@dataclass
class Files:
    """The shim's files for a set of pods, looked at with stat only (a new version of a volume is
    a new directory, so a file's inode changes with every write)."""

    root: Path
    uids: list[str]

    def path(self, uid: str, name: str) -> Path:
        return volume_dir(self.root, uid, VOLUME) / name

    def inodes(self, name: str) -> dict[str, int]:
        out = {}
        for uid in self.uids:
            with contextlib.suppress(OSError):
                out[uid] = self.path(uid, name).stat().st_ino
        return out

    def wait_changed(
        self, name: str, before: dict[str, int], timeout: float, alive: Callable[[], bool]
    ) -> tuple[float, float]:
        """Monotonic times when the first and the last of the pods' `name` files differed from
        `before` (absent counts as unchanged)."""
        pending = set(self.uids)
        first = 0.0
        deadline = time.monotonic() + timeout
        while pending:
            now = time.monotonic()
            if now > deadline or not alive():
                raise TimeoutError(f"{len(pending)} of {len(self.uids)} {name} files unchanged")
            for uid in list(pending):
                with contextlib.suppress(OSError):
                    if self.path(uid, name).stat().st_ino != before.get(uid):
                        pending.discard(uid)
                        first = first or now
            if pending:
                time.sleep(POLL)
        return first, time.monotonic()


def prioritize(nice: int) -> None:
    """The calling thread at priority `nice` (Linux keeps one per thread; new threads and child
    processes inherit it from the thread that makes them)."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


# --- probes: the shim's watch handling ----------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One probe pod, in monotonic seconds."""

    called: float  # its create call started
    answered: float  # the create call answered
    seen: float  # its ADDED event reached an independent watch (the benchmark's own)
    on_disk: float  # its trust file appeared


@dataclass
class Prober:
    """A pod with a trust-only volume on the shim's node every `every` seconds, in the
    background until halted: the time from its create call to its trust file on disk, split at
    the moment an independent watch of the same pods (this benchmark's, as admin) saw it, which
    is when the API server delivered the event: before it the API server, after it the shim."""

    root: Path
    node_root: Path
    every: float
    nice: int = 0
    timeout: float = 120.0
    samples: list[Sample] = field(default_factory=list)
    missed: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    seen: dict[str, float] = field(default_factory=dict)  # pod name -> its ADDED event here
    watching: threading.Thread | None = None

    def start(self) -> Prober:
        if self.watching is None:
            self.watching = threading.Thread(target=self._watch, daemon=True)
            self.watching.start()
        self.stop.clear()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def halt(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()

    def _watch(self) -> None:
        prioritize(self.nice)
        rest = Rest(kube.admin_client(self.root))
        path = path_of("v1", "pods", PROBES)
        while True:
            try:
                items, version = rest.list(path)
                for _ in items:
                    pass
                for event in rest.watch(path, version, timeout_seconds=60):
                    if event["type"] == "ADDED":
                        name = str(event["object"]["metadata"]["name"])
                        self.seen.setdefault(name, time.monotonic())
            except ApiError:
                time.sleep(0.2)

    def one(self, client: Client) -> None:
        name = f"probe-{time.monotonic_ns()}"
        t0 = time.monotonic()
        status, out = client.call(
            "POST", path_of("v1", "pods", PROBES), pod(PROBES, name, trust_only())
        )
        answered = time.monotonic()
        if status != 201:
            return
        path = volume_dir(self.node_root, str(kube_json(out)["metadata"]["uid"]), VOLUME) / TRUST
        deadline = t0 + self.timeout
        try:
            while time.monotonic() < deadline:
                if path.exists():
                    on_disk = time.monotonic()
                    # The watch's thread may not have had its turn yet.
                    self.stop.wait(0.05)
                    seen = self.seen.get(name, float("nan"))
                    self.samples.append(Sample(t0, answered, seen, on_disk))
                    return
                time.sleep(0.005)
            self.missed += 1
        finally:
            client.call("DELETE", path_of("v1", "pods", PROBES, name), DELETE_NOW)

    def _run(self) -> None:
        prioritize(self.nice)
        client = Client(self.root)
        while not self.stop.is_set():
            t0 = time.monotonic()
            with contextlib.suppress(RuntimeError):
                self.one(client)
            self.stop.wait(max(0.0, self.every - (time.monotonic() - t0)))

    def summary(self, since: float, until: float) -> str:
        took = [p for p in self.samples if since <= p.called <= until]
        if not took:
            return f"no probe answered ({self.missed} missed)"

        def spread(values: list[float]) -> str:
            values = [v for v in values if not math.isnan(v)] or [float("nan")]
            return f"median {statistics.median(values):.3f} s, max {max(values):.3f} s"

        return (
            f"{len(took)} probes, create call -> trust file: "
            f"{spread([p.on_disk - p.called for p in took])}; the create call "
            f"{spread([p.answered - p.called for p in took])}; its answer -> the event at an "
            f"independent watch {spread([p.seen - p.answered for p in took])}; that event -> "
            f"the file (the shim) {spread([p.on_disk - p.seen for p in took])}; "
            f"{self.missed} missed"
        )


# --- churn on the other nodes -------------------------------------------------------------------


def _change_share(root: str, jobs: list[tuple[str, str]], threads: int, action: str) -> int:
    """One churn process: a label patch (`action` "patch") or a delete of its share of pods."""
    local = threading.local()

    def one(job: tuple[str, str]) -> int:
        client = getattr(local, "client", None) or Client(Path(root))
        local.client = client
        namespace, name = job
        path = path_of("v1", "pods", namespace, name)
        if action == "patch":
            body = {"metadata": {"labels": {"churned": "yes"}}}
            status, _ = client.call("PATCH", path, body, "application/merge-patch+json")
        else:
            status, _ = client.call("DELETE", path, DELETE_NOW)
        return int(status in (200, 201, 404))

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(one, jobs, chunksize=64))


def churn(root: Path, count: int, nodes: int, procs: int, threads: int) -> None:
    """Create, label and delete `count` pods spread over the other nodes; a line per step."""
    force_delete_all(root, CHURN)
    created = [(CHURN, f"churn-{i:07d}", f"scale-{i % nodes}") for i in range(count)]
    jobs = [(ns, name) for ns, name, _ in created]
    steps: list[tuple[str, Callable[..., int], list[tuple[object, ...]]]] = [
        ("created", create_share, split(created, procs, (root, threads))),
        ("labelled", _change_share, split(jobs, procs, (root, threads, "patch"))),
        ("deleted", _change_share, split(jobs, procs, (root, threads, "delete"))),
    ]
    # The loaders run at the default priority whatever the benchmark's own (`--nice`).
    context = multiprocessing.get_context("spawn")
    with context.Pool(procs, initializer=prioritize, initargs=(0,)) as pool:
        for step, function, shares in steps:
            t0 = time.monotonic()
            done = sum(pool.starmap(function, shares))
            wall = time.monotonic() - t0
            print(f"  churn: {done} pods {step} in {wall:.0f}s ({done / wall:.0f}/s)", flush=True)


def split(
    jobs: Sequence[object], parts: int, extra: tuple[object, ...]
) -> list[tuple[object, ...]]:
    root, *rest = extra
    return [(str(root), list(jobs[k::parts]), *rest) for k in range(parts)]


# --- the phases ---------------------------------------------------------------------------------


@dataclass
class Shim:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    node_root: Path
    watcher: Watcher
    reference: Watcher  # an idle server of the same kind: what the machine adds to /healthz

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def metric(self, name: str, **labels: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as resp:
            return metric_total(resp.read().decode(), name, **labels)

    def report(self, what: str, since: float, until: float, extra: str = "") -> None:
        peak, last, stall = self.watcher.window(since, until)
        idle = self.reference.window(since, until)[2]
        at = max(
            ((s, t) for t, s, code in self.watcher.health if since <= t <= until and code),
            default=(0.0, since),
        )[1]
        print(
            f"{what}: peak RSS {peak:.0f} MiB, RSS after {last:.0f} MiB, longest /healthz "
            f"{stall:.3f} s at +{at - since:.1f} s (idle reference {idle:.3f} s)"
            f"{'; ' + extra if extra else ''}",
            flush=True,
        )

    def save(self, work: Path, t0: float) -> None:
        """Every /healthz answer, the shim's and the reference's, and the RSS samples, as
        tab-separated seconds since the shim's start, for a look at a phase afterwards."""
        for name, watcher in (("shim", self.watcher), ("reference", self.reference)):
            lines = [f"{t - t0:.3f}\t{s:.4f}\t{code}" for t, s, code in watcher.health]
            (work / f"healthz-{name}.tsv").write_text("\n".join(lines) + "\n")
        (work / "t0-wall.txt").write_text(f"{time.time() - (time.monotonic() - t0):.3f}\n")
        rss = [f"{t - t0:.3f}\t{m:.1f}" for t, m in self.watcher.rss]
        (work / "rss-shim.tsv").write_text("\n".join(rss) + "\n")


def tail(watcher: Watcher) -> str:
    answers = [s for _, s, code in watcher.health if code]
    slow, slower = sum(s > 0.1 for s in answers), sum(s > 0.2 for s in answers)
    return f"{len(answers)} answers, {slow} over 0.1 s, {slower} over 0.2 s"


# The reference: podcert's health server in a process that does nothing else. Polled like the
# shim's, its slowest answers are what the machine (shared cores, the benchmark's own threads)
# adds, not the shim.
REFERENCE = """import sys, time
from podcert.serving import health
health.serve(lambda: b"", int(sys.argv[1]), lambda: True)
time.sleep(86400)
"""


@contextlib.contextmanager
def running(
    args: list[str],
    log: Path,
    tree: Path,
    nice: int = 0,
    prefix: Sequence[str] = ("-m", "podcert"),
) -> Iterator[subprocess.Popen[bytes]]:
    """A child process (`nice` runs it at that priority: exec'd by nice(1), same pid)."""
    niced = ["nice", "-n", str(nice)] if nice else []
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*niced, sys.executable, *prefix, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tree,
        )
    try:
        yield proc
    finally:
        end(proc, 20)


def start(shim: Shim, files: Files, t0: float, steady: float) -> None:
    ready = wait_readyz(shim.port, 600.0)
    first, last = files.wait_changed(BUNDLE, {}, 600.0, shim.alive)
    _, trust_last = files.wait_changed(TRUST, {}, 60.0, shim.alive)
    done = max(last, trust_last)
    print(
        f"shim start -> ready {ready - t0:.2f} s; -> first credential {first - t0:.2f} s; -> all "
        f"{len(files.uids)} credentials and trust files {done - t0:.2f} s; "
        f"{cpu_seconds(shim.pid):.1f} CPU-s; "
        f"{shim.metric('podcert_shim_requests_total'):.0f} requests made",
        flush=True,
    )
    shim.report("  start", t0, done)
    cpu = cpu_seconds(shim.pid)
    time.sleep(steady)
    idle = (cpu_seconds(shim.pid) - cpu) / steady
    shim.report(f"  then {steady:.0f} s steady", done, time.monotonic(), f"{idle:.1%} of a core")


def bulk(shim: Shim, files: Files, name: str, what: str, act: Callable[[], None]) -> None:
    """`act` (in a thread: what it does may take a while), and the time until every pod's
    `name` file was rewritten."""
    before = files.inodes(name)
    made = shim.metric("podcert_shim_requests_total")
    cpu = cpu_seconds(shim.pid)
    acted = 0.0

    def acting() -> None:
        nonlocal acted
        act()
        acted = time.monotonic()

    t0 = time.monotonic()
    thread = threading.Thread(target=acting, daemon=True)
    thread.start()
    first, last = files.wait_changed(name, before, 300.0, shim.alive)
    thread.join()
    made = shim.metric("podcert_shim_requests_total") - made
    shim.report(
        f"{what}: {acted - t0:.2f} s to act; -> first {name} {first - t0:.2f} s, -> all "
        f"{len(files.uids)} {last - t0:.2f} s",
        t0,
        last,
        f"{made:.0f} requests made, {cpu_seconds(shim.pid) - cpu:.2f} CPU-s",
    )


def new_root(root: Path) -> Callable[[], None]:
    def act() -> None:
        pem = pki.make_ca("bench extra root", dt.datetime.now(dt.UTC)).cert_pem.decode()
        body = {
            "apiVersion": CTBS,
            "kind": "ClusterTrustBundle",
            "metadata": {"name": EXTRA_BUNDLE},
            "spec": {"signerName": SIGNER, "trustBundle": pem},
        }
        status, out = Client(root).call("POST", path_of(CTBS, "clustertrustbundles"), body)
        if status != 201:
            raise RuntimeError(f"ClusterTrustBundle: {status} {out[:300]!r}")

    return act


def drop_root(root: Path) -> None:
    Client(root).call("DELETE", path_of(CTBS, "clustertrustbundles", None, EXTRA_BUNDLE))


def rotate(root: Path) -> Callable[[], None]:
    """Every pod's forced re-key at once: the annotation `podcert shim rotate` sets, on all 110
    pods through 8 connections (the command patches them one by one)."""

    def act() -> None:
        rest = Rest(kube.admin_client(root))
        names = [p["metadata"]["name"] for p in rest.list(path_of("v1", "pods", NAMESPACE))[0]]
        stamp = format_micro_time(dt.datetime.now(dt.UTC))
        body = {"metadata": {"annotations": {ROTATE_ANNOTATION: stamp}}}
        local = threading.local()

        def one(name: str) -> None:
            client = getattr(local, "client", None) or Client(root)
            local.client = client
            path = path_of("v1", "pods", NAMESPACE, name)
            status, out = client.call("PATCH", path, body, "application/merge-patch+json")
            if status != 200:
                raise RuntimeError(f"pod {name}: {status} {out[:300]!r}")

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, names))

    return act


def relist(shim: Shim, prober: Prober, root: Path, window: float) -> None:
    before = log_has(shim.log, WATCH_BROKE)
    t0 = time.monotonic()
    prioritize(0)  # the new kube-apiserver inherits it
    cluster.restart_apiserver(root, timeout=600.0)
    prioritize(prober.nice)
    back = time.monotonic()
    prober.every = 1.0
    prober.start()
    deadline = back + 300.0
    while not [p for p in prober.samples if p.called >= back] and time.monotonic() < deadline:
        time.sleep(0.1)
    handled = min((p.on_disk for p in prober.samples if p.called >= back), default=float("nan"))
    time.sleep(window)
    prober.halt()
    broke = re.findall(WATCH_BROKE, shim.log.read_text(errors="replace"))[before:]
    kinds = ", ".join(sorted({f"{r} {k}" for r, k in broke})) or "no watch broke"
    shim.report(
        f"relist (API server restart took {back - t0:.0f} s; {kinds})",
        t0,
        time.monotonic(),
        f"first new pod handled {handled - back:.1f} s after the API server answered; "
        f"{prober.summary(back, time.monotonic())}",
    )


def run(args: argparse.Namespace, root: Path, nodes: int) -> None:
    tree = args.tree.resolve()
    work = Path(tempfile.mkdtemp(prefix="bench-scale-shim-"))
    print(f"shim from {tree}; logs in {work}", flush=True)
    uids = create_node_pods(root, args.per_node)
    with contextlib.ExitStack() as stack:
        port = free_port()
        nice = args.nice
        idle = stack.enter_context(
            running([str(port)], work / "ref.log", tree, nice, ("-c", REFERENCE))
        )
        reference = Watcher(idle.pid, port, nice=nice).start()
        stack.callback(reference.stop.set)
        # The signer as shipped, watched while it lists the cluster (bench_scale's figures).
        signer, signer_port = signer_args(root, work)
        t0 = time.monotonic()
        signer_proc = stack.enter_context(running(signer, work / "signer.log", tree, nice))
        watch = Watcher(signer_proc.pid, signer_port, nice=nice).start()
        ready = wait_readyz(signer_port, 900.0)
        watch.stop.set()
        peak, _, stall = watch.window(t0, ready)
        print(
            f"signer start -> ready {ready - t0:.1f} s: peak RSS {peak:.0f} MiB, longest /healthz "
            f"{stall:.3f} s (idle reference {reference.window(t0, ready)[2]:.3f} s)",
            flush=True,
        )
        spec = processes.shim(root, work, NODE, root=work / "node")
        t0 = time.monotonic()
        proc = stack.enter_context(running(spec.args, spec.log, tree, nice))
        watcher = Watcher(proc.pid, spec.metrics_port, nice=nice).start()
        stack.callback(watcher.stop.set)
        shim = Shim(proc, spec.metrics_port, spec.log, spec.root, watcher, reference)
        try:
            phases(args, shim, Files(spec.root, uids), root, nodes, t0)
        finally:
            shim.save(work, t0)
        print(
            f"/healthz over the whole run: shim {tail(watcher)}; idle reference {tail(reference)}"
        )
        print(f"shim VmHWM (peak over the whole run): {rss_mib(proc.pid, 'VmHWM'):.0f} MiB")


def phases(
    args: argparse.Namespace,
    shim: Shim,
    files: Files,
    root: Path,
    nodes: int,
    t0: float,
) -> None:
    prioritize(args.nice)  # this thread waits for the files, and starts the churn's loaders
    start(shim, files, t0, args.steady)
    prober = Prober(root, shim.node_root, args.probe_every, args.nice)
    if args.churn:
        prober.start()
        cpu = cpu_seconds(shim.pid)
        t1 = time.monotonic()
        churn(root, args.churn, nodes, args.procs, args.threads)
        prober.halt()
        t2 = time.monotonic()
        used = cpu_seconds(shim.pid) - cpu
        shim.report(
            f"churn of {args.churn} pods elsewhere ({t2 - t1:.0f} s)",
            t1,
            t2,
            f"shim {used:.2f} CPU-s ({used / (t2 - t1):.1%} of a core); {prober.summary(t1, t2)}",
        )
    bulk(shim, files, TRUST, "a new root (second ClusterTrustBundle)", new_root(root))
    bulk(shim, files, TRUST, "the root withdrawn", lambda: drop_root(root))
    bulk(shim, files, BUNDLE, "forced re-key of all 110 at once", rotate(root))
    if not args.no_relist:
        relist(shim, prober, root, args.relist_window)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=20000, help="pods on the other nodes")
    parser.add_argument("--nodes", type=int, default=0, help="default: pods / 110")
    parser.add_argument("--namespaces", type=int, default=0, help="default: pods / 1000")
    parser.add_argument("--per-node", type=int, default=110, help="pods on the shim's node")
    parser.add_argument("--procs", type=int, default=4, help="loader processes")
    parser.add_argument("--threads", type=int, default=8, help="connections per loader process")
    parser.add_argument("--steady", type=float, default=10.0)
    parser.add_argument("--churn", type=int, default=10000, help="pods churned elsewhere")
    parser.add_argument("--probe-every", type=float, default=0.5)
    parser.add_argument("--no-relist", action="store_true")
    parser.add_argument("--relist-window", type=float, default=30.0)
    parser.add_argument("--cluster", type=Path, help="devcluster folder to load or reuse")
    parser.add_argument("--keep", action="store_true", help="leave the devcluster running")
    parser.add_argument("--tree", type=Path, default=processes.REPO)
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="run the signer, the shim, the reference server and the /healthz pollers at this "
        "priority (-10: ahead of the rest of a shared machine, so stalls are their own)",
    )
    args = parser.parse_args(argv)
    nodes = args.nodes or max(1, -(-args.pods // 110))
    namespaces = args.namespaces or max(1, args.pods // 1000)
    with a_cluster(args.cluster, args.keep) as root:
        load(root, args.pods, nodes, namespaces, args.procs, args.threads)
        run(args, root, nodes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
