"""Which certificates.k8s.io version serves PodCertificateRequests and ClusterTrustBundles.

Kubernetes 1.37 serves both as v1; 1.35 and 1.36 as v1beta1 (and v1 already serves
CertificateSigningRequests, so the question is per resource, not per version). The answer comes
from discovery, which `podcert.discovery` asks; choosing from it is pure and lives here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final

GROUP: Final = "certificates.k8s.io"
# Newest first: the order in which a version is preferred.
VERSIONS: Final = ("v1", "v1beta1")
PCRS: Final = "podcertificaterequests"
CTBS: Final = "clustertrustbundles"


@dataclass(frozen=True)
class Served:
    """The version of each resource to use; None when no version serves it."""

    pcr: str | None
    ctb: str | None


def resource_names(listing: object) -> frozenset[str]:
    """The resource names in a discovery answer (an APIResourceList), whatever its shape."""
    resources = listing.get("resources") if isinstance(listing, Mapping) else None
    return frozenset(
        str(r.get("name"))
        for r in (resources if isinstance(resources, list) else ())
        if isinstance(r, Mapping) and isinstance(r.get("name"), str)
    )


def choose(served: Mapping[str, Collection[str]]) -> Served:
    """The newest version serving each resource, from {version: resource names}."""

    def newest(resource: str) -> str | None:
        return next((v for v in VERSIONS if resource in served.get(v, ())), None)

    return Served(pcr=newest(PCRS), ctb=newest(CTBS))


def group_version(version: str) -> str:
    """`certificates.k8s.io/<version>`, as apiVersion and path segment."""
    return f"{GROUP}/{version}"
