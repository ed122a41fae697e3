"""How stale a pod's credential is: fresh, refresh due, overdue for refresh, or expired.

The one rule for the shim's `podcert_shim_projections` gauge and its CertificateOverdueForRefresh
and CertificateExpired events, and for `podcert audit`'s states and findings, so a credential the
audit calls overdue is one the shim has reported overdue too. Pure: `now` is an argument.

The refresh point is the signer's beginRefreshAt when it lies inside the certificate's lifetime.
Without one (a credential found on disk whose request the 15-minute cleaner has removed, which is
most credentials an audit of a node sees, or a hint outside the lifetime) it is 80% of the
lifetime, kept inside the window the API server admits for beginRefreshAt. 80% is the latest point
signers choose (2/3..80% in practice, ours 50% +- 10%), so a node that follows its signer is never
called overdue for lack of a hint, and with the shortest lifetime (1 h) the overdue point
(48 + 10 min) still comes before expiry.
"""

from __future__ import annotations

import datetime as dt
from typing import Final, Literal

from podcert.api.validation import refresh_window

CredentialState = Literal["fresh", "refresh_due", "overdue_for_refresh", "expired"]

# The kubelet's refreshOverdueDuration: overdue this long after the refresh point.
OVERDUE_GRACE: Final = dt.timedelta(minutes=10)
# The kubelet refreshes at beginRefreshAt plus uniform(0, 5 min), so pods issued together do not
# all come back together.
REFRESH_JITTER: Final = dt.timedelta(minutes=5)
# Where the refresh point lies when no usable beginRefreshAt is known.
FALLBACK_FRACTION: Final = 0.8


def fallback_refresh(not_before: dt.datetime, not_after: dt.datetime) -> dt.datetime:
    """80% of the lifetime, moved into the API's beginRefreshAt window when the lifetime has one."""
    point = not_before + (not_after - not_before) * FALLBACK_FRACTION
    window = refresh_window(not_before, not_after)
    if window is not None:
        point = min(max(point, window[0]), window[1])
    return point


def refresh_point(
    not_before: dt.datetime, not_after: dt.datetime, begin_refresh_at: dt.datetime | None
) -> dt.datetime:
    """The signer's beginRefreshAt when it lies within [not_before, not_after), else
    `fallback_refresh`."""
    if begin_refresh_at is not None and not_before <= begin_refresh_at < not_after:
        return begin_refresh_at
    return fallback_refresh(not_before, not_after)


def credential_state(
    not_before: dt.datetime,
    not_after: dt.datetime,
    refresh_at: dt.datetime,
    now: dt.datetime,
    *,
    overdue_grace: dt.timedelta = OVERDUE_GRACE,
) -> CredentialState:
    """How a credential valid over [not_before, not_after), due for refresh at `refresh_at`,
    stands at `now`.

    `expired` once now >= not_after; `overdue_for_refresh` once now > refresh_at + grace (the
    kubelet's CertificateOverdueForRefresh); `refresh_due` from refresh_at on; else `fresh`. A
    certificate whose notBefore is still ahead (clock skew; the API allows +-5 min) is fresh: it
    is the newest there is.
    """
    del not_before  # part of the signature so callers pass the whole validity window
    if now >= not_after:
        return "expired"
    if now > refresh_at + overdue_grace:
        return "overdue_for_refresh"
    if now >= refresh_at:
        return "refresh_due"
    return "fresh"
