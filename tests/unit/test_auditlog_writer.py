"""signer.auditlog.writer: the audit log, a chain that shows removed and edited lines, checkpoints
that show rewrites."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import errno
import hashlib
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from podcert.auditlog import AUDIT_SIGNING_EKU
from signer.auditlog.writer import (
    GENESIS,
    AuditLog,
    AuditLogError,
    Entry,
    iter_entries,
    verify,
)

T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
NOW = T0 + dt.timedelta(hours=1)  # when the auditor runs
AUDIT_ID = "spiffe://cluster.local/podcert/audit"

Lines = list[bytes]


# --- a throwaway PKI: root -> intermediate -> audit leaf ------------------------------------------


@dataclasses.dataclass(frozen=True)
class Pki:
    root: x509.Certificate
    chain: tuple[x509.Certificate, ...]  # audit leaf first, then the intermediate
    key: ec.EllipticCurvePrivateKey  # the audit key


def _cert(
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
    root = _cert(root_name, root_key, root_name, root_key, ca=True, not_before=not_before)
    intermediate = _cert(int_name, int_key, root_name, root_key, ca=True, not_before=not_before)
    leaf = _cert(f"{label} audit", leaf_key, int_name, int_key, ca=False, not_before=not_before)
    return Pki(root=root, chain=(leaf, intermediate), key=leaf_key)


@pytest.fixture(scope="module")
def pki() -> Pki:
    return make_pki("podcert")


@pytest.fixture(scope="module")
def rogue() -> Pki:
    return make_pki("rogue")


# --- helpers --------------------------------------------------------------------------------------


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


# --- the chain ------------------------------------------------------------------------------------


def test_intact_log_verifies_and_is_anchored(tmp_path: Path, pki: Pki) -> None:
    path = tmp_path / "audit.log"
    write_log(path, pki, 10)
    with AuditLog(path) as log:
        log.checkpoint(pki.key, pki.chain, NOW)

    # File iteration keeps each newline; verify takes lines either way.
    with path.open("rb") as lines:
        result = verify(lines, [pki.root], NOW)

    assert result.ok, result.problems
    assert (result.entries, result.checkpoints, result.unsigned_tail) == (10, 3, 0)
    assert result.anchored
    assert result.first_broken_line is None


def test_line_format(tmp_path: Path, pki: Pki) -> None:
    lines = write_log(tmp_path / "audit.log", pki, 4)

    assert lines[0] == (
        b'{"seq":1,"prev":"' + GENESIS.encode() + b'","kind":"entry",'
        b'"time":"2026-05-01T12:00:01Z","namespace":"shop","name":"web-1-pcr",'
        b'"uid":"00000000-0000-0000-0000-000000000001","pod":"web-1","node":"node-a",'
        b'"service_account":"web","decision":"issued","reason":"Issued",'
        b'"signer_name":"example.com/podcert","spiffe_id":"spiffe://cluster.local/ns/shop/sa/web",'
        b'"serial":"0001","not_before":"2026-05-01T12:00:00Z","not_after":"2026-05-02T12:00:00Z"}'
    )
    assert json.loads(lines[1])["prev"] == line_hash(lines[0])
    checkpoint = json.loads(lines[4])
    assert list(checkpoint) == ["seq", "prev", "kind", "jwt"]
    header = jwt.get_unverified_header(checkpoint["jwt"])
    assert header["alg"] == "ES256"
    assert header["x5c"] == [
        base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        for cert in pki.chain
    ]
    claims = jwt.decode(
        checkpoint["jwt"],
        pki.key.public_key(),
        algorithms=["ES256"],
        options={"verify_iat": False},  # T0 may lie ahead of the wall clock
    )
    # Stamped with the time of the entry that triggered it.
    assert claims == {
        "head": line_hash(lines[3]),
        "lines": 4,
        "n": 1,
        "iat": int(T0.timestamp()) + 4,
        "format": 1,  # the log's format; its lines carry none while it is 1 (0.1.0 reads them)
    }


def test_append_returns_the_hash_of_its_line(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    with AuditLog(path) as log:
        digests = [log.append(entry(i)) for i in range(1, 4)]
        assert log.head == digests[-1]
        assert log.lines == 3
    assert digests == [line_hash(line) for line in read_lines(path)]


# Log of 10 entries, checkpoint every 4: entries on 1-4, 6-9, 11-12; checkpoints on 5 and 10.
TAMPERING = [
    pytest.param(
        lambda lines: drop(lines, 3),
        3,
        "line 3: sequence jumps from 2 to 4: 1 line(s) removed before it",
        id="a removed line is caught at the gap it leaves",
    ),
    pytest.param(
        lambda lines: drop(lines, 1),
        1,
        "line 1: sequence jumps from 0 to 2",
        id="a removed first line is caught",
    ),
    pytest.param(
        lambda lines: edit(lines, 3, reason="Renewed"),
        3,
        "line 4: prev does not match the hash of line 3: line 3 was edited",
        id="an edited line breaks the chain at that line",
    ),
    pytest.param(
        lambda lines: edit(lines, 7, decision="denied"),
        7,
        "line 8: prev does not match the hash of line 7: line 7 was edited",
        id="an edited line between checkpoints breaks the chain at that line",
    ),
    pytest.param(
        lambda lines: [*lines[:2], b'{"seq":3,"prev":', *lines[3:]],
        3,
        "line 3: not valid JSON",
        id="a line cut short is named",
    ),
    pytest.param(
        lambda lines: [*lines[:2], lines[3], lines[2], *lines[4:]],
        3,
        "line 3: sequence jumps from 2 to 4",
        id="swapped lines are caught",
    ),
    pytest.param(
        lambda lines: rechain(edit(lines, 2, namespace="kube-system")),
        5,
        "line 5: checkpoint attests 4 line(s)",
        id="a whole log rewritten with a recomputed chain is caught by the next checkpoint",
    ),
    pytest.param(
        lambda lines: rechain(drop(lines, 7)),
        9,
        "line 9: checkpoint attests 9 line(s)",
        id="a line removed and the chain renumbered is caught by the next checkpoint",
    ),
    pytest.param(
        lambda lines: rechain(drop(lines, 5)),
        9,
        "line 9: checkpoint attests 9 line(s)",
        id="a checkpoint removed and the chain recomputed is caught by the next checkpoint",
    ),
    pytest.param(
        lambda lines: [*lines[:10], lines[10], *lines[10:]],
        12,
        "line 12: sequence number 11 follows 11: line(s) duplicated or reordered",
        id="a duplicated line is caught",
    ),
    pytest.param(
        lambda lines: edit(lines, 5, jwt=json.loads(lines[9])["jwt"]),
        5,
        "line 5: checkpoint attests 9 line(s)",
        id="a checkpoint copied from elsewhere in the log is caught",
    ),
    pytest.param(
        lambda lines: edit(lines, 2, private_key="MHcCAQEE"),
        2,
        "line 2: unexpected field(s) in entry line: private_key",
        id="a field smuggled into an entry is rejected",
    ),
]


@pytest.mark.parametrize(("tamper", "first_broken", "problem"), TAMPERING)
def test_tampering_is_caught_and_named(
    tmp_path: Path,
    pki: Pki,
    tamper: Callable[[Lines], Lines],
    first_broken: int,
    problem: str,
) -> None:
    lines = write_log(tmp_path / "audit.log", pki, 10)
    assert verify(lines, [pki.root], NOW).ok

    result = verify(tamper(lines), [pki.root], NOW)

    assert not result.ok
    assert result.first_broken_line == first_broken
    assert any(p.startswith(problem) for p in result.problems), result.problems


def test_one_bad_line_is_reported_once(tmp_path: Path, pki: Pki) -> None:
    lines = write_log(tmp_path / "audit.log", pki, 3)
    result = verify([*lines[:1], b"garbage", *lines[2:]], [pki.root], NOW)
    assert result.problems == ["line 2: not valid JSON (torn or edited line)"]


# --- checkpoints and their keys -------------------------------------------------------------------


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


def _x5c(pki: Pki) -> list[str]:
    return [
        base64.b64encode(c.public_bytes(serialization.Encoding.DER)).decode() for c in pki.chain
    ]


FORGED_CHECKPOINTS = [
    pytest.param(
        lambda pki, rogue, lines: resign(lines, rogue.key, _x5c(rogue)),
        "x5c chain does not verify to the trust roots",
        id="a checkpoint signed by a key chaining to another root is rejected",
    ),
    pytest.param(
        lambda pki, rogue, lines: resign(lines, rogue.key, _x5c(pki)),
        "signature invalid",
        id="a checkpoint re-signed with another key behind the real x5c is rejected",
    ),
    pytest.param(
        lambda pki, rogue, lines: resign(lines, rogue.key, _x5c(rogue)[:1]),
        "x5c chain does not verify to the trust roots",
        id="a checkpoint whose x5c leaves out the intermediate does not chain",
    ),
]


@pytest.mark.parametrize(("forge", "problem"), FORGED_CHECKPOINTS)
def test_forged_checkpoints_are_caught(
    tmp_path: Path,
    pki: Pki,
    rogue: Pki,
    forge: Callable[[Pki, Pki, Lines], Lines],
    problem: str,
) -> None:
    lines = write_log(tmp_path / "audit.log", pki, 10)
    forged = forge(pki, rogue, rechain(edit(lines, 2, namespace="kube-system")))

    result = verify(forged, [pki.root], NOW)

    assert not result.ok
    assert result.first_broken_line == 5
    assert any(problem in p for p in result.problems), result.problems
    assert not result.anchored


def test_a_log_signed_under_another_root_verifies_against_that_root(
    tmp_path: Path, rogue: Pki
) -> None:
    lines = write_log(tmp_path / "audit.log", rogue, 10)
    assert verify(lines, [rogue.root], NOW).anchored


def test_without_trust_roots_signatures_are_checked_but_not_anchored(
    tmp_path: Path, pki: Pki, rogue: Pki
) -> None:
    lines = write_log(tmp_path / "audit.log", pki, 10)

    result = verify(lines, None, NOW)
    assert result.ok, result.problems
    assert not result.anchored

    forged = resign(rechain(edit(lines, 2, pod="other")), rogue.key, _x5c(pki))
    assert not verify(forged, None, NOW).ok


@pytest.mark.parametrize(
    ("now", "problem"),
    [
        pytest.param(
            T0 + dt.timedelta(days=400),
            None,
            id="a checkpoint still verifies after its certificate expired",
        ),
        pytest.param(
            T0 - dt.timedelta(hours=1),
            "in the future",
            id="a checkpoint dated after the auditor's now is flagged",
        ),
    ],
)
def test_checkpoint_times(tmp_path: Path, pki: Pki, now: dt.datetime, problem: str | None) -> None:
    lines = write_log(tmp_path / "audit.log", pki, 4)
    result = verify(lines, [pki.root], now)
    if problem is None:
        assert result.ok, result.problems
    else:
        assert any(problem in p for p in result.problems), result.problems


def test_checkpoint_signed_before_the_certificate_was_valid_does_not_chain(
    tmp_path: Path,
) -> None:
    late = make_pki("late", not_before=T0 + dt.timedelta(days=1))
    lines = write_log(tmp_path / "audit.log", late, 4)
    result = verify(lines, [late.root], NOW + dt.timedelta(days=2))
    assert result.first_broken_line == 5
    assert "x5c chain does not verify" in result.problems[0]


def test_entries_after_the_last_checkpoint_are_counted_not_failed(tmp_path: Path, pki: Pki) -> None:
    lines = write_log(tmp_path / "audit.log", pki, 11)  # checkpoints on 5 and 10, then 11-13
    result = verify(lines, [pki.root], NOW)
    assert result.ok
    assert result.unsigned_tail == 3
    # How long checkpointing has been behind: the time of the first entry no checkpoint covers.
    assert result.unsigned_since == list(iter_entries(lines))[-3].time


def test_a_checkpoint_clears_the_unsigned_tail(tmp_path: Path, pki: Pki) -> None:
    lines = write_log(tmp_path / "audit.log", pki, 8)  # checkpoints after entries 4 and 8
    result = verify(lines, [pki.root], NOW)
    assert (result.unsigned_tail, result.unsigned_since) == (0, None)


def test_a_log_without_checkpoints_is_not_anchored(tmp_path: Path, pki: Pki) -> None:
    path = tmp_path / "audit.log"
    with AuditLog(path) as log:
        log.append(entry(1))
    result = verify(read_lines(path), [pki.root], NOW)
    assert result.ok
    assert (result.checkpoints, result.unsigned_tail, result.anchored) == (0, 1, False)


def test_checkpoint_without_new_lines_writes_nothing(tmp_path: Path, pki: Pki) -> None:
    path = tmp_path / "audit.log"
    with AuditLog(path) as log:
        assert log.checkpoint(pki.key, pki.chain, NOW) is None  # empty log
        log.append(entry(1))
        digest = log.checkpoint(pki.key, pki.chain, NOW)
        assert digest == log.head
        assert log.checkpoint(pki.key, pki.chain, NOW) is None  # idle timer
    with AuditLog(path) as log:  # and after a restart
        assert log.checkpoint(pki.key, pki.chain, NOW) is None
    assert len(read_lines(path)) == 2


@pytest.mark.parametrize(
    "signer",
    [
        pytest.param(lambda pki, rogue: (rogue.key, pki.chain), id="a key that is not the leaf's"),
        pytest.param(lambda pki, rogue: (pki.key, ()), id="an empty chain"),
        pytest.param(
            lambda pki, rogue: (ec.generate_private_key(ec.SECP384R1()), pki.chain),
            id="a P-384 key",
        ),
    ],
)
def test_checkpoint_signer_is_checked_up_front(
    tmp_path: Path,
    pki: Pki,
    rogue: Pki,
    signer: Callable[[Pki, Pki], tuple[ec.EllipticCurvePrivateKey, tuple[x509.Certificate, ...]]],
) -> None:
    key, chain = signer(pki, rogue)
    with AuditLog(tmp_path / "audit.log") as log, pytest.raises(ValueError):
        log.set_checkpoint_signer(key, chain)


# --- the file -------------------------------------------------------------------------------------


def test_restart_continues_the_chain(tmp_path: Path, pki: Pki) -> None:
    path = tmp_path / "audit.log"
    write_log(path, pki, 6)  # checkpoint on line 5, line 6-7 unsigned

    with AuditLog(path, checkpoint_every=4) as log:
        assert log.lines == 7
        assert log.head == line_hash(read_lines(path)[-1])
        log.set_checkpoint_signer(pki.key, pki.chain)
        for i in range(7, 12):
            log.append(entry(i))
        log.checkpoint(pki.key, pki.chain, NOW)

    lines = read_lines(path)
    result = verify(lines, [pki.root], NOW)
    assert result.ok, result.problems
    assert [json.loads(line)["seq"] for line in lines] == list(range(1, len(lines) + 1))
    assert result.entries == 11


TORN_TAILS = [
    pytest.param(b'{"seq":4,"prev":"9f86d08', id="a line cut mid-JSON"),
    pytest.param(None, id="a whole line missing only its newline"),
    pytest.param(b"\0" * 300, id="zeros left by a power loss"),
]


@pytest.mark.parametrize("tail", TORN_TAILS)
def test_torn_final_line_is_cut_and_the_chain_continues(
    tmp_path: Path, pki: Pki, tail: bytes | None
) -> None:
    path = tmp_path / "audit.log"
    with AuditLog(path) as log:
        for i in range(1, 4):
            log.append(entry(i))
        log.append(entry(4))
    intact = path.read_bytes()
    complete = intact[: intact.rindex(b"\n", 0, len(intact) - 1) + 1]  # lines 1-3
    path.write_bytes(complete + (intact[len(complete) : -1] if tail is None else tail))

    with AuditLog(path) as log:
        assert log.recovery_warning is not None
        assert "torn final line" in log.recovery_warning
        assert path.read_bytes() == complete
        log.append(entry(5))

    result = verify(read_lines(path), None, NOW)
    assert result.ok, result.problems
    assert result.entries == 4


def test_a_file_holding_only_a_torn_line_starts_over(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.write_bytes(b'{"seq":1,"pr')
    path.chmod(0o600)
    with AuditLog(path) as log:
        assert log.recovery_warning is not None
        assert log.lines == 0
        log.append(entry(1))
    assert verify(read_lines(path), None, NOW).ok


def test_an_intact_file_opens_without_warning(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    with AuditLog(path) as log:
        log.append(entry(1))
    with AuditLog(path) as log:
        assert log.recovery_warning is None


def test_a_damaged_last_complete_line_refuses_to_open(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    with AuditLog(path) as log:
        log.append(entry(1))
    damaged = path.read_bytes() + b"not an audit line\n"
    path.write_bytes(damaged)

    with pytest.raises(AuditLogError, match="the last line is not an audit line"):
        AuditLog(path)
    assert path.read_bytes() == damaged  # left for a human


def test_a_second_writer_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    with AuditLog(path), pytest.raises(AuditLogError, match="another writer"):
        AuditLog(path)


@pytest.mark.timeout(60)
def test_concurrent_appends_keep_the_chain(tmp_path: Path, pki: Pki) -> None:
    path = tmp_path / "audit.log"
    threads, per_thread = 8, 50
    start = threading.Barrier(threads)

    with AuditLog(path, checkpoint_every=7) as log:
        log.set_checkpoint_signer(pki.key, pki.chain)

        def worker(t: int) -> None:
            start.wait()
            for i in range(per_thread):
                log.append(entry(t * per_thread + i))

        pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()

    result = verify(read_lines(path), [pki.root], NOW)
    assert result.ok, result.problems
    assert result.entries == threads * per_thread
    assert result.checkpoints == threads * per_thread // 7


@pytest.fixture
def open_umask() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.usefixtures("open_umask")
def test_the_file_is_created_0600(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    with AuditLog(path) as log:
        log.append(entry(1))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def _strings(value: object) -> Iterator[str]:
    """Every string in a parsed line, with checkpoint JWTs opened up."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value
        if value.count(".") == 2 and value.startswith("eyJ"):
            yield from _strings(jwt.get_unverified_header(value))
            yield from _strings(jwt.decode(value, options={"verify_signature": False}))


