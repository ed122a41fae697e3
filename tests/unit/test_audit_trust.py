"""audit.trust: the trust anchors, indexed per signer, and what is wrong with a root (expiring,
or trusted with no CA of the signer behind it).
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from cryptography.hazmat.primitives import serialization

from audit import Finding, Settings, Snapshot, TrustSource, VolumeFacts, audit_findings
from audit.examine import TrustFile, sha256_of
from audit.trust import TrustIndex, judge_roots
from signer.authority import ca
from tests.audit_world import (
    NOW,
    T0,
    World,
    healthy,
    kinds,
    pem,
)


def test_a_trust_root_that_expires_soon_is_found(world: World) -> None:
    healthy(world, pods=1)
    ending = ca.new_ca("ending", T0 - dt.timedelta(days=360), root_lifetime=dt.timedelta(days=363))
    snapshot = world.snapshot()
    snapshot = dataclasses.replace(
        snapshot, trust=(*snapshot.trust, TrustSource("old", pem(ending.root)))
    )

    report = audit_findings(snapshot, NOW)

    assert kinds(report) == ["root-expiring", "root-without-ca"]
    (finding,) = [f for f in report.findings if f.kind == "root-expiring"]
    assert "in 2d" in finding.message
    # Not reported once the warning window is shorter than what is left.
    short = audit_findings(snapshot, NOW, Settings(root_expiry_warning=dt.timedelta(days=1)))
    assert kinds(short) == ["root-without-ca"]


def test_a_signers_chains_may_lead_to_its_own_roots_and_to_those_given_for_every_signer() -> None:
    own, general, other = (ca.new_ca(name, T0) for name in ("own", "general", "other"))
    trust = TrustIndex(
        (
            TrustSource("own bundle", pem(own.root), "example.com/own"),
            TrustSource("other bundle", pem(other.root), "example.com/other"),
            TrustSource("--trust-bundle file", pem(general.root)),
        ),
        [],
    )

    assert trust.anchors_for("example.com/own") == {sha256_of(own.root), sha256_of(general.root)}
    # A signer no bundle names, and a projection of no known signer: any given root will do.
    assert trust.anchors_for("example.com/unlinked") is None
    assert trust.anchors_for(None) is None
    assert len(trust.all_der) == 3


def test_an_unreadable_trust_bundle_is_left_out_with_a_note() -> None:
    notes: list[str] = []

    trust = TrustIndex((TrustSource("broken", b"not a bundle"),), notes)

    assert trust.all == ()
    assert len(notes) == 1 and notes[0].startswith("trust bundle broken skipped: ")


def test_a_root_only_pods_hold_is_judged_and_says_how_many_files_hold_it() -> None:
    signers = ca.new_ca("the signer's", T0).root
    root = ca.new_ca("pods only", T0).root
    der = root.public_bytes(serialization.Encoding.DER)
    held = [
        VolumeFacts(f"uid-{i}", "identity", (), (TrustFile("trust-bundle.pem", (der,), None),))
        for i in range(3)
    ]
    findings: list[Finding] = []

    (judged,) = judge_roots(
        Snapshot(ca_roots=pem(signers)), TrustIndex((), []), held, NOW, Settings(), findings, []
    )

    assert judged.sources == ("3 pod trust bundle file(s) on the node",)
    assert judged.has_ca is False
    assert [f.kind for f in findings] == ["root-without-ca"]


def test_without_the_signers_ca_roots_no_root_is_judged_for_a_ca() -> None:
    root = ca.new_ca("given", T0).root
    notes: list[str] = []
    findings: list[Finding] = []

    (judged,) = judge_roots(
        Snapshot(),
        TrustIndex((TrustSource("file", pem(root)),), []),
        [],
        NOW,
        Settings(),
        findings,
        notes,
    )

    assert judged.has_ca is None
    assert findings == []
    assert notes == ["the signer's CA roots were not given: roots without a CA are not checked"]


def test_an_expired_root_is_found_as_expired() -> None:
    ended = ca.new_ca("ended", T0 - dt.timedelta(days=10), root_lifetime=dt.timedelta(days=5))
    findings: list[Finding] = []

    judge_roots(
        Snapshot(ca_roots=pem(ended.root)),
        TrustIndex((TrustSource("file", pem(ended.root)),), []),
        [],
        NOW,
        Settings(),
        findings,
        [],
    )

    (finding,) = findings
    assert finding.kind == "root-expiring"
    assert finding.message.startswith("expired at ")


def test_an_audit_of_some_signers_judges_no_other_signers_bundle() -> None:
    """`--signer-name`: a cluster holds other signers' bundles (another team's short-lived
    SPIRE roots, say); they are neither expiring nor CA-less roots of this audit."""
    own = ca.new_ca("own", T0)
    other = ca.new_ca("other", T0 - dt.timedelta(days=10), root_lifetime=dt.timedelta(days=11))
    trust = TrustIndex(
        (
            TrustSource("own bundle", pem(own.root), "example.com/own"),
            TrustSource("other bundle", pem(other.root), "example.com/other"),
        ),
        [],
    )
    scoped = Settings(signer_names=frozenset({"example.com/own"}))
    findings: list[Finding] = []

    judged = judge_roots(Snapshot(ca_roots=pem(own.root)), trust, [], NOW, scoped, findings, [])

    assert [r.sources for r in judged] == [("own bundle",)]
    assert findings == []
    # Unscoped, the other signer's root is judged: ending, and no CA given for it.
    judge_roots(Snapshot(ca_roots=pem(own.root)), trust, [], NOW, Settings(), findings, [])
    assert sorted(f.kind for f in findings) == ["root-expiring", "root-without-ca"]
