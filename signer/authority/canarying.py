"""The SPIFFE Filesystem Delivery standard's ClusterTrustBundle labels (its Kubernetes appendix),
as the signer puts them on every bundle it publishes. Pure.

- `k8s.spiffe.io/canarying`: `live` (what most pods select) or `preview` (what pods chosen to
  see a CA rotation, or a new federation, first select). podcert publishes both for every
  bundle: the `preview` one holds whatever the `live` one holds plus a CA prepared with
  `--preview`, so a pod selecting either always gets a complete bundle.
- `k8s.spiffe.io/workload-trust-domain`: the trust domain X of the workloads that should load the
  bundle (a workload of X selects `workload-trust-domain: X`).
- `k8s.spiffe.io/peer-trust-domain`: the trust domain Y whose peers the bundle verifies. The
  signer's own roots carry X = Y = its trust domain; a federated domain's roots carry X = each
  trust domain podcert serves, Y = the federated one. So, in a cluster with several trust
  domains, a workload's selector names its own X and only federates where its X does.

A trust domain that is not a valid label value (more than 63 characters) gets no label of that
kind: pods then select the bundle by name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final, Literal

CANARYING: Final = "k8s.spiffe.io/canarying"
WORKLOAD_TRUST_DOMAIN: Final = "k8s.spiffe.io/workload-trust-domain"
PEER_TRUST_DOMAIN: Final = "k8s.spiffe.io/peer-trust-domain"

Channel = Literal["live", "preview"]
LIVE: Final[Channel] = "live"
PREVIEW: Final[Channel] = "preview"
CHANNELS: Final[tuple[Channel, ...]] = (LIVE, PREVIEW)

_LABEL_VALUE: Final = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


def label_value_ok(value: str) -> bool:
    """Whether Kubernetes takes `value` as a label value."""
    return bool(_LABEL_VALUE.match(value))


def labels(channel: Channel, workload_trust_domain: str, peer_trust_domain: str) -> dict[str, str]:
    """The standard's three labels for one bundle."""
    out: dict[str, str] = {CANARYING: channel}
    if label_value_ok(workload_trust_domain):
        out[WORKLOAD_TRUST_DOMAIN] = workload_trust_domain
    if label_value_ok(peer_trust_domain):
        out[PEER_TRUST_DOMAIN] = peer_trust_domain
    return out


def is_live(labels: object) -> bool:
    """Whether an object's labels mark it `live`."""
    return isinstance(labels, Mapping) and labels.get(CANARYING) == LIVE
