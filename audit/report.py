"""`podcert audit`'s table: what a human reads first (projections needing attention, trust
anchors, the audit logs, every finding, then the one-line verdict). JSON comes from
`Report.as_json`; this module is the only one that loads rich.
"""

from __future__ import annotations

import datetime as dt
import sys
from typing import Final

from audit.model import Projection, Report

_STATE_STYLE: Final = {
    "fresh": "green",
    "refresh due": "cyan",
    "pending": "cyan",
    "unseen": "dim",
    "overdue": "yellow",
    "stuck": "red",
    "denied": "red",
    "failed": "red",
    "expired": "bold red",
}


# --- the table ----------------------------------------------------------------------------------


def print_table(report: Report, *, show_all: bool = False, max_rows: int = 200) -> None:
    """Projections needing attention (all with `show_all`), trust anchors, the audit log, then
    every finding in full and the summary line."""
    from rich.console import Console  # rich loads only for humans
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 160, highlight=False)
    if report.inputs:
        console.print("[bold]Inputs[/]: " + escape("; ".join(report.inputs)))
    shown = [p for p in report.projections if show_all or p.findings or p.state != "fresh"]
    if shown:
        table = Table(title="Pod certificate projections", title_justify="left")
        table.add_column("pod", style="bold", overflow="fold")
        table.add_column("volume/file", overflow="fold")
        table.add_column("SPIFFE ID", overflow="fold")
        table.add_column("serial", style="dim", no_wrap=True)
        table.add_column("not after", no_wrap=True)
        table.add_column("refresh at", no_wrap=True)
        table.add_column("state", no_wrap=True)
        table.add_column("rot.", justify="right")
        table.add_column("findings", overflow="fold")
        for projection in shown[: max_rows or None]:
            table.add_row(*(escape(cell) for cell in _row(projection)[:-3]), *_row(projection)[-3:])
        console.print(table)
        if max_rows and len(shown) > max_rows:
            console.print(
                f"… and {len(shown) - max_rows} more rows (--max-rows 0 for all, -o json for "
                "machines)"
            )
    elif report.projections:
        console.print(f"All {len(report.projections)} projections are fresh (--all lists them).")

    if report.roots:
        roots = Table(title="Trust anchors", title_justify="left")
        for column in ("root", "not after", "trusted by", "CA behind it"):
            roots.add_column(column, overflow="fold")
        for root in report.roots:
            has_ca = {None: "not checked", True: "yes", False: "[red]no[/]"}[root.has_ca]
            roots.add_row(
                escape(root.described),
                _short_time(root.not_after),
                escape("\n".join(root.sources)),
                has_ca,
            )
        console.print(roots)

    for log in report.audit_logs or ():
        verdict = (
            "[green]chain and checkpoints verified[/]"
            if log.ok
            else f"[red]broken, first broken line {log.first_broken_line}[/]"
        )
        anchored = (
            f"anchored in the trust roots up to checkpoint {log.last_checkpoint}"
            if log.anchored
            else "[red]NOT anchored: not vouched for by the signer[/]"
        )
        console.print(
            f"[bold]Audit log[/] {escape(log.name)}: {log.lines} lines, {log.entries} entries, "
            f"{log.checkpoints} checkpoints ({log.unsigned_tail} entries after the last good "
            f"one), {anchored}: {verdict}"
        )

    if report.findings:
        console.print(f"[bold]Findings[/] ({len(report.findings)}):")
        for finding in report.findings[: max_rows or None]:
            console.print(
                f"  [red]{finding.kind}[/] [bold]{escape(finding.subject)}[/]: "
                + escape(finding.message)
            )
        for log in report.audit_logs or ():
            for problem in log.problems[1:20]:
                console.print(f"    [red]•[/] audit log {escape(log.name)} {escape(problem)}")
    for note in report.notes:
        console.print(f"[dim]note: {escape(note)}[/]")
    style = "bold green" if report.healthy else "bold red"
    console.print(f"[{style}]{escape(report.summary())}[/]")


def _row(projection: Projection) -> tuple[str, ...]:
    """Table cells; all but the last three are plain text (escaped by the caller)."""
    if projection.namespace and projection.pod:
        pod = f"{projection.namespace}/{projection.pod}"
    else:
        pod = f"uid {projection.pod_uid}"
    where = "/".join(part for part in (projection.volume, projection.path) if part)
    refresh = _short_time(projection.begin_refresh_at)
    if projection.refresh_hint == "estimated":
        refresh += " est."
    style = _STATE_STYLE.get(projection.state, "")
    kinds = ", ".join(dict.fromkeys(f.kind for f in projection.findings))
    return (
        pod,
        where or "-",
        projection.spiffe_id or "-",
        (projection.serial or "-")[:12],
        _short_time(projection.not_after),
        refresh,
        f"[{style}]{projection.state}[/]" if style else projection.state,
        str(projection.rotations),
        f"[red]{kinds}[/]" if kinds else "",
    )


def _short_time(moment: dt.datetime | None) -> str:
    if moment is None:
        return "-"
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%MZ")
