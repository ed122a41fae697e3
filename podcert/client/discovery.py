"""The discovery calls: which certificates.k8s.io version serves each resource we use, and which
form of the subject key the server's PodCertificateRequest takes.

The signer, the shim and the audit ask at start-up; choosing among the answers is pure
(`podcert.api.versions`). A server that lacks what a component needs is `Unserved`: a message
naming the server's version, for the component to print as its one line before it exits.
"""

from __future__ import annotations

from podcert.api import versions
from podcert.api.requests import KeyForm
from podcert.client.rest import ApiError, Rest


class Unserved(Exception):
    """The API server does not serve what the component needs; `str()` says what, naming the
    server's version, and `missing` which resources (for a hint). Not an ApiError: no wait
    fixes it, so start-up does not retry it."""

    def __init__(self, message: str, missing: str = "") -> None:
        super().__init__(message)
        self.missing = missing


def server_version(rest: Rest) -> str:
    """`Kubernetes v1.35.4` (the server's gitVersion), for messages; never raises."""
    try:
        found = rest.get("/version")
    except ApiError:
        found = None
    version = found.get("gitVersion") if isinstance(found, dict) else None
    return f"Kubernetes {version}" if isinstance(version, str) else "this API server"


def certificates_versions(rest: Rest, *, trust_bundles: bool = False) -> tuple[str, str | None]:
    """The newest versions serving PodCertificateRequests and ClusterTrustBundles (None when
    none serves them). Raises Unserved when no version serves PodCertificateRequests (or, with
    `trust_bundles`, ClusterTrustBundles); ApiError when the server cannot be asked now."""
    answers = {
        version: versions.resource_names(rest.get(f"/apis/{versions.GROUP}/{version}"))
        for version in versions.VERSIONS
    }
    served = versions.choose(answers)
    absent = versions.missing(served, trust_bundles=trust_bundles)
    if absent is not None or served.pcr is None:
        raise Unserved(
            f"{server_version(rest)} serves no {versions.GROUP} {absent or versions.PCRS} "
            f"(podcert needs {versions.GROUP}/v1, as from Kubernetes 1.37, or v1beta1 on 1.35 "
            "and 1.36 with the PodCertificateRequest and ClusterTrustBundle feature gates and "
            f"--runtime-config={versions.GROUP}/v1beta1=true)",
            absent or versions.PCRS,
        )
    return served.pcr, served.ctb


def serves(rest: Rest, version: str, resource: str = versions.PCRS) -> bool:
    """Whether `certificates.k8s.io/<version>` serves `resource` now (one discovery GET; a
    version the server does not serve answers 404: False). ApiError when it cannot be asked."""
    return resource in versions.resource_names(rest.get(f"/apis/{versions.GROUP}/{version}"))


def key_form(rest: Rest, version: str) -> KeyForm:
    """The form a node sends its key in at `certificates.k8s.io/<version>`, read from the
    server's OpenAPI v3 schema (1.35 and 1.36 both say v1beta1 but take different fields).
    Raises Unserved when the spec takes neither form, ApiError when the server is unwell."""
    try:
        document = rest.get(f"/openapi/v3/apis/{versions.GROUP}/{version}")
    except ApiError as err:
        if err.retryable:
            raise
        document = None  # not published to us (403): decide by the version alone
    form = versions.key_form(version, versions.spec_fields(document, version))
    if form is None:
        raise Unserved(
            f"{server_version(rest)}'s {versions.GROUP}/{version} PodCertificateRequest takes "
            "neither stubPKCS10Request nor pkixPublicKey with proofOfPossession"
        )
    return form