def test_no_key_material_in_the_file(tmp_path: Path, pki: Pki) -> None:
    path = tmp_path / "audit.log"
    write_log(path, pki, 9)
    with AuditLog(path) as log:
        log.append(entry(10, "denied"))
        log.checkpoint(pki.key, pki.chain, NOW)
    data = path.read_bytes()

    pkcs8 = pki.key.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    scalar = pki.key.private_numbers().private_value.to_bytes(32, "big")
    needles = {
        b"PRIVATE KEY",
        pkcs8,
        base64.b64encode(pkcs8),
        scalar,
        scalar.hex().encode(),
        base64.b64encode(scalar).rstrip(b"="),
        base64.urlsafe_b64encode(scalar).rstrip(b"="),  # as a JWK "d" would hold it
    }
    for needle in needles:
        assert needle not in data
    for line in data.splitlines():
        for text in _strings(json.loads(line)):
            assert not any(needle.decode("latin-1") in text for needle in needles)


# --- reading entries ------------------------------------------------------------------------------


def test_iter_entries_gives_back_what_was_appended(tmp_path: Path, pki: Pki) -> None:
    path = tmp_path / "audit.log"
    appended = [entry(1), entry(2, "denied"), entry(3, "failed"), entry(4), entry(5)]
    with AuditLog(path, checkpoint_every=2) as log:
        log.set_checkpoint_signer(pki.key, pki.chain)
        for e in appended:
            log.append(e)
    assert list(iter_entries(path.read_text().splitlines())) == appended


