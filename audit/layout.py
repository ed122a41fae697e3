"""The SPIFFE Filesystem Delivery layout in a node's volumes (`bundles.folder` holds its rules).

A volume, or a folder inside one, is a credential folder when it holds trust bundles named
`<trust-domain>.trust-bundle.pem`. There a peer verifies a workload's chain with the bundle of
the workload's own trust domain only, so the audit judges the chain of a credential bundle
beside them against that one file, and reports a folder without it. A file named
`credential-bundle.pem` must follow the layout (its key block first, nothing between blocks):
a consumer of the standard refuses it otherwise. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cryptography import x509

from bundles import folder
from bundles.spiffe import CertificateIdError, spiffe_id_of


@dataclass(frozen=True)
class OwnRoots:
    """The roots a credential in a credential folder is judged by, or why there are none."""

    roots: tuple[bytes, ...]  # DER
    problem: str | None = None


def credential_problem(path: str, data: bytes) -> str | None:
    """What in a file named `credential-bundle.pem` breaks the layout, or None."""
    if _split(path)[1] != folder.CREDENTIAL_BUNDLE:
        return None
    return folder.credential_bundle_problem(data)


def own_roots(
    path: str, leaf: x509.Certificate, trust_files: Mapping[str, tuple[bytes, ...]]
) -> OwnRoots | None:
    """The roots of the leaf's own trust domain's file beside the credential at `path`; None
    when no trust bundle there is named by the layout (every trust file of the volume counts),
    or when the leaf has no SPIFFE ID (reported as such)."""
    directory = _split(path)[0]
    named = {
        td: roots
        for file, roots in trust_files.items()
        if _split(file)[0] == directory and (td := folder.trust_domain_of(_split(file)[1]))
    }
    if not named:
        return None
    try:
        own = spiffe_id_of(leaf).trust_domain
    except CertificateIdError:
        return None
    if not named.get(own):
        name = folder.trust_bundle_name(own)
        return OwnRoots((), f"its folder holds no usable {name}, the bundle of its trust domain")
    return OwnRoots(named[own])


def _split(path: str) -> tuple[str, str]:
    directory, _, name = path.rpartition("/")
    return directory, name
