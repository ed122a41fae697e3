"""audit.findings (`podcert audit`): each planted fault is found on its own, and a healthy setup
is clean (exit 0).

The world is real where it can be: leaves signed by the signer's own CA code, volumes written by
the shim's atomic writer, an audit log written by the signer's writer. The cluster's objects are
as `audit.snapshot.read_cluster` hands them over: pods as API dicts, requests decoded from their
JSON into the typed request.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
import msgspec
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from audit import Report, Settings, Snapshot, TrustSource, audit_findings, chain_roots
from audit import cli as audit_cli
from audit.snapshot import read_audit_log, read_root
from kubelet_shim.atomic import AtomicDirStorage
from kubelet_shim.storage import FileSpec
from podcert.api.pods import CertificateSource, parse_pod
from podcert.api.requests import Unreadable, decode_request
from podcert.auditlog import GENESIS, line_hash
from podcert.cli import main
from signer import certs, model
from signer.auditlog.writer import AuditLog, Entry
from signer.authority import ca

T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
SIGNER = "example.com/podcert"
TRUST_DOMAIN = "td.example"
LIFETIME = dt.timedelta(hours=24)
NS = "shop"

Key = ec.EllipticCurvePrivateKey


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _pkcs8(key: Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _time(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Leaf:
    key: Key
    chain_pem: str
    serial: int
    not_before: dt.datetime
    not_after: dt.datetime
    begin_refresh_at: dt.datetime


@dataclass
class World:
    """One signer, one node, its pods; what the signer and the shim would leave behind."""

    tmp: Path
    authority: ca.CABundle
    log: AuditLog
    pods: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    n: int = 0
    last: dt.datetime = T0  # the newest decision in the audit log
    sealed: bool = False

    @property
    def node_root(self) -> Path:
        return self.tmp / "node"

    @property
    def log_path(self) -> Path:
        return self.tmp / "audit.jsonl"

    @property
    def trust_path(self) -> Path:
        path = self.tmp / "trust.pem"
        path.write_bytes(_pem(self.authority.root))
        return path

    def leaf(
        self,
        pod: str,
        at: dt.datetime,
        *,
        key: Key | None = None,
        issuer: ca.CABundle | None = None,
        lifetime: dt.timedelta = LIFETIME,
    ) -> Leaf:
        key = key or ec.generate_private_key(ec.SECP256R1())
        not_before = at - dt.timedelta(minutes=1)
        not_after = not_before + lifetime
        refresh = not_before + lifetime / 2
        plan = model.LeafPlan(
            public_key=key.public_key(),
            spiffe_id=f"spiffe://{TRUST_DOMAIN}/ns/{NS}/sa/{pod}",
            dns_names=(),
            not_before=not_before,
            not_after=not_after,
            begin_refresh_at=refresh,
        )
        serial = certs.random_serial()
        chain = certs.sign_leaf(plan, ca.issuing_ca(issuer or self.authority), serial)
        return Leaf(key, chain, serial, not_before, not_after, refresh)

    def pod(self, name: str, uid: str, signer: str = SIGNER) -> dict[str, Any]:
        pod = {
            "metadata": {"namespace": NS, "name": name, "uid": uid},
            "spec": {
                "nodeName": "node-a",
                "volumes": [
                    {
                        "name": "identity",
                        "projected": {
                            "sources": [
                                {
                                    "podCertificate": {
                                        "signerName": signer,
                                        "keyType": "ECDSAP256",
                                        "credentialBundlePath": "credentialbundle.pem",
                                    }
                                },
                                {
                                    "clusterTrustBundle": {
                                        "signerName": SIGNER,
                                        "path": "trust-bundle.pem",
                                    }
                                },
                            ]
                        },
                    }
                ],
            },
        }
        self.pods.append(pod)
        return pod

    def request(
        self,
        pod: str,
        uid: str,
        at: dt.datetime,
        leaf: Leaf | None = None,
        *,
        signer: str = SIGNER,
        outcome: str | None = "Issued",
        audit: bool = True,
    ) -> dict[str, Any]:
        """A PodCertificateRequest as the API shows it, logged by the signer when it decided."""
        self.n += 1
        status: dict[str, Any] = {}
        if outcome == "Issued":
            assert leaf is not None
            status = {
                "certificateChain": leaf.chain_pem,
                "notBefore": _time(leaf.not_before),
                "notAfter": _time(leaf.not_after),
                "beginRefreshAt": _time(leaf.begin_refresh_at),
            }
        if outcome is not None:
            status["conditions"] = [
                {
                    "type": outcome,
                    "status": "True",
                    "reason": outcome,
                    "lastTransitionTime": _time(at),
                }
            ]
        pcr = {
            "metadata": {
                "namespace": NS,
                "name": f"req-{self.n}",
                "uid": f"pcr-{self.n}",
                "creationTimestamp": _time(at),
            },
            "spec": {
                "signerName": signer,
                "podName": pod,
                "podUID": uid,
                "serviceAccountName": pod,
                "nodeName": "node-a",
            },
            "status": status,
        }
        self.requests.append(pcr)
        if audit and outcome is not None:
            self.last = max(self.last, at)
            self.log.append(
                Entry(
                    time=at,
                    namespace=NS,
                    name=f"req-{self.n}",
                    uid=f"pcr-{self.n}",
                    pod=pod,
                    node="node-a",
                    service_account=pod,
                    decision=outcome.lower(),  # type: ignore[arg-type]
                    reason=outcome,
                    signer_name=signer,
                    spiffe_id=f"spiffe://{TRUST_DOMAIN}/ns/{NS}/sa/{pod}" if leaf else None,
                    serial=f"{leaf.serial:x}" if leaf else None,
                    not_before=leaf.not_before if leaf else None,
                    not_after=leaf.not_after if leaf else None,
                )
            )
        return pcr

    def write(self, uid: str, leaf: Leaf, trust: bytes | None = None) -> None:
        """What the shim writes: credential bundle and trust bundle, atomically."""
        files = {
            "credentialbundle.pem": FileSpec(_pkcs8(leaf.key) + leaf.chain_pem.encode(), 0o600),
            "trust-bundle.pem": FileSpec(trust or _pem(self.authority.root), 0o644),
        }
        AtomicDirStorage(self.node_root).write_volume(uid, "identity", files, None)

    def running_pod(self, name: str, uid: str, at: dt.datetime = T0) -> Leaf:
        """A pod whose credential was issued at `at` and is on disk."""
        self.pod(name, uid)
        leaf = self.leaf(name, at)
        self.request(name, uid, at, leaf)
        self.write(uid, leaf)
        return leaf

    def checkpoint(self, at: dt.datetime, *, force: bool = False) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        pem = certs.sign_audit_certificate(
            key.public_key(),
            TRUST_DOMAIN,
            ca.issuing_ca(self.authority),
            T0 - dt.timedelta(hours=1),
            T0 + dt.timedelta(days=30),
            certs.random_serial(),
        )
        self.log.checkpoint(key, x509.load_pem_x509_certificates(pem.encode()), at, force=force)

    def seal(self) -> None:
        """Checkpoint what is unsigned, as the signer's timer would a minute later, and close."""
        if self.sealed:
            return
        self.checkpoint(self.last + dt.timedelta(minutes=1))
        self.log.close()
        self.sealed = True

    def snapshot(self, *, cluster: bool = True, disk: bool = True, log: bool = True) -> Snapshot:
        self.seal()
        return Snapshot(
            pods=tuple(self.pods) if cluster else None,
            requests=tuple(decode_request(msgspec.json.encode(r)) for r in self.requests)
            if cluster
            else None,
            volumes=read_root(self.node_root) if disk else None,
            trust=(TrustSource(f"{SIGNER}:roots", _pem(self.authority.root), SIGNER),),
            audit_logs=(("audit.jsonl", read_audit_log(self.log_path)),) if log else None,
            ca_roots=_pem(self.authority.root),
        )

    def cli(self, *extra: str, now: dt.datetime) -> list[str]:
        """Arguments for `podcert audit` over this world's files."""
        self.seal()
        ca_roots = self.tmp / "ca-roots.pem"
        ca_roots.write_bytes(_pem(self.authority.root))
        return [
            "audit",
            f"--root={self.node_root}",
            f"--audit-log={self.log_path}",
            f"--trust-bundle={self.trust_path}",
            f"--ca-roots={ca_roots}",
            f"--now={_time(now)}",
            "--jobs=1",
            *extra,
        ]


