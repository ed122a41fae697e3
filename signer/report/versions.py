"""`podcert version` as a pure function: what the client is, what the API server says it runs
and serves of certificates.k8s.io, and what the signer's leader says it runs.

The signer's version is read from its Lease: the leader writes its podcert version there on
every renewal (`signer.leader.VERSION_ANNOTATION`), so the answer is what actually signs now,
even mid-rollout, for a signer run outside a Deployment, or from an image tagged `latest` or
pinned by digest. The Deployment's image is shown beside it when there is one; it says what is
being rolled out, not what leads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from podcert import KUBERNETES_TESTED, __version__
from podcert.api import versions as api_versions
from signer.report.status import Leadership, Replicas


@dataclass(frozen=True)
class VersionInfo:
    client: str
    kubernetes_tested: tuple[str, ...]
    server: str | None  # gitVersion; None when /version did not say
    # certificates.k8s.io version -> the resources of ours it serves (absent: not served)
    certificates: Mapping[str, tuple[str, ...]]
    pcr_version: str | None  # the one podcert reads requests at
    signer: str | None  # the leader's podcert version
    signer_holder: str | None
    signer_live: bool
    signer_image: str | None  # the Deployment's image, when there is one
    lease: str
    signer_problem: str | None = None  # why the lease could not be read

    def as_json(self) -> dict[str, Any]:
        return {
            "client": {"version": self.client, "kubernetesTested": list(self.kubernetes_tested)},
            "server": {
                "kubernetes": self.server,
                "certificatesAPI": {v: list(r) for v, r in self.certificates.items()},
                "podCertificateRequestVersion": self.pcr_version,
            },
            "signer": {
                "version": self.signer,
                "leader": self.signer_holder,
                "leaderLive": self.signer_live,
                "image": self.signer_image,
                "lease": self.lease,
                "problem": self.signer_problem,
            },
        }


def version_info(
    server: Mapping[str, Any] | None,
    discovery: Mapping[str, object],
    leader: Leadership,
    replicas: Replicas | None,
    client: str = __version__,
) -> VersionInfo:
    """`server` is /version's answer; `discovery` each certificates.k8s.io version's resource
    list as read (None: not served)."""
    served = {v: api_versions.resource_names(discovery.get(v)) for v in api_versions.VERSIONS}
    ours = (api_versions.PCRS, api_versions.CTBS)
    chosen = api_versions.choose(served)
    git = (server or {}).get("gitVersion")
    return VersionInfo(
        client=client,
        kubernetes_tested=tuple(KUBERNETES_TESTED.values()),
        server=git if isinstance(git, str) else None,
        certificates={v: tuple(r for r in ours if r in names) for v, names in served.items()},
        pcr_version=chosen.pcr,
        signer=leader.version,
        signer_holder=leader.holder,
        signer_live=leader.live,
        signer_image=replicas.image if replicas else None,
        lease=leader.lease,
        signer_problem=leader.problem,
    )
