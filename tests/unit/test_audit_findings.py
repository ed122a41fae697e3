"""audit.findings (`podcert audit` as one pure function): a healthy setup is clean (exit 0) and
joins every input; the audit log's chain, checkpoints and coverage are checked against the
cluster; the command's usage. Each step's own judgement is in the step's test file
(`test_audit_assess`, `test_audit_join`, `test_audit_examine`, `test_audit_trust`,
`test_audit_snapshot`); the world they share is `tests.audit_world`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from audit import Settings, audit_findings, chain_roots
from audit import cli as audit_cli
from podcert.auditlog import GENESIS, line_hash
from podcert.cli import main
from signer.authority import ca
from tests.audit_world import (
    NOW,
    NS,
    T0,
    TRUST_DOMAIN,
    World,
    healthy,
    kinds,
    wire_time,
)

# --- healthy --------------------------------------------------------------------------------------


def test_a_healthy_setup_is_clean_and_exits_0(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    healthy(world)

    code = main(world.cli(now=NOW))

    out = capsys.readouterr().out
    assert code == 0, out
    assert "healthy" in out
    assert "All 3 projections are fresh" in out


def test_a_healthy_setup_joins_every_input(world: World) -> None:
    leaves = healthy(world)

    report = audit_findings(world.snapshot(), NOW)

    assert report.healthy, report.findings
    assert [p.state for p in report.projections] == ["fresh"] * 3
    first = report.projections[0]
    assert (first.namespace, first.pod, first.volume, first.path) == (
        NS,
        "web-0",
        "identity",
        "credentialbundle.pem",
    )
    assert first.serial == f"{leaves[0].serial:x}"
    assert first.spiffe_id == f"spiffe://{TRUST_DOMAIN}/ns/{NS}/sa/web-0"
    assert first.begin_refresh_at == leaves[0].begin_refresh_at
    assert first.refresh_hint == "request"
    assert first.rotations == 1
    assert report.audit_log is not None and report.audit_log.anchored
    assert [r.has_ca for r in report.roots] == [True]


def test_json_output_is_machine_readable(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    healthy(world, pods=1)

    assert main(world.cli("-o", "json", now=NOW)) == 0

    document = json.loads(capsys.readouterr().out)
    assert document["healthy"] is True
    assert document["projections"][0]["state"] == "fresh"
    assert document["auditLogs"][0]["anchored"] is True
    assert document["findings"] == []


def test_examining_the_node_in_worker_processes_gives_the_same_report(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    healthy(world)
    world.pod("mole", "uid-mole")
    world.write("uid-mole", world.leaf("mole", T0, issuer=ca.new_ca("foreign", T0)))
    snapshot = world.snapshot()
    monkeypatch.setattr(audit_cli, "_PARALLEL_FROM", 1)

    examined = audit_cli.examine_node(world.node_root, chain_roots(snapshot), NOW, jobs=2)

    assert audit_findings(snapshot, NOW, examined=examined) == audit_findings(snapshot, NOW)


# --- a tampered audit log, each way in its own test -----------------------------------------------


def _tamper(world: World, change: Any) -> Path:
    healthy(world, pods=4)  # lines 1-4 entries, 5 checkpoint
    for i in range(4, 6):
        world.running_pod(f"web-{i}", f"uid-{i}", T0 + dt.timedelta(minutes=2))
    world.checkpoint(T0 + dt.timedelta(minutes=3))  # line 8
    world.log.close()
    lines = world.log_path.read_bytes().splitlines()
    world.log_path.write_bytes(b"".join(line + b"\n" for line in change(lines)))
    return world.log_path


def _edit(line: bytes, **changes: Any) -> bytes:
    obj = json.loads(line)
    obj.update(changes)
    return json.dumps(obj, separators=(",", ":")).encode()


def test_a_removed_audit_log_line_is_found(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    _tamper(world, lambda lines: [*lines[:2], *lines[3:]])

    assert main(world.cli(now=NOW)) == 1

    report = audit_findings(world.snapshot(), NOW)
    assert report.audit_log is not None
    assert report.audit_log.first_broken_line == 3
    assert "1 line(s) removed" in report.audit_log.problems[0]
    assert "audit-log" in kinds(report)
    assert "first broken line 3" in capsys.readouterr().out


def test_an_edited_audit_log_line_is_found(world: World) -> None:
    _tamper(world, lambda lines: [*lines[:1], _edit(lines[1], pod="web-9"), *lines[2:]])

    report = audit_findings(world.snapshot(), NOW)

    assert report.audit_log is not None
    assert report.audit_log.first_broken_line == 2
    assert "line 2 was edited" in report.audit_log.problems[0]
    assert [f for f in report.findings if f.kind == "audit-log"]


def _rechain(lines: list[bytes]) -> list[bytes]:
    """A forger's rewrite: every prev recomputed so the hash chain alone looks intact."""
    out: list[bytes] = []
    prev = GENESIS
    for line in lines:
        out.append(_edit(line, prev=prev))
        prev = line_hash(out[-1])
    return out