@pytest.fixture(scope="module")
def signer_ca() -> ca.CABundle:
    return ca.new_ca("podcert", T0 - dt.timedelta(days=30))


@pytest.fixture
def world(tmp_path: Path, signer_ca: ca.CABundle) -> Iterator[World]:
    log = AuditLog(tmp_path / "audit.jsonl", fsync="never")
    w = World(tmp_path, signer_ca, log)
    yield w
    log.close()


def kinds(report: Report) -> list[str]:
    return sorted(f.kind for f in report.findings)


NOW = T0 + dt.timedelta(hours=2)  # two hours into 24 h leaves: fresh


def healthy(world: World, pods: int = 3) -> list[Leaf]:
    leaves = [world.running_pod(f"web-{i}", f"uid-{i}") for i in range(pods)]
    world.checkpoint(T0 + dt.timedelta(minutes=1))
    return leaves


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


def test_the_audit_reads_a_pods_sources_as_the_shim_does(world: World) -> None:
    """One reading of a pod's projected sources: a podCertificate source the API server would
    refuse is served by no shim, so the audit makes no projection of it either."""
    healthy(world, pods=1)
    pod = world.pod("odd", "uid-odd")
    pod["spec"]["volumes"][0]["projected"]["sources"].append(
        {
            "podCertificate": {
                "signerName": SIGNER,
                "keyType": "DSA2048",
                "credentialBundlePath": "refused.pem",
            }
        }
    )

    report = audit_findings(world.snapshot(), NOW)

    served = [
        (source.volume, source.credential_bundle_path)
        for _, source in parse_pod(pod).work_items()
        if isinstance(source, CertificateSource)
    ]
    audited = [(p.volume, p.path) for p in report.projections if p.pod == "odd"]
    assert audited == served == [("identity", "credentialbundle.pem")]


