"""The one discovery call: which certificates.k8s.io version serves each resource we use.

The signer, the shim and the audit ask it at start-up; choosing among the answers is the pure
`podcert.api.versions.choose`.
"""

from __future__ import annotations

from podcert.api import versions
from podcert.rest import ApiError, Rest


def certificates_versions(rest: Rest) -> tuple[str, str | None]:
    """The newest versions serving PodCertificateRequests and ClusterTrustBundles (None when
    none serves them). Raises ApiError (404 when no version serves PodCertificateRequests)."""
    answers = {
        version: versions.resource_names(rest.get(f"/apis/{versions.GROUP}/{version}"))
        for version in versions.VERSIONS
    }
    served = versions.choose(answers)
    if served.pcr is None:
        raise ApiError(404, "NotFound", f"{versions.GROUP} serves no {versions.PCRS}")
    return served.pcr, served.ctb
