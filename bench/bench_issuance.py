"""Issuance throughput and CPU per request, side by side in one run: podcert's signer, the Go
signer it is measured against (`bench.peer`), and the API server's status-write ceiling.

    .venv/bin/python -m bench.bench_issuance [--requests 1000] [--nodes 2] [--workers 1 2 4 8]
        [--rounds 3] [--pin] [--profile DIR] [--peer PATH | --no-peer] [--tree PATH]
        [--apiserver-profile DIR]

On a fresh devcluster, each round runs every side once, at each worker count, in the order
ceiling, podcert, peer (then `--tree`'s) in even rounds and the reverse in odd ones, so the VM's
drift hits every side alike. Each side gets a batch of N pending PodCertificateRequests of its
own (pods spread over `--nodes` nodes, each request made as its pod's node) under its own signer
name, made just before its run and deleted after it: no signer sees another's requests, and each
starts on a cluster of the same size.

- the ceiling: the fastest status writer this benchmark could build (measured against the
  others, BENCHMARKS.md "Issuance throughput"): `W` threads, each with its own kept-alive TLS
  connection, writing precomputed bytes (head and a minimal body: the request's name, namespace,
  uid and resourceVersion, and the Issued status; the status subresource takes spec and the
  rest of metadata from the stored object) and reading the JSON answer to throw it away. It runs
  as a ServiceAccount with the signer's own RBAC, so the API server authenticates, authorizes
  (`sign` on the signer name) and schedules it exactly as it does the signer.
- podcert: `podcert signer --workers W` as shipped (its ServiceAccount, leader election, the
  audit log with its fsync, INFO logs), started once its batch exists, from compiled bytecode as
  pip installs it (this environment sets PYTHONDONTWRITEBYTECODE, which would otherwise
  recompile podcert at every start).
- peer: the Go controller-runtime signer with `--max-concurrent-reconciles=W`, as its README runs
  it (the cluster's admin, a CA in files, INFO logs), started once its batch exists.
- `--tree PATH` (another checkout: `git archive <commit> | tar -x -C PATH`): that checkout's
  podcert signer too, before and after a change side by side.

One watch times every side: the rate is over the steady state, the 10-90 % window of the batch.
CPU per request comes from /proc/<pid>/stat: each process's over that window ("steady"), and for
a signer also whole-process ("whole": everything from exec to the last settled request, start-up
included, over N); "first" is exec to the first issuance. "GETs" is podcert's live reads of pods,
nodes and ServiceAccounts (`podcert_signer_live_reads_total`). The summary gives each ratio as
the median of the round-by-round ratios (both sides of a ratio ran in the same round), because
a shared two-core VM drifts by +-20% from one minute to the next. `--profile DIR` records each
podcert run with py-spy (on-CPU samples of the thread holding the interpreter lock);
`--apiserver-profile DIR` takes the API server's own CPU profile (pprof, the cluster started
with profiling on) of every side from its 10 % mark, and reports the API server's CPU per write
of each side from it (`ServerProfile`).
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any, BinaryIO, Final, cast
from urllib.parse import urlsplit

import msgspec

from bench import peer
from bench.bench_time_to_credential import component_pids, cpu_of, cpu_seconds
from devcluster import cluster, kube, planestate, processes
from devcluster.identities import Paths, admin_ssl
from devcluster.planestate import read_state
from podcert.api import keys
from podcert.api.requests import outcome as pcr_outcome
from podcert.api.requests import parse_request
from podcert.client.kubeconfig import ClientSettings
from podcert.client.rest import JSON, ApiError, Rest, load_client, path_of
from signer import certs, model
from signer.authority import ca
from signer.issue.decide import parse_public_key
from signer.issue.settle import issued_status

PCRS = "certificates.k8s.io/v1"
REPO: Final = Path(__file__).resolve().parents[1]
PACKAGES: Final = ("podcert", "signer", "bundles", "audit", "kubelet_shim")
PYCACHE: Final = Path(tempfile.gettempdir()) / "podcert-bench-pycache"


def make_requests(root: Path, namespace: str, signer: str, count: int, nodes: int) -> list[JSON]:
    """`count` pods over `nodes` nodes and one PCR each, created by each pod's node."""
    admin = kube.admin_client(root)
    kube.ensure_namespace(admin, namespace)
    node_apis = {
        f"node-{i}": Rest(kube.api_client(kube.node_kubeconfig(root, f"node-{i}")))
        for i in range(nodes)
    }
    rest = Rest(admin)
    node_objs = {n: rest.request("GET", path_of("v1", "nodes", None, n)) for n in node_apis}
    kube.ensure_service_account(admin, namespace, "default")
    sa = rest.request("GET", path_of("v1", "serviceaccounts", namespace, "default"))
    key = keys.generate("ECDSAP256")  # one key: the bench measures the signer, not keygen
    csr = base64.b64encode(keys.stub_csr(key)).decode()
    volume = kube.pod_certificate_volume(signer)

    def pod(i: int) -> Any:
        return kube.create_pod(
            admin, namespace, f"p{i}", node=f"node-{i % nodes}", volumes=[volume]
        )

    def one(i: int, pod: Any) -> JSON:
        node = f"node-{i % nodes}"
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
                "nodeUID": node_objs[node]["metadata"]["uid"],
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
    process used is sampled at those two marks, at the first issuance and when the last
    request is settled. Only Issued counts toward the rate: a request denied or failed is
    settled (the watch stops waiting for it) but reported apart, so a signer that denies fast
    cannot look like one that issues fast."""

    def __init__(
        self,
        root: Path,
        namespace: str,
        count: int,
        pids: dict[str, int],
        server_profile: Path | None = None,
    ) -> None:
        self.root = root
        self.server_profile = server_profile
        self.profiler: threading.Thread | None = None
        self.profiled: tuple[float, bytes] | None = None  # (its start, the pprof answer)
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
        self.first: float | None = None  # monotonic time of the first issuance
        self.issued_at: list[float] = []  # monotonic time of every issuance, in order
        self.last_cpu: dict[str, float] = {}  # CPU seconds by process when the last settled
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while len(self.settled) < self.count:
            for event in self.rest.watch(self.path, self.version, timeout_seconds=60):
                obj = event["object"]
                self.version = obj["metadata"]["resourceVersion"]
                name = obj["metadata"]["name"]
                outcome = pcr_outcome(obj)
                if outcome and name not in self.settled:
                    self.settled.add(name)
                    self.outcomes[outcome] += 1
                    if outcome == "Issued":
                        self.issued_at.append(time.monotonic())
                    if self.first is None and outcome == "Issued":
                        self.first = time.monotonic()
                    if outcome == "Issued" and self.outcomes["Issued"] in self.marks:
                        self.times.append(time.monotonic())
                        self.cpu.append(cpu_of(self.pids))
                        if self.server_profile is not None and self.profiler is None:
                            self.profiler = threading.Thread(target=self._profile, daemon=True)
                            self.profiler.start()
                    if len(self.settled) >= self.count:
                        self.last_cpu = cpu_of(self.pids)
                        return

    def _profile(self) -> None:
        """The API server's own CPU profile over PROFILE_SECONDS from the 10 % mark on."""
        paths = Paths(self.root.resolve())
        state = read_state(paths)
        if state is None:
            raise RuntimeError(f"no devcluster under {self.root}")
        conn = http.client.HTTPSConnection(
            "127.0.0.1", state.apiserver_port, context=admin_ssl(paths), timeout=60
        )
        start = time.monotonic()
        try:
            conn.request("GET", f"/debug/pprof/profile?seconds={PROFILE_SECONDS}")
            answer = conn.getresponse()
            data = answer.read()
        finally:
            conn.close()
        if answer.status != 200:
            raise RuntimeError(f"the API server's profile: {answer.status} {data[:200]!r}")
        self.profiled = (start, data)

    def server(self) -> ServerProfile | None:
        """What the API server spent per issuance while it profiled (the profile saved beside
        its `go tool pprof -top -cum`), or None without a profile."""
        if self.profiler is None or self.server_profile is None:
            return None
        self.profiler.join(PROFILE_SECONDS + 60)
        if self.profiled is None:
            raise RuntimeError("the API server's profile did not come")
        start, data = self.profiled
        writes = sum(start <= t < start + PROFILE_SECONDS for t in self.issued_at)
        return ServerProfile.saved(self.server_profile, data, writes)

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
            issued / max(self.times[1] - self.times[0], 1e-3),
            cpu_ms,
            denied=denied,
            failed=failed,
            server=self.server(),
        )


