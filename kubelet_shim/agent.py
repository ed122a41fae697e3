"""The node agent: the kubelet's half of Pod Certificates for the pods bound to one node.

Level-based, like the signer's controller. Three reflectors (the node's pods, the node's
PodCertificateRequests, all ClusterTrustBundles) keep caches and enqueue pod UIDs; a work item
is a pod, so one worker at a time owns each pod's volumes (the atomic writer needs a single
writer per volume). Reconciling a pod drives every podCertificate source through the pure
`projection.step` (per pod UID, volume and source index), resolves every clusterTrustBundle
source from the watched bundles, and publishes each volume that changed as one atomic version.

What it does better than the kubelet: after a restart it adopts the fresh credentials already on
disk (no new keys, no new requests); trust bundles follow a watch instead of a 5-minute cache;
an operator can force re-keying through a pod annotation. Private keys live in a `Pending`
state until written and then only in the pod's files; they are never logged.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import random
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from cryptography import x509

from bundles import formats
from kubelet_shim import projection, trust
from kubelet_shim.kube import ROTATE_ANNOTATION, PodRef, ShimApi, pcr_body
from kubelet_shim.metrics import Metrics
from kubelet_shim.podspec import parse_pod
from kubelet_shim.projection import ProjectionState
from kubelet_shim.storage import FileSpec, Storage, StorageError, UnsafeDirectoryError
from kubelet_shim.volumes import (
    CertificateSource,
    PodVolumes,
    ProjectedVolume,
    TrustBundleSource,
    WorkKey,
)
from podcert.api import keys
from podcert.api.requests import RequestError, certificates, parse_status
from podcert.api.requests import outcome as settled
from podcert.api.times import parse_time
from podcert.reflector import Reflector
from podcert.rest import JSON, ApiError
from podcert.workqueue import ShutDown, WorkQueue

log = logging.getLogger("podcert.shim")

# Pods in these phases run nothing any more: their files stay until the pod is deleted, but no
# new request is made for them (the signer would deny it anyway).
_TERMINAL_PHASES: Final = frozenset({"Succeeded", "Failed"})
# Key-bearing files are never readable beyond the owner, whatever defaultMode says.
_KEY_MODE_MASK: Final = 0o600


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Settings:
    workers: int = 4
    projection: projection.Settings = projection.DEFAULT_SETTINGS
    # The longest a pod sleeps between reconciles even when nothing is due: a safety net for
    # wall-clock jumps (timers run on the monotonic clock), not an API poll.
    resync: dt.timedelta = dt.timedelta(hours=1)


@dataclass(frozen=True)
class _Pod:
    ref: PodRef
    volumes: PodVolumes
    force_after: dt.datetime | None
    terminal: bool

    @property
    def has_trust_sources(self) -> bool:
        return any(isinstance(s, TrustBundleSource) for _, s in self.volumes.work_items())


@dataclass(frozen=True)
class _Tracked:
    signer_name: str
    state: projection.State
    force_after: dt.datetime | None


@dataclass
class Outcome:
    """What one reconcile asks of its worker: wake at `wake_at`, or retry with backoff."""

    wake_at: dt.datetime | None = None
    retry: bool = False

    def wake(self, at: dt.datetime | None) -> None:
        if at is not None and (self.wake_at is None or at < self.wake_at):
            self.wake_at = at


@dataclass
class _Memory:
    """What the agent remembers about one pod between reconciles. Only the worker holding the
    pod touches it, so it needs no lock; it is dropped with the pod."""

    disk: dict[str, dict[str, bytes]] = field(default_factory=dict)  # volume -> files
    adopted: set[WorkKey] = field(default_factory=set)  # disk content already considered
    reported: dict[WorkKey, ProjectionState] = field(default_factory=dict)  # for stale events
    noted: set[tuple[object, ...]] = field(default_factory=set)  # one-off events already sent

    def first(self, note: tuple[object, ...]) -> bool:
        """True the first time `note` is seen (one-off events are not repeated per reconcile)."""
        if note in self.noted:
            return False
        self.noted.add(note)
        return True


@dataclass
class _VolumePlan:
    """The files one volume should hold, built source by source."""

    files: dict[str, bytes] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)
    written: list[tuple[WorkKey, str]] = field(default_factory=list)  # credentials to confirm

    def put(self, path: str, data: bytes, mode: int) -> None:
        self.files[path] = data
        self.modes[path] = mode


class Agent:
    def __init__(
        self,
        kube: ShimApi,
        storage: Storage,
        *,
        settings: Settings = Settings(),
        clock: Callable[[], dt.datetime] = utcnow,
        rng: random.Random | None = None,
    ) -> None:
        self.kube = kube
        self.storage = storage
        self.settings = settings
        self.clock = clock
        self.rng = rng or random.Random()  # noqa: S311 (refresh jitter, not secrets)
        self.metrics = Metrics(self.projection_states)
        self.queue: WorkQueue[str] = WorkQueue(base_delay=0.2, max_delay=300.0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started = threading.Event()
        self._threads: list[threading.Thread] = []
        self.reflectors: list[Reflector] = []
        # Caches fed by the reflectors (guarded by _lock).
        self._pods: dict[str, _Pod] = {}
        self._pcrs: dict[tuple[str, str], JSON] = {}
        self._pcrs_by_pod: dict[str, set[tuple[str, str]]] = {}
        self._bundles: dict[str, trust.Bundle] = {}
        self._tracked: dict[WorkKey, _Tracked] = {}
        # Per pod, owned by whichever worker holds it (the queue never gives a pod to two).
        self._memory: dict[str, _Memory] = {}

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.reflectors = [
            Reflector(
                "pods",
                self.kube.list_pods,
                self.kube.watch_pods,
                self.on_pod_list,
                self.on_pod_event,
                self._stop,
            ),
            Reflector(
                "podcertificaterequests",
                self.kube.list_pcrs,
                self.kube.watch_pcrs,
                self.on_pcr_list,
                self.on_pcr_event,
                self._stop,
            ),
            Reflector(
                "clustertrustbundles",
                self.kube.list_trust_bundles,
                self.kube.watch_trust_bundles,
                self.on_bundle_list,
                self.on_bundle_event,
                self._stop,
            ),
        ]
        for reflector in self.reflectors:
            self._spawn(reflector.name, reflector.run)
        self._spawn("starter", self._start_workers)

    def _start_workers(self) -> None:
        # Nothing is decided before every cache is whole: a pod missing from a half-done list
        # would look deleted, a request missing would look vanished.
        for reflector in self.reflectors:
            while not reflector.synced.wait(0.5):
                if self._stop.is_set():
                    return
        self.sweep()
        for index in range(self.settings.workers):
            self._spawn(f"worker-{index}", self._work)
        self._started.set()
        log.info("caches synced; %d pods on node %s", len(self._pods), self.kube.node_name)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def ready(self) -> bool:
        return self._started.is_set()

    def healthy(self) -> bool:
        """Every thread it started is still running (a dead worker is a restart, not a hang)."""
        return not self._stop.is_set() and all(
            t.is_alive() for t in self._threads if t.name != "starter"
        )

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.queue.shut_down()
        for thread in self._threads:
            if thread.name.startswith("worker"):
                thread.join(timeout)

    def sweep(self) -> None:
        """After the first sync: queue every known pod, the pods that left files on disk while
        the shim was away, and the pods that left pending requests behind."""
        with self._lock:
            known = set(self._pods)
            pending_of_gone = {
                _pod_uid(pcr)
                for pcr in self._pcrs.values()
                if _pod_uid(pcr) not in known and settled(pcr) is None
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
        fresh = {pod.ref.uid: pod for pod in map(_pod_from, items) if pod is not None}
        with self._lock:
            gone = set(self._pods) - set(fresh)
            self._pods = fresh
        for uid in sorted(set(fresh) | gone):
            self.queue.add(uid)

    def on_pod_event(self, kind: str, obj: JSON) -> None:
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        if not uid:
            return
        pod = None if kind == "DELETED" else _pod_from(obj)
        with self._lock:
            if pod is None:
                self._pods.pop(uid, None)
            else:
                self._pods[uid] = pod
        self.queue.add(uid)

    def on_pcr_list(self, items: list[JSON]) -> None:
        with self._lock:
            self._pcrs, self._pcrs_by_pod = {}, {}
            for obj in items:
                self._index_pcr(obj, present=True)
            # Requests of pods we serve, and pending ones whose pod is gone (to clean up).
            uids = {
                _pod_uid(obj)
                for obj in items
                if _pod_uid(obj) in self._pods or settled(obj) is None
            }
        for uid in sorted(uids):
            if uid:
                self.queue.add(uid)

    def on_pcr_event(self, kind: str, obj: JSON) -> None:
        uid = _pod_uid(obj)
        with self._lock:
            self._index_pcr(obj, present=kind != "DELETED")
            wanted = uid in self._pods or (kind != "DELETED" and settled(obj) is None)
        if uid and wanted:
            self.queue.add(uid)

    def _index_pcr(self, obj: JSON, *, present: bool) -> None:
        key = _object_key(obj)
        if key is None:
            return
        uid = _pod_uid(obj)
        if present:
            self._pcrs[key] = obj
            self._pcrs_by_pod.setdefault(uid, set()).add(key)
        else:
            self._pcrs.pop(key, None)
            names = self._pcrs_by_pod.get(uid)
            if names is not None:
                names.discard(key)
                if not names:
                    del self._pcrs_by_pod[uid]

    def on_bundle_list(self, items: list[JSON]) -> None:
        parsed = [trust.parse_bundle(obj) for obj in items]
        with self._lock:
            self._bundles = {b.name: b for b in parsed if b is not None}
        self._queue_trust_pods()

    def on_bundle_event(self, kind: str, obj: JSON) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        bundle = None if kind == "DELETED" else trust.parse_bundle(obj)
        with self._lock:
            if bundle is None:
                self._bundles.pop(name, None)
            else:
                self._bundles[name] = bundle
        self._queue_trust_pods()

    def _queue_trust_pods(self) -> None:
        with self._lock:
            uids = [uid for uid, pod in self._pods.items() if pod.has_trust_sources]
        for uid in uids:
            self.queue.add(uid)

    # --- workers ---------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            try:
                uid = self.queue.get()
            except ShutDown:
                return
            if uid is None:
                continue
            try:
                outcome = self.reconcile(uid)
                if outcome.retry:
                    delay = self.queue.retry(uid)
                    log.info("will retry in %.2fs", delay, extra={"pod_uid": uid})
                else:
                    self.queue.forget(uid)
                    if outcome.wake_at is not None:
                        self.queue.add_after(uid, self._delay_until(outcome.wake_at))
            except Exception:
                delay = self.queue.retry(uid)
                log.exception(
                    "unexpected error; will retry in %.2fs", delay, extra={"pod_uid": uid}
                )
            finally:
                self.queue.done(uid)

    def _delay_until(self, at: dt.datetime) -> float:
        seconds = (at - self.clock()).total_seconds()
        return max(0.0, min(seconds, self.settings.resync.total_seconds()))

    def reconcile(self, uid: str) -> Outcome:
        """Bring one pod's projected files in line with what the caches say."""
        with self._lock:
            pod = self._pods.get(uid)
        if pod is None:
            return self._forget_pod(uid)
        now = self.clock()
        outcome = Outcome()
        memory = self._memory.setdefault(uid, _Memory())
        if pod.volumes.errors and memory.first(("volume-errors",)):
            problems = "; ".join(str(e) for e in pod.volumes.errors)
            self._event(pod, "Warning", "InvalidProjectedVolume", problems, now)
        for volume in pod.volumes.volumes:
            if any(isinstance(s, CertificateSource | TrustBundleSource) for s in volume.sources):
                self._sync_volume(pod, memory, volume, now, outcome)
        return outcome

    def _sync_volume(
        self,
        pod: _Pod,
        memory: _Memory,
        volume: ProjectedVolume,
        now: dt.datetime,
        outcome: Outcome,
    ) -> None:
        uid = pod.ref.uid
        try:
            current = self._current(uid, memory, volume.name)
        except UnsafeDirectoryError as err:
            # Refused before anything is planned: no new key or request for a volume that
            # cannot be written.
            self._refuse_volume(pod, memory, volume.name, err, now, outcome)
            return
        plan = _VolumePlan()
        # The atomic writer takes one owner per volume: that of the first source we serve
        # (its `user`, else the volume's defaultUser). Sources that disagree are rare and alpha.
        owner: int | None = None
        for source in volume.sources:
            if isinstance(source, CertificateSource):
                self._plan_certificate(pod, memory, volume, source, current, plan, now, outcome)
            elif isinstance(source, TrustBundleSource):
                self._plan_trust(pod, memory, volume, source, current, plan, now)
            else:
                continue
            if owner is None:
                owner = volume.owner_of(source)

        if plan.files != current:
            files = {path: FileSpec(data, plan.modes[path]) for path, data in plan.files.items()}
            try:
                self.storage.write_volume(uid, volume.name, files, owner)
            except UnsafeDirectoryError as err:
                # As below, the new key waits in its state; the retry reads the disk again.
                self._refuse_volume(pod, memory, volume.name, err, now, outcome)
                plan.written.clear()
            except StorageError as err:
                # The previous version is intact; the new key stays in its Fresh state for the
                # retry. The error names a path and a cause, never file content.
                self.metrics.writes.labels(result="error").inc()
                log.error("cannot write volume: %s", err, extra=_ctx(pod, volume.name))
                outcome.retry = True
                plan.written.clear()
            else:
                self.metrics.writes.labels(result="ok").inc()
                memory.disk[volume.name] = dict(plan.files)
                memory.noted.discard(("unsafe-volume", volume.name))
                log.info("published volume (%d files)", len(files), extra=_ctx(pod, volume.name))
        for key, request_name in plan.written:
            self._step(pod, key, projection.CredentialWritten(request_name), now)

        for source in volume.sources:
            if isinstance(source, CertificateSource):
                self._after(pod, memory, source, now, outcome)

    def _current(self, uid: str, memory: _Memory, volume: str) -> dict[str, bytes]:
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
        pod: _Pod,
        memory: _Memory,
        volume: str,
        err: UnsafeDirectoryError,
        now: dt.datetime,
        outcome: Outcome,
    ) -> None:
        """A link (or a non-directory) where the volume's directories should be: leave the
        volume alone, tell the pod's owner once, and look again with backoff (up to 5 min),
        so the volume is served again once the directory is put right."""
        memory.disk.pop(volume, None)  # the retry reads the disk again before planning
        self.metrics.writes.labels(result="error").inc()
        outcome.retry = True
        if memory.first(("unsafe-volume", volume)):
            self._event(
                pod,
                "Warning",
                "UnsafeVolumeDirectory",
                f"cannot write volume {volume!r}: {err}",
                now,
            )
        else:
            log.debug("volume still refused: %s", err, extra=_ctx(pod, volume))

    # --- podCertificate sources ------------------------------------------------------------

    def _plan_certificate(
        self,
        pod: _Pod,
        memory: _Memory,
        volume: ProjectedVolume,
        source: CertificateSource,
        current: Mapping[str, bytes],
        plan: _VolumePlan,
        now: dt.datetime,
        outcome: Outcome,
    ) -> None:
        key = source.key(pod.ref.uid)
        key_mode = volume.default_mode & _KEY_MODE_MASK
        modes = {
            source.credential_bundle_path: key_mode,
            source.key_path: key_mode,
            source.chain_path: volume.default_mode,
        }
        write = None if pod.terminal else self._drive(pod, memory, source, current, now, outcome)
        if write is not None:
            # The chain as the kubelet writes it: re-encoded block by block, after the key.
            credential = formats.Credential(
                write.key, tuple(x509.load_pem_x509_certificates(write.chain_pem))
            )
            fresh = {
                source.credential_bundle_path: formats.dump_credential(credential),
                source.key_path: formats.dump_private_key(credential.key),
                source.chain_path: formats.dump_certificates(credential.chain),
            }
            for path, data in fresh.items():
                if path is not None:
                    plan.put(path, data, modes[path])
            plan.written.append((key, write.request_name))
            return
        # Nothing new: whatever the pod reads now stays (an older credential outlives a denial).
        for path, mode in modes.items():
            if path is not None and path in current:
                plan.put(path, current[path], mode)

    def _drive(
        self,
        pod: _Pod,
        memory: _Memory,
        source: CertificateSource,
        current: Mapping[str, bytes],
        now: dt.datetime,
        outcome: Outcome,
    ) -> projection.WriteCredential | None:
        """Feed the projection what was observed, then a Tick; carry out its actions."""
        key = source.key(pod.ref.uid)
        state = self._state(key)
        events: list[projection.Event] = []
        if isinstance(state, projection.NotYetIssued) and key not in memory.adopted:
            memory.adopted.add(key)
            found = self._found_on_disk(pod, source, current)
            if found is not None:
                events.append(found)
        if isinstance(state, projection.Pending):
            events.append(self._observe(pod, source, state, now))
        events.append(projection.Tick())

        write: projection.WriteCredential | None = None
        while events:
            actions = self._step(pod, key, events.pop(0), now, source)
            for action in actions:
                if isinstance(action, projection.WriteCredential):
                    write = action
                elif isinstance(action, projection.CreateRequest):
                    created = self._create(pod, memory, source, action.reason, outcome)
                    if created is not None:
                        events.append(projection.RequestCreated(*created))
        return write

    def _step(
        self,
        pod: _Pod,
        key: WorkKey,
        event: projection.Event,
        now: dt.datetime,
        source: CertificateSource | None = None,
    ) -> list[projection.Action]:
        """One `projection.step`, its state kept for the pod and the metrics, its events sent."""
        state, actions = projection.step(
            self._state(key),
            event,
            now=now,
            rng=self.rng,
            force_after=pod.force_after,
            settings=self.settings.projection,
        )
        with self._lock:
            known = self._tracked.get(key)
            signer_name = known.signer_name if known else source.signer_name if source else ""
            self._tracked[key] = _Tracked(signer_name, state, pod.force_after)
        for action in actions:
            if isinstance(action, projection.RecordEvent):
                self._event(pod, action.type, action.reason, action.message, now)
        return actions

    def _state(self, key: WorkKey) -> projection.State:
        with self._lock:
            tracked = self._tracked.get(key)
        return tracked.state if tracked is not None else projection.NotYetIssued()

    def _observe(
        self,
        pod: _Pod,
        source: CertificateSource,
        state: projection.Pending,
        now: dt.datetime,
    ) -> projection.Event:
        with self._lock:
            pcr = self._pcrs.get((pod.ref.namespace, state.request_name))
        event = request_event(state.request_name, pcr, state.key)
        signer = source.signer_name
        if isinstance(event, projection.RequestIssued):
            self.metrics.outcomes.labels(signer=signer, outcome="issued").inc()
            elapsed = max(0.0, (now - state.created_at).total_seconds())
            self.metrics.latency.labels(signer=signer).observe(elapsed)
        elif isinstance(event, projection.RequestDenied):
            self.metrics.outcomes.labels(signer=signer, outcome="denied").inc()
        elif isinstance(event, projection.RequestFailed):
            self.metrics.outcomes.labels(signer=signer, outcome="failed").inc()
        return event

    def _create(
        self,
        pod: _Pod,
        memory: _Memory,
        source: CertificateSource,
        reason: str,
        outcome: Outcome,
    ) -> tuple[str, keys.PrivateKey] | None:
        """A new key and a request for it, made as the node. None (and a retry) on API trouble."""
        extra = _ctx(pod, source.volume)
        key = keys.generate(source.key_type)
        try:
            body = pcr_body(
                pod.ref,
                signer_name=source.signer_name,
                service_account=pod.volumes.service_account,
                service_account_uid=self.kube.service_account_uid(
                    pod.ref.namespace, pod.volumes.service_account
                ),
                node_name=self.kube.node_name,
                node_uid=self.kube.node_uid(),
                max_expiration_seconds=source.max_expiration_seconds,
                stub_csr_b64=base64.b64encode(keys.stub_csr(key)).decode(),
                user_annotations=source.user_annotations,
            )
            created = self.kube.create_pcr(pod.ref.namespace, body)
        except ApiError as err:
            self.metrics.errors.labels(operation="create_request").inc()
            outcome.retry = True
            log.warning("cannot create request: %s", err, extra=extra)
            # Refusals (as opposed to outages) are worth telling the pod's owner, once.
            if err.status in (400, 403, 422) and memory.first(
                ("refused", source.volume, source.index)
            ):
                self._event(
                    pod,
                    "Warning",
                    "CertificateRequestRefused",
                    f"the API server refused a request for signer {source.signer_name}: "
                    f"{err.message}",
                    self.clock(),
                )
            return None
        name = str(created["metadata"]["name"])
        memory.noted.discard(("refused", source.volume, source.index))
        self.metrics.requests.labels(signer=source.signer_name, reason=reason).inc()
        log.info(
            "requested a certificate from %s (%s)",
            source.signer_name,
            reason,
            extra={**extra, "request": name},
        )
        return name, key

    def _found_on_disk(
        self, pod: _Pod, source: CertificateSource, current: Mapping[str, bytes]
    ) -> projection.FoundOnDisk | None:
        """A credential a previous run left in the volume, if it is whole and consistent."""
        try:
            chain = _chain_on_disk(source, current)
        except formats.BundleError as err:
            log.warning("credential on disk is unusable: %s", err, extra=_ctx(pod, source.volume))
            return None
        if chain is None:
            return None
        leaf = chain[0]
        return projection.FoundOnDisk(
            chain_pem=formats.dump_certificates(chain),
            not_before=leaf.not_valid_before_utc,
            not_after=leaf.not_valid_after_utc,
            begin_refresh_at=self._begin_refresh_of(pod.ref.uid, leaf),
        )

    def _begin_refresh_of(self, uid: str, leaf: x509.Certificate) -> dt.datetime | None:
        """The signer's refresh hint for a leaf, from its request if that still exists."""
        with self._lock:
            candidates = [self._pcrs[k] for k in self._pcrs_by_pod.get(uid, ())]
        for pcr in candidates:
            try:
                status = parse_status(pcr.get("status"))
                if status.outcome == "Issued" and certificates(status)[0] == leaf:
                    return status.begin_refresh_at
            except RequestError:
                continue
        return None

    def _after(
        self,
        pod: _Pod,
        memory: _Memory,
        source: CertificateSource,
        now: dt.datetime,
        outcome: Outcome,
    ) -> None:
        """Staleness events on state changes, and the next instant this projection needs us."""
        if pod.terminal:
            return
        key = source.key(pod.ref.uid)
        state = self._state(key)
        settings = self.settings.projection
        shown = projection.projection_state(
            state, now, force_after=pod.force_after, settings=settings
        )
        before = memory.reported.get(key)
        memory.reported[key] = shown
        if shown != before and shown in _STALE_EVENTS:
            reason, what = _STALE_EVENTS[shown]
            served = projection.served(state)
            until = served.not_after.isoformat() if served is not None else "?"
            self._event(
                pod, "Warning", reason, f"{source.signer_name} certificate {what} ({until})", now
            )
        outcome.wake(projection.wake_at(state, now, force_after=pod.force_after, settings=settings))

    # --- clusterTrustBundle sources --------------------------------------------------------

    def _plan_trust(
        self,
        pod: _Pod,
        memory: _Memory,
        volume: ProjectedVolume,
        source: TrustBundleSource,
        current: Mapping[str, bytes],
        plan: _VolumePlan,
        now: dt.datetime,
    ) -> None:
        with self._lock:
            resolved = trust.resolve(source, self._bundles)
        if resolved.content is not None:
            plan.put(source.path, resolved.content, volume.default_mode)
            memory.noted.discard(("trust-missing", source.volume, source.index))
            return
        # A required bundle is missing: keep what the pod has (the kubelet would not start it).
        if source.path in current:
            plan.put(source.path, current[source.path], volume.default_mode)
        if memory.first(("trust-missing", source.volume, source.index)):
            self._event(pod, "Warning", "TrustBundleUnavailable", str(resolved.problem), now)

    # --- pods that are gone ----------------------------------------------------------------

    def _forget_pod(self, uid: str) -> Outcome:
        """Remove a deleted pod's files and its requests still waiting for an answer."""
        outcome = Outcome()
        try:
            self.storage.remove_pod(uid)
        except UnsafeDirectoryError as err:
            # Terminal: removing through a link could delete what it points to. An operator
            # removes what was planted; nothing else will change by retrying.
            log.error("left the pod's files alone: %s", err, extra={"pod_uid": uid})
        except StorageError as err:
            log.error("cannot remove the pod's files: %s", err, extra={"pod_uid": uid})
            outcome.retry = True
        self._memory.pop(uid, None)
        with self._lock:
            self._tracked = {k: v for k, v in self._tracked.items() if k.pod_uid != uid}
            pending = [
                self._pcrs[k]
                for k in self._pcrs_by_pod.get(uid, ())
                if settled(self._pcrs[k]) is None
            ]
        for pcr in pending:
            meta = pcr["metadata"]
            try:
                deleted = self.kube.delete_pcr(meta["namespace"], meta["name"], meta["uid"])
            except ApiError as err:
                self.metrics.errors.labels(operation="delete_request").inc()
                log.warning("cannot delete request: %s", err, extra={"request": meta["name"]})
                outcome.retry = True
                continue
            extra = {"namespace": meta["namespace"], "request": meta["name"]}
            if deleted:
                log.info("deleted the pending request of a deleted pod", extra=extra)
            else:
                # Nodes may not delete requests; the garbage collector follows ownerReferences.
                log.debug("pending request of a deleted pod left to the collector", extra=extra)
        return outcome

    # --- helpers ---------------------------------------------------------------------------

    def _event(self, pod: _Pod, kind: str, reason: str, message: str, now: dt.datetime) -> None:
        level = logging.WARNING if kind == "Warning" else logging.INFO
        log.log(level, "%s: %s", reason, message, extra=_ctx(pod, None))
        self.kube.record_event(pod.ref, kind, reason, message, now)

    def projection_states(self) -> Iterable[tuple[str, ProjectionState]]:
        """(signer, state) of every projection, for the metrics gauge."""
        now = self.clock()
        with self._lock:
            tracked = list(self._tracked.values())
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
        return self._state(key)


