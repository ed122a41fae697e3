"""Kubernetes times (RFC 3339, as metav1.Time writes them) in and out. Pure."""

from __future__ import annotations

import datetime as dt


def parse_time(value: object) -> dt.datetime | None:
    """An aware datetime, or None for anything that is not a usable time (never raises)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def format_time(moment: dt.datetime) -> str:
    """Whole seconds in UTC with a Z, as the API server writes them."""
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
