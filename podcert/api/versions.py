"""Which certificates.k8s.io version serves PodCertificateRequests and ClusterTrustBundles, and
in which form a node sends its key there.

Kubernetes 1.37 serves both as v1; 1.35 and 1.36 as v1beta1 (and v1 already serves
CertificateSigningRequests, so the question is per resource, not per version). The key's form
differs within v1beta1: 1.35's spec has only pkixPublicKey + proofOfPossession, 1.36's also
stubPKCS10Request (preferred: the other two are deprecated), v1 has only the stub. A 1.37 server
with v1beta1 enabled keeps taking 1.35's form there, and its v1 view of such a request has no
key: `key_fallback` names the version to read it through. The answers come from discovery and
the server's OpenAPI schema, which `podcert.client.discovery` asks; choosing from them is pure and
lives here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final

from podcert.api.requests import PROOF_OF_POSSESSION, STUB_CSR, KeyForm

GROUP: Final = "certificates.k8s.io"
# Newest first: the order in which a version is preferred.
VERSIONS: Final = ("v1", "v1beta1")
PCRS: Final = "podcertificaterequests"
# Where a request's key may hide from the newest version's view: Kubernetes 1.37 stores a 1.35
# node's pkixPublicKey + proofOfPossession (made through v1beta1), but its v1 has neither field,
# so the v1 view of such a request holds no key at all and only v1beta1 shows it.
KEY_FALLBACK: Final[Mapping[str, str]] = {"v1": "v1beta1"}
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


def key_fallback(version: str) -> str | None:
    """The older version that shows a key the view at `version` lacks, or None when `version`
    already shows every form (v1beta1 does)."""
    return KEY_FALLBACK.get(version)


def group_version(version: str) -> str:
    """`certificates.k8s.io/<version>`, as apiVersion and path segment."""
    return f"{GROUP}/{version}"


def missing(served: Served, *, trust_bundles: bool) -> str | None:
    """The resources a component needs that no version serves ("podcertificaterequests",
    "clustertrustbundles" or both, for a message), or None when all are served."""
    absent = [PCRS] if served.pcr is None else []
    if trust_bundles and served.ctb is None:
        absent.append(CTBS)
    return " and ".join(absent) or None


def spec_fields(openapi: object, version: str) -> frozenset[str] | None:
    """The properties of PodCertificateRequestSpec in the server's OpenAPI v3 document for
    `certificates.k8s.io/<version>`, or None when the document does not describe it."""
    components = openapi.get("components") if isinstance(openapi, Mapping) else None
    schemas = components.get("schemas") if isinstance(components, Mapping) else None
    spec = (
        schemas.get(f"io.k8s.api.certificates.{version}.PodCertificateRequestSpec")
        if isinstance(schemas, Mapping)
        else None
    )
    properties = spec.get("properties") if isinstance(spec, Mapping) else None
    if not isinstance(properties, Mapping):
        return None
    return frozenset(name for name in properties if isinstance(name, str))


def key_form(version: str, fields: Collection[str] | None) -> KeyForm | None:
    """The form a node sends its key in, given the spec's `fields` (None: the server publishes
    no schema), or None when the spec takes neither form.

    The stub CSR wherever the spec has it; else the key and its proof. Without a schema, v1
    takes only the stub and every v1beta1 (1.35 to 1.37) still takes the key and proof.
    """
    if fields is None:
        return STUB_CSR if version == "v1" else PROOF_OF_POSSESSION
    if "stubPKCS10Request" in fields:
        return STUB_CSR
    if {"pkixPublicKey", "proofOfPossession"} <= set(fields):
        return PROOF_OF_POSSESSION
    return None
