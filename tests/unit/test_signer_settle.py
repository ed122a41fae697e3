"""The settlement (pure: answer -> status, audit entry, Event, metric labels) for every decision
kind, and the one writer that applies it: the audit entry is durable before an Issued status
(and a refusing log stops issuance), 404/409/422 are handled, Events follow denials. No API
server: the writer's kube and audit trail are recording fakes."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, cast

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from podcert.api import requests
from podcert.client.rest import ApiError
from signer import certs, model
from signer.auditlog.trail import AuditTrail
from signer.authority import ca
from signer.authority.castore import CAStore
from signer.issue import controller as controller_module
from signer.issue.controller import Controller, utcnow
from signer.issue.settle import Labels, Settlement, settle
from signer.kube import SignerKube
from signer.metrics import Metrics
from signer.policy import default_policy
from tests.signer_world import SIGNER, changed, make_request

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
CREATED = NOW - dt.timedelta(seconds=2)
ISSUER = ca.issuing_ca(ca.new_ca("settle", NOW - dt.timedelta(days=1)))
PLAN = model.LeafPlan(
    public_key=ec.generate_private_key(ec.SECP256R1()).public_key(),
    spiffe_id="spiffe://cluster.local/ns/web/sa/frontend",
    dns_names=(),
    not_before=NOW - dt.timedelta(minutes=1),
    not_after=NOW + dt.timedelta(hours=24),
    begin_refresh_at=NOW + dt.timedelta(hours=12),
)
SERIAL = 0xC0FFEE
SIGNED = model.Signed(PLAN, certs.sign_leaf(PLAN, ISSUER, SERIAL), SERIAL)
DENY = model.Deny(model.POD_NOT_ON_NODE, "Pod web/web runs on node 'b', not on 'a'.")
FAIL = model.Fail(model.SIGNER_MISCONFIGURED, "The signer cannot sign for this name.")


REQUEST = make_request(
    name="req-1",
    uid="u1",
    pod_name="frontend-0",
    pod_uid="pod-uid",
    service_account_name="frontend",
    service_account_uid="sa-uid",
    node_uid="node-uid",
    created=CREATED,
    resource_version="41",
    generation=1,
)


# --- the pure step -----------------------------------------------------------------------------


def wire(status: requests.Status) -> dict[str, Any]:
    """The status as its PUT carries it (msgspec writes the Struct under its wire names)."""
    body: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(status))
    return body


def test_an_issuance_settles_to_the_chain_an_entry_written_ahead_and_no_event() -> None:
    done = settle(REQUEST, SIGNED, NOW)
    status = wire(done.status)
    assert status["certificateChain"] == SIGNED.chain_pem
    assert (status["notBefore"], status["notAfter"], status["beginRefreshAt"]) == (
        "2026-11-29T11:59:00Z",
        "2026-11-30T12:00:00Z",
        "2026-11-30T00:00:00Z",
    )
    [condition] = status["conditions"]
    assert (condition["type"], condition["reason"], condition["status"]) == (
        "Issued",
        "Issued",
        "True",
    )
    assert done.target.resource_version == "41", "the write is guarded by it"
    assert condition["observedGeneration"] == 1
    assert done.write_ahead
    assert done.event is None
    assert (done.labels.signer_name, done.labels.outcome, done.labels.reason) == (
        SIGNER,
        "Issued",
        "Issued",
    )
    entry = done.entry
    assert (entry.decision, entry.reason, entry.serial) == ("issued", "Issued", "c0ffee")
    assert (entry.spiffe_id, entry.not_before, entry.not_after) == (
        PLAN.spiffe_id,
        PLAN.not_before,
        PLAN.not_after,
    )
    assert (entry.namespace, entry.name, entry.pod, entry.node, entry.service_account) == (
        "web",
        "req-1",
        "frontend-0",
        "node-a",
        "frontend",
    )
    assert (done.key, done.created, done.serial) == (("web", "req-1"), CREATED, "c0ffee")


@pytest.mark.parametrize(
    ("answer", "outcome", "decision"),
    [
        pytest.param(DENY, "Denied", "denied", id="a denial"),
        pytest.param(FAIL, "Failed", "failed", id="a failure"),
    ],
)
def test_a_refusal_settles_to_its_condition_an_entry_after_the_write_and_a_warning_event(
    answer: model.Deny | model.Fail, outcome: str, decision: str
) -> None:
    done = settle(REQUEST, answer, NOW)
    [condition] = wire(done.status)["conditions"]
    assert (condition["type"], condition["reason"], condition["message"]) == (
        outcome,
        answer.reason,
        answer.message,
    )
    assert "certificateChain" not in wire(done.status)
    assert not done.write_ahead
    assert done.event is not None
    assert (done.event.type, done.event.reason, done.event.message) == (
        "Warning",
        answer.reason,
        answer.message,
    )
    assert (done.labels.outcome, done.labels.reason) == (outcome, answer.reason)
    assert (done.entry.decision, done.entry.reason) == (decision, answer.reason)
    assert done.entry.serial is None and done.entry.spiffe_id is None
    assert done.serial is None


def test_an_object_that_is_no_request_settles_from_what_of_it_reads() -> None:
    broken = {
        "metadata": {"namespace": "web", "name": "req-1", "uid": "u1", "resourceVersion": "41"},
        "spec": {"signerName": SIGNER, "podName": 7, "nodeName": "node-a"},
    }
    read = requests.read_request(broken)
    assert isinstance(read, requests.Unreadable)
    done = settle(read, model.Deny(model.INVALID_REQUEST, str(read.problem)), NOW)
    assert done.created is None
    assert (done.entry.pod, done.entry.node) == ("", "node-a")
    assert done.target.resource_version == "41"
    assert done.labels == Labels(SIGNER, "Denied", "InvalidRequest")
    assert done.message == "spec.podName: expected str, got int"


@pytest.mark.parametrize("answer", [SIGNED, DENY, FAIL], ids=["issued", "denied", "failed"])
def test_no_settlement_shows_key_material(answer: model.Answer) -> None:
    done = settle(REQUEST, answer, NOW)
    assert "PRIVATE KEY" not in repr(done)
    assert "BEGIN CERTIFICATE" not in repr(done), "the chain is written, not logged"


# --- the writer --------------------------------------------------------------------------------


@dataclass
class Fakes:
    """The writer's kube and audit trail, recording in one list what was written in what order."""

    writes: list[Any] = field(default_factory=list)
    write_errors: list[ApiError] = field(default_factory=list)
    fresh: requests.Read | None = None  # what a re-read after a 409 finds
    audit_ok: bool = True

    def write_status(self, target: requests.Metadata, status: requests.Status) -> None:
        if self.write_errors:
            self.writes.append(("refused", self.write_errors[0].status))
            raise self.write_errors.pop(0)
        self.writes.append(("status", status.conditions[0].type))

    def get_pcr(self, namespace: str, name: str) -> requests.Read | None:
        self.writes.append(("get", name))
        return self.fresh

    def record_event(
        self, target: requests.Metadata, reason: str, message: str, now: dt.datetime, kind: str
    ) -> None:
        self.writes.append(("event", kind, reason))

    def record(self, entry: Any) -> bool:
        self.writes.append(("audit", entry.decision) if self.audit_ok else ("audit refused",))
        return self.audit_ok


