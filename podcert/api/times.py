"""Kubernetes times in and out: metav1.Time (whole seconds), metav1.MicroTime, and the full
precision RFC 3339 stamps podcert's own records carry (audit log, audit report). Pure."""

from __future__ import annotations

import datetime as dt


class TimeFieldError(ValueError):
    """A field that must hold an RFC 3339 time does not; `field` names it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def parse_time(value: object) -> dt.datetime | None:
    """An aware datetime, or None for anything that is not a usable time (never raises).

    A time without a zone is read as UTC, as the API server writes every time in UTC.
    """
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def require_time(value: object, field: str) -> dt.datetime:
    """`parse_time`, for a field that must be a time: raises TimeFieldError naming `field`."""
    parsed = parse_time(value)
    if parsed is None:
        shown = repr(value[:64]) if isinstance(value, str) else type(value).__name__
        raise TimeFieldError(field, f"expected an RFC 3339 time, got {shown}")
    return parsed


def parse_zoned_time(text: str, field: str) -> dt.datetime:
    """A time typed by a person: RFC 3339 with an explicit zone (`Z` or an offset), since a
    guessed zone would move an emergency rotation or an audit's `now` by hours."""
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise TimeFieldError(field, f"{text!r} is not an RFC 3339 time") from None
    if moment.tzinfo is None:
        raise TimeFieldError(field, f"{text!r} has no time zone (add Z or +00:00)")
    return moment


def format_time(moment: dt.datetime) -> str:
    """metav1.Time: whole seconds in UTC with a Z, as the API server writes them."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(moment: dt.datetime) -> str:
    """metav1.MicroTime: microseconds in UTC with a Z (Leases, annotations that order events)."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def format_precise(moment: dt.datetime) -> str:
    """RFC 3339 in UTC with a Z and all the precision `moment` has (microseconds only when it
    has some): podcert's own records, which must round-trip what they were given."""
    return moment.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
