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