@dataclass(frozen=True)
class Phase:
    rate: float  # requests issued per second, 10-90 % window
    cpu_ms: dict[str, float]  # CPU milliseconds per issued request in the window, by process
    denied: int = 0  # requests of the batch denied instead (not in the rate)
    failed: int = 0  # ... and failed
    whole_ms: float | None = None  # the signer's whole-process CPU ms per request
    first_s: float | None = None  # the signer's process start -> first issuance, seconds
    live_reads: int | None = None  # the signer's GETs of pods/nodes/ServiceAccounts (backlog: 0)
    own_ms: float | None = None  # the signer's own CPU ms per request in the window ("steady")
    server: ServerProfile | None = None  # the API server's own profile of part of the window


PROFILE_SECONDS: Final = 3  # of the API server's profile; a batch of 2,000+ outlasts it at 500/s
_TOTAL: Final = re.compile(r"Total samples = ([0-9.]+)(ms|s)\b")


@dataclass(frozen=True)
class ServerProfile:
    """The API server's own CPU profile (`/debug/pprof/profile`, Go's sampler at 100 Hz) over
    PROFILE_SECONDS of a side's steady state: its on-CPU milliseconds per issuance of that side
    in those seconds, against the /proc figures of the same process over the 10-90 % window."""

    path: Path  # the profile; `path.with_suffix(".top.txt")` holds its `-top -cum`
    writes: int  # issuances in the profile's seconds
    cpu_ms: float  # the API server's sampled CPU ms per issuance

    @classmethod
    def saved(cls, path: Path, data: bytes, writes: int) -> ServerProfile:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        top = subprocess.run(
            ["go", "tool", "pprof", "-top", "-cum", "-nodecount=60", str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        path.with_suffix(".top.txt").write_text(top)
        found = _TOTAL.search(top)
        if found is None:
            raise RuntimeError(f"no 'Total samples' in the profile's summary ({path})")
        ms = float(found[1]) * (1000 if found[2] == "s" else 1)
        return cls(path, writes, ms / max(writes, 1))


# --- the ceiling: the fastest status writer ----------------------------------------------------


class RawWriter:
    """Status PUTs as precomputed bytes, one kept-alive TLS connection per thread; answers read
    (Content-Length or chunked) and thrown away. Only what a status write needs of HTTP/1.1."""

    def __init__(self, settings: ClientSettings) -> None:
        url = urlsplit(settings.server)
        self.host, self.port = url.hostname or "", url.port or 443
        self.context = settings.ssl_context
        self.token = settings.token() if settings.token is not None else ""
        self._local = threading.local()

    def request(self, path: str, body: bytes) -> bytes:
        head = (
            f"PUT {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"User-Agent: podcert-bench-ceiling\r\nAuthorization: Bearer {self.token}\r\n"
            "Accept: application/json\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        return head.encode("latin-1") + body

    def _connection(self) -> tuple[socket.socket, BinaryIO]:
        conn: tuple[socket.socket, BinaryIO] | None = getattr(self._local, "conn", None)
        if conn is None:
            sock = socket.create_connection((self.host, self.port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.context is not None:
                sock = self.context.wrap_socket(sock, server_hostname=self.host)
            reader = cast(BinaryIO, sock.makefile("rb", buffering=64 * 1024))
            conn = self._local.conn = (sock, reader)
        return conn

    def send(self, data: bytes) -> None:
        sock, reader = self._connection()
        sock.sendall(data)
        status = int(reader.readline().split()[1])
        length, chunked = 0, False
        while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
        if chunked:
            answer = b""
            while size := int(reader.readline().split(b";")[0], 16):
                answer += reader.read(size)
                reader.readline()
            reader.readline()
        else:
            answer = reader.read(length)
        if status != 200:
            raise RuntimeError(f"status write refused: {status} {answer[:300]!r}")


def ceiling(
    root: Path,
    namespace: str,
    pcrs: list[JSON],
    workers: int,
    pids: dict[str, int],
    server_profile: Path | None = None,
) -> Phase:
    """The fastest writer (`RawWriter`) with `workers` threads, as the signer's own
    ServiceAccount: the API server authenticates, authorizes (RBAC, and `sign` on the signer
    name) and schedules it exactly as it does the signer. Bodies and certificates are made
    before the clock starts."""
    bundle = ca.new_ca("bench", dt.datetime.now(dt.UTC))
    issuer = ca.issuing_ca(bundle)
    now = dt.datetime.now(dt.UTC)
    first = parse_request(pcrs[0])
    plan = model.LeafPlan(
        public_key=parse_public_key(first).public_key,
        spiffe_id="spiffe://bench/ns/x/sa/y",
        dns_names=(),
        not_before=certs.truncate_to_second(now - dt.timedelta(minutes=1)),
        not_after=certs.truncate_to_second(now + dt.timedelta(hours=2)),
        begin_refresh_at=certs.truncate_to_second(now + dt.timedelta(hours=1)),
    )
    chain = certs.sign_leaf(plan, issuer, certs.random_serial())
    identity = processes.install_signer_identity(
        root, f"{namespace}-writer", [first.spec.signer_name], namespace
    )
    writer = RawWriter(load_client(identity))
    requests = []
    for pcr in pcrs:
        meta = pcr["metadata"]
        body = {
            "apiVersion": PCRS,
            "kind": "PodCertificateRequest",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion")},
            "status": issued_status(
                meta.get("generation"),
                chain,
                plan.not_before,
                plan.not_after,
                plan.begin_refresh_at,
                f"issued for {plan.spiffe_id}",
                now,
            ),
        }
        path = path_of(PCRS, "podcertificaterequests", meta["namespace"], meta["name"])
        requests.append(writer.request(path + "/status", msgspec.json.encode(body)))
    # Each thread its own share, taken in turn: no queue or future between two writes.
    errors: list[BaseException] = []

    def write(share: list[bytes]) -> None:
        try:
            for data in share:
                writer.send(data)
        except BaseException as err:  # reported after the join, not lost in the thread
            errors.append(err)

    threads = [threading.Thread(target=write, args=(requests[i::workers],)) for i in range(workers)]
    observer = Observer(root, namespace, len(pcrs), pids, server_profile)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return observer.result()


# --- the signers: podcert, the Go peer, another tree's podcert ----------------------------------


def signer_phase(
    root: Path,
    side: str,
    proc: processes.Process,
    namespace: str,
    count: int,
    profile: Path | None = None,
    reads: Callable[[], int | None] = lambda: None,
    server_profile: Path | None = None,
) -> Phase:
    """One signer process, started once its batch exists, timed by the watch: the rate and
    CPU per request in the 10-90 % window, its whole-process CPU from exec to the last settled
    request (start-up included), and exec to the first issuance."""
    # The watch starts first, so no issuance can come before it; the process's pid joins the
    # ones it samples as soon as there is one (it first samples at the 10 % mark).
    pids = component_pids(root)
    observer = Observer(root, namespace, count, pids, server_profile)
    started = time.monotonic()
    proc.start()
    assert proc.proc is not None
    pid = pids[side] = proc.proc.pid
    spy = None
    try:
        # Inside the try: a py-spy that cannot start must not leave the signer running.
        spy = py_spy(pid, profile / f"{namespace}.txt") if profile is not None else None
        phase = observer.result()
        whole = observer.last_cpu.get(side)
        if whole is None:  # the process was gone: read it now (it cannot have grown)
            whole = cpu_seconds(pid)
        return Phase(
            phase.rate,
            phase.cpu_ms,
            phase.denied,
            phase.failed,
            whole_ms=whole * 1000 / count,
            first_s=(observer.first - started) if observer.first is not None else None,
            live_reads=reads(),
            own_ms=phase.cpu_ms.get(side),
            server=phase.server,
        )
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its samples on SIGINT, not SIGTERM
            spy.wait(60)
        if not proc.running:
            print(proc.output()[-2000:])
        proc.stop()


def podcert_signer(
    root: Path, work: Path, signer: str, namespace: str, workers: int, tree: Path | None = None
) -> processes.Signer:
    """`podcert signer --workers W` as shipped (its own ServiceAccount and RBAC, leader
    election, the audit log with its fsync, INFO logs), from compiled bytecode as pip installs
    it; with `tree`, the signer of that checkout (its packages first on the path)."""
    proc = processes.signer(
        root,
        work,
        [signer],
        namespace=f"{namespace}-signer",
        extra=[f"--workers={workers}", f"--audit-log={work / namespace / 'audit.jsonl'}"],
    )
    proc.env = {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(PYCACHE)}
    if tree is not None:
        proc.env["PYTHONPATH"] = str(tree)
    return proc


def live_reads(metrics: str) -> int:
    """podcert_signer_live_reads_total, summed over resources, from a /metrics page."""
    return round(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("podcert_signer_live_reads_total{")
        )
    )


def py_spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy recording `pid` (the interpreter lock's holder only: CPU, not waits) into `out`,
    collapsed stacks; until terminated."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--gil", "--rate", "250", "--format", "raw", "-o", out],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# --- running it --------------------------------------------------------------------------------


@dataclass
class Rows:
    """Every round of one worker count, by side."""

    workers: int
    sides: dict[str, list[Phase]] = field(default_factory=dict)

    def ratios(self, a: str, b: str, of: Callable[[Phase], float | None]) -> list[float]:
        """`of(a) / of(b)`, round by round (both ran in each)."""
        pairs = zip(self.sides.get(a, []), self.sides.get(b, []), strict=True)
        return [(of(x) or 0.0) / (of(y) or 1e-9) for x, y in pairs]

    def median(self, side: str, of: Callable[[Phase], float | None]) -> float:
        return median(of(p) or 0.0 for p in self.sides[side])


def rate(phase: Phase) -> float:
    return phase.rate


def whole(phase: Phase) -> float | None:
    return phase.whole_ms


def first(phase: Phase) -> float | None:
    return phase.first_s


def steady(phase: Phase) -> float | None:
    return phase.own_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=2, help="the requests' nodes")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per worker count (median)")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="kube-apiserver and etcd on CPU 0, this benchmark and the signer on CPU 1",
    )
    parser.add_argument("--profile", type=Path, help="py-spy each signer run into this folder")
    parser.add_argument("--tree", type=Path, help="also run this checkout's signer, alternating")
    parser.add_argument(
        "--peer", type=Path, help="the Go signer's module (default: PODCERT_PEER, ../shared/peer)"
    )
    parser.add_argument("--no-peer", action="store_true", help="leave the Go signer out")
    parser.add_argument(
        "--apiserver-profile",
        type=Path,
        help="take the API server's own CPU profile (pprof) of each side into this folder "
        "(use --requests 2000 or more, so the steady state outlasts the profile)",
    )
    args = parser.parse_args()
    sides = ["ceiling", "podcert"]
    if not args.no_peer:
        args.peer_binary = peer.ensure(peer.source(args.peer))
        print(f"the Go signer: {args.peer_binary}")
        sides.append("peer")
    if args.tree is not None:
        args.tree = args.tree.resolve()
        print(f"the other signer: podcert from {imported_from(args.tree)}")
        for tree in (REPO, args.tree):  # both from bytecode from their first round on
            compiled(tree)
        sides.append("other")
    else:
        compiled(REPO)
    with tempfile.TemporaryDirectory(prefix="podcert-bench-") as tmp:
        root = Path(tmp) / "cluster"
        state = cluster.up(root, apiserver_profiling=args.apiserver_profile is not None)
        if args.pin:
            pin(state)
        try:
            print(
                f"requests per batch: {args.requests}, nodes: {args.nodes}, rounds: "
                f"{args.rounds}, sides: {', '.join(sides)}, load average at start: {load()}"
            )
            table = []
            for workers in args.workers:
                rows = Rows(workers, {side: [] for side in sides})
                for r in range(args.rounds):
                    order = sides if r % 2 == 0 else sides[::-1]
                    for side in order:
                        phase = run_side(root, Path(tmp), side, f"w{workers}-r{r}", args, workers)
                        rows.sides[side].append(phase)
                        print(show_phase(workers, r + 1, side, phase), flush=True)
                    print(f"{'':>7} {'':>5} load {load()}", flush=True)
                table.append(rows)
                for side in sides:
                    print(show_median(rows, side), flush=True)
            summary(table)
        finally:
            cluster.down(root)


def run_side(
    root: Path, work: Path, side: str, round_name: str, args: argparse.Namespace, workers: int
) -> Phase:
    """One side's run on a batch of its own, made just before it and deleted after it, under
    a signer name of its own: no signer ever sees (or spends anything on) another's requests,
    and every signer starts on a cluster of the same size."""
    namespace = f"{round_name}-{side}"
    signer = f"bench.podcert.dev/{round_name}-{side}"
    count = args.requests
    pcrs = make_requests(root, namespace, signer, count, args.nodes)
    server = args.apiserver_profile / f"{namespace}.pb.gz" if args.apiserver_profile else None
    try:
        if side == "ceiling":
            return ceiling(root, namespace, pcrs, workers, component_pids(root), server)
        if side == "peer":
            proc = peer.Peer.for_cluster(args.peer_binary, root, work, signer, workers)
            return signer_phase(root, side, proc, namespace, count, server_profile=server)
        tree = args.tree if side == "other" else None
        podcert = podcert_signer(root, work, signer, namespace, workers, tree)
        return signer_phase(
            root,
            side,
            podcert,
            namespace,
            count,
            args.profile,
            reads=lambda: live_reads(podcert.metrics()),
            server_profile=server,
        )
    finally:
        clear(root, namespace)


def summary(table: Sequence[Rows]) -> None:
    """podcert against the Go signer and against the ceiling, and this tree against the other
    one, from the round-by-round ratios (each a pair from one round), as medians."""
    print(f"\nload average at the end: {load()}")
    for rows in table:
        w = rows.workers
        if "peer" in rows.sides:
            r = median(rows.ratios("podcert", "peer", rate))
            s = median(rows.ratios("podcert", "peer", steady))
            c = median(rows.ratios("podcert", "peer", whole))
            print(
                f"podcert / Go signer, {w} workers: rate {r:.2f} "
                f"({rows.median('podcert', rate):.0f} v {rows.median('peer', rate):.0f}/s; "
                f">= 1.0), steady-state CPU per request {s:.2f} "
                f"({rows.median('podcert', steady):.2f} v "
                f"{rows.median('peer', steady):.2f} ms; <= 1.0), whole-process CPU "
                f"{c:.2f} ({rows.median('podcert', whole):.2f} v "
                f"{rows.median('peer', whole):.2f} ms), first issuance "
                f"{rows.median('podcert', first):.2f} v {rows.median('peer', first):.2f} s"
            )
        if "other" in rows.sides:
            print(
                f"this tree / the other, {w} workers: rate "
                f"{median(rows.ratios('podcert', 'other', rate)):.2f}, whole-process CPU per "
                f"request {median(rows.ratios('podcert', 'other', whole)):.2f}"
            )
        ceil = median(rows.ratios("podcert", "ceiling", rate))
        print(f"podcert / ceiling, {w} workers: {ceil:.2f} (>= 0.8)")
        profiled = {
            side: [p.server.cpu_ms for p in phases if p.server is not None]
            for side, phases in rows.sides.items()
        }
        if any(profiled.values()):
            print(
                f"the API server's own profile, CPU ms per write, {w} workers: "
                + ", ".join(f"{side} {median(ms):.2f}" for side, ms in profiled.items() if ms)
            )


def compiled(tree: Path) -> None:
    """The bytecode of a checkout's packages, in the cache the signer runs from."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", *(str(tree / p) for p in PACKAGES)],
        env={**os.environ, "PYTHONPYCACHEPREFIX": str(PYCACHE)},
        check=True,
        stdout=subprocess.DEVNULL,
    )


def imported_from(tree: Path) -> str:
    """Where a process started with `tree` first on its path imports podcert from: `tree`, or
    the run is refused (an install that wins over the path would measure this tree twice)."""
    found = subprocess.run(
        [sys.executable, "-c", "import podcert; print(podcert.__file__)"],
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout.strip()
    if not found.startswith(f"{tree}/"):
        raise SystemExit(f"--tree {tree}: podcert comes from {found} there, not from the tree")
    return found


def clear(root: Path, namespace: str) -> None:
    """Delete a batch's pods and requests, so the cluster (and the pod list every signer run
    starts with) does not grow from one round to the next."""
    rest = Rest(kube.admin_client(root))
    now = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
    for gv, resource in (("v1", "pods"), (PCRS, "podcertificaterequests")):
        rest.request("DELETE", path_of(gv, resource, namespace), body=now)


def pin(state: planestate.State) -> None:
    """Give the control plane and the clients a core each, as separate machines would: on a
    shared pair of cores every millisecond a client spends is taken from the API server, and
    the ratio then measures CPU competition more than how close the signer comes to the API
    server's ceiling. Threads started later inherit their creator's set."""
    for pid, cpus in ((state.apiserver_pid, {0}), (state.etcd_pid, {0}), (os.getpid(), {1})):
        for task in Path(f"/proc/{pid}/task").iterdir():
            os.sched_setaffinity(int(task.name), cpus)


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def show_phase(workers: int, round_no: int, side: str, phase: Phase) -> str:
    """One side's run: rate, its own CPU per request in the window, whole-process CPU, first
    issuance, live reads, the requests not issued, and the control plane's CPU."""
    parts = [
        f"{workers:>7} {round_no:>5} {side:>8} {phase.rate:>7.0f}/s",
        f"steady {phase.own_ms:.2f} ms" if phase.own_ms is not None else "",
        f"whole {phase.whole_ms:.2f} ms" if phase.whole_ms is not None else "",
        f"first {phase.first_s:.2f} s" if phase.first_s is not None else "",
        f"GETs {phase.live_reads}" if phase.live_reads is not None else "",
        f"NOT ISSUED {phase.denied} denied, {phase.failed} failed"
        if phase.denied or phase.failed
        else "",
        f"[{show_cpu(phase.cpu_ms)}]",
        f"pprof api {phase.server.cpu_ms:.2f} ms over {phase.server.writes}"
        if phase.server is not None
        else "",
    ]
    return "  ".join(part for part in parts if part)


def show_median(rows: Rows, side: str) -> str:
    phases = rows.sides[side]
    own = [p.own_ms for p in phases if p.own_ms is not None]
    wholes = [p.whole_ms for p in phases if p.whole_ms is not None]
    return (
        f"{rows.workers:>7} {'median':>5} {side:>8} {median(p.rate for p in phases):>7.0f}/s"
        + (f"  steady {median(own):.2f} ms" if own else "")
        + (f"  whole {median(wholes):.2f} ms" if wholes else "")
    )


def show_cpu(cpu_ms: dict[str, float]) -> str:
    short = {"kube-apiserver": "api"}
    return " ".join(f"{short.get(k, k)} {v:.2f}" for k, v in sorted(cpu_ms.items()))


if __name__ == "__main__":
    main()
