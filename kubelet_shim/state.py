"""What the node agent knows and remembers, shared by its parts.

`Caches` holds what the reflectors feed (the node's pods, their PodCertificateRequests, the
ClusterTrustBundles) and the state of every projection, under one lock. `Memory` is what the agent
remembers about one pod between reconciles, owned by whichever worker holds the pod; `Requeue` is
what one reconcile asks of that worker; `VolumePlan` the files one volume should hold. `pod_from`
reads a pod object into what the agent serves.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from kubelet_shim import projection, trust
from kubelet_shim.kube import ROTATE_ANNOTATION, PodRef
from kubelet_shim.projection import ProjectionState
from podcert.api.keys import PrivateKey
from podcert.api.pods import PodVolumes, TrustBundleSource, WorkKey, parse_pod
from podcert.api.requests import Read
from podcert.api.times import parse_time

log = logging.getLogger("podcert.shim")

# Pods in these phases run nothing any more: their files stay until the pod is deleted, but no
# new request is made for them (the signer would deny it anyway).
TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class Pod:
    ref: PodRef
    volumes: PodVolumes
    force_after: dt.datetime | None
    terminal: bool

    @property
    def has_trust_sources(self) -> bool:
        return any(isinstance(s, TrustBundleSource) for _, s in self.volumes.work_items())


@dataclass(frozen=True)
class Tracked:
    signer_name: str
    state: projection.State
    force_after: dt.datetime | None


class Caches:
    """Fed by the reflectors, read by the workers; every field is guarded by `lock`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pods: dict[str, Pod] = {}
        self.pcrs: dict[tuple[str, str], Read] = {}
        self.pcrs_by_pod: dict[str, set[tuple[str, str]]] = {}
        self.bundles: dict[str, trust.Bundle] = {}
        self.tracked: dict[WorkKey, Tracked] = {}


@dataclass
class Requeue:
    """What one reconcile asks of its worker: look at the pod again at `wake_at`, or retry with
    backoff; with neither, the pod waits for its next event. Not a request's settled outcome
    (`podcert.api.requests.Outcome`), which the shim reads but never decides."""

    wake_at: dt.datetime | None = None
    retry: bool = False

    def wake(self, at: dt.datetime | None) -> None:
        if at is not None and (self.wake_at is None or at < self.wake_at):
            self.wake_at = at


@dataclass
class Memory:
    """What the agent remembers about one pod between reconciles. Only the worker holding the
    pod touches it, so it needs no lock; it is dropped with the pod."""

    disk: dict[str, dict[str, bytes]] = field(default_factory=dict)  # volume -> files
    adopted: set[WorkKey] = field(default_factory=set)  # disk content already considered
    reported: dict[WorkKey, ProjectionState] = field(default_factory=dict)  # for stale events
    noted: set[tuple[object, ...]] = field(default_factory=set)  # one-off events already sent
    # The key of each source's create whose outcome is not known (no answer, or an error):
    # the next create for that source uses it again, so it names the same request and meets
    # the first one if the API server applied it. Dropped once a create is answered.
    unanswered: dict[WorkKey, PrivateKey] = field(default_factory=dict, repr=False)

    def first(self, note: tuple[object, ...]) -> bool:
        """True the first time `note` is seen (one-off events are not repeated per reconcile)."""
        if note in self.noted:
            return False
        self.noted.add(note)
        return True


@dataclass
class VolumePlan:
    """The files one volume should hold, built source by source."""

    files: dict[str, bytes] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)
    written: list[tuple[WorkKey, str]] = field(default_factory=list)  # credentials to confirm

    def put(self, path: str, data: bytes, mode: int) -> None:
        self.files[path] = data
        self.modes[path] = mode


def pod_from(obj: Mapping[str, Any]) -> Pod | None:
    volumes = parse_pod(obj)
    if not volumes.uid:
        return None
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    force_after = None
    raw = annotations.get(ROTATE_ANNOTATION) if isinstance(annotations, Mapping) else None
    if raw is not None:
        force_after = parse_time(raw)
        if force_after is None:
            log.warning(
                "ignoring %s=%r: not an RFC 3339 time",
                ROTATE_ANNOTATION,
                raw,
                extra={"namespace": volumes.namespace, "pod": volumes.name},
            )
    phase = (obj.get("status") or {}).get("phase")
    return Pod(
        ref=PodRef(volumes.namespace, volumes.name, volumes.uid),
        volumes=volumes,
        force_after=force_after,
        terminal=phase in TERMINAL_PHASES,
    )


def log_context(pod: Pod, volume: str | None) -> dict[str, str]:
    """Log context for a pod ("name" is taken by logging itself)."""
    extra = {"namespace": pod.ref.namespace, "pod": pod.ref.name}
    if volume is not None:
        extra["volume"] = volume
    return extra
