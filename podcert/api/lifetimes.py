"""How long a pod certificate may live and where its refresh point may lie: the API server's
validation of a PodCertificateRequest's spec and of an Issued status, in one place. Pure."""

from __future__ import annotations

import datetime as dt
from typing import Final

# spec.maxExpirationSeconds: defaulted, and bounded for every signer.
DEFAULT_MAX_EXPIRATION_SECONDS: Final = 86400
MIN_MAX_EXPIRATION_SECONDS: Final = 3600
MAX_MAX_EXPIRATION_SECONDS: Final = 7862400  # 91 days
# Signers under kubernetes.io/ may not go beyond a day.
KUBERNETES_IO_MAX_EXPIRATION_SECONDS: Final = 86400

# An Issued status is refused unless notAfter - notBefore is at least this (and at most
# maxExpirationSeconds).
MIN_LIFETIME: Final = dt.timedelta(seconds=MIN_MAX_EXPIRATION_SECONDS)
# ... and unless beginRefreshAt lies in [notBefore + 10 min, notAfter - 10 min].
REFRESH_MARGIN: Final = dt.timedelta(minutes=10)
# ... and unless notBefore is within this of the API server's clock (either way): a signer's
# backdating for clock skew must stay inside it.
NOT_BEFORE_SKEW: Final = dt.timedelta(minutes=5)


def max_expiration_allowed(seconds: int) -> bool:
    """Whether the API admits `seconds` as maxExpirationSeconds (for some signer)."""
    return MIN_MAX_EXPIRATION_SECONDS <= seconds <= MAX_MAX_EXPIRATION_SECONDS


def refresh_window(
    not_before: dt.datetime, not_after: dt.datetime
) -> tuple[dt.datetime, dt.datetime] | None:
    """[earliest, latest] for a beginRefreshAt the API server admits, or None when the lifetime
    is too short to hold one."""
    earliest, latest = not_before + REFRESH_MARGIN, not_after - REFRESH_MARGIN
    return (earliest, latest) if earliest <= latest else None
