"""The tables `podcert status`, `podcert explain pod` and `podcert version` print: plain text,
one fact a line, sections in the order a person asks (who signs, with what, for whom, what
waits). Pure: a model in, a string out. Programs read `-o json|yaml` instead (docs/OUTPUT.md);
the table's wording may change between releases.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from podcert.api.times import format_time
from signer.report.explain import EventView, Explanation
from signer.report.revocations import RevocationState
from signer.report.status import Leadership, Status
from signer.report.versions import VersionInfo


def ago(delta: dt.timedelta) -> str:
    """`42s`, `5m`, `3h12m`, `2d4h`: a duration as kubectl prints ages."""
    seconds = max(int(delta.total_seconds()), 0)
    if seconds < 120:
        return f"{seconds}s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if minutes < 60:
        return f"{minutes}m"
    if hours < 24:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"


def _when(moment: dt.datetime | None) -> str:
    return format_time(moment) if moment is not None else "-"


def columns(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Rows padded into left-aligned columns (the first row is the header)."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _leader(leader: Leadership, now: dt.datetime) -> str:
    if leader.problem is not None:
        return f"unknown: {leader.problem}"
    if not leader.found:
        return f"none: no lease {leader.lease}"
    if not leader.holder:
        return f"none: the lease {leader.lease} is released"
    if not leader.live:
        return (
            f"none: {leader.holder}'s lease {leader.lease} ran out "
            f"{ago(now - leader.expires) if leader.expires else '?'} ago"
        )
    renewed = ago(now - leader.renewed) if leader.renewed else "?"
    version = f", podcert {leader.version}" if leader.version else ""
    return f"{leader.holder} (lease {leader.lease}, renewed {renewed} ago{version})"


def status_table(status: Status) -> str:
    now = status.now
    names = ", ".join(status.signer_names) or "(none found)"
    lines = [
        f"Signer names:  {names}  (from the {status.names_from})",
        f"Leader:        {_leader(status.leader, now)}",
    ]
    r = status.replicas
    lines.append(
        f"Replicas:      {r.ready}/{r.desired} ready, {r.updated} up to date "
        f"(Deployment {r.deployment}, image {r.image or '-'})"
        if r
        else f"Replicas:      unknown (no Deployment app.kubernetes.io/name=podcert-signer in "
        f"{status.namespace})"
    )
    ca = status.authority
    lines.append("")
    if ca.problem is not None:
        lines.append(f"CA ({ca.secret}): unreadable: {ca.problem}")
    else:
        lines.append(f"CA ({ca.secret}):")
        rows = [["GENERATION", "STATE", "SINCE", "SIGNS UNTIL", "ROOT UNTIL", "ROOT"]]
        rows += [
            [
                g.id,
                g.state,
                _when(g.since),
                _when(g.signing_not_after),
                _when(g.root_not_after),
                g.root,
            ]
            for g in ca.generations
        ]
        lines += columns(rows)
        step = (
            ca.next_step or "none due now"
            if ca.rotates
            else "none: an operator's CA, rotated by hand"
        )
        lines.append(f"  next step: {step}")
    lines += _revocations(status.revocations)
    lines.append("")
    if status.trust_bundles:
        lines.append("Trust bundles:")
        rows = [["NAME", "SIGNER", "ROOTS", "EARLIEST EXPIRY", "MATCHES CA"]]
        for t in status.trust_bundles:
            match = "-" if t.matches_ca is None else ("yes" if t.matches_ca else "NO")
            rows.append(
                [t.name, t.signer_name, str(t.roots), _when(t.earliest_expiry), t.problem or match]
            )
        lines += columns(rows)
    else:
        lines.append("Trust bundles: none for these signer names")
    q = status.requests
    lines += [
        "",
        f"Requests:      {q.seen} in the cluster: {q.issued} issued, {q.denied} denied, "
        f"{q.failed} failed, {len(q.pending)} pending ({len(q.stuck)} stuck: pending over "
        f"{ago(status.stuck_after)})",
    ]
    if q.pending:
        rows = [["REQUEST", "POD", "NODE", "SIGNER", "AGE", ""]]
        rows += [
            [
                f"{p.namespace}/{p.name}",
                p.pod,
                p.node,
                p.signer_name,
                ago(p.age),
                "STUCK" if p.stuck else "",
            ]
            for p in q.pending
        ]
        lines += columns(rows)
    window = ago(status.window)
    if q.denials or q.failures:
        lines.append(f"Denials in the last {window}:")
        rows = [["REASON", "COUNT"]] + [[k, str(v)] for k, v in q.denials.items()]
        rows += [[f"{k} (Failed)", str(v)] for k, v in q.failures.items()]
        lines += columns(rows)
    else:
        lines.append(f"Denials in the last {window}: none")
    lines += ["", "Healthy." if status.healthy else "NOT healthy: " + _unhealthy(status)]
    return "\n".join(lines) + "\n"


# The pods a revocation's table names; `-o json` carries them all.
SHOWN_PODS = 10


def _revocations(revoked: Sequence[RevocationState]) -> list[str]:
    """A line per followed revocation: what still holds it, then the first pods that do."""
    lines = []
    for r in revoked:
        head = f"  revoked {r.id} at {_when(r.revoked_at)}: "
        if not r.in_progress:
            lines.append(head + "done (no live leaf chains to it, its root is in no bundle)")
            continue
        said = []
        if r.pods_problem is not None:
            said.append(f"pods unread: {r.pods_problem}")
        elif r.stale is not None:
            shim = sum(1 for s in r.stale if s.replacer == "shim")
            said.append(
                f"{len(r.stale)} live pod(s) hold its leaves ({shim} on shim nodes, "
                f"{len(r.stale) - shim} on kubelet nodes)"
            )
            if r.unverified:
                said.append(f"{len(r.unverified)} pod(s) with no request left to tell")
        roots = ", ".join(r.bundles_with_root)
        said.append(f"its root is still in {roots}" if roots else "its root is in no bundle")
        lines.append(head + "; ".join(said))
        for s in (r.stale or ())[:SHOWN_PODS]:
            lines.append(f"    {s.pod.namespace}/{s.pod.name} on {s.pod.node} ({s.replacer})")
        if len(r.stale or ()) > SHOWN_PODS:
            lines.append(f"    ... and {len(r.stale or ()) - SHOWN_PODS} more (-o json lists all)")
    return lines


def _unhealthy(status: Status) -> str:
    said = []
    if status.leader.problem is not None:
        said.append("who leads is unknown")
    elif not status.leader.live:
        said.append("no signer leads, so nothing is issued")
    if status.requests.stuck:
        said.append(f"{len(status.requests.stuck)} request(s) stuck")
    return "; ".join(said)


def _events(events: Sequence[EventView], indent: str) -> list[str]:
    return [
        f"{indent}{e.type} {e.reason}: {e.message}" + (f" (x{e.count})" if e.count > 1 else "")
        for e in events
    ]


def explain_table(explanation: Explanation) -> str:
    e = explanation
    lines = [
        f"Pod {e.namespace}/{e.pod} (uid {e.uid}, node {e.node or '-'}, phase {e.phase or '-'})"
    ]
    lines += [f"  spec problem: {problem}" for problem in e.volume_errors]
    if not e.sources:
        lines.append("  It has no podCertificate projected volume source: it asks for none.")
    for s in e.sources:
        lines += [
            "",
            f"Volume {s.volume}, source {s.index}: signer {s.signer_name}, key {s.key_type}",
        ]
        for r in s.requests:
            outcome = f"{r.outcome} {r.reason}".strip() if r.outcome else "pending"
            lines.append(f"  request {r.name} (created {_when(r.created)}): {outcome}")
            if r.message:
                lines.append(f"    message: {r.message}")
            if r.not_after:
                refresh = _when(r.begin_refresh_at)
                lines.append(f"    valid until {_when(r.not_after)}, refresh from {refresh}")
            lines += _events(r.events, "    event: ")
        lines.append(f"  => {s.verdict.upper()}: {s.why}")
        lines.append(f"  next step: {s.next_step or 'nothing to do'}")
    if e.pod_events:
        lines += ["", "Pod events:", *_events(e.pod_events, "  ")]
    return "\n".join(lines) + "\n"


def version_table(info: VersionInfo) -> str:
    served = [f"{v} ({', '.join(r)})" for v, r in info.certificates.items() if r]
    if info.signer is not None:
        state = "leading" if info.signer_live else "lease ran out"
        signer = f"podcert {info.signer} ({info.signer_holder}, {state}; lease {info.lease})"
    elif info.signer_problem:
        signer = f"unknown: {info.signer_problem}"
    elif info.signer_holder:
        signer = f"unknown: the holder {info.signer_holder} of {info.lease} does not say"
    else:
        signer = f"unknown: no leader holds {info.lease}"
    lines = [
        f"Client:            podcert {info.client} (tested with Kubernetes "
        f"{', '.join(info.kubernetes_tested)})",
        f"Server:            Kubernetes {info.server or 'unknown'}",
        f"certificates.k8s.io: {'; '.join(served) or 'serves no Pod Certificates resources'}"
        + (f"; requests read at {info.pcr_version}" if info.pcr_version else ""),
        f"Signer:            {signer}",
    ]
    if info.signer_image:
        lines.append(f"Signer image:      {info.signer_image}")
    return "\n".join(lines) + "\n"
