"""The audit log's world for its unit tests: a throwaway PKI (root -> intermediate -> audit leaf,
the audit leaf with the audit EKU and name), entries, logs written by the signer's writer, and the
edits a forger with write access makes (edit, drop, re-chain, re-sign). Shared by the writer's
tests (`test_auditlog_writer`), the verifier's (`test_auditlog_checkpoints`), the line reader's
(`test_auditlog_lines`) and the fuzzer's (`test_hostile_input`).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import hashlib
import json
from pathlib import Path

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from podcert.auditlog import AUDIT_SIGNING_EKU
from signer.auditlog.writer import GENESIS, AuditLog, Entry

T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
NOW = T0 + dt.timedelta(hours=1)  # when the auditor runs
AUDIT_ID = "spiffe://cluster.local/podcert/audit"

Lines = list[bytes]


@dataclasses.dataclass(frozen=True)
class Pki:
    root: x509.Certificate
    chain: tuple[x509.Certificate, ...]  # audit leaf first, then the intermediate
    key: ec.EllipticCurvePrivateKey  # the audit key


def make_cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: str,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    not_before: dt.datetime,
) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_before + dt.timedelta(days=30))
        # CA or not, and a CA here signs no deeper than one intermediate.
        .add_extension(x509.BasicConstraints(ca=ca, path_length=1 if ca else None), critical=True)
        # Key identifiers let the verifier find issuers.
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
        # CAs sign certificates; the audit leaf signs checkpoints.
        .add_extension(
            x509.KeyUsage(
                digital_signature=not ca,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    if not ca:
        # The audit EKU and name: the audit key is good for nothing but audit checkpoints.
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([AUDIT_SIGNING_EKU]), critical=False
        ).add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(AUDIT_ID)]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(label: str, not_before: dt.datetime = T0 - dt.timedelta(days=1)) -> Pki:
    root_key, int_key, leaf_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    root_name, int_name = f"{label} root", f"{label} intermediate"
    root = make_cert(root_name, root_key, root_name, root_key, ca=True, not_before=not_before)
    intermediate = make_cert(int_name, int_key, root_name, root_key, ca=True, not_before=not_before)
    leaf = make_cert(f"{label} audit", leaf_key, int_name, int_key, ca=False, not_before=not_before)
    return Pki(root=root, chain=(leaf, intermediate), key=leaf_key)


def entry(i: int, decision: str = "issued") -> Entry:
    issued = decision == "issued"
    return Entry(
        time=T0 + dt.timedelta(seconds=i),
        namespace="shop",
        name=f"web-{i}-pcr",
        uid=f"00000000-0000-0000-0000-{i:012d}",
        pod=f"web-{i}",
        node="node-a",
        service_account="web",
        decision=decision,  # type: ignore[arg-type]
        reason="Issued" if issued else "PodNotFound",
        signer_name="example.com/podcert",
        spiffe_id="spiffe://cluster.local/ns/shop/sa/web" if issued else None,
        serial=f"{i:04x}" if issued else None,
        not_before=T0 if issued else None,
        not_after=T0 + dt.timedelta(hours=24) if issued else None,
    )


def read_lines(path: Path) -> Lines:
    return path.read_bytes().splitlines()


def line_hash(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


def write_log(path: Path, pki: Pki, entries: int, *, every: int = 4) -> Lines:
    """Appends `entries` entries, a checkpoint after each `every` (every=4: lines 5, 10, ...)."""
    with AuditLog(path, checkpoint_every=every) as log:
        log.set_checkpoint_signer(pki.key, pki.chain)
        for i in range(1, entries + 1):
            log.append(entry(i))
    return read_lines(path)


def rechain(lines: Lines) -> Lines:
    """What a forger with write access does after editing: renumber and recompute every prev."""
    out: Lines = []
    prev = GENESIS
    for seq, line in enumerate(lines, start=1):
        obj = json.loads(line)
        obj["seq"], obj["prev"] = seq, prev
        out.append(json.dumps(obj, separators=(",", ":")).encode())
        prev = line_hash(out[-1])
    return out


def edit(lines: Lines, line_no: int, **changes: object) -> Lines:
    obj = json.loads(lines[line_no - 1])
    obj.update(changes)
    return [
        *lines[: line_no - 1],
        json.dumps(obj, separators=(",", ":")).encode(),
        *lines[line_no:],
    ]


def drop(lines: Lines, line_no: int) -> Lines:
    return [*lines[: line_no - 1], *lines[line_no:]]


def resign(lines: Lines, key: ec.EllipticCurvePrivateKey, x5c: list[str]) -> Lines:
    """A forger's rewrite: the chain recomputed and every checkpoint re-signed with `key`."""
    out: Lines = []
    prev = GENESIS
    number = 0
    for seq, line in enumerate(lines, start=1):
        obj = json.loads(line)
        obj["seq"], obj["prev"] = seq, prev
        if obj["kind"] == "checkpoint":
            number += 1
            claims = {"head": prev, "lines": seq - 1, "n": number, "iat": int(T0.timestamp())}
            obj["jwt"] = jwt.encode(claims, key, algorithm="ES256", headers={"x5c": x5c})
        out.append(json.dumps(obj, separators=(",", ":")).encode())
        prev = line_hash(out[-1])
    return out


def x5c_of(pki: Pki) -> list[str]:
    return [
        base64.b64encode(c.public_bytes(serialization.Encoding.DER)).decode() for c in pki.chain
    ]