_STALE_EVENTS: Final = {
    ProjectionState.OVERDUE_FOR_REFRESH: ("CertificateOverdueForRefresh", "is overdue for refresh"),
    ProjectionState.EXPIRED: ("CertificateExpired", "has expired"),
}


# --- reading API objects (pure) --------------------------------------------------------------


def request_event(
    name: str, pcr: Mapping[str, Any] | None, key: keys.PrivateKey | None = None
) -> projection.Event:
    """What a request's current object means to its projection.

    An Issued status whose chain does not parse, or whose leaf does not hold `key`, is a
    failure: writing it would give the pod a key that does not match its certificate.
    """
    if pcr is None:
        return projection.RequestVanished(name)
    try:
        status = parse_status(pcr.get("status"))
    except RequestError as err:
        return projection.RequestFailed(name, "InvalidStatus", str(err))
    if status.condition is None:
        return projection.RequestPending(name)
    if status.condition == "Denied":
        return projection.RequestDenied(name, status.reason, status.message)
    if status.condition == "Failed":
        return projection.RequestFailed(name, status.reason, status.message)
    if not status.certificate_chain or status.not_before is None or status.not_after is None:
        return projection.RequestFailed(
            name, "InvalidIssuedStatus", "issued without certificateChain, notBefore or notAfter"
        )
    try:
        chain = certificates(status)
    except RequestError as err:
        return projection.RequestFailed(name, "InvalidIssuedStatus", str(err))
    if key is not None and keys.spki_der(chain[0].public_key()) != keys.public_der(key):
        return projection.RequestFailed(
            name, "InvalidIssuedStatus", "the leaf certificate does not hold the requested key"
        )
    return projection.RequestIssued(
        name,
        chain_pem=status.certificate_chain.encode(),
        not_before=status.not_before,
        not_after=status.not_after,
        begin_refresh_at=status.begin_refresh_at,
    )


