"""Judging one projection: its state (fresh ... expired, pending, stuck), and what is wrong with
its credential (chain, identity, a copy in another volume, a key reused, missing from the log).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from audit.examine import CertFacts, ReadableKey, anchor_set, cert_facts
from audit.join import Proj, Request, norm_serial
from audit.model import (
    SEVERITY,
    STATE_FINDINGS,
    Finding,
    Projection,
    Settings,
    State,
    duration_text,
    fmt_time,
    short_serial,
    subject_of,
)
from audit.trust import TrustIndex
from podcert.api.credentials import CredentialState, refresh_point
from podcert.api.credentials import credential_state as api_credential_state
from podcert.auditlog import Entry

# The API's credential states under the names the audit reports.
_STATE_NAMES: Final[Mapping[CredentialState, State]] = {
    "fresh": "fresh",
    "refresh_due": "refresh due",
    "overdue_for_refresh": "overdue",
    "expired": "expired",
}

# --- judging one projection ---------------------------------------------------------------------


def assess(
    proj: Proj,
    now: dt.datetime,
    settings: Settings,
    trust: TrustIndex,
    served: set[str],
    issued_serials: set[int] | None,
    issued_to: Mapping[str, Holder],
    copies: Mapping[int, str],
) -> Projection:
    subject = subject_of(proj.namespace, proj.pod, proj.pod_uid, proj.volume, proj.path)
    findings: list[Finding] = []
    requests = sorted(proj.requests, key=lambda r: r.pcr.created or now)
    issued = [r for r in requests if r.pcr.status.outcome == "Issued" and r.chain]
    # Serials and keys of every issued leaf; only the current one's chain is checked below.
    unchecked = anchor_set(())
    request_facts = {r.pcr.uid: cert_facts(r.chain, unchecked, now) for r in issued}

    # The current credential: what is on disk, else the newest issued request's leaf; its
    # refresh point is the one that request gave (beginRefreshAt), else the API's estimate.
    current: CertFacts | None = None
    hinted: Request | None = None
    if proj.disk is not None:
        if proj.disk.cert is None:
            findings.append(
                Finding("unreadable", subject, f"{proj.disk.path}: {proj.disk.problem}")
            )
        current = proj.disk.cert
        if current is not None:
            hinted = next(
                (r for r in issued if request_facts[r.pcr.uid].serial == current.serial), None
            )
    elif issued:
        hinted = issued[-1]
        current = cert_facts(hinted.chain, anchor_set(trust.all_der), now)
    refresh_at: dt.datetime | None = None
    hint: Literal["request", "estimated"] | None = None
    credential_state: State | None = None
    if current is not None:
        given = hinted.pcr.status.begin_refresh_at if hinted is not None else None
        refresh_at = refresh_point(current.not_before, current.not_after, given)
        hint = "request" if given is not None and refresh_at == given else "estimated"
        credential_state = _STATE_NAMES[
            api_credential_state(
                current.not_before,
                current.not_after,
                refresh_at,
                now,
                overdue_grace=settings.overdue_grace,
            )
        ]

    # The newest request matters when it is newer than the credential: unanswered or refused.
    request_state: State | None = None
    latest = requests[-1] if requests else None
    latest_created = latest.pcr.created if latest is not None else None
    superseded = (
        current is not None and latest_created is not None and latest_created < current.not_before
    )
    if latest is not None and latest.pcr.status.outcome != "Issued" and not superseded:
        request_state, message = _request_state(latest, now, settings, served)
        kind = STATE_FINDINGS.get(request_state)
        if kind is not None:
            findings.append(Finding(kind, subject, message))

    if credential_state is None and request_state is None:
        state: State = "unseen"
    elif credential_state is None or (
        request_state is not None and SEVERITY[request_state] >= SEVERITY[credential_state]
    ):
        assert request_state is not None
        state = request_state
    else:
        state = credential_state
    if current is not None and credential_state in ("expired", "overdue"):
        if credential_state == "expired":
            message = (
                f"serial {short_serial(current.serial)} expired at {fmt_time(current.not_after)}"
            )
        else:
            late = now - (refresh_at or now)
            message = (
                f"serial {short_serial(current.serial)} is {duration_text(late)} past its refresh "
                "point "
                f"{fmt_time(refresh_at)} ({hint}) and no newer credential replaced it"
            )
        findings.append(Finding(credential_state, subject, message))

    if current is not None:
        findings.extend(_credential_findings(current, proj, subject, trust, issued_serials))
        findings.extend(_identity_findings(current, proj, subject, issued_to))
    if id(proj) in copies:
        findings.append(Finding("credential-shared", subject, copies[id(proj)]))
    findings.extend(Finding("key-readable", subject, _readable(key)) for key in proj.readable_keys)
    if issued_serials is not None:
        # Joined with the cluster: every certificate a request holds must be in the log. This is
        # what catches a log cut back to an earlier checkpoint (a consistent, signed prefix).
        on_disk = current.serial if current is not None and proj.disk is not None else None
        missing = sorted(
            facts.serial
            for facts in request_facts.values()
            if int(facts.serial, 16) not in issued_serials and facts.serial != on_disk
        )
        for serial in missing:
            findings.append(
                Finding(
                    "not-in-audit-log",
                    subject,
                    f"serial {short_serial(serial)} was issued by request but is not in the "
                    "audit log",
                )
            )

    # Rotations and key reuse across every leaf seen for the projection.
    leaves: dict[str, CertFacts] = {f.serial: f for f in request_facts.values()}
    if current is not None:
        leaves[current.serial] = current
    serials = set(leaves) | {
        norm_serial(e.serial) for e in proj.entries if e.decision == "issued" and e.serial
    }
    by_key: dict[str, list[str]] = defaultdict(list)
    for serial, facts in sorted(leaves.items()):
        by_key[facts.spki_sha256].append(serial)
    for spki, shared in sorted(by_key.items()):
        if len(shared) > 1:
            listed = ", ".join(short_serial(s) for s in shared)
            findings.append(
                Finding(
                    "key-reused",
                    subject,
                    f"{len(shared)} leaves share one public key (sha256 {spki[:16]}): "
                    f"serials {listed}",
                )
            )

    return Projection(
        pod_uid=proj.pod_uid,
        namespace=proj.namespace,
        pod=proj.pod,
        volume=proj.volume,
        path=proj.path,
        signer_name=proj.signer_name,
        spiffe_id=current.spiffe_id if current is not None else None,
        serial=current.serial if current is not None else None,
        not_before=current.not_before if current is not None else None,
        not_after=current.not_after if current is not None else None,
        begin_refresh_at=refresh_at,
        refresh_hint=hint,
        state=state,
        rotations=len(serials),
        findings=tuple(findings),
    )


def _request_state(
    request: Request, now: dt.datetime, settings: Settings, served: set[str]
) -> tuple[State, str]:
    pcr = request.pcr
    where = f"request {pcr.namespace}/{pcr.name}"
    outcome, signer_name = pcr.status.outcome, pcr.spec.signer_name
    if outcome == "Denied":
        return "denied", f"{where} was denied: {request.message}"
    if outcome == "Failed":
        return "failed", f"{where} failed: {request.message}"
    created = pcr.created
    age = now - created if created is not None else dt.timedelta(0)
    if signer_name not in served and age > settings.no_signer_grace:
        return "stuck", (
            f"{where} has waited {duration_text(age)} for signer {signer_name}, which "
            "answered none of the requests and audit log entries read (is a signer serving "
            "this name?)"
        )
    if age > settings.stuck_after:
        return "stuck", f"{where} has waited {duration_text(age)} for {signer_name}"
    return "pending", f"{where} is waiting for {signer_name}"


def _credential_findings(
    current: CertFacts,
    proj: Proj,
    subject: str,
    trust: TrustIndex,
    issued_serials: set[int] | None,
) -> Iterator[Finding]:
    serial = short_serial(current.serial)
    if current.id_problem is not None:
        yield Finding("bad-spiffe-id", subject, f"serial {serial}: {current.id_problem}")
    if current.chain_problem is not None:
        yield Finding(
            "untrusted-chain", subject, f"serial {serial} does not verify: {current.chain_problem}"
        )
    elif current.anchor is not None:
        allowed = trust.anchors_for(proj.signer_name)
        if allowed is not None and current.anchor not in allowed:
            yield Finding(
                "untrusted-chain",
                subject,
                f"serial {serial} leads to root sha256 {current.anchor[:16]}, which is not in "
                f"the trust bundles of {proj.signer_name}",
            )
    if (
        issued_serials is not None
        and proj.disk is not None
        and proj.disk.cert is current
        and int(current.serial, 16) not in issued_serials
    ):
        yield Finding(
            "not-in-audit-log",
            subject,
            f"serial {serial} on disk was never issued according to the audit log",
        )


def _readable(key: ReadableKey) -> str:
    """Which file, who may read it and its mode; never what it holds."""
    group, others = key.mode & 0o040, key.mode & 0o004
    who = " and ".join(w for w, bit in (("its group", group), ("all other users", others)) if bit)
    return (
        f"{key.path} holds the private key and is readable by {who} (mode {key.mode:04o}): the "
        "kubelet keeps it private only with defaultMode 0600 on the volume, or one runAsUser "
        "for every container, and no fsGroup"
    )


@dataclass(frozen=True)
class Holder:
    """Whom a serial was issued to, by a request (with the pod's UID) or an audit log entry."""

    namespace: str
    pod: str
    pod_uid: str | None
    service_account: str


def holders_by_serial(requests: Sequence[Request], entries: Sequence[Entry]) -> dict[str, Holder]:
    """serial (normalised hex) -> to whom it was issued; a request's word wins (it has the UID)."""
    holders: dict[str, Holder] = {}
    for entry in entries:
        if entry.decision == "issued" and entry.serial:
            holders[norm_serial(entry.serial)] = Holder(
                entry.namespace, entry.pod, None, entry.service_account
            )
    for request in requests:
        if request.chain:
            spec = request.pcr.spec
            holders[f"{request.chain[0].serial_number:x}"] = Holder(
                request.pcr.namespace, spec.pod_name, spec.pod_uid, spec.service_account_name
            )
    return holders


def _identity_findings(
    current: CertFacts, proj: Proj, subject: str, issued_to: Mapping[str, Holder]
) -> Iterator[Finding]:
    """A credential must name the pod that holds it: its SPIFFE ID's namespace and service
    account are the pod's, and it was issued (by request or audit log) to this very pod."""
    serial = short_serial(current.serial)
    spiffe_path = (current.spiffe_id or "").split("://", 1)[-1].partition("/")[2]
    if current.spiffe_id and proj.namespace and proj.service_account:
        expected = f"ns/{proj.namespace}/sa/{proj.service_account}"
        if spiffe_path != expected:
            yield Finding(
                "wrong-identity",
                subject,
                f"serial {serial} names {current.spiffe_id}, but the pod runs as "
                f"{proj.namespace}/{proj.service_account} (…/{expected})",
            )
            return
    holder = issued_to.get(current.serial)
    if holder is None or proj.disk is None:
        return  # only a credential on disk can sit in the wrong pod
    other_pod = holder.pod_uid is not None and holder.pod_uid != proj.pod_uid
    if proj.namespace and proj.pod:
        other_pod = other_pod or (holder.namespace, holder.pod) != (proj.namespace, proj.pod)
    if other_pod:
        yield Finding(
            "wrong-identity",
            subject,
            f"serial {serial} was issued to pod {holder.namespace}/{holder.pod}, not to this one",
        )


def shared_credentials(projections: Sequence[Proj]) -> dict[int, str]:
    """id(projection) -> why its credential on disk is also another projection's (the same
    certificate, or another certificate for the same key): a copied credential."""
    by_serial: dict[str, list[Proj]] = defaultdict(list)
    by_key: dict[str, list[Proj]] = defaultdict(list)
    for proj in projections:
        if proj.disk is not None and proj.disk.cert is not None:
            by_serial[proj.disk.cert.serial].append(proj)
            by_key[proj.disk.cert.spki_sha256].append(proj)
    out: dict[int, str] = {}
    for what, groups in (("certificate", by_serial), ("private key", by_key)):
        for value, holders in groups.items():
            if len(holders) < 2:
                continue
            for proj in holders:
                others = [
                    subject_of(o.namespace, o.pod, o.pod_uid, o.volume, o.path)
                    for o in holders
                    if o is not proj
                ]
                out.setdefault(
                    id(proj),
                    f"the same {what} ({value[:16]}) is also in {', '.join(sorted(others)[:3])}"
                    + (f" and {len(others) - 3} more" if len(others) > 3 else ""),
                )
    return out
