"""Benchmark: the cost of a durable audit log entry per issuance, and what group commit saves.

    .venv/bin/python -m bench.bench_auditlog [--entries 4000] [--threads 1 4 8 16] [--dir DIR]

Every `issued` entry is fsynced before `AuditLog.append` returns (the signer writes the
certificate only afterwards). Threads stand for the signer's workers: entries appended while one
fsync runs share the next one. Prints entries per second and fsyncs per entry for each thread
count, against the same log with fsync off (what the log cost before it failed closed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import tempfile
import threading
import time
from pathlib import Path

from podcert.auditlog import Entry
from signer.auditlog.writer import AuditLog

T0 = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


def entry(i: int, decision: str) -> Entry:
    issued = decision == "issued"
    return Entry(
        time=T0,
        namespace="bench",
        name=f"req-{i}",
        uid=f"00000000-0000-0000-0000-{i:012d}",
        pod=f"pod-{i}",
        node="node-a",
        service_account="default",
        decision=decision,  # type: ignore[arg-type]
        reason="Issued" if issued else "PodNotFound",
        signer_name="bench.podcert.dev/signer",
        spiffe_id="spiffe://cluster.local/ns/bench/sa/default" if issued else None,
        serial=f"{i + 1:x}" if issued else None,
        not_before=T0 if issued else None,
        not_after=T0 + dt.timedelta(hours=24) if issued else None,
    )


def run(path: Path, entries: int, threads: int, decision: str) -> tuple[float, int]:
    """(entries per second, fsyncs) appending `entries` from `threads` threads."""
    fsyncs = 0
    real_fsync = os.fsync

    def counting(fd: int) -> None:
        nonlocal fsyncs
        fsyncs += 1
        real_fsync(fd)

    os.fsync = counting  # type: ignore[assignment]
    try:
        with AuditLog(path, fsync="never") as log:
            per = entries // threads
            workers = [
                threading.Thread(
                    target=lambda base=t * per: [
                        log.append(entry(base + i, decision)) for i in range(per)
                    ]
                )
                for t in range(threads)
            ]
            fsyncs = 0
            started = time.perf_counter()
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            elapsed = time.perf_counter() - started
    finally:
        os.fsync = real_fsync
    return per * threads / elapsed, fsyncs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=4000)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--dir", type=Path, help="where the log goes (default: a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-auditlog-", dir=args.dir) as scratch:
        print(f"log on {scratch}; {args.entries} entries per run")
        for threads in args.threads:
            for decision, label in (
                ("issued", "durable (issued)"),
                ("denied", "no fsync (denied)"),
            ):
                path = Path(scratch) / f"{decision}-{threads}.jsonl"
                rate, fsyncs = run(path, args.entries, threads, decision)
                print(
                    f"{threads:>3} threads, {label:<18}: {rate:>9,.0f} entries/s, "
                    f"{fsyncs / args.entries:.2f} fsyncs per entry"
                )


if __name__ == "__main__":
    main()
