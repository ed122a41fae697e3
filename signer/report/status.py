"""`podcert status` as a pure function: the signer's lease, Deployment, CA Secret, trust
bundles and requests, as fetched, and `now` -> one `Status`.

What it judges, and why:
- The leader is the lease's holder while `renewTime` plus the duration the holder wrote (as the
  election honours it, `signer.leader.honoured_duration`) lies ahead; past it, nobody signs.
- The CA's next step is `signer.authority.schedule.ca_schedule`'s, with the schedule's default
  settings (the running signer's --ca-* flags are not in the cluster to read); an operator's CA
  (a Secret without the generations index) never rotates by itself, so it has no step.
- A request is pending while it has no terminal condition, and stuck once pending longer than
  `stuck_after` (the signer answers in well under a second; five minutes of silence is no lag).
- Denials and failures are counted by reason when their condition's lastTransitionTime falls in
  the last `window` (an hour by default). The controller-manager deletes requests 15 minutes
  after creation, so older ones are gone from the cluster: the signer's metrics keep the rest.
- Healthy means a live leader and no stuck request (a revocation in progress is reported by
  `signer.report.revocations`, not judged); anything else exits 1. A lease we may not read
  leaves the leader unknown (`Leadership.problem`): the command says so and exits 3.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from podcert.api.requests import Condition, RequestError, parse_status
from podcert.api.times import format_time, parse_time
from signer.authority import ca as authority_ca
from signer.authority import canarying, downstream, schedule
from signer.leader import (
    SIGNER_NAMES_ANNOTATION,
    VERSION_ANNOTATION,
    LeaseSettings,
    honoured_duration,
)
from signer.report.revocations import RevocationState, revocations, revoked_of

STUCK_AFTER: Final = dt.timedelta(minutes=5)
DENIALS_WINDOW: Final = dt.timedelta(hours=1)
# Kubernetes' own signers, which podcert never serves: left out when no signer name is given.
BUILTIN_PREFIX: Final = "kubernetes.io/"


def _time(value: dt.datetime | None) -> str | None:
    return format_time(value) if value is not None else None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


@dataclass(frozen=True)
class Leadership:
    """Who holds the signer's lease, until when, and what the holder says it runs."""

    lease: str  # namespace/name
    found: bool
    holder: str | None
    renewed: dt.datetime | None
    expires: dt.datetime | None
    live: bool  # a holder whose lease has not run out at `now`
    version: str | None  # the holder's podcert version (VERSION_ANNOTATION)
    signer_names: tuple[str, ...]  # what the holder serves (SIGNER_NAMES_ANNOTATION)
    transitions: int | None
    problem: str | None = None  # why the lease could not be read: who leads is unknown

    def as_json(self) -> dict[str, Any]:
        return {
            "lease": self.lease,
            "found": self.found,
            "problem": self.problem,
            "holder": self.holder,
            "renewTime": _time(self.renewed),
            "expires": _time(self.expires),
            "live": self.live,
            "version": self.version,
            "signerNames": list(self.signer_names),
            "transitions": self.transitions,
        }


def leadership(lease: Mapping[str, Any] | str | None, where: str, now: dt.datetime) -> Leadership:
    """The lease as read (None: absent; a string: why it could not be read) judged at `now`."""
    if lease is None:
        return Leadership(where, False, None, None, None, False, None, (), None)
    if isinstance(lease, str):
        return Leadership(where, False, None, None, None, False, None, (), None, lease)
    spec, annotations = _spec(lease), _meta(lease).get("annotations") or {}
    holder = spec.get("holderIdentity") or None
    renewed = parse_time(spec.get("renewTime"))
    duration = honoured_duration(spec.get("leaseDurationSeconds"), LeaseSettings().duration)
    expires = renewed + dt.timedelta(seconds=duration) if renewed is not None else None
    names = str(annotations.get(SIGNER_NAMES_ANNOTATION) or "")
    transitions = spec.get("leaseTransitions")
    return Leadership(
        lease=where,
        found=True,
        holder=str(holder) if holder else None,
        renewed=renewed,
        expires=expires,
        live=bool(holder) and expires is not None and now < expires,
        version=str(annotations.get(VERSION_ANNOTATION) or "") or None,
        signer_names=tuple(n for n in names.split(",") if n),
        transitions=transitions if isinstance(transitions, int) else None,
    )