@pytest.mark.parametrize(
    ("line", "message"),
    [
        pytest.param(b"{", "not valid JSON", id="bad JSON"),
        pytest.param(b"", "empty line", id="an empty line"),
        pytest.param(b"[]", "not a JSON object", id="a JSON array"),
        pytest.param({"seq": 0}, "seq must be a positive integer", id="seq zero"),
        pytest.param({"seq": 1, "prev": "abc", "kind": "entry"}, "prev must be", id="short prev"),
        pytest.param({"seq": 1, "prev": GENESIS, "kind": "note"}, "unknown kind", id="bad kind"),
        pytest.param({"decision": "approved"}, "decision must be one of", id="unknown decision"),
        pytest.param({"time": "yesterday"}, "time is not an ISO 8601 time", id="bad time"),
        pytest.param({"time": "2026-05-01T12:00:00"}, "time has no time zone", id="naive time"),
        pytest.param({"pod": None}, "entry field 'pod' must be a string", id="null pod"),
        pytest.param({"serial": "xyz"}, "serial must be hex", id="non-hex serial"),
    ],
)
def test_iter_entries_names_the_malformed_line(
    tmp_path: Path, line: bytes | dict[str, object], message: str
) -> None:
    path = tmp_path / "audit.log"
    with AuditLog(path) as log:
        log.append(entry(1))
    good = read_lines(path)[0]
    if isinstance(line, dict):
        line = json.dumps({**json.loads(good), "seq": 2, **line}).encode()

    with pytest.raises(AuditLogError, match=message) as caught:
        list(iter_entries([good, line]))
    assert caught.value.line_no == 2


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"time": dt.datetime(2026, 5, 1)}, id="a naive time"),
        pytest.param({"decision": "approved"}, id="an unknown decision"),
        pytest.param({"serial": "0x1f"}, id="a serial that is not bare hex"),
    ],
)
def test_entry_rejects(change: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        dataclasses.replace(entry(1), **change)


def test_the_module_imports_neither_kubernetes_nor_aiohttp() -> None:
    code = (
        "import sys, signer.auditlog.writer; "
        "print(sorted({'kubernetes', 'aiohttp'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_checkpoints_under_a_retired_root_are_vouched_for_by_a_later_anchored_one(
    tmp_path: Path, pki: Pki
) -> None:
    # A CA rotation: the first checkpoints chain to the old root, which is then withdrawn; the
    # signer re-keys its audit certificate under the new root and checkpoints again.
    old = make_pki("old")
    path = tmp_path / "audit.jsonl"
    with AuditLog(path, checkpoint_every=4) as log:
        log.set_checkpoint_signer(old.key, old.chain)
        for i in range(1, 9):
            log.append(entry(i))
        log.set_checkpoint_signer(pki.key, pki.chain)
        for i in range(9, 13):
            log.append(entry(i))
    lines = read_lines(path)
    result = verify(lines, [pki.root], T0 + dt.timedelta(days=2))
    assert result.ok, result.problems
    assert result.anchored
    # Without the later anchored checkpoint, the old ones are reported.
    cut = lines[:10]  # entries 1-8 and their two checkpoints under the old root
    alone = verify(cut, [pki.root], T0 + dt.timedelta(days=2))
    assert not alone.ok
    assert alone.first_broken_line == 5
    assert "does not verify to the trust roots" in alone.problems[0]


# --- only the signer's audit certificate vouches for the log --------------------------------------


def _workload_pki(pki: Pki) -> tuple[ec.EllipticCurvePrivateKey, list[str]]:
    """A pod's key and chain as the signer issues them, under the same trusted root as `pki`:
    what an attacker can read from any pod's volume."""
    from signer import certs, model

    intermediate_key = ec.generate_private_key(ec.SECP256R1())
    root_key = ec.generate_private_key(ec.SECP256R1())
    root = _cert("w root", root_key, "w root", root_key, ca=True, not_before=T0)
    intermediate = _cert("w int", intermediate_key, "w root", root_key, ca=True, not_before=T0)
    issuer = model.IssuingCA(certificate=intermediate, key=intermediate_key, root=root)
    key = ec.generate_private_key(ec.SECP256R1())
    plan = model.LeafPlan(
        public_key=key.public_key(),
        spiffe_id="spiffe://cluster.local/ns/shop/sa/web",
        dns_names=(),
        not_before=T0,
        not_after=T0 + dt.timedelta(days=1),
        begin_refresh_at=T0 + dt.timedelta(hours=12),
    )
    chain = x509.load_pem_x509_certificates(certs.sign_leaf(plan, issuer, 7).encode())
    return key, [
        base64.b64encode(c.public_bytes(serialization.Encoding.DER)).decode()
        for c in [*chain, intermediate]
    ]


def test_a_checkpoint_signed_with_a_workload_key_is_not_the_signers(
    tmp_path: Path, pki: Pki
) -> None:
    key, x5c = _workload_pki(pki)
    lines = write_log(tmp_path / "audit.log", pki, 10)
    forged = resign(rechain(edit(lines, 2, namespace="kube-system")), key, x5c)
    root = x509.load_der_x509_certificate(base64.b64decode(x5c[-1]))

    # Even with the workload's own root among the trust roots, its key cannot vouch for a log.
    result = verify(forged, [pki.root, root], NOW)

    assert not result.ok and not result.anchored
    assert "is not signed by an audit certificate" in result.problems[0]
    assert "clientAuth" in result.problems[0] or "serverAuth" in result.problems[0]


AUDIT_CERT_SHAPES = [
    pytest.param(
        {"usages": [AUDIT_SIGNING_EKU, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]},
        "extended key usage",
        id="an audit EKU next to clientAuth is refused",
    ),
    pytest.param({"usages": None}, "no extended key usage", id="no EKU is refused"),
    pytest.param(
        {"uri": "spiffe://cluster.local/ns/podcert/sa/audit"},
        "is not spiffe://<trust domain>/podcert/audit",
        id="a workload-shaped name is refused",
    ),
    pytest.param({"uri": None}, "no subject alternative name", id="no name is refused"),
]


@pytest.mark.parametrize(("shape", "problem"), AUDIT_CERT_SHAPES)
def test_audit_certificate_shape(shape: dict[str, object], problem: str) -> None:
    from podcert.auditlog import audit_certificate_problem

    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ca")]))
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(T0)
        .not_valid_after(T0 + dt.timedelta(days=1))
    )
    usages = shape.get("usages", [AUDIT_SIGNING_EKU])
    if usages is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)  # type: ignore[arg-type]
    uri = shape.get("uri", AUDIT_ID)
    if uri is not None:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(str(uri))]), critical=True
        )
    cert = builder.sign(key, hashes.SHA256())

    found = audit_certificate_problem(cert)

    assert found is not None and problem in found


