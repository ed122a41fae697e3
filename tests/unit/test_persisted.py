"""What release 0.1.0 persisted is read by today's code, and a newer format is refused untouched.

The fixtures in data/release-0.1.0/ were written by 0.1.0's own code (its make.py says how): the
CA Secret its CAStore created and rotated, and an audit log its AuditLog wrote and checkpointed.
A "newer" format is made here by marking a copy of them with a format number above today's.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import shutil
from pathlib import Path
from typing import cast

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

import podcert
from podcert.auditlog import AuditLogError, encode_line, iter_entries, line_hash, verify
from podcert.persisted import FormatTooNew
from signer import certs
from signer.auditlog.writer import AuditLog, Entry
from signer.authority import schedule, spiffebundle
from signer.authority.castore import FORMAT_KEY, CAStore
from signer.kube import SignerKube
from tests.ca_secrets import SecretKube, secret_event

DATA = Path(__file__).parent / "data" / "release-0.1.0"
WRITTEN_AT = dt.datetime(2026, 12, 1, 16, 0, 0, tzinfo=dt.UTC)  # make.py's NOW
LATER = WRITTEN_AT + dt.timedelta(hours=1)
REF = "podcert-system/podcert-ca"


def release_secret() -> dict[str, bytes]:
    raw = json.loads((DATA / "ca-secret.json").read_text())
    return {k: base64.b64decode(v) for k, v in raw.items()}


def store(kube: SecretKube) -> CAStore:
    return CAStore(cast(SignerKube, kube), "podcert-system", "podcert-ca", lambda: LATER)


def too_new_line(what: str, found: int = 2) -> str:
    return (
        f"{what} is in format {found}; podcert {podcert.__version__} reads formats up to 1, "
        "so it leaves it untouched (run a podcert release that reads it)"
    )


# --- the CA Secret ------------------------------------------------------------------------------


def test_the_ca_secret_0_1_0_wrote_is_read_as_it_is() -> None:
    data = release_secret()
    assert FORMAT_KEY not in data  # 0.1.0 wrote no format
    kube = SecretKube(data)
    cas = store(kube)

    gens = cas.load()

    assert gens is not None and cas.error is None
    assert [g.state for g in gens] == ["active", "prepared"]
    assert cas.issuing() is not None
    roots, sequence = cas.spiffe_bundle()
    assert len(roots) == 2
    assert sequence == spiffebundle.read_sequence(data)
    assert kube.writes == 0


def test_a_rotation_step_on_0_1_0s_secret_keeps_its_material_and_marks_format_1() -> None:
    before = release_secret()
    kube = SecretKube(before)
    cas = store(kube)
    gens = cas.load()
    assert gens is not None
    prepared = next(g for g in gens if g.state == "prepared")

    cas.step(schedule.Activate(prepared.id))

    assert kube.data is not None and kube.writes == 1
    assert kube.data[FORMAT_KEY] == b"1"
    # Every generation's key and certificates carried over, byte for byte.
    material = [k for k in before if k.startswith(tuple(f"{g.id}." for g in gens))]
    assert len(material) >= 6
    assert {k: kube.data[k] for k in material} == {k: before[k] for k in material}
    assert schedule.active(cas.generations) is not None
    assert schedule.active(cas.generations).id == prepared.id  # type: ignore[union-attr]


def test_a_new_ca_secret_carries_format_1() -> None:
    kube = SecretKube(None)

    assert store(kube).load() is not None

    assert kube.data is not None and kube.data[FORMAT_KEY] == b"1"


def newer_secret() -> dict[str, bytes]:
    return {**release_secret(), FORMAT_KEY: b"2"}


def test_a_ca_secret_in_a_newer_format_is_refused_in_one_line_and_never_written() -> None:
    kube = SecretKube(newer_secret())
    cas = store(kube)

    assert cas.load() is None

    assert cas.error == too_new_line(f"CA Secret {REF}")
    assert cas.issuing() is None and cas.due() is None
    with pytest.raises(schedule.RotationError, match="is in format 2"):
        cas.step(schedule.Prepare())
    assert kube.writes == 0
    assert kube.data == newer_secret()


def test_a_newer_format_arriving_by_watch_stops_signing_until_a_readable_one_returns() -> None:
    kube = SecretKube(release_secret())
    cas = store(kube)
    assert cas.load() is not None
    held = cas.generations

    cas.on_secret(secret_event(newer_secret(), "7"))

    assert cas.issuing() is None and cas.due() is None
    assert str(cas.error) == too_new_line(f"CA Secret {REF}")
    assert cas.generations == held  # what it last read, kept, not replaced

    cas.on_secret(secret_event({**release_secret(), FORMAT_KEY: b"1"}, "8"))

    assert cas.issuing() is not None and cas.error is None
    assert kube.writes == 0


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"two", id="a word"),
        pytest.param(b"0", id="zero"),
        pytest.param(b"-1", id="negative"),
        pytest.param(b"\xff", id="not ASCII"),
    ],
)
def test_an_unreadable_format_number_is_an_error_naming_the_secret(raw: bytes) -> None:
    kube = SecretKube({**release_secret(), FORMAT_KEY: raw})
    cas = store(kube)

    assert cas.load() is None

    assert cas.error is not None and cas.error.startswith(f"CA Secret {REF}: format ")
    assert kube.writes == 0


# --- the audit log ------------------------------------------------------------------------------


def release_roots() -> list[x509.Certificate]:
    gens = schedule.from_secret(release_secret(), LATER)
    return schedule.trusted_roots(gens)


def audit_signer() -> tuple[ec.EllipticCurvePrivateKey, list[x509.Certificate]]:
    """A fresh audit key certified by the fixture's active CA, as today's signer makes one."""
    cas = store(SecretKube(release_secret()))
    cas.load()
    issuer = cas.issuing()
    assert issuer is not None
    key = ec.generate_private_key(ec.SECP256R1())
    pem = certs.sign_audit_certificate(
        key.public_key(), "cluster.local", issuer, WRITTEN_AT, WRITTEN_AT + dt.timedelta(days=30), 9
    )
    return key, list(x509.load_pem_x509_certificates(pem.encode()))


def release_log(tmp_path: Path) -> Path:
    path = tmp_path / "audit.jsonl"
    shutil.copyfile(DATA / "audit.jsonl", path)
    path.chmod(0o600)
    return path


def test_the_audit_log_0_1_0_wrote_verifies_anchored_to_its_roots() -> None:
    lines = (DATA / "audit.jsonl").read_bytes().splitlines()

    result = verify(lines, release_roots(), LATER)

    assert result.problems == []
    assert result.anchored
    assert (result.entries, result.checkpoints, result.last_checkpoint) == (5, 4, 4)
    assert [e.decision for e in iter_entries(lines)] == ["issued", "denied"] * 2 + ["issued"]


def entry(n: int) -> Entry:
    return Entry(
        time=LATER + dt.timedelta(seconds=n),
        namespace="shop",
        name=f"api-{n}-pcr",
        uid=f"10000000-0000-0000-0000-00000000000{n}",
        pod=f"api-{n}",
        node="node-b",
        service_account="api",
        decision="denied",
        reason="PodNotFound",
        signer_name="example.com/podcert",
    )


def test_todays_writer_continues_0_1_0s_log_in_lines_0_1_0_reads(tmp_path: Path) -> None:
    path = release_log(tmp_path)
    before = path.read_bytes()
    key, chain = audit_signer()

    with AuditLog(path) as log:
        assert log.checkpoints == 4  # 0.1.0's numbering goes on
        log.append(entry(1))
        log.checkpoint(key, chain, LATER + dt.timedelta(seconds=5))

    data = path.read_bytes()
    assert data.startswith(before)
    lines = data.splitlines()
    assert verify(lines, release_roots(), LATER + dt.timedelta(minutes=1)).problems == []
    new_entry, new_checkpoint = json.loads(lines[-2]), json.loads(lines[-1])
    # An entry line is framed exactly as 0.1.0 frames one: no field it would refuse.
    assert list(new_entry)[:3] == ["seq", "prev", "kind"] and "format" not in new_entry
    assert "format" not in new_checkpoint
    claims = jwt.decode(new_checkpoint["jwt"], options={"verify_signature": False})
    assert (claims["n"], claims["format"]) == (5, 1)


def chained(lines: list[bytes], body: dict[str, object]) -> bytes:
    """A line after `lines`, chained to the last of them."""
    return encode_line({"seq": len(lines) + 1, "prev": line_hash(lines[-1]), **body})


def newer_entry_line(lines: list[bytes]) -> bytes:
    # A newer format may frame entries differently: a field today's reader does not know.
    return chained(lines, {"kind": "entry", "format": 2, "decision": "issued", "signals": [1]})


@pytest.mark.parametrize(
    "tail",
    [pytest.param(b"", id="ending in a whole line"), pytest.param(b'{"seq":', id="a torn tail")],
)
def test_an_audit_log_in_a_newer_format_is_refused_in_one_line_and_left_as_it_is(
    tmp_path: Path, tail: bytes
) -> None:
    path = release_log(tmp_path)
    lines = path.read_bytes().splitlines()
    path.write_bytes(path.read_bytes() + newer_entry_line(lines) + b"\n" + tail)
    before = path.read_bytes()

    with pytest.raises(FormatTooNew) as caught:
        AuditLog(path)

    assert str(caught.value) == too_new_line(f"audit log {path}")
    assert path.read_bytes() == before


def test_a_reader_stops_at_a_newer_line_naming_it_and_its_format() -> None:
    lines = (DATA / "audit.jsonl").read_bytes().splitlines()
    lines = [*lines, newer_entry_line(lines)]
    lines = [*lines, chained(lines, {"kind": "entry", "format": 2})]

    result = verify(lines, release_roots(), LATER)

    assert result.problems == [
        "line 10: in audit log format 2, newer than format 1, the newest read; "
        "lines 10.. were not read"
    ]
    assert result.first_broken_line == 10
    assert result.entries == 5  # what it could read is still counted
    with pytest.raises(AuditLogError, match="line 10: in audit log format 2"):
        list(iter_entries(lines))


def newer_checkpoint(lines: list[bytes]) -> bytes:
    key, chain = audit_signer()
    claims = {"head": line_hash(lines[-1]), "lines": len(lines), "n": 5, "iat": 0, "format": 2}
    x5c = [base64.b64encode(c.public_bytes(serialization.Encoding.DER)).decode() for c in chain]
    token = jwt.encode(claims, key, algorithm="ES256", headers={"x5c": x5c})
    return chained(lines, {"kind": "checkpoint", "jwt": token})


def test_a_checkpoint_claiming_a_newer_format_is_refused_by_reader_and_writer(
    tmp_path: Path,
) -> None:
    path = release_log(tmp_path)
    lines = path.read_bytes().splitlines()
    lines.append(newer_checkpoint(lines))
    path.write_bytes(b"\n".join(lines) + b"\n")
    before = path.read_bytes()

    result = verify(lines, release_roots(), LATER)
    with pytest.raises(FormatTooNew) as caught:
        AuditLog(path)

    assert result.problems == [
        "line 10: checkpoint is in audit log format 2, newer than format 1, the newest read"
    ]
    assert str(caught.value) == too_new_line(f"audit log {path}")
    assert path.read_bytes() == before