@dataclass(frozen=True)
class Replicas:
    """The signer's Deployment, when there is one (a signer run as a process has none)."""

    deployment: str
    desired: int
    ready: int
    updated: int
    image: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment,
            "desired": self.desired,
            "ready": self.ready,
            "updated": self.updated,
            "image": self.image,
        }


def replicas(deployment: Mapping[str, Any] | None) -> Replicas | None:
    if deployment is None:
        return None
    meta, spec = _meta(deployment), _spec(deployment)
    status = deployment.get("status") or {}
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or [{}]

    def count(value: object) -> int:
        return value if isinstance(value, int) else 0

    return Replicas(
        deployment=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        desired=count(spec.get("replicas", 1)),
        ready=count(status.get("readyReplicas")),
        updated=count(status.get("updatedReplicas")),
        image=containers[0].get("image") if isinstance(containers[0], Mapping) else None,
    )


@dataclass(frozen=True)
class CAGeneration:
    id: str
    state: schedule.State
    since: dt.datetime
    trusted_until: dt.datetime | None
    root: str  # the root's subject
    root_not_after: dt.datetime
    signing_not_after: dt.datetime  # the intermediate's: when it can no longer issue

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "since": _time(self.since),
            "trustedUntil": _time(self.trusted_until),
            "root": self.root,
            "rootNotAfter": _time(self.root_not_after),
            "signingNotAfter": _time(self.signing_not_after),
        }


@dataclass(frozen=True)
class Authority:
    secret: str  # namespace/name
    generations: tuple[CAGeneration, ...]
    rotates: bool  # False for an operator's CA (no generations index)
    next_step: str | None  # what `ca_schedule` says is due now, in words; None: nothing
    problem: str | None  # why the CA could not be read
    roots: frozenset[bytes] = field(default=frozenset(), repr=False)  # trusted roots, DER
    live: frozenset[bytes] = field(default=frozenset(), repr=False)  # but those in preview

    def as_json(self) -> dict[str, Any]:
        return {
            "secret": self.secret,
            "readable": self.problem is None,
            "problem": self.problem,
            "rotates": self.rotates,
            "generations": [g.as_json() for g in self.generations],
            "nextStep": self.next_step,
        }


def authority(
    secret: Mapping[str, bytes] | str,
    where: str,
    now: dt.datetime,
    settings: schedule.Settings = schedule.DEFAULT_SETTINGS,
) -> Authority:
    """The CA Secret's data (or why it could not be read) judged at `now`. Only certificates
    and the index are shown; the keys are parsed by the loader and go no further."""
    if isinstance(secret, str):
        return Authority(where, (), False, None, secret)
    try:
        # Keys in a token stay there: only the certificates are read.
        gens = schedule.from_secret(secret, now, unopened=True)
        upstream = downstream.authorities_from_secret(secret)  # SPIRE's, when it signs
    except authority_ca.CAError as err:
        return Authority(where, (), False, None, f"the Secret holds no usable CA: {err}")
    rotates = schedule.INDEX_KEY in secret
    return Authority(
        secret=where,
        generations=tuple(
            CAGeneration(
                id=g.id,
                state=g.state,
                since=g.since,
                trusted_until=g.trusted_until,
                root=g.root.subject.rfc4514_string(),
                root_not_after=g.root.not_valid_after_utc,
                signing_not_after=g.bundle.not_after,
            )
            for g in gens
        ),
        rotates=rotates,
        next_step=downstream.next_step(secret, gens, now, settings) if rotates else None,
        problem=None,
        roots=_ders(downstream.merged_roots(schedule.trusted_roots(gens), upstream)),
        live=_ders(downstream.merged_roots(schedule.live_roots(gens), upstream)),
    )


@dataclass(frozen=True)
class TrustBundleState:
    name: str
    signer_name: str
    roots: int
    earliest_expiry: dt.datetime | None
    matches_ca: bool | None  # the CA's trusted roots exactly; None when the CA is unread
    problem: str | None

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "signerName": self.signer_name,
            "roots": self.roots,
            "earliestExpiry": _time(self.earliest_expiry),
            "matchesCA": self.matches_ca,
            "problem": self.problem,
        }