def test_the_signers_audit_certificate_has_the_audit_shape() -> None:
    from podcert.auditlog import audit_certificate_problem
    from signer import certs, model

    root_key = ec.generate_private_key(ec.SECP256R1())
    root = _cert("r", root_key, "r", root_key, ca=True, not_before=T0)
    issuer = model.IssuingCA(certificate=root, key=root_key, root=root)
    key = ec.generate_private_key(ec.SECP256R1())
    pem = certs.sign_audit_certificate(
        key.public_key(), "cluster.local", issuer, T0, T0 + dt.timedelta(days=1), 5
    )
    assert audit_certificate_problem(x509.load_pem_x509_certificate(pem.encode())) is None


def test_a_workload_plan_cannot_carry_the_audit_id() -> None:
    from signer import certs, model

    root_key = ec.generate_private_key(ec.SECP256R1())
    root = _cert("r", root_key, "r", root_key, ca=True, not_before=T0)
    issuer = model.IssuingCA(certificate=root, key=root_key, root=root)
    plan = model.LeafPlan(
        public_key=ec.generate_private_key(ec.SECP256R1()).public_key(),
        spiffe_id=AUDIT_ID,
        dns_names=(),
        not_before=T0,
        not_after=T0 + dt.timedelta(days=1),
        begin_refresh_at=T0 + dt.timedelta(hours=12),
    )
    with pytest.raises(ValueError, match="audit log's own SPIFFE ID"):
        certs.sign_leaf(plan, issuer, 9)


