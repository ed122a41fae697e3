"""What `podcert signer ca status` prints: a line per generation, the one awaiting its signed
chain, the next step due, an upstream-signed intermediate's end coming with no successor, and
each revocation. Read from a loaded `CAStore`; nothing is written."""

from __future__ import annotations

import datetime as dt

from signer.authority import offline, revoke, schedule, successor
from signer.authority.castore import CAStore


def report(cas: CAStore, gens: list[schedule.Generation], now: dt.datetime) -> list[str]:
    """The lines for the CA `cas` holds (`gens`, as it loaded them) at `now`."""
    due = cas.due() if gens[0].id != "operator" else None
    waiting = cas.pending()
    warning = successor.successor_due(gens, waiting.id if waiting else None, now, cas.settings)
    return status_lines(gens, waiting, due, cas.revoked, warning)


def status_lines(
    generations: list[schedule.Generation],
    waiting: offline.Pending | None,
    due: schedule.Step | None,
    revoked: list[revoke.Revocation],
    warning: successor.SuccessorDue | None = None,
) -> list[str]:
    """What `podcert signer ca status` prints: a line per generation, the one awaiting its
    signed chain, the next step due, an upstream-signed intermediate's end approaching with no
    successor (`signer.authority.successor`), and each revocation."""
    lines = []
    for g in generations:
        until = f" trusted until {g.trusted_until:%Y-%m-%dT%H:%M:%SZ}" if g.trusted_until else ""
        lines.append(
            f"{g.id:24} {'preview' if g.preview else g.state:9} "
            f"since {g.since:%Y-%m-%dT%H:%M:%SZ}  "
            f"root until {g.root.not_valid_after_utc:%Y-%m-%d}  "
            f"signing CA until {g.bundle.not_after:%Y-%m-%d}{until}"
        )
    if waiting is not None:
        lines.append(
            f"{waiting.id:24} {'awaiting signed chain':9} "
            f"since {waiting.since:%Y-%m-%dT%H:%M:%SZ}  "
            f"(CSR for spiffe://{waiting.trust_domain}; "
            f"`ca import --id {waiting.id} --chain FILE`)"
        )
    lines.append(f"next step due: {type(due).__name__ if due else 'none'}")
    if warning is not None:
        lines.append(f"{'URGENT' if warning.urgent else 'warning'}: {warning.message()}")
    for r in revoked:
        where = "out of every trust bundle" if r.untrusted else "root still trusted"
        lines.append(f"revoked: {r.id} at {r.revoked_at:%Y-%m-%dT%H:%M:%SZ} ({where})")
    return lines