def _pod_from(obj: Mapping[str, Any]) -> _Pod | None:
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
    return _Pod(
        ref=PodRef(volumes.namespace, volumes.name, volumes.uid),
        volumes=volumes,
        force_after=force_after,
        terminal=phase in _TERMINAL_PHASES,
    )


def _chain_on_disk(
    source: CertificateSource, current: Mapping[str, bytes]
) -> tuple[x509.Certificate, ...] | None:
    """The chain the source's files hold, checked against their key where there is one."""
    bundle, key, chain = source.credential_bundle_path, source.key_path, source.chain_path
    if bundle is not None:
        return formats.load_credential(current[bundle]).chain if bundle in current else None
    if key is not None:
        if chain is None or key not in current or chain not in current:
            return None  # a key alone says nothing about when it expires: ask again
        return formats.load_credential_files(current[key], current[chain]).chain
    if chain is not None and chain in current:
        try:
            found = tuple(x509.load_pem_x509_certificates(current[chain]))
        except ValueError as err:
            raise formats.MalformedCertificateError(f"chain file: {err}") from None
        return found or None
    return None


def _object_key(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    meta = obj.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name")
    if isinstance(namespace, str) and isinstance(name, str):
        return namespace, name
    return None


def _pod_uid(pcr: Mapping[str, Any]) -> str:
    return str((pcr.get("spec") or {}).get("podUID") or "")


def _ctx(pod: _Pod, volume: str | None) -> dict[str, str]:
    """Log context for a pod ("name" is taken by logging itself)."""
    extra = {"namespace": pod.ref.namespace, "pod": pod.ref.name}
    if volume is not None:
        extra["volume"] = volume
    return extra