def test_checkpoints_are_numbered_across_restarts(tmp_path: Path, pki: Pki) -> None:
    path = tmp_path / "audit.log"
    write_log(path, pki, 8)  # checkpoints 1 and 2
    with AuditLog(path) as log:
        assert log.checkpoints == 2
        log.append(entry(9))
        log.checkpoint(pki.key, pki.chain, NOW)
        assert log.checkpoints == 3

    result = verify(read_lines(path), [pki.root], NOW)

    assert result.ok and result.anchored
    assert result.last_checkpoint == 3
    assert result.last_checkpoint_at == NOW.replace(microsecond=0)
    assert result.covered_entries == 9


def test_a_removed_checkpoint_shows_as_a_gap_in_the_numbers(tmp_path: Path, pki: Pki) -> None:
    lines = write_log(tmp_path / "audit.log", pki, 12)  # checkpoints at lines 5, 10, 15
    # Drop checkpoint 2 and re-sign the rest with the real key, as one holding it could not, but
    # the renumbering is what is pinned here: the numbers in the signed claims must run 1, 2, 3.
    forged = rechain(drop(lines, 10))
    forged = [
        *forged[:13],
        *resign_numbered(forged[13:], pki, start_line=14, number=3),
    ]

    result = verify(forged, [pki.root], NOW)

    assert any("checkpoint number 3 follows 1" in p for p in result.problems), result.problems


