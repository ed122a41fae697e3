"""Which pods hold a leaf of a revoked CA generation, and how each is replaced: pure decisions.

A pod's credential is judged by its PodCertificateRequests: for each signer name, the newest
issued request of the pod (by its UID) holds the chain the pod was last given. The pod is stale
when that chain was signed by a revoked generation (`revoke.chains_to`). A pod with a
podCertificate volume for one of `signer_names` and no issued request for it at all (the API
server deletes old requests) is stale too: nothing shows its leaf is from a good generation.

A pod created after the revocation is never stale for want of a request: its first leaf came
from a good generation.

A pod is re-keyed by the shim when the requests for it were made by the shim (a pod with none
left: when those of the other pods on its node were) (their
managedFields manager is podcert's, `SHIM_MANAGER`); any other maker is a kubelet, which ignores
the rotate-before annotation, so its pod is evicted (or, by choice, left to its next refresh).
As `kubectl drain`, a kubelet pod no controller owns is evicted only when forced: its eviction
deletes it for good (`waves`, `unowned`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from cryptography import x509

from podcert.api.times import parse_time
from signer.authority import revoke

# The annotation the shim honours (`kubelet_shim.kube.ROTATE_ANNOTATION`; the signer may not
# import the shim, a unit test holds the two equal).
ROTATE_ANNOTATION: Final = "podcert.dev/rotate-before"
# The managedFields manager of what podcert's clients write (their user agent's product).
SHIM_MANAGER: Final = "podcert"

Replacer = Literal["shim", "kubelet"]


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    uid: str
    node: str
    signer_names: frozenset[str]  # of its podCertificate volumes
    terminating: bool = False
    created: dt.datetime | None = None
    controlled: bool = True  # an ownerReference with controller: true (it comes back evicted)


@dataclass(frozen=True)
class Issued:
    """One issued PodCertificateRequest, as far as the decision reads it."""

    pod_uid: str
    signer_name: str
    created: dt.datetime
    chain: tuple[x509.Certificate, ...]  # leaf first
    manager: str  # who created it (managedFields)


@dataclass(frozen=True)
class Stale:
    pod: Pod
    replacer: Replacer
    why: str
    leaves: int = 1  # its signer names whose newest leaf chains to a revoked generation


def stale_pods(
    pods: Iterable[Pod],
    issued: Iterable[Issued],
    revoked: Sequence[revoke.Revocation],
    signer_names: Iterable[str] = (),
) -> list[Stale]:
    """The live pods still holding a leaf of a revoked generation, each with who replaces it."""
    newest: dict[tuple[str, str], Issued] = {}
    for item in issued:
        key = (item.pod_uid, item.signer_name)
        if key not in newest or item.created >= newest[key].created:
            newest[key] = item
    watched = frozenset(signer_names)
    since = min((r.revoked_at for r in revoked), default=None)
    pods = list(pods)
    node_of = {p.uid: p.node for p in pods}
    node_makers: dict[str, set[str]] = {}
    for (uid, _), item in newest.items():
        if uid in node_of:
            node_makers.setdefault(node_of[uid], set()).add(item.manager)
    out = []
    for pod in pods:
        if pod.terminating:
            continue
        mine = {s: i for (uid, s), i in newest.items() if uid == pod.uid}
        hits = [
            (signer, hit.id)
            for signer, item in sorted(mine.items())
            if (hit := next((r for r in revoked if revoke.chains_to(item.chain, r)), None))
        ]
        why = f"{hits[0][0]}: its leaf was signed by revoked CA {hits[0][1]}" if hits else ""
        if not why and _before(pod, since):
            missing = sorted((pod.signer_names & watched) - mine.keys())
            if missing:
                why = f"{missing[0]}: no issued request shows where its leaf came from"
        if why:
            # No request left of its own: the node's other pods' makers say who serves it.
            makers = {i.manager for i in mine.values()} or node_makers.get(pod.node, set())
            replacer: Replacer = (
                "shim" if makers and all(m.startswith(SHIM_MANAGER) for m in makers) else "kubelet"
            )
            out.append(Stale(pod, replacer, why, max(1, len(hits))))
    return sorted(out, key=lambda s: (s.pod.node, s.pod.namespace, s.pod.name))


def _before(pod: Pod, since: dt.datetime | None) -> bool:
    """Whether `pod` may have got a leaf before `since` (unknown creation: it may)."""
    return since is None or pod.created is None or pod.created < since


def unverified(
    pods: Iterable[Pod],
    issued: Iterable[Issued],
    signer_names: Iterable[str],
    since: dt.datetime,
) -> list[Pod]:
    """The live pods made before `since` with a podCertificate volume for one of
    `signer_names` and no issued request for it left (the controller-manager deletes requests
    after 15 minutes): nothing in the cluster says which generation signed their leaf."""
    have = {(i.pod_uid, i.signer_name) for i in issued}
    watched = frozenset(signer_names)
    return sorted(
        (
            p
            for p in pods
            if not p.terminating
            and _before(p, since)
            and any((p.uid, s) not in have for s in p.signer_names & watched)
        ),
        key=lambda p: (p.node, p.namespace, p.name),
    )


def unowned(stale: Sequence[Stale]) -> list[Stale]:
    """The kubelet nodes' pods no controller owns: evicting one deletes it for good."""
    return [s for s in stale if s.replacer == "kubelet" and not s.pod.controlled]


