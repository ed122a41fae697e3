"""audit.examine: one node volume at a time, its files told apart by content (a credential
bundle, a key and the chain it certifies, a trust bundle) and each chain checked.
"""

from __future__ import annotations

import datetime as dt

from cryptography.hazmat.primitives import serialization

from audit import VolumeFiles, audit_findings, examine_volume
from audit.examine import sha256_of
from kubelet_shim.atomic import AtomicDirStorage
from kubelet_shim.storage import FileSpec
from signer.authority import ca
from tests.audit_world import (
    NOW,
    T0,
    World,
    healthy,
    kinds,
    pem,
    pkcs8,
)

UID = "uid-web"


def test_a_torn_key_and_chain_pair_on_disk_is_found(world: World) -> None:
    healthy(world, pods=1)
    leaf, other = world.leaf("torn", T0), world.leaf("torn", T0)
    files = {
        "tls.key": FileSpec(pkcs8(other.key), 0o600),
        "tls.crt": FileSpec(leaf.chain_pem.encode(), 0o644),
    }
    AtomicDirStorage(world.node_root).write_volume("uid-torn", "identity", files, None)

    report = audit_findings(world.snapshot(log=False), NOW)

    assert kinds(report) == ["unreadable"]
    assert "does not belong to leaf" in report.findings[0].message


def der_roots(*authorities: ca.CABundle) -> tuple[bytes, ...]:
    return tuple(a.root.public_bytes(serialization.Encoding.DER) for a in authorities)


def test_files_are_told_apart_by_content_not_by_name(world: World) -> None:
    leaf = world.leaf("web", T0)
    files = {
        "trust.crt": pem(world.authority.root),  # CA certificates only: a trust bundle
        "bundle.key": pkcs8(leaf.key) + leaf.chain_pem.encode(),  # key and chain: a credential
    }

    facts = examine_volume(VolumeFiles(UID, "identity", files), roots=(), now=NOW)

    (credential,) = facts.credentials
    assert (credential.path, credential.key_path, credential.problem) == ("bundle.key", None, None)
    assert credential.cert is not None and credential.cert.serial == f"{leaf.serial:x}"
    (trust,) = facts.trust_files
    assert (trust.path, trust.problem) == ("trust.crt", None)
    assert trust.roots == der_roots(world.authority)


def test_a_key_goes_with_the_chain_it_certifies_whatever_the_names(world: World) -> None:
    first, second = world.leaf("a", T0), world.leaf("b", T0)
    files = {
        "a.crt": first.chain_pem.encode(),
        "a.key": pkcs8(second.key),
        "b.crt": second.chain_pem.encode(),
        "b.key": pkcs8(first.key),
    }

    facts = examine_volume(VolumeFiles(UID, "identity", files), roots=(), now=NOW)

    paired = {(c.path, c.key_path, c.problem) for c in facts.credentials}
    assert paired == {("a.crt", "b.key", None), ("b.crt", "a.key", None)}


def test_a_key_file_with_no_chain_is_a_credential_no_consumer_can_load(world: World) -> None:
    files = {"tls.key": pkcs8(world.leaf("web", T0).key)}

    facts = examine_volume(VolumeFiles(UID, "identity", files), roots=(), now=NOW)

    (credential,) = facts.credentials
    assert credential.cert is None
    assert credential.problem == "a key file with no certificate chain"


def test_without_roots_a_chain_is_checked_against_the_volumes_own_trust_bundle(
    world: World,
) -> None:
    foreign = ca.new_ca("foreign", T0 - dt.timedelta(days=1))
    leaf = world.leaf("mole", T0, issuer=foreign)
    files = {
        "credentialbundle.pem": pkcs8(leaf.key) + leaf.chain_pem.encode(),
        "trust-bundle.pem": pem(foreign.root),
    }
    volume = VolumeFiles(UID, "identity", files)

    own = examine_volume(volume, roots=(), now=NOW).credentials[0].cert
    given = examine_volume(volume, roots=der_roots(world.authority), now=NOW).credentials[0].cert

    assert own is not None and own.chain_problem is None
    assert own.anchor == sha256_of(foreign.root)
    assert given is not None and given.anchor is None
    assert given.chain_problem is not None and "signed by no root" in given.chain_problem


def test_an_expired_leaf_is_judged_inside_its_own_window_not_as_an_untrusted_chain(
    world: World,
) -> None:
    leaf = world.leaf("old", T0, lifetime=dt.timedelta(hours=1))
    files = {"credentialbundle.pem": pkcs8(leaf.key) + leaf.chain_pem.encode()}
    later = leaf.not_after + dt.timedelta(days=1)

    facts = examine_volume(
        VolumeFiles(UID, "identity", files), roots=der_roots(world.authority), now=later
    )

    cert = facts.credentials[0].cert
    assert cert is not None and cert.chain_checked
    assert (cert.chain_problem, cert.anchor) == (None, sha256_of(world.authority.root))
    assert cert.not_after == leaf.not_after
