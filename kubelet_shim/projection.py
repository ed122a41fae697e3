"""The life of one podCertificate projection, as a pure state machine.

The agent feeds `step` what it observed (a request it created, a status it saw, time passing) and
carries out the actions it gets back; this module touches no API, disk or clock, so every rule of
the kubelet's half is a unit test with fixed datetimes:

- the first credential and every refresh use a NEW key (`CreateRequest` carries none: the agent
  makes one for each request); the old credential stays on disk until the new one is written;
- Denied and Failed are terminal for the projection: no new request, the older credential (if
  any) is left in place until it expires;
- a pending request that vanished before issuance (the 15-minute cleaner, or a deletion) is
  abandoned `abandon_after` later and replaced; the delay absorbs informer lag;
- a request nobody answers is reported once after `unanswered_after` (the kubelet is silent);
- `force_after` (from a pod annotation) makes a credential whose key was made before that
  instant due then, even one whose request was still pending at the instant: emergency
  rotation, or a scheduled one when the instant is in the future.

`projection_state` is the metrics label. The staleness events (CertificateOverdueForRefresh,
CertificateExpired) come from changes of the API's `credential_state` (shared with the audit) of
`served(state)`, which also covers the old credential of a Denied projection; `wake_at` includes
those instants.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Final, Literal

from kubelet_shim import refresh
from podcert.api import credentials
from podcert.api.keys import PrivateKey


@dataclass(frozen=True)
class Settings:
    jitter: timedelta = credentials.REFRESH_JITTER
    abandon_after: timedelta = timedelta(minutes=10)
    unanswered_after: timedelta = timedelta(minutes=5)
    overdue_grace: timedelta = credentials.OVERDUE_GRACE


DEFAULT_SETTINGS = Settings()


class ProjectionState(enum.StrEnum):
    """What a projection looks like from outside: the metrics label and the event source."""

    NOT_YET_ISSUED = "not_yet_issued"
    FRESH = "fresh"
    OVERDUE_FOR_REFRESH = "overdue_for_refresh"
    EXPIRED = "expired"
    DENIED = "denied"
    FAILED = "failed"


# The API's credential states under the kubelet's metric labels: it has no "refresh due" (a
# credential stays "fresh" until it is overdue).
_LABELS: Final[dict[credentials.CredentialState, ProjectionState]] = {
    "fresh": ProjectionState.FRESH,
    "refresh_due": ProjectionState.FRESH,
    "overdue_for_refresh": ProjectionState.OVERDUE_FOR_REFRESH,
    "expired": ProjectionState.EXPIRED,
}


def label(state: credentials.CredentialState) -> ProjectionState:
    """The metric label (and event source) of a credential in `state`."""
    return _LABELS[state]


@dataclass(frozen=True)
class Credential:
    """An issued certificate chain and its timing; the key lives on disk (or in `Fresh`)."""

    request_name: str | None  # None when recovered from disk
    chain_pem: bytes = field(repr=False)
    not_before: datetime
    not_after: datetime
    begin_refresh_at: datetime | None
    refresh_at: datetime  # begin_refresh_at plus this credential's jitter, drawn once
    # When its key was made and requested (not when the issuance was seen): what force_after
    # is compared with, so a rotation also replaces a key whose request was pending across it.
    requested_at: datetime

    def due_at(self, force_after: datetime | None) -> datetime:
        if force_after is not None and self.requested_at < force_after:
            return min(self.refresh_at, force_after)
        return self.refresh_at


# -- states -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NotYetIssued:
    pass


@dataclass(frozen=True)
class Pending:
    request_name: str
    key: PrivateKey = field(repr=False)
    created_at: datetime
    previous: Credential | None = None  # still served while this request is open
    vanished_at: datetime | None = None
    reported_unanswered: bool = False


@dataclass(frozen=True)
class Fresh:
    """Holds a credential. Until the agent confirms the write, the new key is kept here (so a
    failed write can be retried) and `serving` is what the files still hold."""

    credential: Credential
    unwritten_key: PrivateKey | None = field(default=None, repr=False)
    serving: Credential | None = None

    @property
    def on_disk(self) -> Credential | None:
        return self.credential if self.unwritten_key is None else self.serving


@dataclass(frozen=True)
class Denied:
    request_name: str
    reason: str
    message: str
    previous: Credential | None = None


@dataclass(frozen=True)
class Failed:
    request_name: str
    reason: str
    message: str
    previous: Credential | None = None


State = NotYetIssued | Pending | Fresh | Denied | Failed

# -- events -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    """Time passed (the agent's timer or retry fired); level-driven actions come from here."""


@dataclass(frozen=True)
class RequestCreated:
    request_name: str
    key: PrivateKey = field(repr=False)


@dataclass(frozen=True)
class RequestPending:
    """The request is visible with no terminal condition yet (cancels a vanish)."""

    request_name: str


@dataclass(frozen=True)
class RequestIssued:
    request_name: str
    chain_pem: bytes = field(repr=False)
    not_before: datetime
    not_after: datetime
    begin_refresh_at: datetime | None


@dataclass(frozen=True)
class RequestDenied:
    request_name: str
    reason: str
    message: str


@dataclass(frozen=True)
class RequestFailed:
    request_name: str
    reason: str
    message: str


@dataclass(frozen=True)
class RequestVanished:
    request_name: str


@dataclass(frozen=True)
class CredentialWritten:
    request_name: str


@dataclass(frozen=True)
class FoundOnDisk:
    """After a restart: a credential already in the volume (the agent checked that its key and
    chain match)."""

    chain_pem: bytes = field(repr=False)
    not_before: datetime
    not_after: datetime
    begin_refresh_at: datetime | None = None


Event = (
    Tick
    | RequestCreated
    | RequestPending
    | RequestIssued
    | RequestDenied
    | RequestFailed
    | RequestVanished
    | CredentialWritten
    | FoundOnDisk
)

# -- actions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateRequest:
    """Generate a new key and create a PodCertificateRequest for it; report `RequestCreated`."""

    reason: Literal["initial", "refresh", "forced", "replace_abandoned"]


@dataclass(frozen=True)
class WriteCredential:
    """Write key + chain into the projection's files; report `CredentialWritten`."""

    request_name: str
    key: PrivateKey = field(repr=False)
    chain_pem: bytes = field(repr=False)


@dataclass(frozen=True)
class RecordEvent:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


Action = CreateRequest | WriteCredential | RecordEvent


def step(
    state: State,
    event: Event,
    *,
    now: datetime,
    rng: random.Random,
    force_after: datetime | None = None,
    settings: Settings = DEFAULT_SETTINGS,
) -> tuple[State, list[Action]]:
    """The next state and what the agent must do. Events about another request are ignored."""
    if isinstance(state, Denied | Failed):
        return state, []  # terminal
    if isinstance(event, Tick):
        return _tick(state, now, force_after, settings)
    if isinstance(event, RequestCreated):
        return _created(state, event, now)
    if isinstance(event, FoundOnDisk):
        return _found(state, event, now, rng, settings)
    if isinstance(event, CredentialWritten):
        if (
            isinstance(state, Fresh)
            and state.unwritten_key is not None
            and state.credential.request_name == event.request_name
        ):
            return Fresh(state.credential), []
        return state, []

    # Everything below concerns the open request only.
    if not isinstance(state, Pending) or state.request_name != event.request_name:
        return state, []
    if isinstance(event, RequestPending):
        return replace(state, vanished_at=None), []
    if isinstance(event, RequestVanished):
        if state.vanished_at is None:
            return replace(state, vanished_at=now), []
        return state, []
    if isinstance(event, RequestIssued):
        try:
            refresh_at = refresh.next_refresh(
                event.not_before,
                event.not_after,
                event.begin_refresh_at,
                rng=rng,
                now=now,
                jitter=settings.jitter,
            )
        except ValueError as exc:
            # The API server validates issued times, so this is a broken status, not a race;
            # asking again could loop, so it ends like any other terminal failure.
            return _failed(
                state, RequestFailed(event.request_name, "InvalidIssuedStatus", str(exc))
            )
        credential = Credential(
            request_name=event.request_name,
            chain_pem=event.chain_pem,
            not_before=event.not_before,
            not_after=event.not_after,
            begin_refresh_at=event.begin_refresh_at,
            refresh_at=refresh_at,
            requested_at=state.created_at,
        )
        return (
            Fresh(credential, unwritten_key=state.key, serving=state.previous),
            [WriteCredential(event.request_name, state.key, event.chain_pem)],
        )
    if isinstance(event, RequestDenied):
        return Denied(event.request_name, event.reason, event.message, state.previous), [
            RecordEvent(
                "Warning",
                "CertificateDenied",
                f"request {event.request_name} denied: {event.reason}: {event.message}",
            )
        ]
    return _failed(state, event)


def _failed(state: Pending, event: RequestFailed) -> tuple[State, list[Action]]:
    return Failed(event.request_name, event.reason, event.message, state.previous), [
        RecordEvent(
            "Warning",
            "CertificateFailed",
            f"request {event.request_name} failed: {event.reason}: {event.message}",
        )
    ]


def _tick(
    state: NotYetIssued | Pending | Fresh,
    now: datetime,
    force_after: datetime | None,
    settings: Settings,
) -> tuple[State, list[Action]]:
    if isinstance(state, NotYetIssued):
        return state, [CreateRequest("initial")]
    if isinstance(state, Fresh):
        if state.unwritten_key is not None:
            credential = state.credential
            assert credential.request_name is not None  # only issued credentials are unwritten
            return state, [
                WriteCredential(credential.request_name, state.unwritten_key, credential.chain_pem)
            ]
        due = state.credential.due_at(force_after)
        if now < due:
            return state, []
        forced = due < state.credential.refresh_at
        return state, [CreateRequest("forced" if forced else "refresh")]

    if state.vanished_at is not None and now >= state.vanished_at + settings.abandon_after:
        after: State = Fresh(state.previous) if state.previous is not None else NotYetIssued()
        return after, [
            RecordEvent(
                "Warning",
                "CertificateRequestAbandoned",
                f"request {state.request_name} vanished before issuance; replacing it",
            ),
            CreateRequest("replace_abandoned"),
        ]
    if not state.reported_unanswered and now >= state.created_at + settings.unanswered_after:
        waited = int((now - state.created_at).total_seconds() // 60)
        return replace(state, reported_unanswered=True), [
            RecordEvent(
                "Warning",
                "CertificateRequestUnanswered",
                f"request {state.request_name} has had no answer from its signer for {waited} min",
            )
        ]
    return state, []


def _created(
    state: NotYetIssued | Pending | Fresh, event: RequestCreated, now: datetime
) -> tuple[State, list[Action]]:
    if isinstance(state, Pending):
        previous = state.previous  # a newer request supersedes the open one
    elif isinstance(state, Fresh):
        previous = state.on_disk
    else:
        previous = None
    return Pending(event.request_name, event.key, now, previous), []


def _found(
    state: NotYetIssued | Pending | Fresh,
    event: FoundOnDisk,
    now: datetime,
    rng: random.Random,
    settings: Settings,
) -> tuple[State, list[Action]]:
    if not isinstance(state, NotYetIssued):
        return state, []  # only a cold start adopts disk content
    try:
        refresh_at = refresh.next_refresh(
            event.not_before,
            event.not_after,
            event.begin_refresh_at,
            rng=rng,
            now=now,
            jitter=settings.jitter,
        )
    except ValueError:
        return state, []  # unusable times: a new request is the way out
    if now >= event.not_after:
        return state, []  # an expired credential is not worth adopting
    credential = Credential(
        request_name=None,
        chain_pem=event.chain_pem,
        not_before=event.not_before,
        not_after=event.not_after,
        begin_refresh_at=event.begin_refresh_at,
        refresh_at=refresh_at,
        # Unknown; notBefore (backdated by the signer) is the best bound there is, so an
        # emergency rotation newer than the certificate still applies to it.
        requested_at=event.not_before,
    )
    return Fresh(credential), []


def served(state: State) -> Credential | None:
    """The credential the pod's files hold (or held last), if any."""
    if isinstance(state, NotYetIssued):
        return None
    if isinstance(state, Fresh):
        return state.on_disk
    return state.previous


def projection_state(
    state: State,
    now: datetime,
    *,
    force_after: datetime | None = None,
    settings: Settings = DEFAULT_SETTINGS,
) -> ProjectionState:
    """The externally visible state at `now`, judged by the credential the pod can read."""
    if isinstance(state, Denied):
        return ProjectionState.DENIED
    if isinstance(state, Failed):
        return ProjectionState.FAILED
    credential = served(state)
    if credential is None:
        return ProjectionState.NOT_YET_ISSUED
    return label(
        credentials.credential_state(
            credential.not_before,
            credential.not_after,
            credential.due_at(force_after),
            now,
            overdue_grace=settings.overdue_grace,
        )
    )


def wake_at(
    state: State,
    now: datetime,
    *,
    force_after: datetime | None = None,
    settings: Settings = DEFAULT_SETTINGS,
) -> datetime | None:
    """When the agent should next `Tick` this projection: `now` when something is due already,
    None when nothing will ever be (terminal with nothing left to expire).

    Includes the instants at which the served credential turns overdue or expires, so the
    staleness events fire on time.
    """
    if isinstance(state, NotYetIssued):
        return now
    if isinstance(state, Fresh) and state.unwritten_key is not None:
        return now
    instants: list[datetime] = []
    if isinstance(state, Fresh):
        instants.append(max(now, state.credential.due_at(force_after)))
    if isinstance(state, Pending):
        if state.vanished_at is not None:
            instants.append(state.vanished_at + settings.abandon_after)
        if not state.reported_unanswered:
            instants.append(state.created_at + settings.unanswered_after)
    credential = served(state)
    if credential is not None:
        overdue = credential.due_at(force_after) + settings.overdue_grace
        # Overdue means `now > due + grace`, hence the epsilon; expiry means `now >= not_after`.
        instants += [t for t in (overdue + _EPSILON, credential.not_after) if t > now]
    if isinstance(state, Denied | Failed):
        instants = [t for t in instants if t > now]
    return min((max(now, t) for t in instants), default=None)


_EPSILON = timedelta(microseconds=1)