def test_a_rewritten_log_with_a_recomputed_chain_is_caught_by_its_checkpoints(
    world: World,
) -> None:
    _tamper(world, lambda lines: _rechain([*lines[:1], _edit(lines[1], pod="web-9"), *lines[2:]]))

    report = audit_findings(world.snapshot(), NOW)

    assert report.audit_log is not None
    # The chain verifies; the first checkpoint (line 5) attests other content.
    assert report.audit_log.first_broken_line == 5
    assert "were rewritten" in report.audit_log.problems[0]
    assert "audit-log" in kinds(report)


def _strip_checkpoints(lines: list[bytes]) -> list[bytes]:
    entries = [line for line in lines if json.loads(line)["kind"] == "entry"]
    return _rechain([_edit(line, seq=seq) for seq, line in enumerate(entries, start=1)])


def test_a_rewritten_log_without_its_checkpoints_is_not_vouched_for(world: World) -> None:
    # The attack: chain recomputed, every checkpoint dropped, entry times set to now
    # (so no "old unsigned tail" either). Only the cluster's times and signatures can tell.
    def rewrite(lines: list[bytes]) -> list[bytes]:
        fresh = wire_time(NOW)
        return _rechain(
            [_edit(line, time=fresh) for line in _strip_checkpoints(lines) if b'"time"' in line]
        )

    _tamper(world, rewrite)

    report = audit_findings(world.snapshot(), NOW)

    assert report.audit_log is not None and report.audit_log.ok  # the chain alone is consistent
    assert not report.audit_log.anchored
    messages = [f.message for f in report.findings if f.kind == "audit-log"]
    assert any("no checkpoint signed by the signer's audit certificate" in m for m in messages)
    assert any("newest signed checkpoint is from never" in m for m in messages)
    assert not report.healthy


def test_a_checkpoint_forged_with_another_key_is_found(world: World) -> None:
    def forge(lines: list[bytes]) -> list[bytes]:
        rogue = ec.generate_private_key(ec.SECP256R1())
        header = jwt.get_unverified_header(json.loads(lines[4])["jwt"])
        claims = jwt.decode(json.loads(lines[4])["jwt"], options={"verify_signature": False})
        token = jwt.encode(claims, rogue, algorithm="ES256", headers={"x5c": header["x5c"]})
        return [*lines[:4], _edit(lines[4], jwt=token), *lines[5:]]

    _tamper(world, lambda lines: _rechain(forge(lines)))

    report = audit_findings(world.snapshot(), NOW)

    assert report.audit_log is not None
    assert report.audit_log.first_broken_line == 5
    assert "signature invalid" in report.audit_log.problems[0]


