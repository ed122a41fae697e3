"""When to refresh a pod credential, how stale it is, and how long to back off: pure timing math.

Kept apart from the agent so every timing rule is tested with fixed datetimes and a seeded RNG.
Nothing here reads the clock or a global random source.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Final, Literal

# The kubelet adds up to 5 minutes of jitter to the signer's beginRefreshAt.
DEFAULT_JITTER: Final = timedelta(minutes=5)
# The kubelet's CertificateOverdueForRefresh fires this long after the refresh point.
OVERDUE_GRACE: Final = timedelta(minutes=10)
# Used when no beginRefreshAt is known (a credential recovered from disk after a restart, or a
# hint outside the certificate's lifetime). Late enough that a restart soon after issuance does
# not re-key (signers tend to pick 2/3..80%), early enough that with a 1 h certificate the overdue
# signal (refresh point + 10 min) still fires before expiry.
FALLBACK_FRACTION: Final = 0.8
# The API server admits beginRefreshAt only within [notBefore + 10 min, notAfter - 10 min]; the
# fallback keeps to that window too when the lifetime allows.
HINT_MARGIN: Final = timedelta(minutes=10)
# A refresh is never scheduled later than this before expiry, whatever the jitter: the new
# certificate needs a moment to be issued and written.
EXPIRY_MARGIN: Final = timedelta(minutes=1)

CredentialState = Literal["fresh", "overdue_for_refresh", "expired"]


def _aware(name: str, value: datetime) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware")


def fallback_refresh(not_before: datetime, not_after: datetime) -> datetime:
    """The refresh point used when the signer gave none: 80% of the lifetime, in the API window."""
    lifetime = not_after - not_before
    point = not_before + lifetime * FALLBACK_FRACTION
    if lifetime >= 2 * HINT_MARGIN:
        point = min(max(point, not_before + HINT_MARGIN), not_after - HINT_MARGIN)
    return point


def next_refresh(
    not_before: datetime,
    not_after: datetime,
    begin_refresh_at: datetime | None,
    *,
    rng: random.Random,
    now: datetime,
    jitter: timedelta = DEFAULT_JITTER,
) -> datetime:
    """When to start refreshing a credential valid over [not_before, not_after).

    - base: `begin_refresh_at` when it lies within [not_before, not_after), else
      `fallback_refresh` (80% of the lifetime);
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
    if begin_refresh_at is not None and not_before <= begin_refresh_at < not_after:
        base = begin_refresh_at
    else:
        base = fallback_refresh(not_before, not_after)
    latest = max(not_before, not_after - EXPIRY_MARGIN)

    at = min(base + _draw(rng, jitter), latest)
    if at < now:
        at = min(now + _draw(rng, jitter), max(now, latest))
    return at


def credential_state(
    not_before: datetime,
    not_after: datetime,
    refresh_at: datetime,
    now: datetime,
    *,
    overdue_grace: timedelta = OVERDUE_GRACE,
) -> CredentialState:
    """How the credential on disk stands at `now`.

    `expired` once now >= not_after; `overdue_for_refresh` once now > refresh_at + 10 min (the
    kubelet's CertificateOverdueForRefresh); else `fresh`. A certificate whose notBefore is still
    ahead (clock skew, the API server allows +-5 min) counts as fresh: it is the newest there is.
    """
    del not_before  # part of the signature so callers pass the whole validity window
    if now >= not_after:
        return "expired"
    if now > refresh_at + overdue_grace:
        return "overdue_for_refresh"
    return "fresh"


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
