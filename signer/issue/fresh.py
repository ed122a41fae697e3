"""Facts as fresh as a request: every change made before the signer saw it, and no older.

A ServiceAccount deleted, a pod that failed or a node removed just before a request was made
must deny it, yet a watched cache can still show the old state for a while after (its watch
lags the API server). resourceVersions cannot order a pod against a request: they compare only
within one resource (KEP-5504; `--etcd-servers-overrides` can store each in its own etcd). So the
order comes from the signer's own clock. A list or a GET is a consistent read: what it returns
reflects every change the API server had made before it was asked. A request the signer has
seen was made before it was seen. So a read asked for after a request was seen is fresh enough
for it:

- the cache, when the list its entries rest on was asked for after the request was seen (a
  start-up backlog: the caches list after the requests, `Controller`'s `after`);
- otherwise a live GET, whose answer is kept for the requests seen before it was asked (a node's
  or a ServiceAccount's many pods re-keying at once cost one GET, not one each).

Changes after the request was made are not waited for, as in the kubelet: the cache catches them
when it can. What a cache would deny on is read live in any case (`Bindings.read`).

A pod's labels are kept only while small (`signer.objects.LABELS_KEPT`), in the cache and among
the kept live answers alike, so no tenant's labels grow the signer past a bound per pod. A
decision that needs labels the pod's entry does not hold reads that pod live, which is as fresh
as any read above, and uses its labels whole for itself only. A live read is decoded into the
cache's shape (`signer.objects.PodShape`: labels raw, annotations and the rest never decoded), so
it costs the object's bytes while it is read and nothing after.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, Final, Generic, Protocol, TypeVar

from prometheus_client import Counter

from podcert.api.requests import PodCertificateRequest
from podcert.reconcile.cache import Cache
from signer import model, objects
from signer.issue.decide import binding_problem
from signer.kube import SignerKube

Key = tuple[str, str]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
K_contra = TypeVar("K_contra", bound=Hashable, contravariant=True)
V_co = TypeVar("V_co", covariant=True)

KEPT: Final = 4096  # live answers kept for reuse, the oldest dropped first


class Listed(Protocol[K_contra, V_co]):
    """A watched cache as seen here (`podcert.reconcile.cache.Cache`)."""

    @property
    def listed_at(self) -> float: ...

    def get(self, key: K_contra) -> V_co | None: ...


class Fresh(Generic[K, V]):
    """One kind of fact (pods, nodes or ServiceAccounts), read fresh for a request seen at a
    given moment of `monotonic`."""

    def __init__(
        self,
        cache: Listed[K, V],
        read: Callable[[K], V | None],
        monotonic: Callable[[], float],
        on_read: Callable[[], None] = lambda: None,
        kept: int = KEPT,
        keep: Callable[[V | None], V | None] = lambda value: value,
    ) -> None:
        self.cache = cache
        self._read, self._monotonic, self._on_read = read, monotonic, on_read
        self._kept, self._keep = kept, keep
        self._lock = threading.Lock()
        self._answers: dict[K, tuple[float, V | None]] = {}  # key -> (asked at, answer)

    def get(self, key: K, seen_at: float) -> tuple[V | None, bool]:
        """The fact as it was at least at `seen_at`, and whether it came from the cache: cached
        when the cache is that fresh, else a live answer asked for since, else read live now.
        A live answer is the API server's word; a cached one may lag, so the caller reads it
        live before denying on it."""
        if self.cache.listed_at >= seen_at:
            return self.cache.get(key), True
        with self._lock:
            answer = self._answers.get(key)
        if answer is not None and answer[0] >= seen_at:
            return answer[1], False
        return self.read(key), False

    def read(self, key: K) -> V | None:
        """Read live: the answer whole; `keep` of it is kept for requests seen before now."""
        asked = self._monotonic()
        value = self._read(key)
        self._on_read()
        with self._lock:
            kept = self._answers.pop(key, None)
            # Two workers may read one key at once: the answer asked for later stays.
            if kept is None or kept[0] <= asked:
                kept = (asked, self._keep(value))
            self._answers[key] = kept
            if len(self._answers) > self._kept:
                del self._answers[next(iter(self._answers))]
        return value


class Bindings:
    """The watched caches of the cluster's pods, nodes and ServiceAccounts, each read through
    `Fresh`. They list only `after` the requests were listed (the controller sets it), so a
    start-up backlog is settled from the caches, with no GET."""

    def __init__(
        self,
        kube: SignerKube,
        live_reads: Counter,
        stop: threading.Event,
        after: threading.Event,
        monotonic: Callable[[], float],
    ) -> None:
        self.kube = kube

        def cache(
            resource: str,
            shape: type[Any],
            key: Callable[[Any], K | None],
            convert: Callable[[Any], V],
        ) -> Cache[K, V]:
            """Each decoded as its shape (a few fields of each object), a page at a time."""
            return Cache(
                resource,
                lambda: kube.list_all(resource, shape),
                lambda rv: kube.watch_all(resource, rv, shape),
                key,
                convert,
                stop,
                after=after,
                monotonic=monotonic,
            )

        self.pods: Cache[Key, model.Pod] = cache(
            "pods", objects.PodShape, objects.key_of, objects.pod_from
        )
        self.nodes: Cache[str, model.Node] = cache(
            "nodes", objects.NodeShape, objects.name_of, objects.node_from
        )
        self.service_accounts: Cache[Key, model.ServiceAccount] = cache(
            "serviceaccounts",
            objects.ServiceAccountShape,
            objects.key_of,
            objects.service_account_from,
        )
        self.fresh_pods: Fresh[Key, model.Pod] = Fresh(
            self.pods,
            self._read_pod,
            monotonic,
            live_reads.labels(resource="pods").inc,
            keep=objects.kept,
        )
        self.fresh_nodes: Fresh[str, model.Node] = Fresh(
            self.nodes, self._read_node, monotonic, live_reads.labels(resource="nodes").inc
        )
        self.fresh_service_accounts: Fresh[Key, model.ServiceAccount] = Fresh(
            self.service_accounts,
            self._read_service_account,
            monotonic,
            live_reads.labels(resource="serviceaccounts").inc,
        )

    @property
    def caches(self) -> tuple[Cache[Any, Any], ...]:
        return (self.pods, self.nodes, self.service_accounts)

    def read(
        self, request: PodCertificateRequest, seen_at: float, *, labels: bool = False
    ) -> tuple[model.Pod | None, model.Node | None, model.ServiceAccount | None]:
        """The request's pod, node and ServiceAccount as they were at least at `seen_at`. When
        decide's binding checks would find a problem in them, those that came from a cache are
        read live, so that no request is denied on a cache that lags behind the API server.
        With `labels`, the pod (when it exists) comes with its labels whole: read live when
        its entry does not hold them."""
        pod_key = (request.namespace, request.spec.pod_name)
        sa_key = (request.namespace, request.spec.service_account_name)
        pod, pod_cached = self.fresh_pods.get(pod_key, seen_at)
        if labels and pod is not None and pod.labels is None:
            pod, pod_cached = self.fresh_pods.read(pod_key), False
        node, node_cached = self.fresh_nodes.get(request.spec.node_name, seen_at)
        sa, sa_cached = self.fresh_service_accounts.get(sa_key, seen_at)
        if binding_problem(request, model.Facts(pod, node, sa)) is not None:
            pod = self.fresh_pods.read(pod_key) if pod_cached else pod
            node = self.fresh_nodes.read(request.spec.node_name) if node_cached else node
            sa = self.fresh_service_accounts.read(sa_key) if sa_cached else sa
        return pod, node, sa

    def _read_pod(self, key: Key) -> model.Pod | None:
        found = self.kube.get_pod(*key)
        return objects.pod_from(found, whole=True) if found is not None else None

    def _read_node(self, name: str) -> model.Node | None:
        found = self.kube.get_node(name)
        return objects.node_from(found) if found is not None else None

    def _read_service_account(self, key: Key) -> model.ServiceAccount | None:
        found = self.kube.get_service_account(*key)
        return objects.service_account_from(found) if found is not None else None
