"""The signer and `podcert audit` on a cluster of Kubernetes' published size.

    .venv/bin/python -m bench.bench_scale --pods 20000                 # 110 pods a node
    .venv/bin/python -m bench.bench_scale --pods 150000 --nodes 5000   # the published limits
    .venv/bin/python -m bench.bench_scale --pods 20000 --cluster /tmp/scale --keep
        # load (or reuse) a devcluster under /tmp/scale and leave it running for the next run

A devcluster is loaded with `--pods` small pods (one container, a label, `nodeName` set; about
1.6 KB of JSON each, as the issue's figures) spread over `--nodes` Node objects (no kubelet) and
`--namespaces` namespaces, created by direct POSTs from several processes as fast as the API server
takes them. One more pod in namespace `probe` has a pending PodCertificateRequest made by its
node. Then, for the signer as shipped (`podcert signer` as its ServiceAccount with the shipped
RBAC, the shipped policy from manifests/signer/policy.yaml, an audit log, default flags):

1. start: process start -> the probe request Issued (polled every 10 ms), and -> /readyz (every
   cache listed, the pods too); RSS sampled every 20 ms (VmRSS; VmHWM at the end); /healthz
   polled back to back, the longest answer is the longest stall (the interpreter lock held);
2. steady: RSS and stalls over `--steady` seconds once ready, nothing happening;
3. relist: kube-apiserver is restarted (at 150k pods it takes 1-2 minutes to fill its cache); the
   signer's watches break, or resume from versions the new cache does not have (410 Gone), and
   every list is read again. RSS peak and after, the longest stall, from the restart to
   `--relist-window` seconds after a second request was issued;
4. `podcert audit --kubeconfig` (admin) over the whole cluster: wall time and peak RSS (its own
   rusage from wait4), interpreter start-up included.

`--tree PATH` runs the signer and the audit from another checkout (e.g. `git archive <commit> |
tar -x -C /tmp/old`), to measure before and after on the same loaded cluster.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import multiprocessing
import os
import re
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from bench.bench_time_to_credential import cpu_seconds, exit_on_sigterm, rss_mib
from devcluster import cluster, kube, planestate, processes
from devcluster.identities import Paths
from devcluster.stack import SIGNER_NAMESPACE
from devcluster.supervise import end
from podcert.api import keys
from podcert.client.rest import JSON, ApiError, Rest, path_of

PCRS = "certificates.k8s.io/v1"
PROBE_NS = "probe"
SIGNER = processes.DEFAULT_SIGNER
# The signer's log line when its pods watch ends in 410 Gone, or breaks (the API server went away):
# either way the reflector lists all pods again.
RELIST = r"pods: watch (expired|failed)"


# --- loading the cluster -----------------------------------------------------------------------


class Client:
    """A bare HTTPS client as the devcluster's admin: the loader's per-request CPU stays small
    next to the API server's, so the API server sets the pace."""

    def __init__(self, root: Path) -> None:
        paths = Paths(root.resolve())
        state = planestate.read_state(paths)
        if state is None:
            raise RuntimeError(f"no devcluster runs under {root}")
        self.port = state.apiserver_port
        self.ctx = ssl.create_default_context(cafile=str(paths.pki / "ca.crt"))
        self.ctx.load_cert_chain(str(paths.pki / "admin.crt"), str(paths.pki / "admin.key"))
        self.conn: http.client.HTTPSConnection | None = None

    def call(
        self,
        method: str,
        path: str,
        body: JSON | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, bytes]:
        for attempt in range(5):
            if self.conn is None:
                self.conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx)
            try:
                data = json.dumps(body).encode() if body is not None else None
                headers = {"Content-Type": content_type, "Accept": "application/json"}
                self.conn.request(method, path, body=data, headers=headers)
                resp = self.conn.getresponse()
                out = resp.read()
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                time.sleep(0.2 * (attempt + 1))
                continue
            if resp.status == 429 or resp.status >= 500:
                time.sleep(0.2 * (attempt + 1))
                continue
            return resp.status, out
        raise RuntimeError(f"{method} {path}: no answer after 5 tries")


def small_pod(namespace: str, name: str, node: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name[:-3]}},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": False,
            "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
        },
    }


def create_share(root: str, jobs: list[tuple[str, str, str]], threads: int) -> int:
    """One loader process: its share of (namespace, name, node) through `threads` connections."""
    local = threading.local()

    def one(job: tuple[str, str, str]) -> int:
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = Client(Path(root))
        namespace, name, node = job
        status, out = client.call(
            "POST", path_of("v1", "pods", namespace), small_pod(namespace, name, node)
        )
        if status not in (201, 409):
            raise RuntimeError(f"pod {namespace}/{name}: {status} {out[:300]!r}")
        return 1

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(one, jobs, chunksize=64))


