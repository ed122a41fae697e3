"""The signer's audit logs, judged: each replica's chain and checkpoints verified against the trust
roots, and the logs together against what the cluster holds (what they answer for, how far the
signed checkpoints reach, the signer's checkpoint counter).
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography import x509

from audit.join import Proj
from audit.model import AuditLogReport, Finding, Settings, fmt_time
from audit.trust import TrustIndex
from podcert.auditlog import Entry, verify

# --- the audit log ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogScope:
    """Which certificates the audit logs answer for: those of the signer names whose trust
    bundles hold the roots the logs' checkpoints chain to (signed data and the cluster, not
    what a log's entries claim), plus the names its entries and the operator give."""

    signers: frozenset[str]
    anchors: frozenset[str]

    @classmethod
    def of(
        cls,
        reports: Sequence[AuditLogReport],
        trust: TrustIndex,
        entries: Sequence[Entry],
        settings: Settings,
    ) -> LogScope:
        anchors = frozenset(a for r in reports for a in r.anchors)
        signers = {s for s, roots in trust.by_signer.items() if roots & anchors}
        signers |= {e.signer_name for e in entries} | settings.signer_names
        return cls(frozenset(signers), anchors)

    def covers(self, proj: Proj) -> bool:
        if proj.signer_name in self.signers:
            return True
        cert = proj.disk.cert if proj.disk is not None else None
        return cert is not None and cert.anchor in self.anchors


def issuance_times(projections: Sequence[Proj], scope: LogScope) -> dict[str, dt.datetime]:
    """serial -> when the cluster or a node says it was issued, for what the logs answer for:
    the Issued condition's time (the signer's clock), else the leaf's notBefore (backdated, so
    earlier: the lenient side)."""
    out: dict[str, dt.datetime] = {}
    for proj in projections:
        if not scope.covers(proj):
            continue
        if proj.disk is not None and proj.disk.cert is not None:
            out[proj.disk.cert.serial] = proj.disk.cert.not_before
        for request in proj.requests:
            if request.chain:
                leaf = request.chain[0]
                issued = request.pcr.status.issued_at or leaf.not_valid_before_utc
                out[f"{leaf.serial_number:x}"] = issued
    return out


def verify_logs(
    logs: Sequence[tuple[str, Sequence[bytes]]],
    trust: TrustIndex,
    ca_roots: bytes | None,
    now: dt.datetime,
    settings: Settings,
    findings: list[Finding],
    notes: list[str],
) -> tuple[list[AuditLogReport], bool]:
    """Verify each replica's log; (reports, whether trust roots anchored them)."""
    roots = list(trust.all)
    if ca_roots is not None:
        with contextlib.suppress(ValueError):  # already noted by judge_roots
            roots += x509.load_pem_x509_certificates(ca_roots)
    roots = list(dict.fromkeys(roots))
    if not roots:
        if settings.log_chain_only:
            notes.append(
                "--chain-only: the audit log's hash chain was checked, its checkpoints were not "
                "tied to the signer; the log is not vouched for"
            )
        else:
            findings.append(
                Finding(
                    "audit-log",
                    "audit log",
                    "no trust roots were given, so nothing ties the checkpoints to the signer and "
                    "anyone could have written this log: give --kubeconfig or --trust-bundle "
                    "(or --chain-only to check the hash chain alone)",
                )
            )
    reports = [
        _audit_log(name, lines, roots, now, settings, findings, anchor=bool(roots))
        for name, lines in logs
    ]
    return reports, bool(roots)


def checkpoint_lag(
    reports: Sequence[AuditLogReport],
    issuances: Mapping[str, dt.datetime],
    now: dt.datetime,
    settings: Settings,
    findings: list[Finding],
) -> None:
    """Every certificate issued longer ago than `checkpoint_max_lag` must precede a signed
    checkpoint. Judged by times the writer of a forged log cannot set: the cluster's, and the
    checkpoints' own signed `iat`."""
    signed_until = max(
        (r.last_checkpoint_at for r in reports if r.last_checkpoint_at is not None), default=None
    )
    due = [t for t in issuances.values() if now - t > settings.checkpoint_max_lag]
    if not due:
        return
    newest = max(due)
    if signed_until is None or signed_until < newest:
        signed = fmt_time(signed_until) if signed_until else "never"
        findings.append(
            Finding(
                "audit-log",
                "audit log",
                f"the cluster holds certificates issued until {fmt_time(newest)}, but the newest "
                f"signed checkpoint is from {signed}: checkpoints stopped, or the log was cut "
                "back or stripped of them",
            )
        )


def _audit_log(
    name: str,
    lines: Sequence[bytes],
    roots: list[x509.Certificate],
    now: dt.datetime,
    settings: Settings,
    findings: list[Finding],
    *,
    anchor: bool,
) -> AuditLogReport:
    subject = f"audit log {name}"
    result = verify(lines, roots or None, now)
    problems = tuple(result.problems)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        findings.append(
            Finding(
                "audit-log",
                subject,
                f"first broken line {result.first_broken_line}; {problems[0]}{more}",
            )
        )
    elif anchor and not result.anchored:
        # The signer checkpoints as soon as it opens its log: a log with none is not its log.
        findings.append(
            Finding(
                "audit-log",
                subject,
                "no checkpoint signed by the signer's audit certificate under the trust roots: "
                "the log is not vouched for",
            )
        )
    elif result.unsigned_tail:
        # Entries follow the last checkpoint; too old a tail means checkpointing stopped.
        since = result.unsigned_since
        if since is not None and now - since > settings.unsigned_max_age:
            findings.append(
                Finding(
                    "audit-log",
                    subject,
                    f"the last {result.unsigned_tail} entries (since {fmt_time(since)}) are "
                    "covered by no checkpoint; the signer checkpoints every minute",
                )
            )
    if settings.min_checkpoint is not None and (result.last_checkpoint or 0) < (
        settings.min_checkpoint
    ):
        findings.append(
            Finding(
                "audit-log",
                subject,
                f"its newest good checkpoint is number {result.last_checkpoint or 0}, but the "
                f"signer had written number {settings.min_checkpoint}: the log was cut back",
            )
        )
    return AuditLogReport(
        name=name,
        lines=len(lines),
        entries=result.entries,
        checkpoints=result.checkpoints,
        unsigned_tail=result.unsigned_tail,
        anchored=result.anchored,
        last_checkpoint=result.last_checkpoint,
        last_checkpoint_at=result.last_checkpoint_at,
        anchors=result.anchors,
        first_broken_line=result.first_broken_line,
        problems=problems,
    )
