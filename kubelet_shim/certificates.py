"""Each podCertificate source of a pod, driven through the pure `projection.step`.

Per (pod UID, volume, source index): what its request says (`request_event`) or what a previous
run left on disk (`chain_on_disk`) becomes an event; the step's actions become a new key and a
request made as the node, or the files to write; a credential turning overdue or expired becomes
one Event. Private keys live in a `Pending` state until written and then only in the pod's
files (and, while a create's outcome is unknown, in the pod's `Memory`, for the retry that
must name the same request); they are never logged.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from collections.abc import Callable, Mapping
from typing import Final

from cryptography import x509

from bundles import formats
from kubelet_shim import projection
from kubelet_shim.kube import ForeignRequest, ShimApi, pcr_body, request_name
from kubelet_shim.metrics import Metrics
from kubelet_shim.projection import ProjectionState
from kubelet_shim.state import Caches, Memory, Pod, Requeue, Tracked, VolumePlan, log_context
from podcert.api import keys
from podcert.api.pods import CertificateSource, ProjectedVolume, WorkKey
from podcert.api.requests import Read, RequestError, Unreadable, certificates, key_fields
from podcert.api.times import format_time
from podcert.client.rest import ApiError

log = logging.getLogger("podcert.shim")

# Key-bearing files are never readable beyond the owner, whatever defaultMode says.
KEY_MODE_MASK: Final = 0o600

# The kubelet's staleness Events, sent once each time a projection's state turns into one.
STALE_EVENTS: Final = {
    ProjectionState.OVERDUE_FOR_REFRESH: ("CertificateOverdueForRefresh", "is overdue for refresh"),
    ProjectionState.EXPIRED: ("CertificateExpired", "has expired"),
}

# Where an Event about a pod goes: (pod, type, reason, message, now).
EventSink = Callable[[Pod, str, str, str, dt.datetime], None]


class CertificateSources:
    """The podCertificate sources of the pods on one node; called by the worker holding the pod."""

    def __init__(
        self,
        kube: ShimApi,
        caches: Caches,
        metrics: Metrics,
        *,
        settings: projection.Settings,
        clock: Callable[[], dt.datetime],
        rng: random.Random,
        event: EventSink,
    ) -> None:
        self.kube = kube
        self.caches = caches
        self.metrics = metrics
        self.settings = settings
        self.clock = clock
        self.rng = rng
        self.event = event

    def plan(
        self,
        pod: Pod,
        memory: Memory,
        volume: ProjectedVolume,
        source: CertificateSource,
        current: Mapping[str, bytes],
        plan: VolumePlan,
        now: dt.datetime,
        requeue: Requeue,
    ) -> None:
        key = source.key(pod.ref.uid)
        key_mode = volume.default_mode & KEY_MODE_MASK
        modes = {
            source.credential_bundle_path: key_mode,
            source.key_path: key_mode,
            source.chain_path: volume.default_mode,
        }
        write = None if pod.terminal else self._drive(pod, memory, source, current, now, requeue)
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

    def after(
        self,
        pod: Pod,
        memory: Memory,
        source: CertificateSource,
        now: dt.datetime,
        requeue: Requeue,
    ) -> None:
        """Staleness events on state changes, and the next instant this projection needs us."""
        if pod.terminal:
            return
        key = source.key(pod.ref.uid)
        state = self.state(key)
        settings = self.settings
        shown = projection.projection_state(
            state, now, force_after=pod.force_after, settings=settings
        )
        before = memory.reported.get(key)
        memory.reported[key] = shown
        if shown != before and shown in STALE_EVENTS:
            reason, what = STALE_EVENTS[shown]
            served = projection.served(state)
            until = format_time(served.not_after) if served is not None else "?"
            self.event(
                pod, "Warning", reason, f"{source.signer_name} certificate {what} ({until})", now
            )
        requeue.wake(projection.wake_at(state, now, force_after=pod.force_after, settings=settings))

    def _drive(
        self,
        pod: Pod,
        memory: Memory,
        source: CertificateSource,
        current: Mapping[str, bytes],
        now: dt.datetime,
        requeue: Requeue,
    ) -> projection.WriteCredential | None:
        """Feed the projection what was observed, then a Tick; carry out its actions."""
        key = source.key(pod.ref.uid)
        state = self.state(key)
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
            actions = self.step(pod, key, events.pop(0), now, source)
            for action in actions:
                if isinstance(action, projection.WriteCredential):
                    write = action
                elif isinstance(action, projection.CreateRequest):
                    created = self._create(pod, memory, source, action.reason, requeue)
                    if created is not None:
                        events.append(projection.RequestCreated(*created))
        return write

    def step(
        self,
        pod: Pod,
        key: WorkKey,
        event: projection.Event,
        now: dt.datetime,
        source: CertificateSource | None = None,
    ) -> list[projection.Action]:
        """One `projection.step`, its state kept for the pod and the metrics, its events sent."""
        state, actions = projection.step(
            self.state(key),
            event,
            now=now,
            rng=self.rng,
            force_after=pod.force_after,
            settings=self.settings,
        )
        with self.caches.lock:
            known = self.caches.tracked.get(key)
            signer_name = known.signer_name if known else source.signer_name if source else ""
            self.caches.tracked[key] = Tracked(signer_name, state, pod.force_after)
        for action in actions:
            if isinstance(action, projection.RecordEvent):
                self.event(pod, action.type, action.reason, action.message, now)
        return actions

    def state(self, key: WorkKey) -> projection.State:
        with self.caches.lock:
            tracked = self.caches.tracked.get(key)
        return tracked.state if tracked is not None else projection.NotYetIssued()

    def _observe(
        self,
        pod: Pod,
        source: CertificateSource,
        state: projection.Pending,
        now: dt.datetime,
    ) -> projection.Event:
        with self.caches.lock:
            pcr = self.caches.pcrs.get((pod.ref.namespace, state.request_name))
        event = request_event(state.request_name, pcr, state.key)
        signer = source.signer_name
        if isinstance(event, projection.RequestIssued):
            self.metrics.count_outcome(signer, "Issued")
            elapsed = max(0.0, (now - state.created_at).total_seconds())
            self.metrics.latency.labels(signer_name=signer).observe(elapsed)
            log.info(
                "request issued, seen %.3f s after it was made",
                elapsed,
                extra={**log_context(pod, source.volume), "request": state.request_name},
            )
        elif isinstance(event, projection.RequestDenied):
            self.metrics.count_outcome(signer, "Denied")
        elif isinstance(event, projection.RequestFailed):
            self.metrics.count_outcome(signer, "Failed")
        return event

    def _create(
        self,
        pod: Pod,
        memory: Memory,
        source: CertificateSource,
        reason: str,
        requeue: Requeue,
    ) -> tuple[str, keys.PrivateKey] | None:
        """A new key and a request for it, made as the node. None (and a retry) on API trouble.
        The key of a create whose outcome is unknown is kept for the next try: the request's
        name follows from it, so a create the API server did apply is found, not doubled."""
        extra = log_context(pod, source.volume)
        work = source.key(pod.ref.uid)
        key = memory.unanswered.get(work) or keys.generate(source.key_type)
        memory.unanswered[work] = key
        try:
            body = pcr_body(
                pod.ref,
                name=request_name(pod.ref, work, source.signer_name, keys.public_der(key)),
                signer_name=source.signer_name,
                service_account=pod.volumes.service_account,
                service_account_uid=self.kube.service_account_uid(
                    pod.ref.namespace, pod.volumes.service_account
                ),
                node_name=self.kube.node_name,
                node_uid=self.kube.node_uid(),
                max_expiration_seconds=source.max_expiration_seconds,
                key_fields=key_fields(self.kube.key_form, key, pod.ref.uid),
                user_annotations=source.user_annotations,
            )
            created = self.kube.create_pcr(pod.ref.namespace, body)
        except ApiError as err:
            if isinstance(err, ForeignRequest):
                del memory.unanswered[work]  # that name is taken: the next key names another
            self.metrics.errors.labels(operation="create_request").inc()
            requeue.retry = True
            log.warning("cannot create request: %s", err, extra=extra)
            # Refusals (as opposed to outages) are worth telling the pod's owner, once.
            if err.status in (400, 403, 422) and memory.first(
                ("refused", source.volume, source.index)
            ):
                self.event(
                    pod,
                    "Warning",
                    "CertificateRequestRefused",
                    f"the API server refused a request for signer {source.signer_name}: "
                    f"{err.message}",
                    self.clock(),
                )
            return None
        del memory.unanswered[work]
        name = str(created["metadata"]["name"])
        memory.noted.discard(("refused", source.volume, source.index))
        self.metrics.requests.labels(signer_name=source.signer_name, reason=reason).inc()
        log.info(
            "requested a certificate from %s (%s)",
            source.signer_name,
            reason,
            extra={**extra, "request": name},
        )
        return name, key

    def _found_on_disk(
        self, pod: Pod, source: CertificateSource, current: Mapping[str, bytes]
    ) -> projection.FoundOnDisk | None:
        """A credential a previous run left in the volume, if it is whole and consistent."""
        try:
            chain = chain_on_disk(source, current)
        except formats.BundleError as err:
            log.warning(
                "credential on disk is unusable: %s", err, extra=log_context(pod, source.volume)
            )
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
        with self.caches.lock:
            candidates = [self.caches.pcrs[k] for k in self.caches.pcrs_by_pod.get(uid, ())]
        for pcr in candidates:
            status = pcr.status
            try:
                if status.outcome == "Issued" and certificates(status)[0] == leaf:
                    return status.begin_refresh_at
            except RequestError:
                continue
        return None


# --- reading requests and files (pure) --------------------------------------------------------


def request_event(
    name: str, pcr: Read | None, key: keys.PrivateKey | None = None
) -> projection.Event:
    """What a request's current object means to its projection.

    An object that does not read as a request (a status of the wrong shape), an Issued status
    whose chain does not parse, or whose leaf does not hold `key`, is a failure: writing it
    would give the pod a key that does not match its certificate.
    """
    if pcr is None:
        return projection.RequestVanished(name)
    if isinstance(pcr, Unreadable):
        broken = "InvalidStatus" if pcr.problem.field.startswith("status") else "InvalidRequest"
        return projection.RequestFailed(name, broken, str(pcr.problem))
    status = pcr.status
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


def chain_on_disk(
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
