"""Which version changes the devcluster takes, and in what order an upgrade runs: Kubernetes'
version skew policy as pure functions of the versions involved.

The rules (kubernetes.io/releases/version-skew-policy, and what kubeadm enforces):

- The control plane moves up one minor at a time, never down: kube-apiserver first, then
  kube-controller-manager and kube-scheduler (never newer than the API server they talk to).
  etcd keeps its data and its version (one etcd serves every offered minor).
- A kubelet is never newer than the API server, and at most three minors older; so the control
  plane is not upgraded while a kubelet would fall more than three minors behind it.
- A kubelet moves up any number of minors within that window, never down.

Every decision returns what to do or a `Refused` whose reason is one line for the user; a step
already done is left out, so an interrupted upgrade is finished by asking for it again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

KUBE_APISERVER = "kube-apiserver"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
# kubeadm's order: the API server first (its clients may lag it by one minor, never lead it).
UPGRADE_ORDER = (KUBE_APISERVER, CONTROLLER_MANAGER, SCHEDULER)
# How many minors a kubelet may run behind the API server.
KUBELET_MAX_LAG = 3

_MINOR = re.compile(r"(\d+)\.(\d+)")


@dataclass(frozen=True, order=True)
class Minor:
    """A Kubernetes minor ("1.36"), ordered as releases are."""

    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    def behind(self, other: Minor) -> int:
        """How many minors `self` runs behind `other` (negative when ahead); the majors must
        agree."""
        if self.major != other.major:
            raise ValueError(f"{self} and {other} are of different majors")
        return other.minor - self.minor


@dataclass(frozen=True)
class Refused:
    """A version change the policy does not allow; `reason` is the one line the user sees."""

    reason: str


class RefusedError(ValueError):
    """A `Refused` raised at the edges, where a caller asked for the change (the CLI says its
    reason and exits 2)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def require(found: T | Refused) -> T:
    """`found`, unless it is a refusal: then `RefusedError`."""
    if isinstance(found, Refused):
        raise RefusedError(found.reason)
    return found


def parse(text: str) -> Minor | Refused:
    match = _MINOR.fullmatch(text.strip())
    if match is None:
        return Refused(f"{text!r} is not a Kubernetes minor (like 1.37)")
    return Minor(int(match.group(1)), int(match.group(2)))


def offered(version: str, offer: tuple[str, ...]) -> Minor | Refused:
    """`version` parsed, when the devcluster offers it."""
    found = parse(version)
    if isinstance(found, Refused):
        return found
    if str(found) not in offer:
        return Refused(
            f"Kubernetes {found} is not offered (the devcluster offers {', '.join(offer)})"
        )
    return found


def _same_major(a: Minor, b: Minor) -> Refused | None:
    if a.major != b.major:
        return Refused(f"Kubernetes {a} and {b} are of different majors")
    return None


def kubelet_allowed(kubelet: Minor, apiserver: Minor, node: str = "") -> Refused | None:
    """May a kubelet of `kubelet` run against an API server of `apiserver`?"""
    who = f"node {node}'s kubelet" if node else "a kubelet"
    refused = _same_major(kubelet, apiserver)
    if refused:
        return refused
    lag = kubelet.behind(apiserver)
    if lag < 0:
        return Refused(
            f"{who} {kubelet} would be newer than the API server ({apiserver}): "
            "upgrade the control plane first"
        )
    if lag > KUBELET_MAX_LAG:
        return Refused(
            f"{who} {kubelet} would be {lag} minors older than the API server ({apiserver}); "
            f"kubelets may run at most {KUBELET_MAX_LAG} behind"
        )
    return None


def control_plane_steps(
    running: Mapping[str, Minor], target: Minor, kubelets: Mapping[str, Minor]
) -> tuple[str, ...] | Refused:
    """The components to restart on `target`, in order, given the version each of
    `UPGRADE_ORDER` runs and each node's kubelet. Empty when everything runs `target` already."""
    apiserver = running[KUBE_APISERVER]
    refused = _same_major(apiserver, target)
    if refused:
        return refused
    if target < apiserver:
        return Refused(
            f"cannot downgrade the control plane from {apiserver} to {target} "
            "(Kubernetes does not support downgrades)"
        )
    if apiserver.behind(target) > 1:
        step = Minor(apiserver.major, apiserver.minor + 1)
        return Refused(
            f"cannot upgrade the control plane from {apiserver} to {target} in one step: "
            f"upgrade to {step} first (one minor at a time)"
        )
    for node, kubelet in sorted(kubelets.items()):
        if kubelet.behind(target) > KUBELET_MAX_LAG:
            return Refused(
                f"node {node}'s kubelet {kubelet} would fall {kubelet.behind(target)} minors "
                f"behind {target} (at most {KUBELET_MAX_LAG}): upgrade that node first"
            )
    for component in UPGRADE_ORDER:
        if running[component] > target:
            return Refused(f"{component} runs {running[component]}, newer than the target {target}")
    return tuple(c for c in UPGRADE_ORDER if running[c] != target)


@dataclass(frozen=True)
class KubeletUpgrade:
    """One node's kubelet to move from `current` to `target` (equal: nothing to do)."""

    node: str
    current: Minor
    target: Minor

    @property
    def needed(self) -> bool:
        return self.current != self.target


def kubelet_upgrade(
    node: str, kubelets: Mapping[str, Minor], apiserver: Minor, target: Minor | None = None
) -> KubeletUpgrade | Refused:
    """Upgrade `node`'s kubelet to `target` (default: the API server's minor), given every
    started node's kubelet."""
    if node not in kubelets:
        started = ", ".join(sorted(kubelets)) or "none"
        return Refused(f"no kubelet was started for node {node} (started: {started})")
    current = kubelets[node]
    goal = apiserver if target is None else target
    refused = _same_major(current, goal)
    if refused:
        return refused
    if goal < current:
        return Refused(
            f"cannot downgrade node {node}'s kubelet from {current} to {goal} "
            "(Kubernetes does not support downgrades)"
        )
    refused = kubelet_allowed(goal, apiserver, node)
    if refused:
        return refused
    return KubeletUpgrade(node, current, goal)
