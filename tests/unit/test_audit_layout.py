"""audit.layout: a SPIFFE credential folder on a node, judged as its consumers read it.

A credential bundle beside `<trust-domain>.trust-bundle.pem` files is judged by its own trust
domain's file alone, a folder without that file is reported, and a `credential-bundle.pem` that
breaks the layout is one no consumer of the standard loads."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from audit import VolumeFiles, examine_volume
from audit.examine import sha256_of
from audit.snapshot import SnapshotError, read_trust_files
from signer.authority import ca
from tests.audit_world import NOW, T0, TRUST_DOMAIN, World, pem, pkcs8

UID = "uid-web"
OWN = f"{TRUST_DOMAIN}.trust-bundle.pem"


def folder_files(world: World, **trust: bytes) -> dict[str, bytes]:
    leaf = world.leaf("web", T0)
    return {"credential-bundle.pem": pkcs8(leaf.key) + leaf.chain_pem.encode(), **trust}


def judged(files: dict[str, bytes]) -> tuple[str | None, str | None]:
    (credential,) = examine_volume(
        VolumeFiles(UID, "identity", files), roots=(), now=NOW
    ).credentials
    if credential.cert is None:
        return None, credential.problem
    return credential.cert.anchor, credential.cert.chain_problem


def test_the_chain_is_judged_by_its_own_trust_domains_file_alone(world: World) -> None:
    partner = ca.new_ca("partner", T0 - dt.timedelta(days=1))
    files = folder_files(
        world,
        **{OWN: pem(world.authority.root), "partner.test.trust-bundle.pem": pem(partner.root)},
    )
    assert judged(files) == (sha256_of(world.authority.root), None)


def test_a_folder_without_its_own_trust_domains_file_is_reported(world: World) -> None:
    # Our root is in the volume, but filed under another trust domain: no peer of ours uses it.
    files = folder_files(world, **{"partner.test.trust-bundle.pem": pem(world.authority.root)})
    anchor, problem = judged(files)
    assert anchor is None
    assert problem is not None and OWN in problem


def test_a_credential_bundle_with_the_key_last_is_a_credential_no_consumer_loads(
    world: World,
) -> None:
    leaf = world.leaf("web", T0)
    files = {
        "credential-bundle.pem": leaf.chain_pem.encode() + pkcs8(leaf.key),
        OWN: pem(world.authority.root),
    }
    _, problem = judged(files)
    assert problem is not None and "PRIVATE KEY block first" in problem


def test_outside_the_layout_every_trust_file_of_the_volume_counts(world: World) -> None:
    leaf = world.leaf("web", T0)
    files = {
        "credentialbundle.pem": leaf.chain_pem.encode() + pkcs8(leaf.key),  # any order, any name
        "trust-bundle.pem": pem(world.authority.root),
    }
    assert judged(files) == (sha256_of(world.authority.root), None)


def test_a_credential_folder_given_as_trust_bundle_reads_each_trust_domains_file(
    world: World, tmp_path: Path
) -> None:
    (tmp_path / OWN).write_bytes(pem(world.authority.root))
    (tmp_path / "gone.test.trust-bundle.pem").write_bytes(b"")  # de-federated: left out
    (tmp_path / "credential-bundle.pem").write_bytes(b"not read")
    (source,) = read_trust_files([tmp_path])
    assert source.name == str(tmp_path / OWN)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SnapshotError, match=r"trust-bundle\.pem"):
        read_trust_files([empty])
