"""The signer controller: watch PodCertificateRequests for our signer names, decide, write once.

Level-based: a work item is (namespace, name), never the event. Reflectors (list, then watch from
the last resourceVersion, relist on 410 Gone) keep a store of unsettled requests and enqueue their
keys; the runtime's workers (`podcert.reconcile.runtime`) call `reconcile`, which reads live facts,
calls the pure `decide`, turns an answer into a `Settlement` (`signer.issue.settle`, pure too) and
applies it with the one writer, `apply`: one status write with the object's resourceVersion, so a
lost race is a 409 that re-reads and never overwrites an outcome someone else wrote. Transient
trouble requeues with capped exponential backoff and jitter; it never becomes a terminal `Failed`.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, assert_never

from prometheus_client import Counter, Histogram

from podcert.api.requests import PodCertificateRequest, Read, invalid, key_of
from podcert.client.rest import ApiError
from podcert.reconcile.ratelimit import TokenBuckets
from podcert.reconcile.reflector import Reflector
from podcert.reconcile.runtime import Synced, WorkerPool
from podcert.reconcile.workqueue import WorkQueue
from signer import certs, model
from signer.auditlog.trail import AuditTrail
from signer.authority.castore import CAStore
from signer.issue.decide import CA_TOO_SHORT, decide
from signer.issue.facts import Bindings, ServiceShape, service_names, service_selector
from signer.issue.settle import Labels, Settlement, settle
from signer.kube import KeyNotServed, SignerKube
from signer.metrics import Metrics, api_retry_label
from signer.policy import Policy

log = logging.getLogger("podcert.signer")

Key = tuple[str, str]


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class Settings:
    """How the controller works; `podcert signer`'s flags read their defaults from here."""

    workers: int = 4
    backdate: dt.timedelta = certs.DEFAULT_LEAF_BACKDATE
    refresh_fraction: float = certs.DEFAULT_REFRESH_FRACTION
    # Workers wait this long for the pod/node/ServiceAccount caches' first full list.
    facts_sync_timeout: float = 60.0
    # Workers serve nodes in turn, then a node's namespaces in turn (False: one FIFO, to compare).
    fair_queue: bool = True


DEFAULT_SETTINGS: Final = Settings()
RATE_LIMIT_LOG_EVERY: Final = 30.0  # seconds between log lines about held-back requests


