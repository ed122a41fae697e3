"""What the audit takes and gives: its settings, the snapshot of inputs, the report and its
findings (with the report's JSON and one-line summary), and the small formatting helpers every
step uses to name things the same way.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from podcert.api.credentials import OVERDUE_GRACE
from podcert.api.requests import Read
from podcert.api.times import format_precise

JSON = Mapping[str, Any]

State = Literal[
    "fresh",  # valid, refresh point not reached
    "refresh due",  # past its refresh point, within the kubelet's grace
    "overdue",  # more than the grace past its refresh point
    "expired",  # past notAfter
    "pending",  # waiting for the signer, for a normal while
    "stuck",  # waiting far longer than normal, or for a signer name nobody serves
    "denied",
    "failed",
    "unseen",  # neither a credential nor a request was seen for it
]
FindingKind = Literal[
    "expired",
    "overdue",
    "stuck",
    "denied",
    "failed",
    "unreadable",  # credential files that a consumer could not load
    "bad-spiffe-id",
    "untrusted-chain",
    "key-reused",
    "wrong-identity",  # a credential whose SPIFFE ID or issuance names another pod or account
    "credential-shared",  # one certificate or key in two projections
    "key-readable",  # a file holding a private key that its group or others may read
    "not-in-audit-log",
    "root-expiring",
    "root-without-ca",
    "audit-log",
]

# The states that need someone's attention, each also a finding of the same name.
STATE_FINDINGS: Final[Mapping[str, FindingKind]] = {
    "expired": "expired",
    "overdue": "overdue",
    "stuck": "stuck",
    "denied": "denied",
    "failed": "failed",
}
# Which state wins when a projection has a credential and a newer request (ties: the request).
SEVERITY: Final[Mapping[str, int]] = {
    "unseen": 0,
    "fresh": 0,
    "pending": 1,
    "refresh due": 1,
    "overdue": 3,
    "stuck": 4,
    "denied": 4,
    "failed": 4,
    "expired": 5,
}
SHORT_SERIAL: Final = 16  # hex digits of a serial shown in messages


@dataclass(frozen=True)
class Settings:
    """Thresholds, and which projections to report (empty filters: all)."""

    # A request waiting this long is stuck: the signer normally answers within seconds.
    stuck_after: dt.timedelta = dt.timedelta(minutes=5)
    # A request for a signer name no signer has ever answered is stuck after this long.
    no_signer_grace: dt.timedelta = dt.timedelta(minutes=1)
    # The kubelet's CertificateOverdueForRefresh: this long past the refresh point.
    overdue_grace: dt.timedelta = OVERDUE_GRACE
    # Trust anchors expiring within this window are reported.
    root_expiry_warning: dt.timedelta = dt.timedelta(days=7)
    # Audit log entries not covered by a checkpoint this long after they were written are
    # reported: the signer checkpoints on a timer (a minute by default), so an older unsigned
    # tail means checkpointing stopped, or checkpoints were stripped from a rewritten log.
    unsigned_max_age: dt.timedelta = dt.timedelta(minutes=15)
    # A certificate the cluster or a node holds that was issued longer ago than this must be
    # covered by a signed checkpoint (the signer checkpoints every minute). Judged by times the
    # attacker of a log cannot write: the cluster's and the checkpoints' own signed `iat`.
    checkpoint_max_lag: dt.timedelta = dt.timedelta(minutes=5)
    # The signer's `podcert_signer_audit_checkpoint` metric: the log must reach this checkpoint.
    min_checkpoint: int | None = None
    # Check the audit log's hash chain only, as the operator asked: with no trust roots the
    # checkpoints cannot be tied to the signer, which is otherwise a finding.
    log_chain_only: bool = False
    namespaces: frozenset[str] = frozenset()
    signer_names: frozenset[str] = frozenset()
    node_name: str | None = None


# --- inputs -------------------------------------------------------------------------------------


# How a file holding a private key is told apart: a PEM `... PRIVATE KEY` block (PKCS#8, or an
# older form). The reading stats only these files; `audit.examine` classifies by the same mark.
KEY_MARK: Final = b"PRIVATE KEY-----"


@dataclass(frozen=True)
class VolumeFiles:
    """One projected volume on a node: relative path -> bytes (PEM files only), and the
    permission bits of the files that hold a private key, as read (absent: not known)."""

    pod_uid: str
    volume: str
    files: Mapping[str, bytes] = field(repr=False)
    modes: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class TrustSource:
    """Trust anchors from one place: a ClusterTrustBundle, or a file given by the operator."""

    name: str
    pem: bytes = field(repr=False)
    # The signer whose anchors these are; None for a file that applies to every signer.
    signer_name: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything the audit looks at. None means "not read" (as opposed to read and empty)."""

    pods: tuple[JSON, ...] | None = None  # the cluster's pods (API dicts)
    # PodCertificateRequests as read off the wire (`podcert.client.rest.REQUESTS`)
    requests: tuple[Read, ...] | None = None
    volumes: tuple[VolumeFiles, ...] | None = None  # a node's projected volumes
    trust: tuple[TrustSource, ...] = ()
    # Each signer replica's audit log: (name, lines without newlines). Joined as one record.
    audit_logs: tuple[tuple[str, tuple[bytes, ...]], ...] | None = None
    ca_roots: bytes | None = None  # PEM: the roots the signer holds CA keys for
    inputs: tuple[str, ...] = ()  # what was read, for the report header


# --- outputs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    subject: str  # what it is about: a projection, a root, the audit log
    message: str