def resign_numbered(tail: Lines, pki: Pki, *, start_line: int, number: int) -> Lines:
    """Re-sign the checkpoints of `tail` (lines start_line...) with the real key and numbers
    from `number`; each line's prev must already be right."""
    out: Lines = []
    for offset, line in enumerate(tail):
        obj = json.loads(line)
        if obj["kind"] == "checkpoint":
            claims = {
                "head": obj["prev"],
                "lines": start_line + offset - 1,
                "n": number,
                "iat": int(T0.timestamp()),
            }
            obj["jwt"] = jwt.encode(claims, pki.key, algorithm="ES256", headers={"x5c": _x5c(pki)})
            number += 1
        out.append(json.dumps(obj, separators=(",", ":")).encode())
    return out


def test_a_forced_checkpoint_vouches_for_an_empty_log(tmp_path: Path, pki: Pki) -> None:
    path = tmp_path / "audit.log"
    with AuditLog(path) as log:
        assert log.checkpoint(pki.key, pki.chain, NOW) is None  # nothing to sign
        assert log.checkpoint(pki.key, pki.chain, NOW, force=True) is not None

    result = verify(read_lines(path), [pki.root], NOW)

    assert result.ok and result.anchored and result.last_checkpoint == 1
    assert result.entries == 0


# --- durable before issuance, and fail closed -----------------------------------------------------