def _ders(roots: Sequence[x509.Certificate]) -> frozenset[bytes]:
    return frozenset(r.public_bytes(serialization.Encoding.DER) for r in roots)


def trust_bundle(
    bundle: Mapping[str, Any],
    ca_roots: frozenset[bytes] | None,
    live: frozenset[bytes] = frozenset(),
) -> TrustBundleState:
    """`matches_ca`: a `live` bundle holds the `live` roots, any other every trusted root."""
    spec = _spec(bundle)
    name, signer = str(_meta(bundle).get("name", "")), str(spec.get("signerName") or "")
    try:
        roots = x509.load_pem_x509_certificates(str(spec.get("trustBundle") or "").encode())
    except ValueError as err:
        return TrustBundleState(name, signer, 0, None, None, f"unreadable trustBundle: {err}")
    ders = _ders(roots)
    if ca_roots is not None and canarying.is_live(_meta(bundle).get("labels")):
        ca_roots = live
    return TrustBundleState(
        name=name,
        signer_name=signer,
        roots=len(roots),
        earliest_expiry=min((r.not_valid_after_utc for r in roots), default=None),
        matches_ca=None if ca_roots is None else ders == ca_roots,
        problem=None,
    )


@dataclass(frozen=True)
class PendingRequest:
    namespace: str
    name: str
    pod: str
    node: str
    signer_name: str
    created: dt.datetime | None
    age: dt.timedelta
    stuck: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "pod": self.pod,
            "node": self.node,
            "signerName": self.signer_name,
            "created": _time(self.created),
            "ageSeconds": int(self.age.total_seconds()),
            "stuck": self.stuck,
        }


@dataclass(frozen=True)
class Requests:
    seen: int
    issued: int
    denied: int
    failed: int
    pending: tuple[PendingRequest, ...]  # oldest first
    denials: Mapping[str, int]  # reason -> Denied in the window
    failures: Mapping[str, int]  # reason -> Failed in the window

    @property
    def stuck(self) -> tuple[PendingRequest, ...]:
        return tuple(p for p in self.pending if p.stuck)

    def as_json(self) -> dict[str, Any]:
        return {
            "seen": self.seen,
            "issued": self.issued,
            "denied": self.denied,
            "failed": self.failed,
            "pending": [p.as_json() for p in self.pending],
            "stuck": len(self.stuck),
            "denialsByReason": dict(self.denials),
            "failuresByReason": dict(self.failures),
        }


def _terminal(request: Mapping[str, Any]) -> Condition | None:
    try:
        status = parse_status(request.get("status") or {})
    except RequestError:
        return None
    if status.terminal is not None:
        return status.terminal
    if status.certificate_chain:
        return Condition(type="Issued", status="True")
    return None


def requests(
    items: Sequence[Mapping[str, Any]],
    now: dt.datetime,
    stuck_after: dt.timedelta = STUCK_AFTER,
    window: dt.timedelta = DENIALS_WINDOW,
) -> Requests:
    """Counts, pending requests and recent denials of `items` (already filtered by signer)."""
    outcomes: Counter[str] = Counter()
    denials: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    pending = []
    for item in items:
        meta, spec = _meta(item), _spec(item)
        condition = _terminal(item)
        if condition is None:
            created = parse_time(meta.get("creationTimestamp"))
            age = max(now - created, dt.timedelta(0)) if created is not None else dt.timedelta(0)
            pending.append(
                PendingRequest(
                    namespace=str(meta.get("namespace", "")),
                    name=str(meta.get("name", "")),
                    pod=str(spec.get("podName", "")),
                    node=str(spec.get("nodeName", "")),
                    signer_name=str(spec.get("signerName", "")),
                    created=created,
                    age=age,
                    stuck=age > stuck_after,
                )
            )
            continue
        outcomes[condition.type] += 1
        at = condition.last_transition_time
        recent = at is not None and now - window <= at <= now
        if condition.type == "Denied" and recent:
            denials[condition.reason or "(no reason)"] += 1
        if condition.type == "Failed" and recent:
            failures[condition.reason or "(no reason)"] += 1
    pending.sort(key=lambda p: -p.age)
    return Requests(
        seen=len(items),
        issued=outcomes["Issued"],
        denied=outcomes["Denied"],
        failed=outcomes["Failed"],
        pending=tuple(pending),
        denials=dict(denials.most_common()),
        failures=dict(failures.most_common()),
    )


