"""`podcert explain pod` as a pure function: a pod, its namespace's requests and Events, the
signer's lease, and `now` -> what became of each podCertificate source, why, and what to do.

Each podCertificate source of the pod's projected volumes is matched to the requests made for
it: those owned by the pod (an ownerReference to its UID) or naming it (`spec.podUID`), for the
source's signer name, newest first. The newest one decides the verdict:

- issued: the credential exists; nothing to do.
- denied / failed: final for that projection (the kubelet does not ask again); the reason's
  advice (`DENIAL_ADVICE`, one entry per `signer.model.DenyReason`) says what to change, then
  the pod is recreated.
- waiting: pending for less than `stuck_after`.
- no-signer: pending (or never answered) while no live leader holds the lease, or the leader
  says it serves other signer names: nobody answers.
- not-answering: pending longer than `stuck_after` although a leader holds the lease.
- not-requested: no request at all. The controller-manager deletes requests 15 minutes after
  creation, so a pod older than that may hold an issued credential whose request is gone.
- not-scheduled: the pod has no node yet; only a node makes requests.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, get_args

from podcert.api.pods import CertificateSource, parse_pod
from podcert.api.requests import RequestError, parse_status
from podcert.api.times import format_time, parse_time
from signer.model import DenyReason
from signer.report.status import STUCK_AFTER, Leadership

Verdict = Literal[
    "issued",
    "denied",
    "failed",
    "waiting",
    "no-signer",
    "not-answering",
    "not-requested",
    "not-scheduled",
]
VERDICTS: Final[tuple[Verdict, ...]] = get_args(Verdict)
# Requests older than this are deleted by kube-controller-manager's PodCertificateRequest cleaner.
CLEANER_AGE: Final = dt.timedelta(minutes=15)
RECREATE: Final = "then delete the pod so that its owner recreates it (a denial is final)"

DENIAL_ADVICE: Final[Mapping[DenyReason, str]] = {
    "PodNotFound": "the request names a pod the signer cannot find; if the pod exists, "
    "the node asked before the pod was visible: recreate the pod",
    "PodUIDMismatch": "the request names an older pod of the same name; recreate the pod",
    "PodNotOnNode": "the node that asked is not the pod's node; check which identity "
    "makes requests for this node",
    "PodNotRunnable": "the pod has finished or is being deleted; nothing is issued for it",
    "NodeNotFound": "the request names a node that does not exist (any more); check the node",
    "NodeUIDMismatch": "the request names an older node of the same name; recreate the pod",
    "ServiceAccountMismatch": "the request's service account is not the pod's; recreate the pod",
    "UnsupportedKeyType": "the policy does not allow the key type the pod's volume asks for: "
    f"set keyType in the podCertificate source to one it allows (see the message), {RECREATE}",
    "InvalidRequest": "the request itself is malformed (the message names the field); the node "
    "agent that made it is at fault",
    "InvalidProofOfPossession": "the node's proof of possession does not match its key; the "
    "node agent that made it is at fault",
    "KeyNotServed": "the node sent its key in a form no served API version carries: enable "
    "certificates.k8s.io/v1beta1 (--runtime-config) while nodes older than 1.36 remain",
    "UnknownAnnotation": "the podCertificate source's userAnnotations hold a key the signer "
    f"does not know: remove it or fix its spelling, {RECREATE}",
    "InvalidAnnotation": "a userAnnotations value is not valid (see the message): fix it in "
    f"the pod's volume, {RECREATE}",
    "DNSNameNotAllowed": "the pod asks for a DNS name its policy rule does not allow: change "
    f"the annotation or the policy, {RECREATE}",
    "PolicyDenied": "no rule of the signer's policy allows this namespace and service account: "
    f"add one to the policy (the signer's policy file or the chart's policy values), or run "
    f"the pod as an allowed service account, {RECREATE}",
}


def _time(value: dt.datetime | None) -> str | None:
    return format_time(value) if value is not None else None


@dataclass(frozen=True)
class EventView:
    object: str  # Kind/name the Event is about
    type: str  # Normal / Warning
    reason: str
    message: str
    count: int
    last: dt.datetime | None

    def as_json(self) -> dict[str, Any]:
        return {
            "object": self.object,
            "type": self.type,
            "reason": self.reason,
            "message": self.message,
            "count": self.count,
            "lastTimestamp": _time(self.last),
        }


@dataclass(frozen=True)
class RequestView:
    name: str
    created: dt.datetime | None
    outcome: str | None  # Issued / Denied / Failed, None while pending
    reason: str
    message: str
    decided: dt.datetime | None
    not_after: dt.datetime | None
    begin_refresh_at: dt.datetime | None
    events: tuple[EventView, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "created": _time(self.created),
            "outcome": self.outcome,
            "reason": self.reason,
            "message": self.message,
            "decided": _time(self.decided),
            "notAfter": _time(self.not_after),
            "beginRefreshAt": _time(self.begin_refresh_at),
            "events": [e.as_json() for e in self.events],
        }


@dataclass(frozen=True)
class SourceExplanation:
    volume: str
    index: int
    signer_name: str
    key_type: str
    requests: tuple[RequestView, ...]  # newest first
    verdict: Verdict
    why: str
    next_step: str | None  # None: nothing to do

    def as_json(self) -> dict[str, Any]:
        return {
            "volume": self.volume,
            "sourceIndex": self.index,
            "signerName": self.signer_name,
            "keyType": self.key_type,
            "verdict": self.verdict,
            "why": self.why,
            "nextStep": self.next_step,
            "requests": [r.as_json() for r in self.requests],
        }


@dataclass(frozen=True)
class Explanation:
    namespace: str
    pod: str
    uid: str
    node: str
    phase: str
    sources: tuple[SourceExplanation, ...]
    volume_errors: tuple[str, ...]
    pod_events: tuple[EventView, ...]
    leader: Leadership

    @property
    def healthy(self) -> bool:
        return all(s.verdict == "issued" for s in self.sources)

    def as_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "pod": self.pod,
            "uid": self.uid,
            "node": self.node,
            "phase": self.phase,
            "healthy": self.healthy,
            "sources": [s.as_json() for s in self.sources],
            "volumeErrors": list(self.volume_errors),
            "podEvents": [e.as_json() for e in self.pod_events],
            "leader": self.leader.as_json(),
        }


def event_view(event: Mapping[str, Any]) -> EventView:
    involved = event.get("involvedObject") or {}
    last = (
        parse_time(event.get("lastTimestamp"))
        or parse_time(event.get("eventTime"))
        or parse_time((event.get("metadata") or {}).get("creationTimestamp"))
    )
    count = event.get("count")
    return EventView(
        object=f"{involved.get('kind', '')}/{involved.get('name', '')}",
        type=str(event.get("type") or ""),
        reason=str(event.get("reason") or ""),
        message=str(event.get("message") or ""),
        count=count if isinstance(count, int) and count > 0 else 1,
        last=last,
    )


def _events_of(kind: str, name: str, events: Sequence[EventView]) -> tuple[EventView, ...]:
    return tuple(
        sorted(
            (e for e in events if e.object == f"{kind}/{name}"),
            key=lambda e: e.last or dt.datetime.min.replace(tzinfo=dt.UTC),
        )
    )


def request_view(request: Mapping[str, Any], events: Sequence[EventView]) -> RequestView:
    meta = request.get("metadata") or {}
    name = str(meta.get("name", ""))
    try:
        status = parse_status(request.get("status"))
        terminal, outcome = status.terminal, status.outcome
        not_after, refresh = status.not_after, status.begin_refresh_at
    except RequestError as err:
        terminal, outcome, not_after, refresh = None, None, None, None
        events = [*events, EventView(f"PodCertificateRequest/{name}", "", "", str(err), 1, None)]
    return RequestView(
        name=name,
        created=parse_time(meta.get("creationTimestamp")),
        outcome=outcome,
        reason=terminal.reason if terminal else "",
        message=terminal.message if terminal else "",
        decided=terminal.last_transition_time if terminal else None,
        not_after=not_after,
        begin_refresh_at=refresh,
        events=_events_of("PodCertificateRequest", name, events),
    )


def _belongs(request: Mapping[str, Any], uid: str, signer_name: str) -> bool:
    spec = request.get("spec") or {}
    owners = (request.get("metadata") or {}).get("ownerReferences") or []
    owned = any(isinstance(o, Mapping) and o.get("uid") == uid for o in owners)
    return (owned or spec.get("podUID") == uid) and spec.get("signerName") == signer_name


def _nobody(source: CertificateSource, leader: Leadership) -> str | None:
    """Why no signer answers for the source's signer name, or None when one should (or when
    the lease could not be read, and nobody can tell)."""
    if leader.problem is not None:
        return None
    if not leader.found:
        return f"no signer holds the lease {leader.lease}: no signer runs (or it elects no leader)"
    if not leader.holder:
        return f"the lease {leader.lease} is released (its signer stopped): none issues"
    if not leader.live:
        since = f" at {_time(leader.expires)}" if leader.expires else ""
        return f"the lease {leader.lease} ran out{since}: no signer leads, so none issues"
    if leader.signer_names and source.signer_name not in leader.signer_names:
        return (
            f"the leader {leader.holder} serves {', '.join(leader.signer_names)}, "
            f"not {source.signer_name}"
        )
    return None


def _judge(
    source: CertificateSource,
    views: tuple[RequestView, ...],
    scheduled: bool,
    leader: Leadership,
    pod_age: dt.timedelta | None,
    now: dt.datetime,
    stuck_after: dt.timedelta,
) -> tuple[Verdict, str, str | None]:
    nobody = _nobody(source, leader)
    if not views:
        if not scheduled:
            return "not-scheduled", "the pod is not on a node yet", "wait for the scheduler"
        if pod_age is not None and pod_age > CLEANER_AGE:
            return (
                "not-requested",
                "no request for it exists; requests are deleted 15 minutes after creation, "
                "so an issued credential's request may be gone",
                "check the pod's volume (podcert audit --root on the node) or its Events",
            )
        why = "the node has made no request for it yet"
        return "not-requested", why, "check the node's kubelet (or podcert shim) and its logs"
    newest = views[0]
    if newest.outcome == "Issued":
        until = f", valid until {_time(newest.not_after)}" if newest.not_after else ""
        return "issued", f"{newest.name} was issued{until}", None
    if newest.outcome == "Denied":
        advice = DENIAL_ADVICE.get(newest.reason, "see the message")  # type: ignore[call-overload]
        why = f"the signer denied {newest.name}: {newest.reason}: {newest.message}"
        return "denied", why, advice
    if newest.outcome == "Failed":
        why = f"the signer failed {newest.name}: {newest.reason}: {newest.message}"
        return "failed", why, f"fix the signer (its logs say more), {RECREATE}"
    age = now - newest.created if newest.created else dt.timedelta(0)
    waited = f"{newest.name} has waited {int(age.total_seconds())}s"
    if nobody is not None:
        return "no-signer", f"{waited}; {nobody}", "start the signer (podcert status shows why not)"
    unknown = f" (who leads is unknown: {leader.problem})" if leader.problem else ""
    if age > stuck_after:
        leads = f"although {leader.holder} leads" if leader.holder else "with no answer"
        return (
            "not-answering",
            f"{waited} {leads}{unknown}",
            "read the signer leader's logs; podcert status shows its replicas",
        )
    return "waiting", f"{waited}; the signer usually answers within a second{unknown}", None


def explain_pod(
    pod: Mapping[str, Any],
    requests: Sequence[Mapping[str, Any]],
    events: Sequence[Mapping[str, Any]],
    leader: Leadership,
    now: dt.datetime,
    stuck_after: dt.timedelta = STUCK_AFTER,
) -> Explanation:
    """The pod's podCertificate sources, each judged from its requests and their Events."""
    parsed = parse_pod(pod)
    meta = pod.get("metadata") or {}
    created = parse_time(meta.get("creationTimestamp"))
    seen = [event_view(e) for e in events]
    sources = []
    for volume in parsed.volumes:
        for source in volume.sources:
            if not isinstance(source, CertificateSource):
                continue
            mine = [r for r in requests if _belongs(r, parsed.uid, source.signer_name)]
            views = tuple(
                sorted(
                    (request_view(r, seen) for r in mine),
                    key=lambda v: v.created or dt.datetime.min.replace(tzinfo=dt.UTC),
                    reverse=True,
                )
            )
            verdict, why, step = _judge(
                source,
                views,
                bool(parsed.node_name),
                leader,
                now - created if created else None,
                now,
                stuck_after,
            )
            sources.append(
                SourceExplanation(
                    volume=source.volume,
                    index=source.index,
                    signer_name=source.signer_name,
                    key_type=source.key_type,
                    requests=views,
                    verdict=verdict,
                    why=why,
                    next_step=step,
                )
            )
    return Explanation(
        namespace=parsed.namespace,
        pod=parsed.name,
        uid=parsed.uid,
        node=parsed.node_name,
        phase=str((pod.get("status") or {}).get("phase") or ""),
        sources=tuple(sources),
        volume_errors=tuple(str(e) for e in parsed.errors),
        pod_events=_events_of("Pod", parsed.name, seen),
        leader=leader,
    )