def count(rest: Rest, path: str) -> int:
    body = rest.request("GET", path, query={"limit": 1})
    meta = body.get("metadata") or {}
    return len(body.get("items") or []) + int(meta.get("remainingItemCount") or 0)


def load(root: Path, pods: int, nodes: int, namespaces: int, procs: int, threads: int) -> None:
    """Nodes, namespaces (with their default ServiceAccount) and pods, up to the counts asked
    for; what already exists is kept (a reused cluster is topped up, never emptied)."""
    admin = kube.admin_client(root)
    rest = Rest(admin)
    client = Client(root)
    have_nodes = count(rest, "/api/v1/nodes")
    t0 = time.monotonic()
    for i in range(have_nodes, nodes):
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"scale-{i}"}}
        status, out = client.call("POST", "/api/v1/nodes", body)
        if status not in (201, 409):
            raise RuntimeError(f"node scale-{i}: {status} {out[:200]!r}")
    for n in range(namespaces):
        namespace = f"scale-{n}"
        kube.ensure_namespace(admin, namespace)
        kube.ensure_service_account(admin, namespace, "default")
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "app", "namespace": namespace},
            "spec": {"selector": {"app": "pod-00"}, "ports": [{"port": 80}]},
        }
        client.call("POST", path_of("v1", "services", namespace), service)
    have = count(rest, "/api/v1/pods")
    wanted = [
        (f"scale-{i % namespaces}", f"pod-{i:07d}", f"scale-{i % nodes}") for i in range(pods)
    ]
    # Names are fixed, so a top-up re-posts what exists (409) only for the first `have`.
    todo = wanted[have:] if have < pods else []
    took = time.monotonic() - t0
    print(f"loading: {nodes} nodes ({took:.1f}s); {have} pods exist, {len(todo)} to create")
    if todo:
        t1 = time.monotonic()
        shares = [todo[k::procs] for k in range(procs)]
        with multiprocessing.get_context("spawn").Pool(procs) as pool:
            done = sum(pool.starmap(create_share, [(str(root), s, threads) for s in shares]))
        wall = time.monotonic() - t1
        print(f"created {done} pods in {wall:.0f}s ({done / wall:.0f}/s)", flush=True)


# --- the probe requests ------------------------------------------------------------------------


class Probe:
    """A pod in namespace `probe` on node scale-0 and pending requests for it, made as that
    node (through NodeRestriction) before the signer runs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.api = kube.admin_client(root)
        self.admin = Rest(self.api)
        kube.ensure_namespace(self.api, PROBE_NS)
        sa = kube.ensure_service_account(self.api, PROBE_NS, "default")
        self.sa_uid = str(sa.metadata.uid)
        self.node = "scale-0"
        self.node_rest = Rest(kube.api_client(kube.node_kubeconfig(root, self.node)))
        node = self.admin.request("GET", path_of("v1", "nodes", None, self.node))
        self.node_uid = str(node["metadata"]["uid"])
        self.csr = base64.b64encode(keys.stub_csr(keys.generate("ECDSAP256"))).decode()
        self.path = path_of(PCRS, "podcertificaterequests", PROBE_NS)

    def request(self) -> str:
        """A new pod and a pending request for it; the request's name."""
        name = f"probe-{time.monotonic_ns()}"
        volume = kube.pod_certificate_volume(SIGNER)
        pod = kube.create_pod(self.api, PROBE_NS, name, node=self.node, volumes=[volume])
        body = {
            "apiVersion": PCRS,
            "kind": "PodCertificateRequest",
            "metadata": {"generateName": f"{name}-"},
            "spec": {
                "signerName": SIGNER,
                "podName": name,
                "podUID": pod.metadata.uid,
                "serviceAccountName": "default",
                "serviceAccountUID": self.sa_uid,
                "nodeName": self.node,
                "nodeUID": self.node_uid,
                "stubPKCS10Request": self.csr,
            },
        }
        for _ in range(100):
            try:
                return str(self.node_rest.request("POST", self.path, body=body)["metadata"]["name"])
            except ApiError as err:
                if err.status not in (409, 500):
                    raise
                time.sleep(0.1)
        raise RuntimeError("could not create the probe request")

    def outcome(self, name: str) -> str | None:
        pcr = self.admin.get(f"{self.path}/{name}") or {}
        for cond in (pcr.get("status") or {}).get("conditions") or ():
            if cond.get("status") == "True":
                return str(cond.get("type"))
        return None

    def wait(self, name: str, timeout: float) -> float:
        """Monotonic time when the request was seen settled (polled every 10 ms)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            outcome = self.outcome(name)
            if outcome is not None:
                if outcome != "Issued":
                    raise RuntimeError(f"probe request {name}: {outcome}")
                return time.monotonic()
            time.sleep(0.01)
        raise TimeoutError(f"probe request {name} not settled in {timeout:.0f}s")


# --- watching the signer -----------------------------------------------------------------------


@dataclass
class Watcher:
    """RSS every 20 ms and /healthz back to back, in two threads, for one process."""

    pid: int
    port: int
    rss: list[tuple[float, float]] = field(default_factory=list)  # (monotonic, MiB)
    health: list[tuple[float, float, int]] = field(default_factory=list)  # (start, seconds, code)
    stop: threading.Event = field(default_factory=threading.Event)
    nice: int = 0  # the polling thread's priority (Linux: per thread), as the watched process's

    def start(self) -> Watcher:
        threading.Thread(target=self._rss, daemon=True).start()
        threading.Thread(target=self._health, daemon=True).start()
        return self

    def _rss(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(OSError, RuntimeError):
                self.rss.append((time.monotonic(), rss_mib(self.pid)))
            self.stop.wait(0.02)

    def _health(self) -> None:
        if self.nice:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
        conn: http.client.HTTPConnection | None = None
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                conn.request("GET", "/healthz")
                resp = conn.getresponse()
                resp.read()
                code = resp.status
            except (OSError, http.client.HTTPException):
                code = 0
                if conn is not None:
                    conn.close()
                conn = None
            took = time.monotonic() - t0
            self.health.append((t0, took, code))
            # 10 ms apart: back to back, the probes alone kept the signer's server 40% busy.
            self.stop.wait(0.02 if code == 0 else 0.01)

    def window(self, since: float, until: float) -> tuple[float, float, float]:
        """(peak RSS, last RSS, longest answered /healthz) between two monotonic times."""
        rss = [m for t, m in self.rss if since <= t <= until] or [0.0]
        stalls = [s for t, s, code in self.health if since <= t <= until and code]
        return max(rss), rss[-1], max(stalls, default=0.0)


def wait_ready(port: int, timeout: float) -> float:
    """Monotonic time when the signer's /readyz first answers 200 (every cache has listed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return time.monotonic()
        time.sleep(0.05)
    raise TimeoutError(f"signer not ready in {timeout:.0f}s")


