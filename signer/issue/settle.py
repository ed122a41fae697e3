"""The settlement: one terminal answer for a request, turned into everything the signer writes.

`settle(request, answer, now)` is a purely computational function: from the request as read
and the answer (a signed leaf, a denial or a failure) it builds the status to PUT, the audit
entry, the Event (or none) and the metric labels, and nothing else decides what they say. The
controller applies a `Settlement` with its one writer (`Controller.apply`), which owns only the
order and the faults of the writes: the audit entry before the status for an issuance
(`write_ahead`: no durable entry, no certificate), after it for a denial, the Event after a
denial or failure is written. The status itself is built here only (`issued_status`,
`settled_status`), as the typed `podcert.api.requests.Status` that readers decode: msgspec
writes it with its wire names and its times as metav1.Time (whole seconds, UTC, a Z).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, assert_never

from podcert.api.requests import Condition, Metadata, Outcome, PodCertificateRequest, Read, Status
from podcert.auditlog import Decision, Entry
from signer import model

SettledReason = Literal[model.DenyReason, model.FailReason, "Issued"]
"""The reason on a settled request's condition (an issuance's is "Issued")."""

ISSUED: Final[SettledReason] = "Issued"
_DECISIONS: Final[Mapping[Outcome, Decision]] = {
    "Issued": "issued",
    "Denied": "denied",
    "Failed": "failed",
}


@dataclass(frozen=True)
class EventNote:
    """A core/v1 Event to record on the request (what `kubectl describe` shows)."""

    type: Literal["Normal", "Warning"]
    reason: SettledReason
    message: str


@dataclass(frozen=True)
class Labels:
    """The labels of podcert_signer_requests_total (and, without the reason, of the latency
    histogram). Never a node or namespace: the series stay few."""

    signer_name: str
    outcome: Outcome
    reason: SettledReason


@dataclass(frozen=True)
class Settlement:
    key: tuple[str, str]  # (namespace, name) of the request
    outcome: Outcome
    reason: SettledReason
    message: str
    target: Metadata  # the request written to: its key, UID and resourceVersion (the guard)
    status: Status = field(repr=False)  # the status to PUT
    entry: Entry
    event: EventNote | None
    labels: Labels
    created: dt.datetime | None  # the request's creation, for the latency histogram
    serial: str | None  # hex, of an issued leaf

    @property
    def write_ahead(self) -> bool:
        """The audit entry must be durable before the status is written: a certificate is in
        the log before it can exist anywhere else."""
        return self.outcome == "Issued"


def settle(request: Read, answer: model.Answer, now: dt.datetime) -> Settlement:
    """Everything the signer writes for `answer` to `request`. An `Unreadable` request's
    answer is an InvalidRequest denial."""
    outcome: Outcome
    reason: SettledReason
    event: EventNote | None
    plan: model.LeafPlan | None = None
    serial: str | None = None
    generation = request.metadata.generation
    if isinstance(answer, model.Signed):
        plan, serial = answer.plan, f"{answer.serial:x}"
        outcome, reason, message = "Issued", ISSUED, f"issued for {plan.spiffe_id}"
        status = issued_status(
            generation,
            answer.chain_pem,
            plan.not_before,
            plan.not_after,
            plan.begin_refresh_at,
            message,
            now,
        )
        event = None
    elif isinstance(answer, model.Deny | model.Fail):
        outcome = "Denied" if isinstance(answer, model.Deny) else "Failed"
        reason, message = answer.reason, answer.message
        status = settled_status(outcome, reason, message, generation, now)
        event = EventNote("Warning", reason, message)
    else:
        assert_never(answer)
    meta, spec = request.metadata, request.spec
    entry = Entry(
        time=now,
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid,
        pod=spec.pod_name,
        node=spec.node_name,
        service_account=spec.service_account_name,
        decision=_DECISIONS[outcome],
        reason=reason,
        signer_name=spec.signer_name,
        spiffe_id=plan.spiffe_id if plan else None,
        serial=serial,
        not_before=plan.not_before if plan else None,
        not_after=plan.not_after if plan else None,
    )
    return Settlement(
        key=(entry.namespace, entry.name),
        outcome=outcome,
        reason=reason,
        message=message,
        target=meta,
        status=status,
        entry=entry,
        event=event,
        labels=Labels(spec.signer_name, outcome, reason),
        created=request.created if isinstance(request, PodCertificateRequest) else None,
        serial=serial,
    )


# --- the status itself ---------------------------------------------------------------------------


def issued_status(
    generation: int | None,
    chain_pem: str,
    not_before: dt.datetime,
    not_after: dt.datetime,
    begin_refresh_at: dt.datetime,
    message: str,
    now: dt.datetime,
) -> Status:
    """The status to PUT for an issued request: its times equal the leaf's, as the API server
    requires, in whole seconds (metav1.Time)."""
    return Status(
        conditions=(_condition("Issued", "Issued", message, generation, now),),
        certificate_chain=chain_pem,
        not_before=_whole_seconds(not_before),
        not_after=_whole_seconds(not_after),
        begin_refresh_at=_whole_seconds(begin_refresh_at),
    )


def settled_status(
    kind: Literal["Denied", "Failed"],
    reason: str,
    message: str,
    generation: int | None,
    now: dt.datetime,
) -> Status:
    """The status to PUT for a Denied or Failed request."""
    return Status(conditions=(_condition(kind, reason, message, generation, now),))


MAX_MESSAGE: Final = 32000
"""The longest condition message the API server takes (metav1.Condition)."""


def _condition(
    kind: Outcome, reason: str, message: str, generation: int | None, now: dt.datetime
) -> Condition:
    return Condition(
        type=kind,
        status="True",
        reason=reason,
        message=message[:MAX_MESSAGE],
        last_transition_time=_whole_seconds(now),
        observed_generation=generation,
    )


def _whole_seconds(moment: dt.datetime) -> dt.datetime:
    """metav1.Time: whole seconds in UTC (msgspec writes them with a Z, and no fraction)."""
    return moment.astimezone(dt.UTC).replace(microsecond=0)
