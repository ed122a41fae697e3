"""Benchmark: what judging the peer inside the TLS handshake costs (bundles.handshake).

Mutual TLS 1.3 handshakes over memory BIOs between two TLSSources' contexts (each side checks
the other's chain and SPIFFE ID) against the same material in plain contexts that check nothing
beyond the chain; CPU time per handshake pair, rounds alternated, P-256 keys.

    .venv/bin/python bench/bench_handshake_check.py [--handshakes 300] [--rounds 6]
"""

from __future__ import annotations

import argparse
import datetime as dt
import ssl
import statistics
import tempfile
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bundles.authz import allow_ids
from bundles.formats import dump_certificates, dump_private_key
from bundles.handshake import build_contexts
from bundles.source import TLSSource

SERVER, CLIENT = "spiffe://bench.test/ns/a/sa/api", "spiffe://bench.test/ns/a/sa/web"


Key = ec.EllipticCurvePrivateKey
BOTH = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]


def _material(folder: Path, spiffe_id: str, root: x509.Certificate, root_key: Key) -> Path:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(root.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(BOTH), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(spiffe_id)]), critical=True
        )
        .sign(root_key, hashes.SHA256())
    )  # fmt: skip
    path = folder / f"{spiffe_id.rsplit('/', 1)[1]}.pem"
    path.write_bytes(dump_private_key(key) + dump_certificates([leaf]))
    return path


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> None:
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    s, c = server.wrap_bio(s_in, s_out, server_side=True), client.wrap_bio(c_in, c_out)
    pending = [c, s]
    while pending:
        for side in list(pending):
            try:
                side.do_handshake()
                pending.remove(side)
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--handshakes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-handshake-"))
    root_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench root")])
    now = dt.datetime.now(dt.UTC)
    root = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(root_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(hours=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(root_key, hashes.SHA256())
    )  # fmt: skip
    (folder / "trust.pem").write_bytes(dump_certificates([root]))
    server = TLSSource(_material(folder, SERVER, root, root_key), folder / "trust.pem")
    client = TLSSource(_material(folder, CLIENT, root, root_key), folder / "trust.pem")
    checked = server.server_context(allow_ids([CLIENT])), client.client_context(allow_ids([SERVER]))
    plain = (
        build_contexts(server.credential, server.trust_bundle)[0],
        build_contexts(client.credential, client.trust_bundle)[1],
    )
    kinds = {"checked": checked, "plain": plain}
    cpu: dict[str, list[float]] = {kind: [] for kind in kinds}
    for round_ in range(args.rounds):
        order = list(kinds) if round_ % 2 == 0 else list(reversed(kinds))
        for kind in order:
            started = time.process_time()
            for _ in range(args.handshakes):
                _handshake(*kinds[kind])
            cpu[kind].append((time.process_time() - started) / args.handshakes * 1000)
    for kind, runs in cpu.items():
        shown = ", ".join(f"{r:.3f}" for r in runs)
        print(f"{kind}: median {statistics.median(runs):.3f} ms CPU per handshake pair ({shown})")


if __name__ == "__main__":
    main()
