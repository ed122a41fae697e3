"""What `podcert status` says of a revoked CA generation (`podcert signer ca revoke`), as pure
functions of the CA Secret's revocations, the trust bundles, pods, requests and `now`.

- A revocation is followed while the CA still trusts its root, or while a leaf it signed may
  still be valid (`max_leaf_lifetime` after the revocation; no leaf outlives it).
- For a followed revocation: the live pods whose newest issued leaf chains to it
  (`signer.revokeplan.stale_pods`), split by who replaces them (the shim re-keys, a kubelet's
  pod is evicted or refreshes); the pods nothing in the cluster vouches for (made before the
  revocation, their requests deleted by the controller-manager after 15 minutes:
  `revokeplan.unverified`); and the trust bundles of these signers still holding its root
  (by the root's SHA-256).
- Pods are read (by the caller) only while a revocation is followed; past `max_leaf_lifetime`
  every leaf it signed has expired, so pods are not judged.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from podcert.api.times import format_time
from signer import revokeplan
from signer.authority import ca as authority_ca
from signer.authority import revoke, schedule


def _time(value: dt.datetime | None) -> str | None:
    return format_time(value) if value is not None else None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


@dataclass(frozen=True)
class RevocationState:
    """A revoked CA generation and what still holds it."""

    id: str
    revoked_at: dt.datetime
    untrusted: bool  # the CA Secret records its root as out of the trust bundles
    bundles_with_root: tuple[str, ...]  # trust bundles of these signers still holding its root
    # The live pods whose newest leaf chains to it; None when pods were not read (every leaf
    # it signed has expired) or could not be (`pods_problem`).
    stale: tuple[revokeplan.Stale, ...] | None
    unverified: tuple[revokeplan.Pod, ...]  # made before it, no issued request left to judge
    pods_problem: str | None = None

    @property
    def in_progress(self) -> bool:
        return bool(self.stale or self.unverified or self.bundles_with_root) or (
            self.pods_problem is not None
        )

    def as_json(self) -> dict[str, Any]:
        stale = self.stale or ()
        return {
            "id": self.id,
            "revokedAt": _time(self.revoked_at),
            "inProgress": self.in_progress,
            "rootUntrustedByCA": self.untrusted,
            "rootInTrustBundles": bool(self.bundles_with_root),
            "trustBundlesWithRoot": list(self.bundles_with_root),
            "podsRead": self.stale is not None,
            "podsProblem": self.pods_problem,
            "livePods": None if self.stale is None else len(stale),
            "liveLeaves": None if self.stale is None else sum(s.leaves for s in stale),
            "onShimNodes": None
            if self.stale is None
            else sum(1 for s in stale if s.replacer == "shim"),
            "onKubeletNodes": None
            if self.stale is None
            else sum(1 for s in stale if s.replacer == "kubelet"),
            "unverifiedPods": None if self.stale is None else len(self.unverified),
            "pods": [
                {
                    "namespace": s.pod.namespace,
                    "name": s.pod.name,
                    "node": s.pod.node,
                    "replacedBy": s.replacer,
                    "why": s.why,
                }
                for s in stale
            ],
        }


def followed(
    revoked: Sequence[revoke.Revocation],
    now: dt.datetime,
    settings: schedule.Settings = schedule.DEFAULT_SETTINGS,
) -> list[revoke.Revocation]:
    """The revocations `status` follows: the root still trusted by the CA, or a leaf the
    generation signed possibly still valid (none outlives `max_leaf_lifetime`)."""
    return [
        r for r in revoked if not r.untrusted or now < r.revoked_at + settings.max_leaf_lifetime
    ]


def _root_fingerprints(bundle: Mapping[str, Any]) -> frozenset[str]:
    try:
        roots = x509.load_pem_x509_certificates(str(_spec(bundle).get("trustBundle")).encode())
    except ValueError:
        return frozenset()
    return frozenset(revoke.fingerprint(r) for r in roots)


def revocations(
    revoked: Sequence[revoke.Revocation],
    bundles: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]] | str | None,
    requests: Sequence[Mapping[str, Any]],
    signer_names: Sequence[str],
    now: dt.datetime,
    settings: schedule.Settings = schedule.DEFAULT_SETTINGS,
) -> tuple[RevocationState, ...]:
    """Each followed revocation against the trust bundles, pods and requests (all already of
    these signers); `pods` None: not read, a string: why they could not be."""
    roots = [(str(_meta(b).get("name", "")), _root_fingerprints(b)) for b in bundles]
    live = [revokeplan.pod_of(p) for p in pods] if not isinstance(pods, str | None) else []
    issued = [i for i in map(revokeplan.issued_of, requests) if i is not None]
    out = []
    for r in followed(revoked, now, settings):
        holding = tuple(sorted(name for name, fps in roots if r.root_sha256 in fps))
        expired = now >= r.revoked_at + settings.max_leaf_lifetime
        if pods is None or isinstance(pods, str) or expired:
            problem = pods if isinstance(pods, str) and not expired else None
            out.append(RevocationState(r.id, r.revoked_at, r.untrusted, holding, None, (), problem))
            continue
        stale = revokeplan.stale_pods(live, issued, [r])
        unverified = revokeplan.unverified(live, issued, signer_names, r.revoked_at)
        out.append(
            RevocationState(
                r.id, r.revoked_at, r.untrusted, holding, tuple(stale), tuple(unverified)
            )
        )
    return tuple(out)


def revoked_of(secret: Mapping[str, bytes] | str) -> list[revoke.Revocation]:
    """The CA Secret's revocations; none when it is unread or they are unreadable (the CA's
    own problem line says why the Secret is unusable)."""
    if isinstance(secret, str):
        return []
    try:
        return revoke.from_secret(secret)
    except authority_ca.CAError:
        return []
