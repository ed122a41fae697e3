"""audit.assess: how one projection is judged, through `audit_findings` over a real world
(`tests.audit_world`). Its state (fresh, refresh due, overdue, expired, pending, stuck, denied),
its current credential and refresh point from whatever inputs were given, and what is wrong with
that credential: a chain to no root, a key reused, a serial the audit log never issued, another
pod's identity or a copy of another projection's credential. Each planted fault in its own test.
"""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from audit import audit_findings
from podcert.cli import main
from signer.authority import ca
from tests.audit_world import (
    LIFETIME,
    NOW,
    NS,
    T0,
    World,
    healthy,
    kinds,
    pem,
)


def test_a_request_answered_in_normal_time_is_pending_not_a_finding(world: World) -> None:
    healthy(world, pods=1)
    world.pod("new", "uid-new")
    world.request("new", "uid-new", NOW - dt.timedelta(seconds=20), outcome=None)

    report = audit_findings(world.snapshot(), NOW)

    assert report.healthy, report.findings
    assert {p.pod: p.state for p in report.projections}["new"] == "pending"


def test_only_the_node_root_is_enough(world: World) -> None:
    leaf = healthy(world, pods=1)[0]

    report = audit_findings(world.snapshot(cluster=False, log=False), NOW)

    assert report.healthy, report.findings
    (projection,) = report.projections
    assert projection.pod_uid == "uid-0"
    assert projection.serial == f"{leaf.serial:x}"
    # Without the request, the refresh point is the API's estimate (80% of the lifetime), the
    # one the shim follows for a credential it finds on disk (it was the half-life).
    assert projection.refresh_hint == "estimated"
    assert projection.begin_refresh_at == leaf.not_before + LIFETIME * 0.8


def test_with_only_the_cluster_the_credential_is_the_newest_issued_leaf(world: World) -> None:
    healthy(world, pods=1)
    newer = world.leaf("web-0", T0 + dt.timedelta(hours=1))
    world.request("web-0", "uid-0", T0 + dt.timedelta(hours=1), newer)

    report = audit_findings(world.snapshot(disk=False, log=False), NOW)

    assert report.healthy, report.findings
    (projection,) = report.projections
    assert projection.serial == f"{newer.serial:x}"
    assert (projection.refresh_hint, projection.rotations) == ("request", 2)


def test_a_denial_followed_by_a_newer_credential_is_history_not_a_finding(world: World) -> None:
    healthy(world, pods=1)
    world.request("web-0", "uid-0", T0 + dt.timedelta(minutes=30), outcome="Denied")
    # A later request was issued and written; the cluster has since deleted that request.
    newer = world.leaf("web-0", T0 + dt.timedelta(hours=1))
    world.request("web-0", "uid-0", T0 + dt.timedelta(hours=1), newer)
    world.requests.pop()
    world.write("uid-0", newer)

    report = audit_findings(world.snapshot(), NOW)

    assert report.healthy, report.findings
    assert report.projections[0].serial == f"{newer.serial:x}"


