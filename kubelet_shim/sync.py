"""One pod's projected volumes brought in line with what the agent's caches say.

A work item is a pod, so one worker at a time owns each pod's volumes (the atomic writer needs a
single writer per volume). Every podCertificate source is planned by `CertificateSources`, every
clusterTrustBundle source is resolved from the watched bundles, and each volume that changed is
published as one atomic version. A volume whose way holds a link is refused, never written; a
pod that is gone loses its files and its unanswered requests.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from collections.abc import Callable, Mapping

from kubelet_shim import projection, trust
from kubelet_shim.certificates import CertificateSources
from kubelet_shim.kube import ShimApi
from kubelet_shim.metrics import Metrics
from kubelet_shim.state import Caches, Memory, Pod, Requeue, VolumePlan, log_context
from kubelet_shim.storage import FileSpec, Storage, StorageError, UnsafeDirectoryError
from podcert.api.pods import CertificateSource, ProjectedVolume, TrustBundleSource
from podcert.client.rest import ApiError

log = logging.getLogger("podcert.shim")


class PodSync:
    """Reconciles one pod at a time; the worker holding the pod calls `reconcile`."""

    def __init__(
        self,
        kube: ShimApi,
        storage: Storage,
        caches: Caches,
        metrics: Metrics,
        *,
        settings: projection.Settings,
        clock: Callable[[], dt.datetime],
        rng: random.Random,
    ) -> None:
        self.kube = kube
        self.storage = storage
        self.caches = caches
        self.metrics = metrics
        self.clock = clock
        # Per pod, owned by whichever worker holds it (the queue never gives a pod to two).
        self.memory: dict[str, Memory] = {}
        self.sources = CertificateSources(
            kube, caches, metrics, settings=settings, clock=clock, rng=rng, event=self.event
        )

    def reconcile(self, uid: str) -> Requeue:
        """Bring one pod's projected files in line with what the caches say."""
        with self.caches.lock:
            pod = self.caches.pods.get(uid)
        if pod is None:
            return self._forget_pod(uid)
        now = self.clock()
        requeue = Requeue()
        memory = self.memory.setdefault(uid, Memory())
        if pod.volumes.errors and memory.first(("volume-errors",)):
            problems = "; ".join(str(e) for e in pod.volumes.errors)
            self.event(pod, "Warning", "InvalidProjectedVolume", problems, now)
        for volume in pod.volumes.volumes:
            if any(isinstance(s, CertificateSource | TrustBundleSource) for s in volume.sources):
                self._sync_volume(pod, memory, volume, now, requeue)
        return requeue

    def _sync_volume(
        self,
        pod: Pod,
        memory: Memory,
        volume: ProjectedVolume,
        now: dt.datetime,
        requeue: Requeue,
    ) -> None:
        uid = pod.ref.uid
        try:
            current = self._current(uid, memory, volume.name)
        except UnsafeDirectoryError as err:
            # Refused before anything is planned: no new key or request for a volume that
            # cannot be written.
            self._refuse_volume(pod, memory, volume.name, err, now, requeue)
            return
        plan = VolumePlan()
        # The atomic writer takes one owner per volume: that of the first source we serve
        # (its `user`, else the volume's defaultUser). Sources that disagree are rare and alpha.
        owner: int | None = None
        for source in volume.sources:
            if isinstance(source, CertificateSource):
                self.sources.plan(pod, memory, volume, source, current, plan, now, requeue)
            elif isinstance(source, TrustBundleSource):
                self._plan_trust(pod, memory, volume, source, current, plan, now)
            else:
                continue
            if owner is None:
                owner = volume.owner_of(source)

        if plan.files != current:
            files = {path: FileSpec(data, plan.modes[path]) for path, data in plan.files.items()}
            started = self.clock()
            try:
                self.storage.write_volume(uid, volume.name, files, owner)
            except UnsafeDirectoryError as err:
                # As below, the new key waits in its state; the retry reads the disk again.
                self._refuse_volume(pod, memory, volume.name, err, now, requeue)
                plan.written.clear()
            except StorageError as err:
                # The previous version is intact; the new key stays in its Fresh state for the
                # retry. The error names a path and a cause, never file content.
                self.metrics.writes.labels(result="error").inc()
                log.error("cannot write volume: %s", err, extra=log_context(pod, volume.name))
                requeue.retry = True
                plan.written.clear()
            else:
                self.metrics.writes.labels(result="ok").inc()
                memory.disk[volume.name] = dict(plan.files)
                memory.noted.discard(("unsafe-volume", volume.name))
                # How long the write took (its fsyncs): a slow disk delays every credential.
                took = (self.clock() - started).total_seconds()
                log.info(
                    "published volume (%d files, written in %.3f s)",
                    len(files),
                    took,
                    extra=log_context(pod, volume.name),
                )
        for key, request_name in plan.written:
            self.sources.step(pod, key, projection.CredentialWritten(request_name), now)

        for source in volume.sources:
            if isinstance(source, CertificateSource):
                self.sources.after(pod, memory, source, now, requeue)

    def _current(self, uid: str, memory: Memory, volume: str) -> dict[str, bytes]:
        """What the volume holds: remembered from our last write, or read once from disk.
        Raises UnsafeDirectoryError when the way to it holds a link (or `..data` points
        elsewhere): such a volume is neither adopted nor written."""
        known = memory.disk.get(volume)
        if known is not None:
            return known
        try:
            # First look at this volume since the start: finish whatever a previous run was
            # killed in the middle of, since content found current is not written again.
            self.storage.recover_volume(uid, volume)
        except UnsafeDirectoryError:
            raise
        except StorageError as err:
            log.warning("cannot finish an interrupted write: %s", err, extra={"pod_uid": uid})
        try:
            content = dict(self.storage.read_volume(uid, volume) or {})
        except UnsafeDirectoryError:
            raise
        except StorageError as err:
            log.warning("volume unreadable, will replace it: %s", err, extra={"pod_uid": uid})
            content = {}
        memory.disk[volume] = content
        memory.noted.discard(("unsafe-volume", volume))  # told again if it happens again
        return content

    def _refuse_volume(
        self,
        pod: Pod,
        memory: Memory,
        volume: str,
        err: UnsafeDirectoryError,
        now: dt.datetime,
        requeue: Requeue,
    ) -> None:
        """A link (or a non-directory) where the volume's directories should be: leave the
        volume alone, tell the pod's owner once, and look again with backoff (up to 5 min),
        so the volume is served again once the directory is put right."""
        memory.disk.pop(volume, None)  # the retry reads the disk again before planning
        self.metrics.writes.labels(result="error").inc()
        requeue.retry = True
        if memory.first(("unsafe-volume", volume)):
            self.event(
                pod,
                "Warning",
                "UnsafeVolumeDirectory",
                f"cannot write volume {volume!r}: {err}",
                now,
            )
        else:
            log.debug("volume still refused: %s", err, extra=log_context(pod, volume))

    def _plan_trust(
        self,
        pod: Pod,
        memory: Memory,
        volume: ProjectedVolume,
        source: TrustBundleSource,
        current: Mapping[str, bytes],
        plan: VolumePlan,
        now: dt.datetime,
    ) -> None:
        with self.caches.lock:
            resolved = trust.resolve(source, self.caches.bundles)
        if resolved.content is not None:
            plan.put(source.path, resolved.content, volume.default_mode)
            memory.noted.discard(("trust-missing", source.volume, source.index))
            return
        # A required bundle is missing: keep what the pod has (the kubelet would not start it).
        if source.path in current:
            plan.put(source.path, current[source.path], volume.default_mode)
        if memory.first(("trust-missing", source.volume, source.index)):
            self.event(pod, "Warning", "TrustBundleUnavailable", str(resolved.problem), now)

    def _forget_pod(self, uid: str) -> Requeue:
        """Remove a deleted pod's files and its requests still waiting for an answer."""
        requeue = Requeue()
        try:
            self.storage.remove_pod(uid)
        except UnsafeDirectoryError as err:
            # Terminal: removing through a link could delete what it points to. An operator
            # removes what was planted; nothing else will change by retrying.
            log.error("left the pod's files alone: %s", err, extra={"pod_uid": uid})
        except StorageError as err:
            log.error("cannot remove the pod's files: %s", err, extra={"pod_uid": uid})
            requeue.retry = True
        self.memory.pop(uid, None)
        with self.caches.lock:
            self.caches.tracked = {k: v for k, v in self.caches.tracked.items() if k.pod_uid != uid}
            pending = [
                self.caches.pcrs[k]
                for k in self.caches.pcrs_by_pod.get(uid, ())
                if self.caches.pcrs[k].status.outcome is None
            ]
        for pcr in pending:
            try:
                deleted = self.kube.delete_pcr(pcr.namespace, pcr.name, pcr.metadata.uid)
            except ApiError as err:
                self.metrics.errors.labels(operation="delete_request").inc()
                log.warning("cannot delete request: %s", err, extra={"request": pcr.name})
                requeue.retry = True
                continue
            extra = {"namespace": pcr.namespace, "request": pcr.name}
            if deleted:
                log.info("deleted the pending request of a deleted pod", extra=extra)
            else:
                # Nodes may not delete requests; the garbage collector follows ownerReferences.
                log.debug("pending request of a deleted pod left to the collector", extra=extra)
        return requeue

    def event(self, pod: Pod, kind: str, reason: str, message: str, now: dt.datetime) -> None:
        level = logging.WARNING if kind == "Warning" else logging.INFO
        log.log(level, "%s: %s", reason, message, extra=log_context(pod, None))
        self.kube.record_event(pod.ref, kind, reason, message, now)
