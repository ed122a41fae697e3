"""`podcert inspect`: what a credential bundle, a chain file or a trust bundle holds, the key's
type but never the key, and which given root anchors the chain."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from audit.inspect import NO_REFRESH_HINT, inspect_file, inspection_table
from podcert.cli import main
from podcert.errors import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from tests.audit_world import NS, T0, TRUST_DOMAIN, World, new_signer_ca, pem, pkcs8


def _bundle(world: World) -> tuple[bytes, bytes]:
    leaf = world.leaf("web", T0)
    key = pkcs8(leaf.key)
    return key + leaf.chain_pem.encode(), key


def test_a_credential_bundle_shows_its_id_key_type_and_chain_but_never_the_key(
    world: World,
) -> None:
    data, key = _bundle(world)

    found = inspect_file("cb.pem", data, T0, [world.authority.root])

    assert found.kind == "credential-bundle"
    assert found.spiffe_id == f"spiffe://{TRUST_DOMAIN}/ns/{NS}/sa/web"
    assert found.key_type == "ECDSAP256"
    assert found.validity == "valid"
    assert found.refresh_hint == NO_REFRESH_HINT
    assert found.anchor is not None
    assert found.anchor.subject == world.authority.root.subject.rfc4514_string()
    assert [c.is_ca for c in found.certificates] == [False, True]
    assert found.healthy
    shown = json.dumps(found.as_json()) + inspection_table(found)
    body = b"".join(key.splitlines()[1:-1]).decode()
    assert body[:40] not in shown and "PRIVATE KEY" not in shown


def test_a_chain_no_given_root_anchors_is_a_finding(world: World) -> None:
    data, _ = _bundle(world)
    stranger = new_signer_ca().root

    found = inspect_file("cb.pem", data, T0, [stranger])

    assert found.anchor is None
    assert any("no root of the trust bundle anchors it" in p for p in found.problems)


def test_an_expired_leaf_is_a_finding(world: World) -> None:
    data, _ = _bundle(world)

    found = inspect_file("cb.pem", data, T0 + dt.timedelta(days=3))

    assert found.validity == "expired"
    assert not found.healthy


def test_a_trust_bundle_and_a_chain_file_are_told_apart(world: World) -> None:
    trust = inspect_file("t.pem", pem(world.authority.root), T0)
    assert trust.kind == "trust-bundle" and len(trust.certificates) == 1 and trust.healthy

    chain = inspect_file("c.pem", world.leaf("web", T0).chain_pem.encode(), T0)
    assert chain.kind == "certificate-chain" and chain.key_type == "ECDSAP256"


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"not pem at all", id="no PEM"),
        pytest.param(
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", id="junk DER"
        ),
    ],
)
def test_an_unreadable_file_is_a_finding_naming_the_problem(data: bytes) -> None:
    found = inspect_file("x.pem", data, T0)

    assert found.kind == "unreadable" and found.problems and not found.healthy


def test_the_command_exits_by_what_it_found(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, _ = _bundle(world)
    (tmp_path / "cb.pem").write_bytes(data)
    now = ["--now", T0.strftime("%Y-%m-%dT%H:%M:%SZ")]

    assert main(["inspect", str(tmp_path / "cb.pem"), "-o", "json", *now]) == EXIT_OK
    doc = json.loads(capsys.readouterr().out)
    assert (doc["apiVersion"], doc["kind"]) == ("podcert.dev/v1alpha1", "Inspection")
    trust = ["--trust-bundle", str(world.trust_path)]
    assert main(["inspect", str(tmp_path / "cb.pem"), *trust, *now]) == EXIT_OK
    assert "Anchored by:" in capsys.readouterr().out
    later = ["--now", (T0 + dt.timedelta(days=3)).strftime("%Y-%m-%dT%H:%M:%SZ")]
    assert main(["inspect", str(tmp_path / "cb.pem"), *later]) == EXIT_FINDINGS
    assert main(["inspect", str(tmp_path / "missing.pem")]) == EXIT_USAGE