def test_an_expired_credential_is_found(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    healthy(world, pods=2)
    world.pod("old", "uid-old")
    leaf = world.leaf("old", T0, lifetime=dt.timedelta(hours=1))
    world.request("old", "uid-old", T0, leaf)
    world.write("uid-old", leaf)

    code = main(world.cli(now=NOW))

    out = capsys.readouterr().out
    assert code == 1
    assert "expired" in out
    report = audit_findings(world.snapshot(), NOW)
    assert kinds(report) == ["expired"]
    assert {p.pod_uid: p.state for p in report.projections}["uid-old"] == "expired"


def test_an_overdue_refresh_is_found(world: World) -> None:
    leaves = healthy(world, pods=2)
    # 20 minutes past web-0's refresh point, and nobody replaced it; web-1 is only just due.
    now = leaves[0].begin_refresh_at + dt.timedelta(minutes=20)
    newer = world.leaf("web-1", now - dt.timedelta(hours=1))
    world.request("web-1", "uid-1", now - dt.timedelta(hours=1), newer)
    world.checkpoint(now - dt.timedelta(minutes=59))
    world.write("uid-1", newer)

    report = audit_findings(world.snapshot(), now)

    assert kinds(report) == ["overdue"]
    (finding,) = report.findings
    assert finding.subject.startswith(f"{NS}/web-0 ")
    assert "20m0s past its refresh point" in finding.message


def test_a_refresh_point_reached_within_the_grace_is_due_not_overdue(world: World) -> None:
    leaves = healthy(world, pods=1)
    now = leaves[0].begin_refresh_at + dt.timedelta(minutes=5)

    report = audit_findings(world.snapshot(), now)

    assert report.healthy
    assert report.projections[0].state == "refresh due"


def test_a_key_reused_across_rotations_is_found(world: World) -> None:
    healthy(world, pods=1)
    world.pod("lazy", "uid-lazy")
    key = ec.generate_private_key(ec.SECP256R1())
    first = world.leaf("lazy", T0, key=key)
    world.request("lazy", "uid-lazy", T0, first)
    # The refresh made a new request with the same key instead of a new one.
    second = world.leaf("lazy", T0 + dt.timedelta(minutes=30), key=key)
    world.request("lazy", "uid-lazy", T0 + dt.timedelta(minutes=30), second)
    world.write("uid-lazy", second)

    report = audit_findings(world.snapshot(), NOW)

    assert kinds(report) == ["key-reused"]
    assert f"{first.serial:x}"[:16] in report.findings[0].message
    assert {p.pod: p.rotations for p in report.projections}["lazy"] == 2


def test_a_certificate_from_a_foreign_ca_is_found(world: World) -> None:
    healthy(world, pods=1)
    foreign = ca.new_ca("foreign", T0 - dt.timedelta(days=1))
    world.pod("mole", "uid-mole")
    leaf = world.leaf("mole", T0, issuer=foreign)
    world.request("mole", "uid-mole", T0, leaf)
    # The pod's own trust bundle was swapped too, so only the cluster's bundle tells.
    world.write("uid-mole", leaf, trust=pem(foreign.root))

    report = audit_findings(world.snapshot(), NOW)

    assert "untrusted-chain" in kinds(report)
    (finding,) = [f for f in report.findings if f.kind == "untrusted-chain"]
    assert finding.subject.startswith(f"{NS}/mole ")
    assert "signed by no root" in finding.message
    # Its root sits in a pod's trust bundle on the node, with no CA of our signer behind it.
    assert "root-without-ca" in kinds(report)


def test_a_certificate_on_disk_the_audit_log_never_issued_is_found(world: World) -> None:
    healthy(world, pods=1)
    world.pod("ghost", "uid-ghost")
    leaf = world.leaf("ghost", T0)  # signed with the real CA, but outside the signer
    world.write("uid-ghost", leaf)

    report = audit_findings(world.snapshot(), NOW)

    assert kinds(report) == ["not-in-audit-log"]
    assert f"{leaf.serial:x}"[:16] in report.findings[0].message


def test_a_request_stuck_with_no_signer_is_found(world: World) -> None:
    healthy(world, pods=1)
    world.pod("orphan", "uid-orphan", signer="nobody.example/x")
    world.request(
        "orphan",
        "uid-orphan",
        NOW - dt.timedelta(minutes=2),
        signer="nobody.example/x",
        outcome=None,
    )

    report = audit_findings(world.snapshot(), NOW)

    assert kinds(report) == ["stuck"]
    projection = {p.pod: p for p in report.projections}["orphan"]
    assert projection.state == "stuck"
    assert "is a signer serving this name?" in report.findings[0].message


def test_a_request_waiting_far_longer_than_normal_is_stuck(world: World) -> None:
    healthy(world, pods=1)
    world.pod("slow", "uid-slow")
    world.request("slow", "uid-slow", NOW - dt.timedelta(minutes=6), outcome=None)

    report = audit_findings(world.snapshot(), NOW)

    assert kinds(report) == ["stuck"]
    assert "has waited 6m0s" in report.findings[0].message


def test_a_denied_request_is_found(world: World) -> None:
    healthy(world, pods=1)
    world.pod("bad", "uid-bad")
    world.request("bad", "uid-bad", NOW - dt.timedelta(minutes=1), outcome="Denied")

    report = audit_findings(world.snapshot(), NOW)

    assert kinds(report) == ["denied"]


def test_another_pods_credential_copied_into_a_volume_is_found(world: World) -> None:
    theirs = world.running_pod("db", "uid-db")
    world.running_pod("web", "uid-web")
    world.write("uid-web", theirs)  # the attack: db's credential in web's volume

    report = audit_findings(world.snapshot(), NOW)

    web = next(p for p in report.projections if p.pod == "web")
    found = {f.kind: f.message for f in web.findings}
    assert "wrong-identity" in found and "/sa/db" in found["wrong-identity"]
    assert "credential-shared" in found and f"{NS}/db" in found["credential-shared"]
    db = next(p for p in report.projections if p.pod == "db")
    assert [f.kind for f in db.findings] == ["credential-shared"]


def test_a_credential_issued_to_another_pod_of_the_same_account_is_found(world: World) -> None:
    # Same namespace and service account, so the SPIFFE ID matches: only the issuance tells.
    leaf = world.leaf("web", T0)
    world.pod("web-a", "uid-a")
    world.pod("web-b", "uid-b")
    world.request("web-a", "uid-a", T0, leaf)
    world.write("uid-b", leaf)
    for pod in world.pods:
        pod["spec"]["serviceAccountName"] = "web"

    report = audit_findings(world.snapshot(), NOW)

    b = next(p for p in report.projections if p.pod == "web-b")
    assert any(
        f.kind == "wrong-identity" and "issued to pod" in f.message and "web-a" in f.message
        for f in b.findings
    ), b.findings


def test_a_healthy_world_has_no_identity_findings(world: World) -> None:
    healthy(world, pods=3)

    report = audit_findings(world.snapshot(), NOW)

    assert not {"wrong-identity", "credential-shared"} & set(kinds(report))