def signer_args(root: Path, work: Path) -> tuple[list[str], int]:
    """`podcert signer` as the manifests ship it: their policy (Service DNS names on, so the
    signer also watches Services) and an audit log; its own ServiceAccount and RBAC."""
    policy = work / "policy.yaml"
    shipped = yaml.safe_load((processes.REPO / "manifests/signer/policy.yaml").read_text())
    policy.write_text(shipped["data"]["policy.yaml"])
    extra = [f"--policy={policy}", f"--audit-log={work / 'audit.jsonl'}"]
    proc = processes.signer(root, work, [SIGNER], namespace=SIGNER_NAMESPACE, extra=extra)
    return proc.args, proc.metrics_port


def log_has(path: Path, pattern: str) -> int:
    try:
        return len(re.findall(pattern, path.read_text(errors="replace")))
    except OSError:
        return 0


# --- the phases --------------------------------------------------------------------------------


def run_signer(
    root: Path, work: Path, tree: Path, steady: float, relist: bool, relist_window: float
) -> None:
    probe = Probe(root)
    first = probe.request()
    args, port = signer_args(root, work)
    log = work / "signer-scale.log"
    with log.open("ab") as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "podcert", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tree,
        )
    watcher = Watcher(proc.pid, port).start()
    try:
        issued = probe.wait(first, 300.0)
        print(f"start -> first issuance: {issued - t0:.2f} s", flush=True)
        ready = wait_ready(port, 900.0)
        peak, last, stall = watcher.window(t0, ready)
        print(
            f"start -> ready (every cache listed, the pods too): {ready - t0:.1f} s, "
            f"{cpu_seconds(proc.pid):.1f} CPU-s; peak RSS {peak:.0f} MiB, longest /healthz "
            f"{stall:.3f} s",
            flush=True,
        )
        cpu_ready = cpu_seconds(proc.pid)
        time.sleep(steady)
        t1 = time.monotonic()
        peak, last, stall = watcher.window(ready, t1)
        idle = (cpu_seconds(proc.pid) - cpu_ready) / max(t1 - ready, 1e-3)
        print(
            f"then {steady:.0f}s steady: peak RSS {peak:.0f} MiB, steady RSS {last:.0f} MiB, "
            f"longest /healthz {stall:.3f} s, {idle * 100:.1f}% of a core",
            flush=True,
        )
        if relist:
            before = log_has(log, RELIST)
            t2 = time.monotonic()
            cluster.restart_apiserver(root)
            restarted = time.monotonic()
            deadline = restarted + 300
            while log_has(log, RELIST) == before and time.monotonic() < deadline:
                time.sleep(0.05)
            relisted = log_has(log, RELIST) > before
            seen = time.monotonic()
            second = probe.request()
            asked = time.monotonic()
            done = probe.wait(second, 300.0)
            time.sleep(relist_window)  # the pods' relist runs meanwhile (no signal marks its end)
            peak2, last2, stall2 = watcher.window(t2, time.monotonic())
            print(
                f"relist ({'pods relisted' if relisted else 'NO relist of the pods seen'}; "
                f"API server restart took {restarted - t2:.1f}s): peak RSS {peak2:.0f} MiB, "
                f"after {last2:.0f} MiB, longest /healthz {stall2:.3f} s; relist began "
                f"{seen - restarted:.1f}s after the restart; a new request issued in "
                f"{done - asked:.2f}s; window {relist_window:.0f}s after it",
                flush=True,
            )
        hwm = rss_mib(proc.pid, "VmHWM")
        print(f"signer VmHWM (peak over the whole run): {hwm:.0f} MiB", flush=True)
    finally:
        watcher.stop.set()
        end(proc, 20)


