"""Format versions of what podcert keeps between runs, and the one refusal of a newer one.

What one release persists (the CA Secret, the audit log) is read by the next, and may meet an
older or a newer release in a rolling update or a rollback. So each carries a format number, a
positive integer that changes only when a reader of the previous format could no longer read
the new one correctly. 0.1.0 wrote none: no number means format 1, 0.1.0's, read as it always
was. A release reads every format up to its own and refuses a newer one with `FormatTooNew`,
one line naming the object or file, its format and the highest this release reads, and then
leaves it untouched: no rewrite, no repair, no delete.

Pure: no I/O; the callers name what they read.
"""

from __future__ import annotations

from typing import Final

from podcert import __version__
from podcert.errors import CommandError

# The format a reader assumes where none is written: 0.1.0's, the same bytes this release writes.
UNVERSIONED: Final = 1


class FormatTooNew(CommandError):
    """`what` was written in a format newer than this release reads; it was left untouched."""

    def __init__(self, what: str, found: int, highest: int) -> None:
        super().__init__(
            f"{what} is in format {found}; podcert {__version__} reads formats up to {highest}, "
            "so it leaves it untouched (run a podcert release that reads it)"
        )
        self.what = what
        self.found = found
        self.highest = highest


class FormatUnreadable(ValueError):
    """A format number that is not a positive integer: damage, not a newer release."""


def format_number(raw: object, what: str) -> int:
    """The format `raw` names: UNVERSIONED when absent (None), else a positive integer, given as
    an int or as its decimal digits (bytes or str: a Secret's data). Raises FormatUnreadable."""
    if raw is None:
        return UNVERSIONED
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("ascii")
        except UnicodeDecodeError:
            raise FormatUnreadable(f"{what}: format is not ASCII digits") from None
    if isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) <= 9:
        raw = int(raw)
    if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 1:
        return raw
    shown = repr(raw)[:40]
    raise FormatUnreadable(f"{what}: format must be a positive integer, not {shown}")


def check_readable(found: int, highest: int, what: str) -> None:
    """Raise FormatTooNew when `found` is newer than `highest`, the newest this release reads."""
    if found > highest:
        raise FormatTooNew(what, found, highest)