# --- usage ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["audit"], id="no input at all"),
        pytest.param(["audit", "--audit-log=/nonexistent/audit.jsonl"], id="an unreadable log"),
        pytest.param(["audit", "--root=/nonexistent"], id="a root that is not a kubelet root"),
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "podcert audit:" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["audit", "--now=yesterday", "--root=."], id="a --now that is not RFC 3339"),
        pytest.param(["audit", "--now=2026-05-01T12:00:00", "--root=."], id="a --now without zone"),
        pytest.param(["audit", "--stuck-after=5 minutes", "--root=."], id="a bad duration"),
        pytest.param(["audit", "--bogus"], id="an unknown option"),
    ],
)
def test_argument_errors_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2


def test_the_audit_modules_import_neither_kubernetes_nor_aiohttp() -> None:
    code = (
        "import sys, audit, audit.snapshot, audit.cli; "
        "print(sorted({'kubernetes', 'aiohttp', 'signer', 'kubelet_shim'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- what the audit log proves --------------------------------------------------------------------


def test_without_trust_roots_the_log_cannot_be_vouched_for(world: World) -> None:
    healthy(world, pods=2)
    snapshot = dataclasses.replace(world.snapshot(), trust=(), ca_roots=None)

    report = audit_findings(snapshot, NOW)

    (finding,) = [f for f in report.findings if f.kind == "audit-log"]
    assert "no trust roots were given" in finding.message
    assert "--chain-only" in finding.message


def test_chain_only_checks_the_chain_and_says_it_vouches_for_nothing(world: World) -> None:
    healthy(world, pods=2)
    snapshot = dataclasses.replace(world.snapshot(), trust=(), ca_roots=None)

    report = audit_findings(snapshot, NOW, Settings(log_chain_only=True))

    assert [f for f in report.findings if f.kind == "audit-log"] == []
    assert any("not vouched for" in note for note in report.notes)


def test_an_empty_log_is_not_the_signers(world: World) -> None:
    healthy(world, pods=2)
    snapshot = dataclasses.replace(world.snapshot(), audit_logs=(("empty", ()),))

    report = audit_findings(snapshot, NOW)

    (finding,) = [f for f in report.findings if f.kind == "audit-log"]
    assert "no checkpoint signed by the signer's audit certificate" in finding.message


def test_a_log_cut_back_to_its_opening_checkpoint_misses_every_issuance(world: World) -> None:
    world.checkpoint(T0 - dt.timedelta(minutes=1), force=True)  # what a signer writes at start
    healthy(world, pods=2)
    lines = world.snapshot().audit_logs[0][1]  # type: ignore[index]
    snapshot = dataclasses.replace(world.snapshot(), audit_logs=(("cut", lines[:1]),))

    report = audit_findings(snapshot, NOW)

    assert report.audit_log is not None and report.audit_log.anchored
    assert kinds(report).count("not-in-audit-log") == 2


def test_a_log_cut_back_to_an_earlier_checkpoint_is_caught(world: World) -> None:
    _tamper(world, lambda lines: lines[:5])  # a consistent, signed prefix: checkpoint 1

    report = audit_findings(world.snapshot(), NOW)

    assert report.audit_log is not None and report.audit_log.ok and report.audit_log.anchored
    missing = [f for f in report.findings if f.kind == "not-in-audit-log"]
    assert {f.subject.split()[0] for f in missing} == {f"{NS}/web-4", f"{NS}/web-5"}
    assert any("newest signed checkpoint" in f.message for f in report.findings)


def test_the_signers_checkpoint_counter_catches_a_cut_back(world: World) -> None:
    _tamper(world, lambda lines: lines[:5])

    report = audit_findings(world.snapshot(), NOW, Settings(min_checkpoint=2))

    assert any(
        "newest good checkpoint is number 1, but the signer had written number 2" in f.message
        for f in report.findings
    )
    fine = audit_findings(world.snapshot(), NOW, Settings(min_checkpoint=1))
    assert not any("signer had written number" in f.message for f in fine.findings)