def run_audit(root: Path, tree: Path, runs: int) -> None:
    """`podcert audit` over the cluster as an operator runs it: wall time, and its peak RSS as
    GNU time reports it (interpreter start-up included). Not this process's own wait4: Linux
    carries a parent's resident size into a forked child's ru_maxrss across exec, so a child
    of this (100 MiB) benchmark would never report less."""
    admin = Paths(root.resolve()).admin_kubeconfig
    for _ in range(runs):
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            t0 = time.monotonic()
            code = subprocess.call(
                [
                    "/usr/bin/time",
                    "-f",
                    "maxrss-kib %M",
                    sys.executable,
                    "-m",
                    "podcert",
                    "audit",
                    f"--kubeconfig={admin}",
                    "-o",
                    "json",
                ],
                stdout=out,
                stderr=err,
                cwd=tree,
            )
            wall = time.monotonic() - t0
            out.seek(0)
            err.seek(0)
            errors = err.read().decode(errors="replace")
            found = re.search(r"maxrss-kib (\d+)", errors)
            peak = int(found.group(1)) / 1024 if found else float("nan")
            inputs = ""
            with contextlib.suppress(ValueError, KeyError):
                inputs = "; ".join(json.loads(out.read())["inputs"])
            print(
                f"podcert audit: {wall:.2f} s, peak RSS {peak:.0f} MiB, exit {code} "
                f"({inputs or errors[-300:]})",
                flush=True,
            )


@contextlib.contextmanager
def a_cluster(where: Path | None, keep: bool) -> Iterator[Path]:
    exit_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        root = where or Path(tmp) / "cluster"
        try:
            cluster.up(root)
            yield root
        finally:
            if not keep:
                cluster.down(root)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=20000)
    parser.add_argument("--nodes", type=int, default=0, help="default: pods / 110")
    parser.add_argument("--namespaces", type=int, default=0, help="default: pods / 1000")
    parser.add_argument("--procs", type=int, default=4, help="loader processes")
    parser.add_argument("--threads", type=int, default=8, help="connections per loader process")
    parser.add_argument("--steady", type=float, default=10.0)
    parser.add_argument("--no-relist", action="store_true")
    parser.add_argument(
        "--relist-window", type=float, default=60.0, help="seconds watched after the relist began"
    )
    parser.add_argument("--audit-runs", type=int, default=1)
    parser.add_argument("--cluster", type=Path, help="devcluster folder to load or reuse")
    parser.add_argument("--keep", action="store_true", help="leave the devcluster running")
    parser.add_argument("--tree", type=Path, default=processes.REPO)
    parser.add_argument("--load-only", action="store_true")
    parser.add_argument("--audit-only", action="store_true")
    args = parser.parse_args(argv)
    nodes = args.nodes or max(1, -(-args.pods // 110))
    namespaces = args.namespaces or max(1, args.pods // 1000)
    with a_cluster(args.cluster, args.keep) as root:
        load(root, args.pods, nodes, namespaces, args.procs, args.threads)
        if args.load_only:
            return 0
        if args.audit_only:
            run_audit(root, args.tree.resolve(), args.audit_runs)
            return 0
        work = Path(tempfile.mkdtemp(prefix="bench-scale-work-"))
        print(f"signer and audit from {args.tree}; logs in {work}", flush=True)
        run_signer(
            root, work, args.tree.resolve(), args.steady, not args.no_relist, args.relist_window
        )
        run_audit(root, args.tree.resolve(), args.audit_runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
