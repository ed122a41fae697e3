"""Benchmark: `podcert audit` over a node root holding 10k projected credential bundles.

Target (DESIGN.md section 5): under 3 s on this machine, the whole command as a user runs it
(interpreter start-up, reading every volume, parsing and verifying every chain, the report).

    .venv/bin/python bench/bench_audit.py [--bundles 10000] [--runs 3] [--dir DIR]

Generation is fast on purpose and not timed: one CA, a fresh P-256 key per leaf (key generation
is cheap; signing dominates), volumes laid out as the kubelet's atomic writer does but without its
fsyncs, key files 0600 as the shim writes them (a readable key is a finding). An audit log with
one entry per leaf is written too, for the second figure (root + log).
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bundles.formats import dump_private_key
from podcert.api import volumes
from signer import certs, model
from signer.auditlog.writer import AuditLog, Entry
from signer.authority import ca

REPO = Path(__file__).resolve().parents[1]
SIGNER = "bench.podcert.dev/main"
TRUST_DOMAIN = "bench.test"
TARGET_SECONDS = 3.0


def generate(root: Path, count: int, now: dt.datetime) -> tuple[Path, Path]:
    """`count` pods with one credential bundle + trust bundle each; returns (trust, audit log)."""
    bundle = ca.new_ca("bench", now - dt.timedelta(days=1))
    issuer = ca.issuing_ca(bundle)
    trust_pem = bundle.root.public_bytes(serialization.Encoding.PEM)
    trust_path = root / "trust.pem"
    trust_path.write_bytes(trust_pem)
    log_path = root / "audit.jsonl"
    stamp = volumes.version_prefix(now) + "000000001"
    not_before = certs.truncate_to_second(now - dt.timedelta(minutes=5))
    with AuditLog(log_path, checkpoint_every=1000, fsync="never") as log:
        audit_key = ec.generate_private_key(ec.SECP256R1())
        audit_chain = x509.load_pem_x509_certificates(
            certs.sign_audit_certificate(
                audit_key.public_key(),
                TRUST_DOMAIN,
                issuer,
                not_before,
                not_before + dt.timedelta(days=30),
                certs.random_serial(),
            ).encode()
        )
        log.set_checkpoint_signer(audit_key, audit_chain)
        for i in range(count):
            uid = f"00000000-0000-4000-8000-{i:012d}"
            key = ec.generate_private_key(ec.SECP256R1())
            plan = model.LeafPlan(
                public_key=key.public_key(),
                spiffe_id=f"spiffe://{TRUST_DOMAIN}/ns/ns-{i % 100}/sa/sa-{i}",
                dns_names=(),
                not_before=not_before,
                not_after=not_before + dt.timedelta(hours=24),
                begin_refresh_at=not_before + dt.timedelta(hours=12),
            )
            serial = certs.random_serial()
            chain = certs.sign_leaf(plan, issuer, serial)
            credential = dump_private_key(key) + chain.encode()
            volume = volumes.volume_dir(root, uid, "identity")
            version = volume / stamp
            version.mkdir(parents=True)
            (version / "credentialbundle.pem").write_bytes(credential)
            (version / "credentialbundle.pem").chmod(0o600)  # as the shim writes a key
            (version / "trust-bundle.pem").write_bytes(trust_pem)
            (volume / volumes.DATA_DIR).symlink_to(stamp)
            for name in ("credentialbundle.pem", "trust-bundle.pem"):
                (volume / name).symlink_to(volumes.visible_link(name))
            log.append(
                Entry(
                    time=now,
                    namespace=f"ns-{i % 100}",
                    name=f"req-{i}",
                    uid=f"pcr-{i}",
                    pod=f"pod-{i}",
                    node="node-a",
                    service_account=f"sa-{i}",
                    decision="issued",
                    reason="Issued",
                    signer_name=SIGNER,
                    spiffe_id=plan.spiffe_id,
                    serial=f"{serial:x}",
                    not_before=plan.not_before,
                    not_after=plan.not_after,
                )
            )
        log.checkpoint(audit_key, audit_chain, now)
    return trust_path, log_path


def timed(command: list[str], runs: int) -> tuple[list[float], str]:
    """Wall-clock seconds of a command as a fresh process, `runs` times; its last output line."""
    figures, summary = [], ""
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, *command],
            capture_output=True,
            text=True,
            cwd=REPO,
            check=False,
        )
        figures.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"{command} exited {done.returncode}:\n{done.stdout}{done.stderr}")
        summary = (done.stdout.strip().splitlines() or [""])[-1]
    return figures, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundles", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="generate here (default: a temporary directory)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-audit-") as scratch:
        root = args.dir or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        started = time.perf_counter()
        trust, log = generate(root, args.bundles, now)
        print(f"generated {args.bundles} bundles in {time.perf_counter() - started:.1f}s")

        root_only = [f"--root={root}"]
        everything = [*root_only, f"--trust-bundle={trust}", f"--audit-log={log}"]
        cases = {
            "podcert audit --root": ["-m", "podcert", "audit", *root_only],
            "podcert audit --root --trust-bundle --audit-log": [
                "-m",
                "podcert",
                "audit",
                *everything,
            ],
        }
        for name, command in cases.items():
            figures, summary = timed(command, args.runs)
            best, median = min(figures), statistics.median(figures)
            verdict = "OK" if median < TARGET_SECONDS else "SLOW"
            print(
                f"{name}: {args.bundles} bundles, median {median:.2f}s, best {best:.2f}s over "
                f"{args.runs} runs (target < {TARGET_SECONDS:.0f}s: {verdict})"
            )
            print(f"  {summary}")
        # Interpreter start-up and imports alone, to tell them from the audit's own time.
        figures, _ = timed(["-m", "podcert", "audit", "--help"], args.runs)
        print(f"start-up (podcert audit --help): median {statistics.median(figures):.2f}s")


if __name__ == "__main__":
    main()