def test_json_output_is_machine_readable(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    healthy(world, pods=1)

    assert main(world.cli("-o", "json", now=NOW)) == 0

    document = json.loads(capsys.readouterr().out)
    assert document["healthy"] is True
    assert document["projections"][0]["state"] == "fresh"
    assert document["auditLogs"][0]["anchored"] is True
    assert document["findings"] == []


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


def test_the_audit_log_names_the_pod_of_a_file_on_disk(world: World) -> None:
    healthy(world, pods=1)

    report = audit_findings(world.snapshot(cluster=False), NOW)

    (projection,) = report.projections
    assert (projection.namespace, projection.pod, projection.signer_name) == (NS, "web-0", SIGNER)


def test_a_request_answered_in_normal_time_is_pending_not_a_finding(world: World) -> None:
    healthy(world, pods=1)
    world.pod("new", "uid-new")
    world.request("new", "uid-new", NOW - dt.timedelta(seconds=20), outcome=None)

    report = audit_findings(world.snapshot(), NOW)

    assert report.healthy, report.findings
    assert {p.pod: p.state for p in report.projections}["new"] == "pending"


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


def test_with_only_the_cluster_the_credential_is_the_newest_issued_leaf(world: World) -> None:
    healthy(world, pods=1)
    newer = world.leaf("web-0", T0 + dt.timedelta(hours=1))
    world.request("web-0", "uid-0", T0 + dt.timedelta(hours=1), newer)

    report = audit_findings(world.snapshot(disk=False, log=False), NOW)

    assert report.healthy, report.findings
    (projection,) = report.projections
    assert projection.serial == f"{newer.serial:x}"
    assert (projection.refresh_hint, projection.rotations) == ("request", 2)


def test_an_object_that_does_not_read_as_a_request_is_left_out(world: World) -> None:
    healthy(world, pods=1)
    clean = audit_findings(world.snapshot(), NOW)
    broken = {"metadata": {"namespace": NS, "name": "odd"}, "spec": {"podUID": 7}}
    odd = decode_request(msgspec.json.encode(broken))
    assert isinstance(odd, Unreadable)
    snapshot = world.snapshot()
    assert snapshot.requests is not None

    report = audit_findings(dataclasses.replace(snapshot, requests=(*snapshot.requests, odd)), NOW)

    assert report == clean


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


def test_a_volume_not_written_by_an_atomic_writer_is_read_from_its_visible_files(
    world: World,
) -> None:
    leaf = world.leaf("plain", T0)
    volume = world.node_root / "pods" / "uid-plain" / "volumes" / "kubernetes.io~projected" / "id"
    volume.mkdir(parents=True)
    (volume / "credentialbundle.pem").write_bytes(_pkcs8(leaf.key) + leaf.chain_pem.encode())
    (volume / "token").write_bytes(b"a service account token, not PEM")

    (files,) = read_root(world.node_root)

    assert (files.pod_uid, files.volume, list(files.files)) == (
        "uid-plain",
        "id",
        ["credentialbundle.pem"],
    )


# --- each planted fault, in its own test ----------------------------------------------------------


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
    world.write("uid-mole", leaf, trust=_pem(foreign.root))

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
        fresh = _time(NOW)
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


def test_a_torn_key_and_chain_pair_on_disk_is_found(world: World) -> None:
    healthy(world, pods=1)
    leaf, other = world.leaf("torn", T0), world.leaf("torn", T0)
    files = {
        "tls.key": FileSpec(_pkcs8(other.key), 0o600),
        "tls.crt": FileSpec(leaf.chain_pem.encode(), 0o644),
    }
    AtomicDirStorage(world.node_root).write_volume("uid-torn", "identity", files, None)

    report = audit_findings(world.snapshot(log=False), NOW)

    assert kinds(report) == ["unreadable"]
    assert "does not belong to leaf" in report.findings[0].message


def test_a_trust_root_that_expires_soon_is_found(world: World) -> None:
    healthy(world, pods=1)
    ending = ca.new_ca("ending", T0 - dt.timedelta(days=360), root_lifetime=dt.timedelta(days=363))
    snapshot = world.snapshot()
    snapshot = dataclasses.replace(
        snapshot, trust=(*snapshot.trust, TrustSource("old", _pem(ending.root)))
    )

    report = audit_findings(snapshot, NOW)

    assert kinds(report) == ["root-expiring", "root-without-ca"]
    (finding,) = [f for f in report.findings if f.kind == "root-expiring"]
    assert "in 2d" in finding.message
    # Not reported once the warning window is shorter than what is left.
    short = audit_findings(snapshot, NOW, Settings(root_expiry_warning=dt.timedelta(days=1)))
    assert kinds(short) == ["root-without-ca"]


# --- scope and usage ------------------------------------------------------------------------------


def test_scope_filters_leave_other_namespaces_and_signers_out(world: World) -> None:
    healthy(world, pods=1)
    world.pod("orphan", "uid-orphan", signer="nobody.example/x")
    world.request("orphan", "uid-orphan", T0, signer="nobody.example/x", outcome=None)

    report = audit_findings(world.snapshot(), NOW, Settings(signer_names=frozenset({SIGNER})))

    assert report.healthy, report.findings
    assert [p.pod for p in report.projections] == ["web-0"]


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


# --- what the audit log proves, and whose identity a pod holds ------------------------------------


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