def in_place(stale: Sequence[Stale], *, wait_refresh: bool, force: bool) -> list[Stale]:
    """The kubelet nodes' pods left to refresh in place (not evicted): all of them with
    `wait_refresh`, else those no controller owns unless `force`. Their kubelets write the new
    credential at the pod's next sync, after the request is issued."""
    if wait_refresh:
        return [s for s in stale if s.replacer == "kubelet"]
    return [] if force else unowned(stale)


def waves(stale: Sequence[Stale], size: int, *, force: bool = False) -> list[list[Stale]]:
    """The kubelet nodes' pods in eviction waves of at most `size` pods, node by node in order
    (as `kubectl drain` takes one node at a time); at least one pod per wave. Pods no controller
    owns are left out unless `force`."""
    pods = [s for s in stale if s.replacer == "kubelet" and (force or s.pod.controlled)]
    size = max(1, size)
    return [pods[i : i + size] for i in range(0, len(pods), size)]


def progress_line(revoked_id: str, stale: Sequence[Stale], elapsed: dt.timedelta) -> str:
    by = {"shim": 0, "kubelet": 0}
    for s in stale:
        by[s.replacer] += 1
    return (
        f"[{elapsed.total_seconds():6.1f}s] {len(stale)} live pod(s) still chain to {revoked_id} "
        f"({by['shim']} on shim nodes, {by['kubelet']} on kubelet nodes)"
    )


# --- reading the API's objects -----------------------------------------------------------------


def pod_of(obj: Mapping[str, Any]) -> Pod:
    """A pod as the decisions read it (a pod done running, or being deleted, is terminating)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    return Pod(
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
        str(meta.get("uid", "")),
        str(spec.get("nodeName") or ""),
        frozenset(_signer_names(spec)),
        terminating=bool(meta.get("deletionTimestamp"))
        or (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
        created=parse_time(str(meta.get("creationTimestamp", ""))),
        controlled=any(
            isinstance(ref, Mapping) and ref.get("controller") is True
            for ref in meta.get("ownerReferences") or []
        ),
    )


def _signer_names(spec: Mapping[str, Any]) -> Iterator[str]:
    for volume in spec.get("volumes") or []:
        for source in ((volume or {}).get("projected") or {}).get("sources") or []:
            name = ((source or {}).get("podCertificate") or {}).get("signerName")
            if isinstance(name, str):
                yield name


def issued_of(obj: Mapping[str, Any]) -> Issued | None:
    """An issued request with its chain and maker; None for one not issued or unreadable (no
    evidence either way)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    pem = (obj.get("status") or {}).get("certificateChain")
    created = parse_time(str(meta.get("creationTimestamp", "")))
    if not isinstance(pem, str) or not pem or created is None:
        return None
    try:
        chain = tuple(x509.load_pem_x509_certificates(pem.encode()))
    except ValueError:
        return None
    managers: list[Any] = meta.get("managedFields") or [{}]
    return Issued(
        str(spec.get("podUID", "")),
        str(spec.get("signerName", "")),
        created,
        chain,
        str((managers[0] or {}).get("manager", "")),
    )
