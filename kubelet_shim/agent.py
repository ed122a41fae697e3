"""The node agent: the kubelet's half of Pod Certificates for the pods bound to one node.

Level-based, like the signer's controller. Three reflectors (the node's pods, the node's
PodCertificateRequests, all ClusterTrustBundles) keep caches and enqueue pod UIDs; a work item
is a pod, so one worker at a time owns each pod's volumes (the atomic writer needs a single
writer per volume). Reconciling a pod (`kubelet_shim.sync`) drives every podCertificate source
through the pure `projection.step` (`kubelet_shim.certificates`), resolves every clusterTrustBundle
source from the watched bundles, and publishes each volume that changed as one atomic version.
The workers, their wait for the caches, signals and start-up come from `podcert.reconcile.runtime`
(`pool()`); `kubelet_shim.build` wires the process.

What it does better than the kubelet: after a restart it adopts the fresh credentials already on
disk (no new keys, no new requests); trust bundles follow a watch instead of a 5-minute cache;
an operator can force re-keying through a pod annotation. Private keys live in a `Pending`
state until written and then only in the pod's files; they are never logged.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kubelet_shim import projection, trust
from kubelet_shim.kube import ShimApi
from kubelet_shim.metrics import Metrics
from kubelet_shim.projection import ProjectionState
from kubelet_shim.state import Caches, Requeue, pod_from
from kubelet_shim.storage import Storage, StorageError
from kubelet_shim.sync import PodSync
from podcert.api.pods import WorkKey
from podcert.api.requests import Read, key_of
from podcert.client.rest import JSON
from podcert.reconcile.reflector import Reflector
from podcert.reconcile.runtime import Synced, WorkerPool
from podcert.reconcile.workqueue import WorkQueue

log = logging.getLogger("podcert.shim")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Settings:
    # Each pod waits on the network (request) or the disk (fsync of a new volume version):
    # threads are cheap, and 4 left 200 pods queued for seconds (bench_time_to_credential).
    workers: int = 16
    projection: projection.Settings = projection.DEFAULT_SETTINGS
    # The longest a pod sleeps between reconciles even when nothing is due: a safety net for
    # wall-clock jumps (timers run on the monotonic clock), not an API poll.
    resync: dt.timedelta = dt.timedelta(hours=1)


class Agent:
    def __init__(
        self,
        kube: ShimApi,
        storage: Storage,
        *,
        settings: Settings = Settings(),
        clock: Callable[[], dt.datetime] = utcnow,
        rng: random.Random | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """`stop` ends the reflectors' watches (the runtime's `stopping`)."""
        self.kube = kube
        self.storage = storage
        self.settings = settings
        self.clock = clock
        self.rng = rng or random.Random()  # noqa: S311 (refresh jitter, not secrets)
        self.metrics = Metrics(self.projection_states)
        self.queue: WorkQueue[str] = WorkQueue(base_delay=0.2, max_delay=300.0)
        self._stop = stop if stop is not None else threading.Event()
        self.caches = Caches()  # fed by the reflectors
        self.reflectors: list[Reflector] = [
            Reflector(
                "pods",
                kube.list_pods,
                kube.watch_pods,
                self.on_pod_list,
                self.on_pod_event,
                self._stop,
            ),
            Reflector(
                "podcertificaterequests",
                kube.list_pcrs,
                kube.watch_pcrs,
                self.on_pcr_list,
                self.on_pcr_event,
                self._stop,
            ),
            Reflector(
                "clustertrustbundles",
                kube.list_trust_bundles,
                kube.watch_trust_bundles,
                self.on_bundle_list,
                self.on_bundle_event,
                self._stop,
            ),
        ]
        self.sync = PodSync(
            kube,
            storage,
            self.caches,
            self.metrics,
            settings=settings.projection,
            clock=clock,
            rng=self.rng,
        )

    # --- running on the runtime ------------------------------------------------------------

    def pool(self) -> WorkerPool[str]:
        """The workers. They start only once every cache is whole, however long that takes:
        a pod missing from a half-done list would look deleted, a request missing would look
        vanished, and nothing is decided on that."""
        return WorkerPool(
            "worker",
            self.queue,
            self._reconcile,
            workers=self.settings.workers,
            waits_for=[Synced(r.name, r.synced) for r in self.reflectors],
            sync_timeout=None,
            on_synced=self._on_synced,
            context=_ctx,
            logger=log,
        )

    def _on_synced(self) -> None:
        self.sweep()
        log.info("caches synced; %d pods on node %s", len(self.caches.pods), self.kube.node_name)

    def sweep(self) -> None:
        """After the first sync: queue every known pod, the pods that left files on disk while
        the shim was away, and the pods that left pending requests behind."""
        with self.caches.lock:
            known = set(self.caches.pods)
            pending_of_gone = {
                pcr.spec.pod_uid
                for pcr in self.caches.pcrs.values()
                if pcr.spec.pod_uid not in known and pcr.status.outcome is None
            }
        try:
            on_disk = set(self.storage.list_pods())
        except (OSError, StorageError) as err:
            log.error("cannot list the pods on disk: %s", err)
            on_disk = set()
        for uid in sorted(known | on_disk | pending_of_gone):
            if uid:
                self.queue.add(uid)

    # --- reflector callbacks ---------------------------------------------------------------

    def on_pod_list(self, items: list[JSON]) -> None:
        fresh = {pod.ref.uid: pod for pod in map(pod_from, items) if pod is not None}
        with self.caches.lock:
            gone = set(self.caches.pods) - set(fresh)
            self.caches.pods = fresh
        for uid in sorted(set(fresh) | gone):
            self.queue.add(uid)

    def on_pod_event(self, kind: str, obj: JSON) -> None:
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        if not uid:
            return
        pod = None if kind == "DELETED" else pod_from(obj)
        with self.caches.lock:
            if pod is None:
                self.caches.pods.pop(uid, None)
            else:
                self.caches.pods[uid] = pod
        self.queue.add(uid)

    def on_pcr_list(self, items: list[Read]) -> None:
        with self.caches.lock:
            self.caches.pcrs, self.caches.pcrs_by_pod = {}, {}
            for obj in items:
                self._index_pcr(obj, present=True)
            # Requests of pods we serve, and pending ones whose pod is gone (to clean up).
            uids = {
                obj.spec.pod_uid
                for obj in items
                if obj.spec.pod_uid in self.caches.pods or obj.status.outcome is None
            }
        for uid in sorted(uids):
            if uid:
                self.queue.add(uid)

    def on_pcr_event(self, kind: str, obj: Read) -> None:
        uid = obj.spec.pod_uid
        with self.caches.lock:
            self._index_pcr(obj, present=kind != "DELETED")
            wanted = uid in self.caches.pods or (kind != "DELETED" and obj.status.outcome is None)
        if uid and wanted:
            self.queue.add(uid)

    def _index_pcr(self, obj: Read, *, present: bool) -> None:
        key = key_of(obj)
        if key is None:
            return
        uid = obj.spec.pod_uid
        if present:
            self.caches.pcrs[key] = obj
            self.caches.pcrs_by_pod.setdefault(uid, set()).add(key)
        else:
            self.caches.pcrs.pop(key, None)
            names = self.caches.pcrs_by_pod.get(uid)
            if names is not None:
                names.discard(key)
                if not names:
                    del self.caches.pcrs_by_pod[uid]

    def on_bundle_list(self, items: list[JSON]) -> None:
        parsed = [trust.parse_bundle(obj) for obj in items]
        with self.caches.lock:
            self.caches.bundles = {b.name: b for b in parsed if b is not None}
        self._queue_trust_pods()

    def on_bundle_event(self, kind: str, obj: JSON) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        bundle = None if kind == "DELETED" else trust.parse_bundle(obj)
        with self.caches.lock:
            if bundle is None:
                self.caches.bundles.pop(name, None)
            else:
                self.caches.bundles[name] = bundle
        self._queue_trust_pods()

    def _queue_trust_pods(self) -> None:
        with self.caches.lock:
            uids = [uid for uid, pod in self.caches.pods.items() if pod.has_trust_sources]
        for uid in uids:
            self.queue.add(uid)

    # --- workers ---------------------------------------------------------------------------

    def _reconcile(self, uid: str) -> float | None:
        """One pod's turn, in the runtime's terms: seconds until the pod is looked at again
        (with the queue's backoff when the reconcile asks for a retry), or None."""
        requeue = self.reconcile(uid)
        if requeue.retry:
            delay = self.queue.backoff(uid)
            log.info("will retry in %.2fs", delay, extra=_ctx(uid))
            return delay
        self.queue.forget(uid)
        return None if requeue.wake_at is None else self._delay_until(requeue.wake_at)

    def _delay_until(self, at: dt.datetime) -> float:
        seconds = (at - self.clock()).total_seconds()
        return max(0.0, min(seconds, self.settings.resync.total_seconds()))

    def reconcile(self, uid: str) -> Requeue:
        """Bring one pod's projected files in line with what the caches say."""
        return self.sync.reconcile(uid)

    def projection_states(self) -> Iterable[tuple[str, ProjectionState]]:
        """(signer, state) of every projection, for the metrics gauge."""
        now = self.clock()
        with self.caches.lock:
            tracked = list(self.caches.tracked.values())
        return [
            (
                t.signer_name,
                projection.projection_state(
                    t.state, now, force_after=t.force_after, settings=self.settings.projection
                ),
            )
            for t in tracked
        ]

    def state_of(self, key: WorkKey) -> projection.State:
        """The projection state (for tests and debugging)."""
        return self.sync.sources.state(key)


def _ctx(uid: str) -> dict[str, object]:
    return {"pod_uid": uid}
