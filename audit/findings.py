"""The rotation audit as one pure function: `audit_findings(snapshot, now) -> Report`.

Why it exists: pod credentials rotate silently, so the way to know that rotation works is to look
at everything that records it at once — the cluster's PodCertificateRequests, pods and
ClusterTrustBundles, the files a node projected into pod volumes, and the signer's audit logs —
and join them per pod projection. Each input is optional; every join is made only from what was
given.

Pure: the inputs arrive as a `Snapshot` of bytes, pods as API dicts and requests typed
(`podcert.api.requests`), as `audit.snapshot` reads them; the time as `now`. Each step is a module:
examine (a node's volumes), join, assess (each projection), trust (the anchors), logs (the audit
logs).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from audit.assess import assess, holders_by_serial, shared_credentials
from audit.examine import VolumeFacts, examine_volume
from audit.join import join, joinable, readable_entries, selected
from audit.logs import LogScope, checkpoint_lag, issuance_times, verify_logs
from audit.model import Finding, Report, Settings, Snapshot
from audit.trust import TrustIndex, judge_roots


def chain_roots(snapshot: Snapshot) -> tuple[bytes, ...]:
    """The roots (DER) `examine_volume` checks a node's chains against: every trust source."""
    return TrustIndex(snapshot.trust, []).all_der


def audit_findings(
    snapshot: Snapshot,
    now: dt.datetime,
    settings: Settings | None = None,
    *,
    examined: Iterable[VolumeFacts] | None = None,
) -> Report:
    """Join the inputs per projection and report what is wrong.

    `examined` is a node's volumes already run through `examine_volume(volume,
    roots=chain_roots(snapshot), now=now)` by the caller (the CLI does it in a process pool that
    reads the files as it goes); without it, `snapshot.volumes` are examined here.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    settings = settings or Settings()
    notes: list[str] = []
    findings: list[Finding] = []

    trust = TrustIndex(snapshot.trust, notes)
    facts: list[VolumeFacts] = []
    if examined is not None:
        facts = list(examined)
    elif snapshot.volumes is not None:
        facts = [examine_volume(v, roots=trust.all_der, now=now) for v in snapshot.volumes]
    if (examined is not None or snapshot.volumes is not None) and not trust.all_der:
        notes.append(
            "no trust bundle given: chains on disk were checked against each pod's own trust bundle"
        )

    logs = snapshot.audit_logs
    entries = [e for _, lines in logs or () for e in readable_entries(lines)]
    requests = joinable(snapshot.requests or ())
    projections = join(snapshot, facts, requests, entries)

    # Signer names someone answers for: a settled request, or an audit log entry.
    served = {
        r.pcr.spec.signer_name for r in requests if r.pcr.status.outcome in ("Issued", "Denied")
    }
    served |= {e.signer_name for e in entries}
    log_findings: list[Finding] = []
    log_reports = None
    scope = LogScope(frozenset(), frozenset())
    if logs is not None:
        log_reports, anchored = verify_logs(
            logs, trust, snapshot.ca_roots, now, settings, log_findings, notes
        )
        scope = LogScope.of(log_reports, trust, entries, settings)
        if anchored:
            checkpoint_lag(
                log_reports, issuance_times(projections, scope), now, settings, log_findings
            )
    issued_serials = {int(e.serial, 16) for e in entries if e.decision == "issued" and e.serial}
    issued_to = holders_by_serial(requests, entries)
    copies = shared_credentials(projections)
    reports = [
        assess(
            p,
            now,
            settings,
            trust,
            served,
            issued_serials if logs is not None and scope.covers(p) else None,
            issued_to,
            copies,
        )
        for p in projections
        if selected(p, settings)
    ]
    reports.sort(
        key=lambda p: (p.namespace or "~", p.pod or "", p.pod_uid, p.volume or "", p.path or "")
    )
    for report in reports:
        findings.extend(report.findings)
    if snapshot.requests is None and snapshot.volumes is None and examined is None:
        notes.append("neither the cluster nor a node root was read: no projection to report")

    roots = judge_roots(snapshot, trust, facts, now, settings, findings, notes)
    findings.extend(log_findings)
    return Report(
        now=now,
        inputs=snapshot.inputs,
        projections=tuple(reports),
        roots=roots,
        audit_logs=tuple(log_reports) if log_reports is not None else None,
        findings=tuple(findings),
        notes=tuple(notes),
    )
