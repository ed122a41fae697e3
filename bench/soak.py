"""The chaos soak: the whole service under steady load while faults keep coming, and proof at the
end that nothing was lost.

    .venv/bin/python -m bench.soak --minutes 30 [--seed 1] [--pods 300] [--pairs 3]
        [--fault-every 20:60] [--json report.json]

On a fresh devcluster: two signer replicas (leader election, an audit log each), three shim
nodes, a node run by the real kubelet (containerd; kubemark's hollow kubelet, with the reason,
where the machine cannot), `--pods` pods with identities (one-hour credentials refreshed every
six minutes or so), and `--pairs` example mTLS pairs (plus one served from the kubelet's node when
it is real) talking all along. Every `--fault-every` seconds (seeded, so a run can be
replayed) one fault from bench.soak_faults.FAULTS, every kind once first and then at random:
SIGKILL of the leader, SIGKILL of a shim, an API server restart, etcd paused 5 s, every
connection to the API server cut, `podcert shim rotate` of a service account, a whole CA rotation
(prepare, activate, re-key, retire; it runs on while other faults land), a kubelet restart.

At the end, after the last rotation is finished and the fleet has settled, it proves:
- 0 failed mTLS requests caused by a credential (TLS and authorization failures; a connection
  refused while a process restarts is counted apart; none of the pair's processes restart here);
- every PodCertificateRequest terminal, and none answered with two certificates (the requests are
  listed every few seconds all along);
- every issued certificate in the cluster in one of the audit logs, and `podcert audit` exit 0
  over the cluster, each node's root and both audit logs;
- the signers' and shims' memory flat (the median RSS of each process's last quarter against its
  second quarter).
Exit 0 when every proof holds. `--json` writes the report with the fault log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from cryptography import x509

from bench.bench_time_to_credential import exit_on_sigterm
from bench.soak_faults import FAULTS, Faults
from bench.soak_fleet import KUBELET_NODE, NAMESPACE, SIGNER, Fleet, read_credential
from devcluster import cluster
from devcluster.stack import wait_for
from podcert.api.requests import outcome
from podcert.auditlog import iter_entries

MEMORY_GROWTH_LIMIT = 0.15  # a process whose RSS grew more than this (and > 10 MiB) is not flat
MEMORY_SLACK_MIB = 10.0


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


class Watcher:
    """Lists the requests every few seconds all along, and samples the processes' RSS: what the
    end of the soak judges (a request answered twice, memory that grew)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.certificates: dict[str, set[str]] = defaultdict(set)  # request uid -> leaf serials
        self.rss: dict[str, list[tuple[float, float]]] = defaultdict(list)  # process -> samples
        self.holders: list[str] = []  # the lease holders, in the order they held it
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="watcher", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(3.0):
            self.sample()

    def sample(self) -> None:
        with contextlib.suppress(Exception):  # the API server may be down: next time
            for item in self.fleet.requests():
                serial = leaf_serial(item)
                if serial:
                    self.certificates[item["metadata"]["uid"]].add(serial)
        holder = self.fleet.leader()
        if holder and (not self.holders or self.holders[-1] != holder):
            self.holders.append(holder)
        now = time.monotonic()
        for name, proc in self._processes():
            if proc is not None and proc.poll() is None:
                rss = _rss_mib(proc.pid)
                if rss:
                    self.rss[f"{name} pid {proc.pid}"].append((now, rss))

    def _processes(self) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = [
            (f"signer replica-{i}", s.proc) for i, s in enumerate(self.fleet.signers)
        ]
        out += [(f"shim {node}", s.proc) for node, s in self.fleet.shims.items()]
        return out


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def memory_report(samples: dict[str, list[tuple[float, float]]], span: float) -> dict[str, Any]:
    """Each process that lived at least half the soak: its RSS at the second and the last
    quarter of its life (medians), and whether it stayed flat."""
    out: dict[str, Any] = {}
    for name, series in samples.items():
        if len(series) < 8 or series[-1][0] - series[0][0] < span / 2:
            continue
        quarter = len(series) // 4
        early = statistics.median(v for _, v in series[quarter : 2 * quarter])
        late = statistics.median(v for _, v in series[-quarter:])
        growth = late - early
        out[name] = {
            "early_mib": round(early, 1),
            "late_mib": round(late, 1),
            "peak_mib": round(max(v for _, v in series), 1),
            "flat": growth <= MEMORY_SLACK_MIB or growth <= early * MEMORY_GROWTH_LIMIT,
        }
    return out


def classify(errors: dict[str, int]) -> tuple[int, int]:
    """(failures caused by a credential, connection refusals) of a client's error counts."""
    refused = sum(n for reason, n in errors.items() if "Connect call failed" in reason)
    return sum(errors.values()) - refused, refused