@dataclass(frozen=True)
class StatusInputs:
    """What `signer.report.fetch` read, untouched."""

    namespace: str
    lease_name: str
    ca_secret: str
    lease: Mapping[str, Any] | str | None  # a string: why it could not be read
    deployment: Mapping[str, Any] | None
    secret: Mapping[str, bytes] | str  # the CA Secret's data, or why it could not be read
    trust_bundles: Sequence[Mapping[str, Any]]
    requests: Sequence[Mapping[str, Any]]
    signer_names: tuple[str, ...] = ()  # asked for; empty: what the leader serves
    pods: Sequence[Mapping[str, Any]] | str | None = None  # read while a revocation is followed


@dataclass(frozen=True)
class Status:
    now: dt.datetime
    namespace: str
    signer_names: tuple[str, ...]
    names_from: str  # "flag", "lease" or "cluster": where the signer names came from
    leader: Leadership
    replicas: Replicas | None
    authority: Authority
    trust_bundles: tuple[TrustBundleState, ...]
    requests: Requests
    stuck_after: dt.timedelta
    window: dt.timedelta
    revocations: tuple[RevocationState, ...] = ()

    @property
    def healthy(self) -> bool:
        return self.leader.live and not self.requests.stuck

    def as_json(self) -> dict[str, Any]:
        return {
            "time": format_time(self.now),
            "namespace": self.namespace,
            "signerNames": list(self.signer_names),
            "signerNamesFrom": self.names_from,
            "healthy": self.healthy,
            "leader": self.leader.as_json(),
            "replicas": self.replicas.as_json() if self.replicas else None,
            "ca": self.authority.as_json(),
            "trustBundles": [t.as_json() for t in self.trust_bundles],
            "requests": self.requests.as_json(),
            "revocations": [r.as_json() for r in self.revocations],
            "stuckAfterSeconds": int(self.stuck_after.total_seconds()),
            "windowSeconds": int(self.window.total_seconds()),
        }


def _signer_of(obj: Mapping[str, Any]) -> str:
    return str(_spec(obj).get("signerName") or "")


def signer_names(inputs: StatusInputs, leader: Leadership) -> tuple[tuple[str, ...], str]:
    """The signer names to report on, and where they came from: those asked for, else those
    the leader says it serves, else every non-Kubernetes signer seen in requests and bundles."""
    if inputs.signer_names:
        return inputs.signer_names, "flag"
    if leader.signer_names:
        return leader.signer_names, "lease"
    seen = {_signer_of(o) for o in (*inputs.requests, *inputs.trust_bundles)}
    return tuple(sorted(n for n in seen if n and not n.startswith(BUILTIN_PREFIX))), "cluster"


def build_status(
    inputs: StatusInputs,
    now: dt.datetime,
    *,
    stuck_after: dt.timedelta = STUCK_AFTER,
    window: dt.timedelta = DENIALS_WINDOW,
    settings: schedule.Settings = schedule.DEFAULT_SETTINGS,
) -> Status:
    leader = leadership(inputs.lease, f"{inputs.namespace}/{inputs.lease_name}", now)
    names, names_from = signer_names(inputs, leader)
    ca = authority(inputs.secret, f"{inputs.namespace}/{inputs.ca_secret}", now, settings)
    ca_roots = ca.roots if ca.problem is None else None
    mine = [b for b in inputs.trust_bundles if _signer_of(b) in names]
    states = [trust_bundle(b, ca_roots, ca.live) for b in mine]
    bundles = sorted(states, key=lambda t: (t.signer_name, t.name))
    requests_of = [r for r in inputs.requests if _signer_of(r) in names]
    return Status(
        now=now,
        namespace=inputs.namespace,
        signer_names=names,
        names_from=names_from,
        leader=leader,
        replicas=replicas(inputs.deployment),
        authority=ca,
        trust_bundles=tuple(bundles),
        requests=requests(requests_of, now, stuck_after, window),
        stuck_after=stuck_after,
        window=window,
        revocations=revocations(
            revoked_of(inputs.secret), mine, inputs.pods, requests_of, names, now, settings
        ),
    )
