"""Issuance with the CA's keys in SoftHSM2 against in memory, in one run: the rate and CPU per
request of the real signer, through the devcluster's API server.

    .venv/bin/python -m bench.bench_hsm [--requests 1000] [--workers 4] [--rounds 3] [--nodes 2]
        [--profile DIR]
    .venv/bin/python -m bench.bench_hsm --sign-only [--leaves 300] [--rounds 3]   # no cluster

On a fresh devcluster, each round runs both sides once, `memory` then `softhsm2` in even rounds
and the reverse in odd ones (a shared machine's drift hits both alike), with the same number of
requests and workers: `podcert signer --workers W` as bench_issuance runs it (its ServiceAccount,
leader election, the audit log with its fsync), in memory or with `--ca-key-uri` naming a
SoftHSM2 token made for the run (so the root's and the intermediate's keys are made there and
every leaf is signed through it). Each side gets a batch of pending requests of its own under its
own signer name, made just before its run and deleted after it (bench_issuance's machinery:
`make_requests`, `signer_phase`, `clear`). Reported per side: the rate over the 10-90 % window of
the batch, the signer's CPU per request in that window ("steady", SoftHSM2 runs inside the
signer's process so its CPU is counted there) and whole-process; then the ratios softhsm2 /
memory as the median of the round-by-round ratios (both of a pair ran in the same round).
`--profile DIR` records each signer run with py-spy (when installed).

`--sign-only` times the signing step alone, no cluster: `certs.sign_leaf` with an in-memory
intermediate and with one in a SoftHSM2 token, rounds alternating.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.bench_issuance import (
    PYCACHE,
    REPO,
    Phase,
    clear,
    compiled,
    load,
    make_requests,
    show_phase,
    signer_phase,
)
from devcluster import cluster, processes
from podcert.api import keys
from signer import certs, model
from signer.authority import ca, pkcs11uri, tokenkeys
from tests import softhsm

SIDES = ("memory", "softhsm2")
LABEL = "bench"  # the SoftHSM2 token's


def token_flags(tokens: softhsm.Tokens) -> list[str]:
    return [f"--ca-key-uri=pkcs11:token={LABEL};object=ca", f"--ca-key-pin-file={tokens.pin_file}"]


def signer(
    root: Path,
    work: Path,
    name: str,
    namespace: str,
    workers: int,
    tokens: softhsm.Tokens | None,
) -> processes.Signer:
    """bench_issuance's `podcert signer --workers W` (from compiled bytecode, the audit log on),
    with its CA keys in the token when `tokens` is given."""
    extra = [f"--workers={workers}", f"--audit-log={work / namespace / 'audit.jsonl'}"]
    proc = processes.signer(
        root,
        work,
        [name],
        namespace=f"{namespace}-signer",
        extra=[*extra, *(token_flags(tokens) if tokens is not None else [])],
    )
    proc.env = {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(PYCACHE)}
    if tokens is not None:
        proc.env.update(tokens.env)
    return proc


def run_side(
    root: Path,
    work: Path,
    side: str,
    round_name: str,
    args: argparse.Namespace,
    tokens: softhsm.Tokens,
) -> Phase:
    namespace = f"{round_name}-{side}"
    name = f"bench.podcert.dev/{round_name}-{side}"
    make_requests(root, namespace, name, args.requests, args.nodes)
    try:
        proc = signer(
            root, work, name, namespace, args.workers, tokens if side == "softhsm2" else None
        )
        return signer_phase(root, side, proc, namespace, args.requests, args.profile)
    finally:
        clear(root, namespace)


def issuance(args: argparse.Namespace) -> None:
    compiled(REPO)
    with tempfile.TemporaryDirectory(prefix="podcert-bench-hsm-") as tmp:
        tokens = softhsm.make(Path(tmp) / "softhsm")
        tokens.init_token(LABEL)
        root = Path(tmp) / "cluster"
        cluster.up(root)
        try:
            print(
                f"requests per batch: {args.requests}, workers: {args.workers}, nodes: "
                f"{args.nodes}, rounds: {args.rounds}, cores: {os.cpu_count()}, load average "
                f"at start: {load()}",
                flush=True,
            )
            found: dict[str, list[Phase]] = {side: [] for side in SIDES}
            for r in range(args.rounds):
                for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                    phase = run_side(root, Path(tmp), side, f"r{r}", args, tokens)
                    found[side].append(phase)
                    print(show_phase(args.workers, r + 1, side, phase), flush=True)
                print(f"{'':>7} {'':>5} load {load()}", flush=True)
        finally:
            cluster.down(root)
    print(f"\nload average at the end: {load()}")
    for side, phases in found.items():
        print(
            f"{side:>9} median {statistics.median(p.rate for p in phases):7.0f}/s  steady "
            f"{statistics.median(p.own_ms or 0.0 for p in phases):.2f} ms  whole "
            f"{statistics.median(p.whole_ms or 0.0 for p in phases):.2f} ms CPU per request"
        )
    pairs = list(zip(found["softhsm2"], found["memory"], strict=True))
    rate = statistics.median(h.rate / m.rate for h, m in pairs)
    steady = statistics.median((h.own_ms or 0.0) / (m.own_ms or 1e-9) for h, m in pairs)
    failed = sum(p.failed + p.denied for phases in found.values() for p in phases)
    print(
        f"softhsm2 / memory: rate {rate:.2f} (>= 0.8), steady-state CPU per request "
        f"{steady:.2f}; requests not issued: {failed}"
    )


# --- the signing step alone ---------------------------------------------------------------------


def _sign_rate(issuer: model.IssuingCA, plan: model.LeafPlan, leaves: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(leaves):
        certs.sign_leaf(plan, issuer, certs.random_serial())
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return leaves / wall, 1000 * cpu / leaves


def sign_only(args: argparse.Namespace) -> None:
    now = certs.truncate_to_second(dt.datetime.now(dt.UTC))
    with tempfile.TemporaryDirectory() as workdir:
        tokens = softhsm.make(Path(workdir))
        tokens.init_token(LABEL)
        os.environ.update(tokens.env)
        session = tokenkeys.TokenSession(
            pkcs11uri.parse(f"pkcs11:token={LABEL};object=ca"), softhsm.PIN
        )
        root = ca.new_ca("bench", now)
        sides = {
            "memory": ca.issuing_ca(ca.new_intermediate(root, now)),
            "softhsm2": ca.issuing_ca(ca.new_intermediate(root, now, key=session.generate())),
        }
        plan = model.LeafPlan(
            public_key=keys.generate("ECDSAP256").public_key(),
            spiffe_id="spiffe://cluster.local/ns/bench/sa/default",
            dns_names=(),
            not_before=now,
            not_after=now + dt.timedelta(hours=1),
            begin_refresh_at=now + dt.timedelta(minutes=30),
        )
        found: dict[str, list[tuple[float, float]]] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, issuer in sides.items():
                found[side].append(_sign_rate(issuer, plan, args.leaves))
        session.close()
    rates = {side: statistics.median(r for r, _ in runs) for side, runs in found.items()}
    for side, runs in found.items():
        cpu = statistics.median(c for _, c in runs)
        print(f"{side:9} {rates[side]:8.0f} leaves/s  {cpu:6.2f} ms CPU/leaf")
    print(f"ratio softhsm2/memory: {rates['softhsm2'] / rates['memory']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1000, help="requests per batch")
    parser.add_argument("--workers", type=int, default=4, help="the signer's --workers")
    parser.add_argument("--nodes", type=int, default=2, help="the requests' nodes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", type=Path, help="py-spy each signer run into this folder")
    parser.add_argument("--sign-only", action="store_true", help="the signing step, no cluster")
    parser.add_argument("--leaves", type=int, default=300, help="--sign-only: leaves per round")
    args = parser.parse_args()
    if args.sign_only:
        sign_only(args)
    else:
        issuance(args)


if __name__ == "__main__":
    main()
