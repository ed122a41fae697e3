"""podcert.auditlog.checkpoints: `verify`. The chain of line hashes shows a removed, edited,
swapped or duplicated line where it is; checkpoints show a rewrite that recomputed the chain; and
only a checkpoint signed by an audit certificate (its EKU and name, and a chain to the trust
roots) vouches for a log. The logs are written by the signer's writer and edited as a forger
would (`tests.auditlog_world`).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from podcert.auditlog import AUDIT_SIGNING_EKU, iter_entries, verify
from signer.auditlog.writer import AuditLog
from tests.auditlog_world import (
    AUDIT_ID,
    NOW,
    T0,
    Lines,
    Pki,
    drop,
    edit,
    entry,
    make_cert,
    make_pki,
    read_lines,
    rechain,
    resign,
    write_log,
    x5c_of,
)


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


FORGED_CHECKPOINTS = [
    pytest.param(
        lambda pki, rogue, lines: resign(lines, rogue.key, x5c_of(rogue)),
        "x5c chain does not verify to the trust roots",
        id="a checkpoint signed by a key chaining to another root is rejected",
    ),
    pytest.param(
        lambda pki, rogue, lines: resign(lines, rogue.key, x5c_of(pki)),
        "signature invalid",
        id="a checkpoint re-signed with another key behind the real x5c is rejected",
    ),
    pytest.param(
        lambda pki, rogue, lines: resign(lines, rogue.key, x5c_of(rogue)[:1]),
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

    forged = resign(rechain(edit(lines, 2, pod="other")), rogue.key, x5c_of(pki))
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


def workload_pki(pki: Pki) -> tuple[ec.EllipticCurvePrivateKey, list[str]]:
    """A pod's key and chain as the signer issues them, under the same trusted root as `pki`:
    what an attacker can read from any pod's volume."""
    from signer import certs, model

    intermediate_key = ec.generate_private_key(ec.SECP256R1())
    root_key = ec.generate_private_key(ec.SECP256R1())
    root = make_cert("w root", root_key, "w root", root_key, ca=True, not_before=T0)
    intermediate = make_cert("w int", intermediate_key, "w root", root_key, ca=True, not_before=T0)
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
    key, x5c = workload_pki(pki)
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
    root = make_cert("r", root_key, "r", root_key, ca=True, not_before=T0)
    issuer = model.IssuingCA(certificate=root, key=root_key, root=root)
    key = ec.generate_private_key(ec.SECP256R1())
    pem = certs.sign_audit_certificate(
        key.public_key(), "cluster.local", issuer, T0, T0 + dt.timedelta(days=1), 5
    )
    assert audit_certificate_problem(x509.load_pem_x509_certificate(pem.encode())) is None


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
            obj["jwt"] = jwt.encode(
                claims, pki.key, algorithm="ES256", headers={"x5c": x5c_of(pki)}
            )
            number += 1
        out.append(json.dumps(obj, separators=(",", ":")).encode())
    return out
