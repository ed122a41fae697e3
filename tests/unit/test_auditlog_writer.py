"""signer.auditlog.writer: the audit log as the signer writes it. Each line chained to the one
before, checkpoints signed and numbered across restarts, a torn last line cut on open, one writer
at a time, a file only its owner reads that holds no key material, and an issuance durable before
it is reported. What `verify` makes of a log is `test_auditlog_checkpoints`'s; reading entries
back is `test_auditlog_lines`'s.
"""

from __future__ import annotations

import base64
import datetime as dt
import errno
import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from signer.auditlog.writer import (
    GENESIS,
    AuditLog,
    AuditLogError,
    iter_entries,
    verify,
)
from tests.auditlog_world import (
    AUDIT_ID,
    NOW,
    T0,
    Pki,
    entry,
    line_hash,
    make_cert,
    read_lines,
    write_log,
)

# --- the lines ------------------------------------------------------------------------------------


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


# --- checkpoints ----------------------------------------------------------------------------------


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


def test_the_module_imports_neither_kubernetes_nor_aiohttp() -> None:
    code = (
        "import sys, signer.auditlog.writer; "
        "print(sorted({'kubernetes', 'aiohttp'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- the audit certificate and the checkpoint numbers ---------------------------------------------


def test_a_workload_plan_cannot_carry_the_audit_id() -> None:
    from signer import certs, model

    root_key = ec.generate_private_key(ec.SECP256R1())
    root = make_cert("r", root_key, "r", root_key, ca=True, not_before=T0)
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
