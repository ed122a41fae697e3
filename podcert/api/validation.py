"""What the API server admits, where podcert must decide the same: the names of objects and
signers (apimachinery's `util/validation`), and how long a pod certificate may live and where its
refresh point may lie (the certificates API's validation of a PodCertificateRequest's spec and of
an Issued status). Each rule is written once here, for the signer, the shim and the audit (a
request's own fields: `podcert.api.requests.invalid`). Pure.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Final

# --- names ---------------------------------------------------------------------------------------

# RFC 1123 label, lowercase: what a namespace's name must be, and each label of a DNS subdomain.
MAX_DNS_NAME: Final = 253
_LABEL: Final = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
DNS_LABEL: Final = re.compile(_LABEL)
# An RFC 1123 subdomain: labels joined by dots, 253 characters at most. Both for `fullmatch`.
DNS_NAME: Final = re.compile(rf"(?=.{{1,{MAX_DNS_NAME}}}\Z){_LABEL}(?:\.{_LABEL})*")


def is_dns_label(name: str) -> bool:
    """An RFC 1123 label in Kubernetes' lowercase form (a namespace's name): 1 to 63 characters
    of lowercase letters, digits and dashes, starting and ending with a letter or digit."""
    return DNS_LABEL.fullmatch(name) is not None


def is_dns_name(name: str) -> bool:
    """An RFC 1123 subdomain in Kubernetes' lowercase form (no wildcards, no trailing dot): the
    names of pods, nodes and service accounts, and the DNS names a leaf may carry."""
    return DNS_NAME.fullmatch(name) is not None


# Signer names under these domains are Kubernetes' own (kubernetes.io/kube-apiserver-client-pod,
# ...): another signer must not answer for them.
RESERVED_SIGNER_DOMAINS: Final = ("kubernetes.io", "k8s.io")
# The API's limit on the part after the '/': room is left for a label in a ClusterTrustBundle
# name built from the signer name.
MAX_SIGNER_PATH: Final = MAX_DNS_NAME - 63


def signer_name_problem(name: str, *, builtin_ok: bool = False) -> str | None:
    """Why `name` cannot be a signer name (`<domain>/<path>`, as the API server validates
    spec.signerName), or None when it can. Names under Kubernetes' own domains are refused
    too unless `builtin_ok`: those signers are built in, and ours must not answer for them."""
    domain, slash, path = name.partition("/")
    if not slash or not domain or not path or "/" in path:
        return "must be a domain and a path, like example.com/my-signer"
    if not is_dns_name(domain) or "." not in domain:
        return f"{domain!r} is not a fully qualified lowercase domain name"
    if not is_dns_name(path) or len(path) > MAX_SIGNER_PATH:
        return (
            f"the path {path!r} must be up to {MAX_SIGNER_PATH} lowercase letters, digits, "
            "dashes and dots"
        )
    for reserved in () if builtin_ok else RESERVED_SIGNER_DOMAINS:
        if domain == reserved or domain.endswith("." + reserved):
            return f"signers under {reserved} are Kubernetes' own"
    return None


# --- lifetimes ------------------------------------------------------------------------------------

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