def writer(fakes: Fakes, *, leader: bool = True) -> Controller:
    kube = cast(SignerKube, fakes)
    ctrl = Controller(
        kube,
        [SIGNER],
        default_policy([SIGNER], "cluster.local"),
        CAStore(kube, "podcert-system", "podcert-ca", utcnow),
        Metrics(),
        cast(AuditTrail, fakes),
        clock=lambda: NOW,
        is_leader=lambda: leader,
    )
    ctrl._store[("web", "req-1")] = REQUEST
    return ctrl


def count(ctrl: Controller, metric: str, **labels: str) -> float:
    return ctrl.metrics.registry.get_sample_value(metric, labels) or 0.0


def test_an_issuance_is_in_the_audit_log_before_its_status_is_written() -> None:
    fakes = Fakes()
    ctrl = writer(fakes)
    assert ctrl.apply(settle(REQUEST, SIGNED, NOW)) is None
    assert fakes.writes == [("audit", "issued"), ("status", "Issued")]
    assert ("web", "req-1") not in ctrl._store
    labels = {"signer_name": SIGNER, "outcome": "Issued", "reason": "Issued"}
    assert count(ctrl, "podcert_signer_requests_total", **labels) == 1
    assert count(
        ctrl, "podcert_signer_issue_latency_seconds_sum", signer_name=SIGNER, outcome="Issued"
    ) == pytest.approx(2.0)


def test_a_log_that_refuses_the_entry_stops_the_issuance_and_retries() -> None:
    fakes = Fakes(audit_ok=False)
    ctrl = writer(fakes)
    after = ctrl.apply(settle(REQUEST, SIGNED, NOW))
    assert after is not None and 0 < after <= 30
    assert fakes.writes == [("audit refused",)], "no entry, no certificate"
    assert count(ctrl, "podcert_signer_retries_total", reason="AuditLogUnwritable") == 1
    assert ("web", "req-1") in ctrl._store


