"""When an upstream-signed intermediate needs its successor from the operator, and what to say.

podcert makes the successor of an intermediate its own root signed (the schedule prepares it at
`prepare_at` of the intermediate's life). It cannot for one an upstream signed (an offline CA,
`signer.authority.offline`): only the operator can have the next CSR signed. So from that same
point on, `successor_due` says so, and everything that tells the operator repeats its one
message: `podcert signer ca status`, `podcert status`'s next step, the signer's log line and
Event on the CA Secret, and the gauge `podcert_signer_ca_upstream_successor_due` that the
PodcertUpstreamCASuccessorDue alert watches. Within `URGENT` of the end it is urgent (the
window of PodcertCAExpiringWithoutSuccessor, which fires for such a generation as for any).

Pure: `now` and the CA set are arguments.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from signer.authority import schedule

# PodcertCAExpiringWithoutSuccessor's window: from here on the warning is urgent.
URGENT: Final = dt.timedelta(days=7)
# The id of an operator's own CA (a Secret without an index): never an upstream's generation.
OPERATOR: Final = "operator"
REASON: Final = "UpstreamCASuccessorDue"


@dataclass(frozen=True)
class SuccessorDue:
    """The active generation is upstream-signed, has no successor, and its end approaches."""

    id: str
    not_after: dt.datetime
    left: dt.timedelta  # negative once it has ended
    urgent: bool
    awaiting: str | None  # a generation prepared offline, waiting for its signed chain

    def message(self) -> str:
        """One line for people: what ends when, and the commands that fix it."""
        end = f"{self.not_after:%Y-%m-%dT%H:%M:%SZ}"
        if self.left <= dt.timedelta(0):
            head = (
                f"imported intermediate {self.id} ended at {end}: nothing can be issued until "
                "its successor is imported"
            )
        else:
            head = f"imported intermediate {self.id} ends in {format_left(self.left)} ({end})"
        if self.awaiting is not None:
            return (
                f"{head}; its successor {self.awaiting} awaits its signed chain: have the "
                f"upstream sign it, then `podcert signer ca import --id {self.awaiting} "
                "--chain FILE`"
            )
        return (
            f"{head}; prepare and import its successor: `podcert signer ca prepare --upstream "
            "offline`, have the upstream sign the CSR, then `podcert signer ca import`"
        )


def upstream_signed(gen: schedule.Generation) -> bool:
    """A generation whose intermediate an upstream signed: podcert holds no key of its root.
    (An operator's own CA is rotated by replacing the Secret, as its runbook says.)"""
    return gen.id != OPERATOR and gen.bundle.root_key is None


def successor_due(
    generations: Sequence[schedule.Generation],
    awaiting: str | None,
    now: dt.datetime,
    settings: schedule.Settings = schedule.DEFAULT_SETTINGS,
) -> SuccessorDue | None:
    """The warning due at `now`, or None: the active generation is upstream-signed, no
    generation is prepared after it, and it has used `settings.prepare_at` of its life (when
    the schedule would have prepared its successor itself) or has `URGENT` left. `awaiting` is
    the id of a generation prepared offline whose chain has not been imported yet."""
    current = schedule.active(generations)
    if current is None or not upstream_signed(current):
        return None
    if any(g.state == "prepared" for g in generations):
        return None
    intermediate = current.bundle.intermediate
    start, end = intermediate.not_valid_before_utc, intermediate.not_valid_after_utc
    left = end - now
    if now < start + (end - start) * settings.prepare_at and left > URGENT:
        return None
    return SuccessorDue(current.id, end, left, left <= URGENT, awaiting)


def format_left(left: dt.timedelta) -> str:
    """A duration as people read a deadline: `12d 3h`, `5h 10m`, `40m` (rounded down)."""
    minutes = max(0, int(left.total_seconds()) // 60)
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {mins}m"
    return f"{mins}m"