@dataclass(frozen=True)
class Projection:
    """One podCertificate projection of one pod, joined across every input."""

    pod_uid: str
    namespace: str | None
    pod: str | None
    volume: str | None
    path: str | None  # the credential file (bundle, or chain) inside the volume
    signer_name: str | None
    spiffe_id: str | None
    serial: str | None  # hex, as the audit log writes it
    not_before: dt.datetime | None
    not_after: dt.datetime | None
    begin_refresh_at: dt.datetime | None
    # "request": the request's beginRefreshAt; "estimated": none known, the API's estimate
    # (`podcert.api.credentials.refresh_point`), which the shim also follows.
    refresh_hint: Literal["request", "estimated"] | None
    state: State
    rotations: int  # distinct leaves seen for it across requests, audit log and disk
    findings: tuple[Finding, ...] = ()

    @property
    def subject(self) -> str:
        return subject_of(self.namespace, self.pod, self.pod_uid, self.volume, self.path)


@dataclass(frozen=True)
class Root:
    """A trust anchor found in some trust bundle."""

    fingerprint: str  # sha256 hex
    described: str
    not_after: dt.datetime
    sources: tuple[str, ...]
    has_ca: bool | None  # None when the signer's CA roots were not given


@dataclass(frozen=True)
class AuditLogReport:
    name: str
    lines: int
    entries: int
    checkpoints: int
    unsigned_tail: int
    anchored: bool
    last_checkpoint: int | None
    last_checkpoint_at: dt.datetime | None
    anchors: frozenset[str]
    first_broken_line: int | None
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class Report:
    now: dt.datetime
    inputs: tuple[str, ...]
    projections: tuple[Projection, ...]
    roots: tuple[Root, ...]
    audit_logs: tuple[AuditLogReport, ...] | None
    findings: tuple[Finding, ...]  # every finding, the projections' included
    notes: tuple[str, ...]  # what could not be checked, and why

    @property
    def healthy(self) -> bool:
        return not self.findings

    @property
    def audit_log(self) -> AuditLogReport | None:
        """The first (usually the only) audit log's report."""
        return self.audit_logs[0] if self.audit_logs else None

    def summary(self) -> str:
        states = Counter(p.state for p in self.projections)
        parts = [f"{len(self.projections)} projection(s)"]
        if states:
            order = sorted(states, key=lambda s: (-SEVERITY[s], s))
            parts[0] += " (" + ", ".join(f"{states[s]} {s}" for s in order) + ")"
        parts.append(f"{len(self.roots)} trust root(s)")
        for log in self.audit_logs or ():
            verdict = "verified" if log.ok else f"broken at line {log.first_broken_line}"
            anchored = ", anchored" if log.anchored else ", NOT anchored"
            parts.append(f"audit log {log.entries} entries {verdict}{anchored}")
        kinds = Counter(f.kind for f in self.findings)
        if kinds:
            listed = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
            verdict = f"{len(self.findings)} finding(s): {listed}"
        else:
            verdict = "healthy"
        return f"{'; '.join(parts)} — {verdict}"

    def as_json(self) -> dict[str, Any]:
        return {
            "now": fmt_time(self.now),
            "healthy": self.healthy,
            "summary": self.summary(),
            "inputs": list(self.inputs),
            "findings": [_finding_json(f) for f in self.findings],
            "projections": [
                {
                    "podUID": p.pod_uid,
                    "namespace": p.namespace,
                    "pod": p.pod,
                    "volume": p.volume,
                    "path": p.path,
                    "signerName": p.signer_name,
                    "spiffeID": p.spiffe_id,
                    "serial": p.serial,
                    "notBefore": fmt_time(p.not_before),
                    "notAfter": fmt_time(p.not_after),
                    "beginRefreshAt": fmt_time(p.begin_refresh_at),
                    "refreshHint": p.refresh_hint,
                    "state": p.state,
                    "rotations": p.rotations,
                    "findings": [_finding_json(f) for f in p.findings],
                }
                for p in self.projections
            ],
            "roots": [
                {
                    "sha256": r.fingerprint,
                    "certificate": r.described,
                    "notAfter": fmt_time(r.not_after),
                    "sources": list(r.sources),
                    "hasCA": r.has_ca,
                }
                for r in self.roots
            ],
            "auditLogs": None
            if self.audit_logs is None
            else [
                {
                    "name": log.name,
                    "lines": log.lines,
                    "entries": log.entries,
                    "checkpoints": log.checkpoints,
                    "lastCheckpoint": log.last_checkpoint,
                    "lastCheckpointAt": fmt_time(log.last_checkpoint_at),
                    "unsignedTail": log.unsigned_tail,
                    "anchored": log.anchored,
                    "firstBrokenLine": log.first_broken_line,
                    "problems": list(log.problems),
                }
                for log in self.audit_logs
            ],
            "notes": list(self.notes),
        }


def _finding_json(finding: Finding) -> dict[str, str]:
    return {"kind": finding.kind, "subject": finding.subject, "message": finding.message}


def fmt_time(moment: dt.datetime | None) -> str | None:
    return None if moment is None else format_precise(moment)


def subject_of(
    namespace: str | None, pod: str | None, pod_uid: str, volume: str | None, path: str | None
) -> str:
    who = f"{namespace}/{pod}" if namespace and pod else f"pod {pod_uid}"
    where = "/".join(part for part in (volume, path) if part)
    return f"{who} {where}" if where else who


# --- small formatting helpers -------------------------------------------------------------------


def short_serial(serial: str) -> str:
    return serial if len(serial) <= SHORT_SERIAL else serial[:SHORT_SERIAL] + "…"


def duration_text(delta: dt.timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 0:
        return "-" + duration_text(-delta)
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    if minutes:
        return f"{minutes}m{seconds}s"
    return f"{seconds}s"
