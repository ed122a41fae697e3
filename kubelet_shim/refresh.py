"""When the node refreshes a pod credential, and how long it backs off: pure timing math.

How stale a credential is, and where its refresh point lies without a hint, are the API's rule
(`podcert.api.credentials`), shared with the audit; this adds the node's own part: the jitter
drawn per credential, the last moment before expiry, and the catch-up after a restart. Nothing
here reads the clock or a global random source.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Final

from podcert.api.credentials import REFRESH_JITTER, refresh_point

# A refresh is never scheduled later than this before expiry, whatever the jitter: the new
# certificate needs a moment to be issued and written.
EXPIRY_MARGIN: Final = timedelta(minutes=1)


def _aware(name: str, value: datetime) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware")


def next_refresh(
    not_before: datetime,
    not_after: datetime,
    begin_refresh_at: datetime | None,
    *,
    rng: random.Random,
    now: datetime,
    jitter: timedelta = REFRESH_JITTER,
) -> datetime:
    """When to start refreshing a credential valid over [not_before, not_after).

    - base: the API's `refresh_point` (`begin_refresh_at` when it lies within
      [not_before, not_after), else 80% of the lifetime);
    - plus uniform(0, jitter), so pods issued together do not refresh together;
    - clamped to no later than `not_after - 1 min` (and never before `not_before`);
    - if that point has already passed (a restart found an old credential), the result is
      `now + uniform(0, jitter)` so a node full of overdue pods spreads its requests, unless
      even that would pass the latest point, then `now`.

    The result is therefore never before `now` by more than zero: it is "due" when <= now.
    """
    for name, value in (("not_before", not_before), ("not_after", not_after), ("now", now)):
        _aware(name, value)
    if not_after <= not_before:
        raise ValueError("not_after must be later than not_before")
    if jitter < timedelta(0):
        raise ValueError("jitter must not be negative")

    if begin_refresh_at is not None:
        _aware("begin_refresh_at", begin_refresh_at)
    base = refresh_point(not_before, not_after, begin_refresh_at)
    latest = max(not_before, not_after - EXPIRY_MARGIN)

    at = min(base + _draw(rng, jitter), latest)
    if at < now:
        at = min(now + _draw(rng, jitter), max(now, latest))
    return at


def backoff(
    attempt: int,
    *,
    rng: random.Random,
    base: timedelta = timedelta(seconds=1),
    cap: timedelta = timedelta(minutes=5),
) -> timedelta:
    """Delay before retry number `attempt` (0 for the first retry) after a transient error.

    Capped exponential with full jitter drawn from [base, min(cap, base * 2**attempt)]: the
    jitter spreads a node's retries, the `base` floor keeps a retry from ever being immediate.
    """
    if attempt < 0:
        raise ValueError("attempt must not be negative")
    if base <= timedelta(0) or cap < base:
        raise ValueError("need 0 < base <= cap")
    # Computed in float seconds: base * 2**attempt overflows timedelta long before the cap matters.
    ceiling = min(cap.total_seconds(), base.total_seconds() * 2.0 ** min(attempt, 64))
    return base + _draw(rng, timedelta(seconds=ceiling) - base)


def _draw(rng: random.Random, upto: timedelta) -> timedelta:
    return timedelta(seconds=rng.uniform(0.0, upto.total_seconds()))