def test_an_issued_entry_is_fsynced_before_append_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    with AuditLog(tmp_path / "audit.log", fsync="never") as log:
        synced.clear()  # creating the file syncs its directory
        log.append(entry(1, "denied"))
        assert synced == []  # a denial may wait for the next checkpoint
        log.append(entry(2))
        assert len(synced) == 1  # an issuance may not


def test_a_failed_fsync_cuts_the_unsynced_lines_and_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "audit.log"
    with AuditLog(path) as log:
        log.append(entry(1))

        def full(_fd: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "fsync", full)
        with pytest.raises(OSError, match="No space left"):
            log.append(entry(2))
        monkeypatch.undo()
        # The log is as it was before the failed issuance and goes on from there.
        assert log.lines == 1
        log.append(entry(3))

    assert [e.name for e in iter_entries(read_lines(path))] == ["web-1-pcr", "web-3-pcr"]
    assert verify(read_lines(path), None, NOW).ok


def test_concurrent_issuances_share_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    real_fsync = os.fsync

    def counting(fd: int) -> None:
        nonlocal calls
        calls += 1
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting)
    with AuditLog(tmp_path / "audit.log", fsync="never") as log:
        threads = [
            threading.Thread(target=lambda i=i: [log.append(entry(i * 100 + j)) for j in range(50)])
            for i in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert log.lines == 400
    # Every issuance was durable when it returned, with at most one fsync each.
    assert 0 < calls <= 400
