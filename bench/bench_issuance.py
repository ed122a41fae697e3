"""Issuance throughput and CPU per request: against the API server's status-write ceiling
(issue 14 target 2) and the way a Go signer was measured (target 1), in one run.

    .venv/bin/python -m bench.bench_issuance [--requests 1000] [--nodes 2] [--workers 1 2 4 8]
                                             [--rounds 3] [--pin] [--profile DIR]

On a fresh devcluster, each round makes two batches of N pending PodCertificateRequests (pods
spread over `--nodes` nodes, each request made as its pod's node), then runs the two writers
back to back, in alternating order from round to round so the VM's drift hits both alike:

- the ceiling: the fastest status writer this benchmark could build (measured against the
  others, BENCHMARKS.md "Issuance throughput"): `W` threads, each with its own kept-alive TLS
  connection, writing precomputed bytes (head and a minimal body: the request's name, namespace,
  uid and resourceVersion, and the Issued status; the status subresource takes spec and the
  rest of metadata from the stored object) and reading the JSON answer to throw it away (neither
  that body nor a protobuf answer changed the API server's CPU per write measurably; the client's
  own CPU did). It runs as a ServiceAccount with the signer's own RBAC, so the API server
  authenticates, authorizes (`sign` on the signer name) and schedules it exactly as it does the
  signer.
- `podcert signer --workers W` as shipped (leader election, audit log with its fsync, INFO
  logs), started after its batch exists, as the Go signer was.

Both are timed by one watch: the rate is over the steady state, the 10%-90% window of the batch.
CPU per request comes from /proc/<pid>/stat: per process over that window, and for the signer
also whole-process (utime+stime of everything from exec to the last issuance, start-up
included, over N), which is how the Go signer's 2.1-3.3 ms was measured (issue 14). The signer
runs from compiled bytecode, as installed by pip (this environment sets PYTHONDONTWRITEBYTECODE,
which would otherwise recompile podcert at every start). "GETs" is the signer's live reads of
pods, nodes and ServiceAccounts (`podcert_signer_live_reads_total`): a backlog listed before its
caches costs none. The ratio is signer / ceiling; each worker count reports the medians of
`--rounds`, because a shared two-core VM drifts by +-20% from one minute to the next.
`--profile DIR` records each signer run with py-spy (on-CPU samples of the thread holding the
interpreter lock). `--tree PATH` (another checkout: `git archive <commit> | tar -x -C PATH`)
also runs that checkout's signer in every round, on a batch of its own, this tree's and that
one's in alternating order: before and after a change, side by side on one cluster.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any, BinaryIO, Final, cast
from urllib.parse import urlsplit

import msgspec

from bench.bench_time_to_credential import component_pids, cpu_of, cpu_seconds
from devcluster import cluster, kube, planestate, processes
from podcert.api import keys
from podcert.api.requests import outcome as pcr_outcome
from podcert.api.requests import parse_request
from podcert.client.kubeconfig import ClientSettings
from podcert.client.rest import JSON, ApiError, Rest, load_client, path_of
from signer import certs, model
from signer.authority import ca
from signer.issue.requested import parse_public_key
from signer.issue.settle import issued_status

PCRS = "certificates.k8s.io/v1"
# The Go signer's figures (issue 14: a controller-runtime signer, 8 workers, 1,000 pending
# requests from two nodes, on a quiet machine of this kind): what target 1 compares against.
GO_RATE: Final = (218.0, 260.0)  # requests/s at 8 workers, 10-90 % window
GO_CPU_MS: Final = (2.1, 3.3)  # whole-process CPU ms per request, start-up included
CPU_ALLOWANCE: Final = 1.5  # target 1: podcert's CPU per request at most 1.5x the Go signer's
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

    def __init__(self, root: Path, namespace: str, count: int, pids: dict[str, int]) -> None:
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
                    if self.first is None and outcome == "Issued":
                        self.first = time.monotonic()
                    if outcome == "Issued" and self.outcomes["Issued"] in self.marks:
                        self.times.append(time.monotonic())
                        self.cpu.append(cpu_of(self.pids))
                    if len(self.settled) >= self.count:
                        self.last_cpu = cpu_of(self.pids)
                        return

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
            issued / max(self.times[1] - self.times[0], 1e-3), cpu_ms, denied=denied, failed=failed
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
    root: Path, namespace: str, pcrs: list[JSON], workers: int, pids: dict[str, int]
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
    observer = Observer(root, namespace, len(pcrs), pids)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return observer.result()


# --- the signer --------------------------------------------------------------------------------


def signer_phase(
    root: Path,
    work: Path,
    signer: str,
    namespace: str,
    count: int,
    workers: int,
    profile: Path | None = None,
    tree: Path | None = None,
) -> Phase:
    """`podcert signer --workers W` as shipped (leader election, audit log, INFO logs), started
    once its batch exists; its whole-process CPU from exec to the last settled request. With
    `tree`, the signer of that checkout (its packages first on the path)."""
    proc = processes.signer(
        root,
        work,
        [signer],
        namespace=f"{namespace}-signer",
        extra=[f"--workers={workers}", f"--audit-log={work / namespace / 'audit.jsonl'}"],
    )
    # From compiled bytecode, as pip installs it (kept outside the checkout).
    proc.env = {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(PYCACHE)}
    if tree is not None:
        proc.env["PYTHONPATH"] = str(tree)
    started = time.monotonic()
    proc.start()
    assert proc.proc is not None
    pid = proc.proc.pid
    spy = py_spy(pid, profile / f"{namespace}.txt") if profile is not None else None
    observer = Observer(root, namespace, count, component_pids(root, ("signer", proc)))
    try:
        phase = observer.result()
        whole = observer.last_cpu.get("signer")
        if whole is None:  # the process was gone: read it now (it cannot have grown)
            whole = cpu_seconds(pid)
        return Phase(
            phase.rate,
            phase.cpu_ms,
            phase.denied,
            phase.failed,
            whole_ms=whole * 1000 / count,
            first_s=(observer.first - started) if observer.first is not None else None,
            live_reads=live_reads(proc.metrics()),
        )
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its samples on SIGINT, not SIGTERM
            spy.wait(60)
        if not proc.running:
            print(proc.output()[-2000:])
        proc.stop()


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
    """Every round of one worker count."""

    workers: int
    tops: list[Phase] = field(default_factory=list)
    gots: list[Phase] = field(default_factory=list)
    olds: list[Phase] = field(default_factory=list)  # the other tree's signer, with --tree

    def ratios(self) -> list[float]:
        return [got.rate / top.rate for top, got in zip(self.tops, self.gots, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=2, help="the requests' nodes")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument(
        "--rounds", type=int, default=3, help="ceiling/signer pairs per worker count (median)"
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="kube-apiserver and etcd on CPU 0, this benchmark and the signer on CPU 1",
    )
    parser.add_argument("--profile", type=Path, help="py-spy each signer run into this folder")
    parser.add_argument("--tree", type=Path, help="also run this checkout's signer, alternating")
    args = parser.parse_args()
    if args.tree is not None:
        args.tree = args.tree.resolve()
        print(f"the other signer: podcert from {imported_from(args.tree)}")
        for tree in (REPO, args.tree):  # both from bytecode from their first round on
            compiled(tree)
    with tempfile.TemporaryDirectory(prefix="podcert-bench-") as tmp:
        root = Path(tmp) / "cluster"
        state = cluster.up(root)
        if args.pin:
            pin(state)
        try:
            print(
                f"requests per batch: {args.requests}, nodes: {args.nodes}, rounds: "
                f"{args.rounds}, load average at start: {load()}"
            )
            print(
                f"{'workers':>7} {'round':>5} {'ceiling/s':>9} {'signer/s':>8} {'ratio':>5}"
                f" {'whole ms':>8} {'first s':>7} {'GETs':>4}   CPU ms/request, 10-90 %"
                " (ceiling | signer)"
            )
            table = []
            for workers in args.workers:
                rows = Rows(workers)
                for r in range(args.rounds):
                    top, got, old = one_round(root, Path(tmp), f"w{workers}-r{r}", args, workers, r)
                    rows.tops.append(top)
                    rows.gots.append(got)
                    if old is not None:
                        rows.olds.append(old)
                        print(
                            f"{'':>7} {'':>5} the other tree: {old.rate:.0f}/s, whole "
                            f"{old.whole_ms or 0:.2f} ms, first {old.first_s or 0:.2f} s,"
                            f" {show_cpu(old.cpu_ms)}; this tree / other: rate "
                            f"{got.rate / old.rate:.2f}, whole CPU "
                            f"{(got.whole_ms or 0) / (old.whole_ms or 1):.2f}",
                            flush=True,
                        )
                    print(
                        f"{workers:>7} {r + 1:>5} {top.rate:>9.0f} {got.rate:>8.0f}"
                        f" {rows.ratios()[-1]:>5.2f} {got.whole_ms or 0:>8.2f}"
                        f" {got.first_s or 0:>7.2f} {got.live_reads or 0:>4}"
                        f"   {show_cpu(top.cpu_ms)} |"
                        f" {show_cpu(got.cpu_ms)}{show_not_issued(top, got)}   load {load()}",
                        flush=True,
                    )
                table.append(rows)
                print(
                    f"{workers:>7} {'median':>5} {median(t.rate for t in rows.tops):>9.0f}"
                    f" {median(g.rate for g in rows.gots):>8.0f} {median(rows.ratios()):>5.2f}"
                    f" {median(g.whole_ms or 0 for g in rows.gots):>8.2f}"
                    f" {median(g.first_s or 0 for g in rows.gots):>7.2f}",
                    flush=True,
                )
            summary(table)
        finally:
            cluster.down(root)


def summary(table: Sequence[Rows]) -> None:
    """Both targets, from the medians: target 2 at every worker count, target 1 at 4 and 8;
    and this tree against the other one, with --tree."""
    print(f"\nload average at the end: {load()}")
    for rows in table:
        if not rows.olds:
            continue
        pairs = list(zip(rows.gots, rows.olds, strict=True))
        rates = [g.rate / o.rate for g, o in pairs]
        cpus = [(g.whole_ms or 0) / (o.whole_ms or 1) for g, o in pairs]
        rate_new, rate_old = median(g.rate for g in rows.gots), median(o.rate for o in rows.olds)
        cpu_new = median(g.whole_ms or 0 for g in rows.gots)
        cpu_old = median(o.whole_ms or 0 for o in rows.olds)
        print(
            f"this tree / the other, {rows.workers} workers: rate {median(rates):.2f} "
            f"({rate_new:.0f} v {rate_old:.0f}/s), whole-process CPU per request "
            f"{median(cpus):.2f} ({cpu_new:.2f} v {cpu_old:.2f} ms)"
        )
    for rows in table:
        ratio = median(rows.ratios())
        print(f"target 2, {rows.workers} workers: {ratio:.2f} of the ceiling (>= 0.8)")
    bar = CPU_ALLOWANCE * GO_CPU_MS[0], CPU_ALLOWANCE * GO_CPU_MS[1]
    for rows in table:
        if rows.workers not in (4, 8):
            continue
        rate = median(g.rate for g in rows.gots)
        cpu = median(g.whole_ms or 0 for g in rows.gots)
        print(
            f"target 1, {rows.workers} workers: {rate:.0f}/s (Go at 8 workers: "
            f"{GO_RATE[0]:.0f}-{GO_RATE[1]:.0f}/s on a quiet machine); {cpu:.2f} ms CPU per "
            f"request, whole process (at most {bar[0]:.2f}-{bar[1]:.2f}: 1.5x Go's "
            f"{GO_CPU_MS[0]}-{GO_CPU_MS[1]})"
        )


def one_round(
    root: Path, work: Path, ns: str, args: argparse.Namespace, workers: int, index: int
) -> tuple[Phase, Phase, Phase | None]:
    """A fresh batch for each side, then the runs back to back, in alternating order so
    drift of the VM hits every side alike; then the batches are deleted. Each side has its own
    signer name, so a signer never touches another's batch. With --tree, the other tree's
    signer too, after this tree's in even rounds and before it in odd ones."""
    signer = f"bench.podcert.dev/w{workers}"
    count, nodes = args.requests, args.nodes
    pcrs = make_requests(root, f"{ns}-ceiling", f"{signer}-ceiling", count, nodes)
    make_requests(root, f"{ns}-signer", signer, count, nodes)
    old: Phase | None = None
    if args.tree is not None:
        make_requests(root, f"{ns}-other", f"{signer}-other", count, nodes)

    def run_other() -> Phase:
        return signer_phase(
            root, work, f"{signer}-other", f"{ns}-other", count, workers, args.profile, args.tree
        )

    if args.tree is not None and index % 2:
        old = run_other()

    def run_ceiling() -> Phase:
        return ceiling(root, f"{ns}-ceiling", pcrs, workers, component_pids(root))

    def run_signer() -> Phase:
        return signer_phase(root, work, signer, f"{ns}-signer", count, workers, args.profile)

    if index % 2:
        got, top = run_signer(), run_ceiling()
    else:
        top, got = run_ceiling(), run_signer()
    if args.tree is not None and not index % 2:
        old = run_other()
    for side in ("ceiling", "signer", "other"):
        if side != "other" or args.tree is not None:
            clear(root, f"{ns}-{side}")
    return top, got, old


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


def show_not_issued(top: Phase, got: Phase) -> str:
    """The requests that ended other than Issued, by side; empty when every one was issued."""
    parts = [
        f"{side}: {phase.denied} denied, {phase.failed} failed"
        for side, phase in (("ceiling", top), ("signer", got))
        if phase.denied or phase.failed
    ]
    return f"   NOT ISSUED {'; '.join(parts)}" if parts else ""


def show_cpu(cpu_ms: dict[str, float]) -> str:
    short = {"kube-apiserver": "api", "etcd": "etcd", "bench": "bench", "signer": "signer"}
    return " ".join(f"{short.get(k, k)} {v:.2f}" for k, v in sorted(cpu_ms.items()))


if __name__ == "__main__":
    main()
