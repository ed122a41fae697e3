"""Kubernetes object names: which strings the API server accepts as a name, for the signer's
checks of a request's names, the DNS names it may put in a certificate, and its policy file.
Pure."""

from __future__ import annotations

import re
from typing import Final

# RFC 1123 label, lowercase: what a namespace's name must be, and each label of a DNS subdomain.
_DNS_LABEL: Final = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
MAX_DNS_NAME: Final = 253


def is_dns_label(name: str) -> bool:
    """An RFC 1123 label in Kubernetes' lowercase form (a namespace's name): 1 to 63 characters
    of lowercase letters, digits and dashes, starting and ending with a letter or digit."""
    return _DNS_LABEL.fullmatch(name) is not None


def is_dns_name(name: str) -> bool:
    """An RFC 1123 subdomain in Kubernetes' lowercase form (no wildcards, no trailing dot): the
    names of pods, nodes and service accounts, and the DNS names a leaf may carry."""
    return len(name) <= MAX_DNS_NAME and all(is_dns_label(label) for label in name.split("."))
