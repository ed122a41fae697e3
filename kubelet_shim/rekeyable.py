"""Which pods `podcert shim rotate` can re-key: a pure decision over the pods' requests.

The rotate-before annotation is read by the shim only. A pod's PodCertificateRequests say who
serves its node: made by podcert's client (their managedFields manager, `SHIM_MANAGER`), a shim
re-keys it; made by anything else (a kubelet, real or hollow), nothing acts on the annotation,
and only an eviction (or the kubelet's own refresh) replaces its credential. A pod with no
request has no pod certificate yet, or none left to show; it is annotated, and said unconfirmed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, Literal

SHIM_MANAGER: Final = "podcert"

Verdict = Literal["shim", "kubelet", "unknown"]


def verdicts(pods: Iterable[str], managers: Mapping[str, Iterable[str]]) -> dict[str, Verdict]:
    """Per pod name, who would act on its annotation; `managers` holds, per pod name, the
    managers of its requests."""
    out: dict[str, Verdict] = {}
    for pod in pods:
        made = set(managers.get(pod, ()))
        if not made:
            out[pod] = "unknown"
        elif all(m.startswith(SHIM_MANAGER) for m in made):
            out[pod] = "shim"
        else:
            out[pod] = "kubelet"
    return out