def audit(fleet: Fleet, root: Path) -> tuple[int, str]:
    """`podcert audit` of one node's root with the cluster and every replica's audit log."""
    args = [
        sys.executable,
        "-m",
        "podcert",
        "audit",
        f"--kubeconfig={fleet.admin_kubeconfig}",
        f"--root={root}",
        f"--namespace={NAMESPACE}",
        f"--signer-name={SIGNER}",
        *(f"--audit-log={p}" for p in audit_logs(fleet)),
        "-o",
        "json",
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    return done.returncode, done.stdout + done.stderr


def audit_logs(fleet: Fleet) -> list[Path]:
    return [fleet.work / f"replica-{i}" / "audit.jsonl" for i in range(len(fleet.signers))]


def prove(fleet: Fleet, watcher: Watcher, span: float) -> dict[str, Any]:
    """Every proof the soak promises, each with its figures."""
    proofs: dict[str, Any] = {}
    # mTLS
    pairs = []
    for pair in fleet.pairs:
        summary = pair.summaries()
        client = summary.get("client", {})
        credential_failures, refused = classify(client.get("errors", {}))
        pairs.append(
            {
                "server": f"{pair.server_pod.name} on {pair.server_pod.node}",
                "client": f"{pair.client_pod.name} on {pair.client_pod.node}",
                "ok": client.get("ok", 0),
                "credential_failures": credential_failures,
                "refused": refused,
                "server_certificates_seen": len(client.get("server_serials", [])),
                "client_certificates_seen": len(
                    summary.get("server", {}).get("client_serials", [])
                ),
                "errors": client.get("errors", {}),
            }
        )
    proofs["mtls"] = {
        "pairs": pairs,
        "ok": all(p["ok"] > 0 and p["credential_failures"] == 0 for p in pairs),
    }
    # requests
    items = fleet.requests()
    watcher.sample()
    outcomes = Counter(outcome(i) or "pending" for i in items)
    twice = sorted(uid for uid, leaves in watcher.certificates.items() if len(leaves) > 1)
    proofs["requests"] = {
        "total": len(items),
        "outcomes": dict(outcomes),
        "answered_twice": twice,
        "ok": outcomes.get("pending", 0) == 0 and not twice,
    }
    # the audit logs hold every issued certificate
    logged: Counter[str] = Counter()
    serials: set[str] = set()
    for path in audit_logs(fleet):
        with contextlib.suppress(OSError):
            for entry in iter_entries(path.read_bytes().splitlines()):
                if entry.decision == "issued":
                    logged[entry.uid] += 1
                    serials.add((entry.serial or "").lower())
    issued = [i for i in items if outcome(i) == "Issued"]
    missing = [i["metadata"]["name"] for i in issued if leaf_serial(i) not in serials]
    proofs["audit_log"] = {
        "issued_in_cluster": len(issued),
        "issued_entries": sum(logged.values()),
        "requests_logged_more_than_once": sum(1 for n in logged.values() if n > 1),
        "missing": missing,
        "ok": not missing,
    }
    # podcert audit over each node's root
    roots = {node: shim.root for node, shim in fleet.shims.items()}
    if fleet.kubelet is not None:
        roots[KUBELET_NODE] = fleet.kubelet.root
    audits = {}
    for node, root in roots.items():
        code, out = audit(fleet, root)
        audits[node] = {"exit": code, "tail": "" if code == 0 else out[-1500:]}
    proofs["podcert_audit"] = {"nodes": audits, "ok": all(a["exit"] == 0 for a in audits.values())}
    # memory
    memory = memory_report(watcher.rss, span)
    proofs["memory"] = {"processes": memory, "ok": all(m["flat"] for m in memory.values())}
    # every pod holds a credential that chains to its trust file now
    stale = [p.name for p in fleet.pods if read_credential(p) is None]
    proofs["pods"] = {"total": len(fleet.pods), "without_credential": stale, "ok": not stale}
    return proofs


def leaf_serial(pcr: dict[str, Any]) -> str | None:
    """The issued leaf's serial (hex), as the audit log writes it; None before issuance."""
    chain = pcr.get("status", {}).get("certificateChain")
    if not chain:
        return None
    return format(x509.load_pem_x509_certificates(chain.encode())[0].serial_number, "x")


def soak(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    root = work / "devcluster"
    say(f"devcluster under {root}")
    cluster.up(root, progress=lambda line: say("  " + line))
    fleet = Fleet(root, work)
    watcher = Watcher(fleet)
    rng = random.Random(args.seed)
    faults = Faults(fleet, rng)
    log: list[dict[str, Any]] = []
    started = time.monotonic()

    def note(kind: str, detail: str) -> None:
        at = round(time.monotonic() - started, 1)
        log.append({"t": at, "fault": kind, "detail": detail})
        say(f"t={at:7.1f}s {kind}: {detail}")

    try:
        fleet.start_signers(2)
        fleet.start_shims(3)
        fleet.start_kubelet(lambda line: say("  " + line), args.kubelet_sync_seconds)
        if fleet.kubelet_reason:
            say(f"  no real node here ({fleet.kubelet_reason}): the hollow kubelet stands in")
        fleet.create_pods(args.pods, args.kubelet_pods, args.accounts)
        fleet.wait_credentials(fleet.pods, 300)
        say(f"{len(fleet.pods)} pods hold credentials")
        fleet.start_pairs(args.pairs, args.rate)
        watcher.start()
        low, high = args.fault_every
        first = rng.sample(FAULTS, len(FAULTS))
        next_fault = time.monotonic() + rng.uniform(low, high)
        end = time.monotonic() + args.minutes * 60  # the soak proper, after set-up
        say(f"soaking for {args.minutes} min, a fault every {low:g}-{high:g}s (seed {args.seed})")
        while time.monotonic() < end or faults.campaign is not None:
            for what in faults.restart_due():
                note("restart", f"{what} started again")
            said = faults.advance_campaign()
            if said:
                note("ca-rotation step", said)
            if time.monotonic() >= next_fault and time.monotonic() < end:
                eligible = faults.eligible()
                # Every kind once first (a seeded order), then any at random.
                kind = next((k for k in first if k in eligible), None) or rng.choice(eligible)
                if kind in first:
                    first.remove(kind)
                try:
                    note(kind, faults.run(kind))
                except Exception as err:
                    note(kind, f"could not be applied: {type(err).__name__}: {err}")
                next_fault = time.monotonic() + rng.uniform(low, high)
            if time.monotonic() > end + args.settle_minutes * 60:
                raise TimeoutError("the last CA rotation did not finish")
            time.sleep(0.5)
        for what in faults.restart_due() + [r.what for r in faults.pending]:
            note("restart", f"{what} started again")
        for pending in faults.pending:
            pending.start()
        faults.pending.clear()
        say("faults over: settling")
        for signer in fleet.signers:
            signer.wait_ready(120)
        for shim in fleet.shims.values():
            shim.wait_ready(120)
        wait_for(
            lambda: all(read_credential(p) is not None for p in fleet.pods),
            180,
            "every pod to hold a good credential",
        )
        wait_for(
            lambda: all(outcome(i) for i in fleet.requests()),
            180,
            "every request to be answered",
        )
        time.sleep(3.0)  # the pairs' last requests, under the settled credentials
        for pair in fleet.pairs:
            pair.client.stop()
            pair.server.stop()
        watcher.stop.set()
        span = time.monotonic() - started
        proofs = prove(fleet, watcher, span)
    finally:
        watcher.stop.set()
        fleet.stop()
        cluster.down(root)
    faults_by_kind = Counter(e["fault"] for e in log if e["fault"] in FAULTS)
    return {
        "minutes": args.minutes,
        "seed": args.seed,
        "pods": len(fleet.pods),
        "kubelet": "real" if fleet.kubelet_is_real else f"hollow ({fleet.kubelet_reason})",
        "faults": dict(faults_by_kind),
        "ca_rotations": faults.rotations_done,
        "leaders": watcher.holders,
        "proofs": proofs,
        "ok": all(p["ok"] for p in proofs.values()),
        "log": log,
    }


def _range(text: str) -> tuple[float, float]:
    low, _, high = text.partition(":")
    try:
        bounds = float(low), float(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not SECONDS or LOW:HIGH") from None
    if not 0 < bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 < LOW <= HIGH")
    return bounds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--pods", type=int, default=300)
    p.add_argument("--kubelet-pods", type=int, default=30, help="of --pods, on the kubelet's node")
    p.add_argument("--accounts", type=int, default=12, help="service accounts the pods run as")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--rate", type=float, default=20.0, help="requests/s of each pair's client")
    p.add_argument("--fault-every", type=_range, default=(20.0, 60.0), metavar="LOW:HIGH")
    p.add_argument("--settle-minutes", type=float, default=15.0, help="for the last rotation")
    p.add_argument(
        "--kubelet-sync-seconds",
        type=float,
        default=None,
        help="a real kubelet's pod resync (default: the kubelet's own, 1 min plus jitter)",
    )
    p.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    p.add_argument("--json", type=Path, default=None, help="write the report here")
    args = p.parse_args(argv)
    if not 0 < args.kubelet_pods < args.pods:
        p.error("--kubelet-pods must be between 1 and --pods")
    exit_on_sigterm()  # a SIGTERM unwinds through every `finally`: nothing is left running
    with tempfile.TemporaryDirectory(prefix="podcert-soak-") as tmp:
        work = (args.dir or Path(tmp)).resolve()
        report = soak(args, work)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    summary = {k: v for k, v in report.items() if k != "log"}
    print(json.dumps(summary, indent=2))
    say("SOAK PASSED" if report["ok"] else "SOAK FAILED")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