@pytest.mark.parametrize("answer", [DENY, FAIL], ids=["denied", "failed"])
def test_a_refusal_is_written_then_announced_then_logged(answer: model.Deny | model.Fail) -> None:
    fakes = Fakes()
    ctrl = writer(fakes)
    assert ctrl.apply(settle(REQUEST, answer, NOW)) is None
    outcome = "Denied" if isinstance(answer, model.Deny) else "Failed"
    assert fakes.writes == [
        ("status", outcome),
        ("event", "Warning", answer.reason),
        ("audit", outcome.lower()),
    ]
    labels = {"signer_name": SIGNER, "outcome": outcome, "reason": answer.reason}
    assert count(ctrl, "podcert_signer_requests_total", **labels) == 1


def test_a_request_deleted_meanwhile_is_forgotten() -> None:
    fakes = Fakes(write_errors=[ApiError(404, "NotFound", "gone")])
    ctrl = writer(fakes)
    assert ctrl.apply(settle(REQUEST, DENY, NOW)) is None
    assert fakes.writes == [("refused", 404)], "no Event, no entry for a request that is gone"
    assert ("web", "req-1") not in ctrl._store


def test_a_conflict_rereads_and_tries_again_with_the_fresh_object() -> None:
    fresh = changed(REQUEST, resource_version="42")
    fakes = Fakes(write_errors=[ApiError(409, "Conflict", "changed")], fresh=fresh)
    ctrl = writer(fakes)
    assert ctrl.apply(settle(REQUEST, SIGNED, NOW)) == 0.0
    assert ctrl._store[("web", "req-1")].metadata.resource_version == "42"


def test_a_conflict_with_an_outcome_written_by_someone_else_lets_it_stand() -> None:
    denied = requests.parse_status({"conditions": [{"type": "Denied", "status": "True"}]})
    fresh = msgspec.structs.replace(REQUEST, status=denied)
    fakes = Fakes(write_errors=[ApiError(409, "Conflict", "changed")], fresh=fresh)
    ctrl = writer(fakes)
    assert ctrl.apply(settle(REQUEST, SIGNED, NOW)) is None
    assert ("web", "req-1") not in ctrl._store


def test_a_status_the_api_server_rejects_is_retried_never_failed() -> None:
    fakes = Fakes(write_errors=[ApiError(422, "Invalid", "notBefore is in the future")])
    ctrl = writer(fakes)
    after = ctrl.apply(settle(REQUEST, SIGNED, NOW))
    assert after is not None and 0 < after <= 60
    assert count(ctrl, "podcert_signer_retries_total", reason="StatusRejected") == 1
    assert ("web", "req-1") in ctrl._store


def test_other_api_errors_go_to_the_runtime_for_a_retry() -> None:
    fakes = Fakes(write_errors=[ApiError(503, "Unavailable", "etcd paused")])
    ctrl = writer(fakes)
    with pytest.raises(ApiError):
        ctrl.apply(settle(REQUEST, DENY, NOW))


def test_a_replica_that_lost_the_lease_writes_nothing() -> None:
    fakes = Fakes()
    ctrl = writer(fakes, leader=False)
    assert ctrl.apply(settle(REQUEST, SIGNED, NOW)) is None
    assert fakes.writes == []


# --- reconcile: every decision kind reaches the writer as one settlement, or none -----------


@pytest.mark.parametrize(
    ("decision", "written"),
    [
        pytest.param(model.Issue(PLAN), "Issued", id="issue: signed, then settled"),
        pytest.param(DENY, "Denied", id="deny"),
        pytest.param(FAIL, "Failed", id="fail"),
        pytest.param(
            model.Retry(dt.timedelta(seconds=60), "CATooShort"), None, id="retry: nothing written"
        ),
    ],
)
def test_every_decision_kind_is_settled_once_or_put_off(
    monkeypatch: pytest.MonkeyPatch, decision: model.Decision, written: str | None
) -> None:
    ctrl = writer(Fakes())
    applied: list[Settlement] = []
    monkeypatch.setattr(
        ctrl, "facts", lambda request, seen_at, **_: model.Facts(None, None, None, ca=ISSUER)
    )
    monkeypatch.setattr(controller_module, "decide", lambda *args, **kwargs: decision)
    monkeypatch.setattr(ctrl, "apply", lambda settlement: applied.append(settlement))
    after = ctrl.reconcile(("web", "req-1"))
    assert [s.outcome for s in applied] == ([written] if written else [])
    if written is None:
        assert after == 60.0
        assert count(ctrl, "podcert_signer_ca_too_short") == 1
        assert count(ctrl, "podcert_signer_retries_total", reason="CATooShort") == 1
    if written == "Issued":
        [issued] = applied
        chain = issued.status.certificate_chain
        assert chain.startswith("-----BEGIN CERTIFICATE-----")
        assert issued.serial is not None