class Controller:
    def __init__(
        self,
        kube: SignerKube,
        signer_names: Iterable[str],
        policy: Policy,
        cas: CAStore,
        metrics: Metrics,
        trail: AuditTrail | None = None,
        *,
        settings: Settings = DEFAULT_SETTINGS,
        clock: Callable[[], dt.datetime] = utcnow,
        is_leader: Callable[[], bool] = lambda: True,
        monotonic: Callable[[], float] = time.monotonic,
        stop: threading.Event | None = None,
    ) -> None:
        self.kube = kube
        self.signer_names = tuple(signer_names)
        self.policy = policy
        self.cas = cas
        self.metrics = metrics
        self.settings = settings
        self.clock = clock
        self.is_leader = is_leader
        self.monotonic = monotonic
        self._stop = stop if stop is not None else threading.Event()
        # Without a trail nothing is logged and issuance never waits for a log.
        self.trail = trail or AuditTrail(
            None, metrics, cas.issuing, "", clock=clock, backdate=settings.backdate
        )
        self.queue: WorkQueue[Key] = WorkQueue(
            base_delay=0.1, max_delay=60.0, flow=self._flow if settings.fair_queue else None
        )
        self._node_rates = {
            name: TokenBuckets(rate)
            for name in self.signer_names
            if (rate := policy.for_signer(name).rate_per_node) is not None
        }
        self._settled_series: dict[Labels, tuple[Counter, Histogram]] = {}
        self._held_lock = threading.Lock()
        self._held_back = 0  # requests held back since the last log line about it
        self._held_logged = float("-inf")
        self._lock = threading.Lock()
        self._store: dict[Key, Read] = {}  # unsettled requests, latest seen
        self._services: dict[str, dict[str, Mapping[str, str]]] = {}  # ns -> name -> selector
        # When each unsettled request was first seen (self.monotonic): it was made before then.
        self._seen: dict[Key, float] = {}
        # Set once every signer name's first list of requests came in: the caches list only
        # then, so a start-up backlog finds them fresh enough (`signer.issue.facts`).
        self._pcrs_listed = threading.Event()
        self._unlisted = set(self.signer_names)
        # The pod, node and ServiceAccount of each request, as fresh as the request.
        self.bindings = Bindings(kube, metrics.live_reads, self._stop, self._pcrs_listed, monotonic)
        self.reflectors: list[Reflector] = [c.reflector for c in self.bindings.caches]
        for signer_name in self.signer_names:
            self.reflectors.append(
                Reflector(
                    f"pcrs[{signer_name}]",
                    lambda s=signer_name: self.kube.list_pcrs(s),  # type: ignore[misc]
                    lambda rv, s=signer_name: self.kube.watch_pcrs(s, rv),  # type: ignore[misc]
                    lambda items, s=signer_name: self._on_pcr_list(s, items),  # type: ignore[misc]
                    self._on_pcr_event,
                    self._stop,
                )
            )
        # The Services that give pods their names, when a policy gives any (`facts`).
        self._services_reflector: Reflector | None = None
        if any(self.policy.for_signer(s).dns.services for s in self.signer_names):
            self._services_reflector = Reflector(
                "services",
                lambda: self.kube.list_all("services", ServiceShape),
                lambda rv: self.kube.watch_all("services", rv, ServiceShape),
                self._on_service_list,
                self._on_service_event,
                self._stop,
            )
            self.reflectors.append(self._services_reflector)

    # --- running on the runtime ------------------------------------------------------------

    def pool(self) -> WorkerPool[Key]:
        """The workers: only the leader settles requests (a standby keeps them in its store;
        `started_leading` queues them again). As controllers wait for their informers, they
        wait for full lists in the node and ServiceAccount caches (and the Services', when a
        policy gives their names), else a start-up backlog is read live, three GETs a request
        (and its namespace's Services); after `facts_sync_timeout` they start anyway, live
        reads keeping each decision correct. The pod cache, the cluster's largest list, is not
        waited for: a request whose pod it lacks costs one live GET, so a signer on a large
        cluster issues once the small lists are in."""
        return WorkerPool(
            "worker",
            self.queue,
            self.reconcile,
            workers=self.settings.workers,
            active=self.is_leader,
            expected=(ApiError,),
            on_retry=self._count_retry,
            after_each=self._gauge_depth,
            context=_ctx,
            waits_for=[
                Synced(r.name, r.synced)
                for r in (
                    self.bindings.nodes.reflector,
                    self.bindings.service_accounts.reflector,
                    *([self._services_reflector] if self._services_reflector else []),
                )
            ],
            sync_timeout=self.settings.facts_sync_timeout,
            sync_timeout_note="settling requests with live reads until it does",
            logger=log,
        )

    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.reflectors)

    def started_leading(self) -> None:
        """Pick up every pending request."""
        with self._lock:
            keys = list(self._store)
        self.queue.add_all(keys)

    def stopped_leading(self) -> None:
        log.warning("not the leader any more: issuing stops")

    def _count_retry(self, key: Key, err: Exception) -> None:
        self.metrics.count_retry(
            api_retry_label(err.status) if isinstance(err, ApiError) else "Unexpected"
        )

    def _gauge_depth(self) -> None:
        self.metrics.queue_depth.set(len(self.queue))

    # --- reflector callbacks ---------------------------------------------------------------

    def _on_pcr_list(self, signer_name: str, items: Iterable[Read]) -> None:
        """One signer name's requests, listed whole: they replace that name's in the store."""
        seen = self.monotonic()  # the list answered: every request in it was made before
        if signer_name in self._unlisted:
            self._unlisted.discard(signer_name)
            if not self._unlisted:
                self._pcrs_listed.set()
        fresh: dict[Key, Read] = {}
        for obj in items:
            key = key_of(obj)
            if key is not None and obj.status.outcome is None:
                fresh[key] = obj
        with self._lock:
            for key, obj in list(self._store.items()):
                if key not in fresh and obj.spec.signer_name in (signer_name, ""):
                    self._store.pop(key)
                    self._seen.pop(key, None)
            self._store.update(fresh)
            for key in fresh:
                self._seen.setdefault(key, seen)
        # All at once: a worker must not take a flood's first keys before another node's
        # request of the same list is queued, or the fair queue cannot put it among the first.
        self.queue.add_all(fresh)
        self.metrics.queue_depth.set(len(self.queue))

    def _on_pcr_event(self, kind: str, obj: Read) -> None:
        key = key_of(obj)
        if key is None:
            return
        seen = self.monotonic()
        with self._lock:
            if kind == "DELETED" or obj.status.outcome is not None:
                self._store.pop(key, None)
                self._seen.pop(key, None)
                return
            self._store[key] = obj
            self._seen.setdefault(key, seen)
        self.queue.add(key)
        self.metrics.queue_depth.set(len(self.queue))

    def _on_service_list(self, items: Iterable[ServiceShape]) -> None:
        services: dict[str, dict[str, Mapping[str, str]]] = {}
        for obj in items:
            _index_service(services, obj, present=True)
        with self._lock:
            self._services = services

    def _on_service_event(self, kind: str, obj: ServiceShape) -> None:
        with self._lock:
            _index_service(self._services, obj, present=kind != "DELETED")

    # --- one request -----------------------------------------------------------------------

    def reconcile(self, key: Key) -> float | None:
        """Settle one request. Returns seconds until it should be looked at again, or None."""
        namespace, name = key
        with self._lock:
            pcr = self._store.get(key)
            seen_at = self._seen.get(key)
        if pcr is None:
            pcr = self.kube.get_pcr(namespace, name)
            if pcr is None:
                return None
        if seen_at is None:
            seen_at = self.monotonic()  # read just now (or stored by hand, in tests)
        if pcr.status.outcome is not None:
            return None
        hidden = False
        if isinstance(pcr, PodCertificateRequest) and not pcr.spec.holds_key:
            # A 1.35 node's request seen at v1: read at v1beta1.
            try:
                found = self.kube.keyed_pcr(pcr)
            except KeyNotServed:
                found, hidden = pcr, True
            if found is None or found.status.outcome is not None:
                self._forget(key)
                return None
            pcr = found
        problem = invalid(pcr)
        if problem is not None:
            invalid_request = model.Deny(model.INVALID_REQUEST, str(problem))
            return self.apply(settle(pcr, invalid_request, self.clock()))
        assert isinstance(pcr, PodCertificateRequest)  # `invalid` says why any other is not
        request = pcr
        if request.spec.signer_name not in self.signer_names:
            return None
        facts = self.facts(request, seen_at, key_not_served=hidden)
        decision = decide(
            request,
            facts,
            self.policy.for_signer(request.spec.signer_name),
            self.clock(),
            backdate=self.settings.backdate,
            refresh_fraction=self.settings.refresh_fraction,
        )
        answer: model.Answer
        if isinstance(decision, model.Retry):
            self.metrics.count_retry(decision.reason)
            self.metrics.ca_too_short.set(1 if decision.reason == CA_TOO_SHORT else 0)
            log.warning("not yet: %s", decision.reason, extra=_ctx(key))
            return decision.after.total_seconds()
        elif isinstance(decision, model.Issue):
            assert facts.ca is not None  # decide issues only with a CA
            self.metrics.ca_too_short.set(0)
            # Only issuance counts against the node's rate: a denial costs it nothing, so
            # requests that merely name a node (anyone may) cannot spend that node's tokens.
            wait = self._hold_back(key, request)
            if wait > 0:
                return wait
            try:
                answer = sign(decision.plan, facts.ca)
            except model.KeyUnavailable as err:
                self.metrics.token_errors.inc()
                log.warning("the CA key did not sign, retrying: %s", err, extra=_ctx(key))
                return 2.0  # seconds: a token that refused may well sign the next time
        elif isinstance(decision, model.Deny | model.Fail):
            answer = decision
        else:
            assert_never(decision)
        return self.apply(settle(request, answer, self.clock()))

    def _flow(self, key: Key) -> tuple[str, str]:
        """The queue's flow path of a request: its node, then its namespace. Workers take
        turns between nodes, so a node's flood cannot hold back the others; and within a node
        between namespaces, because anyone allowed to create requests can name any node.
        Requests not in the store share the node "" (they are rare: re-reads, relists)."""
        # One dict read (atomic) and no lock, so queue.add stays callable under self._lock.
        pcr = self._store.get(key)
        return (pcr.spec.node_name if pcr is not None else "", key[0])

    def _hold_back(self, key: Key, request: PodCertificateRequest) -> float:
        """Seconds this request must wait under its node's rate limit, 0 to go ahead. Held
        back, never denied: a node over its rate gets its certificates later. Logged at most
        every RATE_LIMIT_LOG_EVERY seconds, with how many were held back meanwhile."""
        spec = request.spec
        buckets = self._node_rates.get(spec.signer_name)
        if buckets is None:
            return 0.0
        now = self.monotonic()
        wait = buckets.admit(spec.node_name, key, now)
        if wait <= 0:
            return 0.0
        self.metrics.rate_limited.labels(signer_name=spec.signer_name, reason="NodeRateLimit").inc()
        with self._held_lock:
            self._held_back += 1
            if now - self._held_logged < RATE_LIMIT_LOG_EVERY:
                return wait
            held, self._held_back, self._held_logged = self._held_back, 0, now
        log.warning(
            "node %s is over its rate limit for %s: this request waits %.1fs (%d held back "
            "since the last such message)",
            spec.node_name,
            spec.signer_name,
            wait,
            held,
            extra=_ctx(key),
        )
        return wait

    def facts(
        self, request: PodCertificateRequest, seen_at: float, *, key_not_served: bool = False
    ) -> model.Facts:
        """The request's pod, node and service account as they were at least when it was seen
        (`seen_at`, on self.monotonic: `signer.issue.facts`), its Service names and the CA.
        `key_not_served`: the adapter found that no served version shows the request's key."""
        dns = self.policy.for_signer(request.spec.signer_name).dns
        pod, node, sa = self.bindings.read(request, seen_at, labels=dns.services)
        names: frozenset[str] = frozenset()
        if pod is not None and dns.services:
            assert pod.labels is not None  # read whole when the cache did not keep them
            reflector = self._services_reflector
            if reflector is not None and reflector.synced.is_set():
                with self._lock:
                    services = dict(self._services.get(request.namespace, {}))
            else:  # not listed yet: an empty index is not "no Services", so read them live
                index: dict[str, dict[str, Mapping[str, str]]] = {}
                for obj in self.kube.list_in("services", request.namespace, ServiceShape):
                    _index_service(index, obj, present=True)
                services = dict(index.get(request.namespace, {}))
            names = service_names(services, pod.namespace, pod.labels, dns.cluster_domain)
        return model.Facts(
            pod=pod,
            node=node,
            service_account=sa,
            service_dns_names=names,
            ca=self.cas.issuing(),
            key_not_served=key_not_served,
        )

    def admission_facts(self, request: PodCertificateRequest) -> model.Facts:
        """The facts for the admission webhook's pre-check, before the request exists: the
        caches as they are (read live only where they would deny). Issuance checks again with
        facts as fresh as the request."""
        return self.facts(request, -math.inf)

    # --- the one writer --------------------------------------------------------------------

    def apply(self, settlement: Settlement) -> float | None:
        """Write one settlement: its status (one PUT, guarded by the resourceVersion), its
        audit entry, its Event and its metrics. Returns seconds until the request should be
        looked at again (the write must be retried), or None."""
        key, extra = settlement.key, _ctx(settlement.key)
        if not self.is_leader():
            return None  # lost the lease mid-flight: the new leader will settle it
        if settlement.write_ahead and not self.trail.record(settlement.entry):
            # Write-ahead and fail closed: a certificate is durably in the audit log before it
            # can exist anywhere else (a crash between the two leaves an entry for a leaf nobody
            # received, never a leaf the log does not know); no entry, no certificate.
            self.metrics.count_retry("AuditLogUnwritable")
            return min(30.0, self.queue.backoff(key))
        try:
            self.kube.write_status(settlement.target, settlement.status)
        except ApiError as err:
            if err.status == 404:
                self._forget(key)
                return None
            if err.status == 409:
                # Someone changed it since we read it: re-read; an outcome already written
                # by someone else stands.
                fresh = self.kube.get_pcr(*key)
                if fresh is None or fresh.status.outcome is not None:
                    self._forget(key)
                    return None
                with self._lock:
                    self._store[key] = fresh
                return 0.0
            if err.status == 422:
                # The API server refused our status (clock skew, a CA it cannot parse...):
                # a fault to retry and alert on, never a reason to fail the pod.
                self.metrics.count_retry("StatusRejected")
                log.error("API server rejected the status: %s", err.message, extra=extra)
                return min(60.0, self.queue.backoff(key))
            raise
        self._forget(key)
        now = self.clock()
        counter, latency = self._series(settlement.labels)
        counter.inc()
        if settlement.created is not None:
            latency.observe(max(0.0, (now - settlement.created).total_seconds()))
        if settlement.outcome == "Issued":
            log.info("issued serial %s", settlement.serial, extra=extra)
        else:
            log.warning(
                "%s (%s): %s",
                settlement.outcome.lower(),
                settlement.reason,
                settlement.message,
                extra=extra,
            )
        if settlement.event is not None:
            event = settlement.event
            self.kube.record_event(settlement.target, event.reason, event.message, now, event.type)
        if not settlement.write_ahead:
            self.trail.record(settlement.entry)
        return None

    def _series(self, labels: Labels) -> tuple[Counter, Histogram]:
        """The requests counter and latency histogram of a settlement's labels, looked up once
        per label set (a few: signer names x outcomes x reasons), not at every write."""
        found = self._settled_series.get(labels)
        if found is None:
            found = (
                self.metrics.requests.labels(
                    signer_name=labels.signer_name, outcome=labels.outcome, reason=labels.reason
                ),
                self.metrics.latency.labels(signer_name=labels.signer_name, outcome=labels.outcome),
            )
            self._settled_series[labels] = found
        return found

    def _forget(self, key: Key) -> None:
        with self._lock:
            self._store.pop(key, None)
            self._seen.pop(key, None)


def sign(plan: model.LeafPlan, issuer: model.IssuingCA) -> model.Signed:
    """Carry out an Issue: a fresh random serial, the leaf signed to its plan."""
    serial = certs.random_serial()
    return model.Signed(plan, certs.sign_leaf(plan, issuer, serial), serial)


def _index_service(
    index: dict[str, dict[str, Mapping[str, str]]], obj: ServiceShape, *, present: bool
) -> None:
    """Keep the Service's selector when it gives its name to pods (`service_selector`),
    drop it when it is gone or gives its name to none (a type changed to ExternalName)."""
    namespace, name = obj.metadata.namespace, obj.metadata.name
    if not namespace or not name:
        return
    selector = service_selector(obj) if present else None
    if selector is not None:
        index.setdefault(namespace, {})[name] = selector
    else:
        index.get(namespace, {}).pop(name, None)


def _ctx(key: Key) -> dict[str, str]:
    """Log context for a request ("name" is taken by logging itself)."""
    return {"namespace": key[0], "request": key[1]}
