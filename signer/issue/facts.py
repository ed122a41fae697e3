"""The facts a request is checked against: the pods, nodes, ServiceAccounts and Services the
signer reads, in the shapes it decodes them as, bounded, and no older than the request.

Shapes. The signer caches every pod, node and ServiceAccount of the cluster, so each is decoded
from a list page, a watch event or a live read as a shape (`PodShape`...: the few fields the
signer needs, everything else skipped unread) and turned into its value (`model.Pod`...), which
shares what repeats between objects (namespaces, node and account names, phases, label sets)
instead of holding a copy each. Hostile or broken objects become `ObjectError` naming the field,
never a KeyError or TypeError.

Bounds. A pod's labels are the one field a tenant can make as large as the pod itself
(Kubernetes bounds each label, not their number), so a cached pod holds them only while their
JSON is at most `LABELS_KEPT` bytes. A shape reads them as raw JSON and measures that before
decoding, so a larger map is never built at all; the pod then holds None, "not kept", and the one
decision that reads labels (`dnsNames.services`) reads that pod live, its labels whole, for
itself only (`Bindings.read`). The bound decides only where labels come from, never what a
decision sees.

Freshness. A ServiceAccount deleted, a pod that failed or a node removed just before a request was
made must deny it, yet a watched cache can still show the old state for a while after (its watch
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

Services give a pod DNS names (`service_selector`, `service_names`); the controller keeps their
index. Pure but for `Bindings`, whose reads go through the API adapter it is given.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Hashable, Mapping
from types import MappingProxyType
from typing import Any, Final, Generic, Protocol, TypeVar

import msgspec
from prometheus_client import Counter

from podcert.api.requests import PodCertificateRequest
from podcert.reconcile.cache import Cache
from signer import model
from signer.issue.decide import binding_problem
from signer.kube import SignerKube


class ObjectError(ValueError):
    """An API object lacks a field the signer needs, or has it with the wrong type."""


def _str(obj: Mapping[str, Any], path: str, *, required: bool = True) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    if node is None and not required:
        return ""
    if not isinstance(node, str) or (required and not node):
        raise ObjectError(f"{path}: expected a non-empty string, got {type(node).__name__}")
    return node


# --- shapes: what the signer's caches decode of each object -------------------------------------


class _Meta(msgspec.Struct, frozen=True, gc=False):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""  # the API's spelling: msgspec matches fields by name


class _PodMeta(_Meta, frozen=True, gc=False):
    # Raw: measured before it is decoded (`_labels`), and never decoded when over the bound.
    labels: msgspec.Raw = msgspec.Raw(b"null")
    deletionTimestamp: str | None = None


class _PodSpec(msgspec.Struct, frozen=True, gc=False):
    nodeName: str = ""
    serviceAccountName: str = ""


class _PodStatus(msgspec.Struct, frozen=True, gc=False):
    phase: str = ""


class PodShape(msgspec.Struct, frozen=True, gc=False):
    metadata: _PodMeta = _PodMeta()
    spec: _PodSpec = _PodSpec()
    status: _PodStatus = _PodStatus()


class NodeShape(msgspec.Struct, frozen=True, gc=False):
    metadata: _Meta = _Meta()


class ServiceAccountShape(msgspec.Struct, frozen=True, gc=False):
    metadata: _Meta = _Meta()


Shape = PodShape | NodeShape | ServiceAccountShape


def key_of(obj: Mapping[str, Any] | Shape) -> tuple[str, str] | None:
    """(namespace, name) of an object, a dict or a shape; None without both."""
    if isinstance(obj, Mapping):
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping):
            return None
        namespace, name = meta.get("namespace"), meta.get("name")
    else:
        namespace, name = obj.metadata.namespace, obj.metadata.name
    if isinstance(namespace, str) and isinstance(name, str) and namespace and name:
        return sys.intern(namespace), name
    return None


def name_of(obj: Mapping[str, Any] | Shape) -> str | None:
    if isinstance(obj, Mapping):
        name = (obj.get("metadata") or {}).get("name")
        return name if isinstance(name, str) else None
    return obj.metadata.name or None


# --- the cached values ---------------------------------------------------------------------------

LABELS_KEPT: Final = 2048
"""The largest label map a cached pod holds, in bytes of JSON as the API server writes it (the
labels of the workloads seen in practice take a few hundred). A larger one is not kept: read
live when a decision needs it."""
_NO_LABELS: Final[Mapping[str, str]] = MappingProxyType({})
_LABEL_SETS_MAX: Final = 1 << 16
_label_sets: dict[tuple[tuple[str, str], ...], Mapping[str, str]] = {}
_LABELS: Final = msgspec.json.Decoder(dict[str, str] | None)


def labels_size(labels: Mapping[str, str]) -> int:
    """The bytes of `labels` as JSON without spaces (`{"k":"v",...}`), as the API server writes
    them: a label's key and value never need escaping."""
    return 1 + sum(len(k) + len(v) + 6 for k, v in labels.items()) if labels else 2


def _labels(raw: object, *, whole: bool = False) -> Mapping[str, str] | None:
    """A pod's labels as a read-only mapping, or None when they are over `LABELS_KEPT` and not
    `whole` (raw JSON that long is not even decoded). Label sets that fit are shared, one mapping
    per distinct set (the pods of a ReplicaSet share theirs); the table of known sets is emptied
    when it grows past a bound, never grown without one: mappings already handed out stay valid,
    later pods just share afresh. A `whole` set over the bound is the caller's alone."""
    if isinstance(raw, msgspec.Raw):
        if len(raw) > LABELS_KEPT and not whole:
            return None
        try:
            raw = _LABELS.decode(raw)
        except msgspec.DecodeError as err:
            raise ObjectError(f"metadata.labels: {err}") from None
    if not isinstance(raw, Mapping) or not raw:
        return _NO_LABELS
    labels = {str(k): str(v) for k, v in raw.items()}
    if labels_size(labels) > LABELS_KEPT:
        return MappingProxyType(labels) if whole else None
    items = tuple(sorted(labels.items()))
    found = _label_sets.get(items)
    if found is None:
        if len(_label_sets) >= _LABEL_SETS_MAX:
            _label_sets.clear()
        found = MappingProxyType({sys.intern(k): sys.intern(v) for k, v in items})
        _label_sets[items] = found
    return found


def kept(pod: model.Pod | None) -> model.Pod | None:
    """`pod` as a cache keeps it: without its labels when they are over `LABELS_KEPT`."""
    if pod is None or pod.labels is None or labels_size(pod.labels) <= LABELS_KEPT:
        return pod
    return msgspec.structs.replace(pod, labels=None)


def _required(value: object, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise ObjectError(f"{path}: expected a non-empty string, got {type(value).__name__}")
    return value


def pod_from(obj: Mapping[str, Any] | PodShape, *, whole: bool = False) -> model.Pod:
    """The signer's view of a pod; its labels None when over `LABELS_KEPT`, unless `whole`
    (a live read for one decision, never kept)."""
    if isinstance(obj, PodShape):
        shaped = obj.metadata
        return model.Pod(
            namespace=sys.intern(_required(shaped.namespace, "namespace")),
            name=_required(shaped.name, "name"),
            uid=_required(shaped.uid, "uid"),
            node_name=sys.intern(obj.spec.nodeName),
            service_account_name=sys.intern(obj.spec.serviceAccountName or "default"),
            phase=sys.intern(obj.status.phase or "Pending"),
            deleting=bool(shaped.deletionTimestamp),
            labels=_labels(shaped.labels, whole=whole),
        )
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    return model.Pod(
        namespace=sys.intern(_str(meta, "namespace")),
        name=_str(meta, "name"),
        uid=_str(meta, "uid"),
        node_name=sys.intern(_str(spec, "nodeName", required=False)),
        service_account_name=sys.intern(
            _str(spec, "serviceAccountName", required=False) or "default"
        ),
        phase=sys.intern(_str(status, "phase", required=False) or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        labels=_labels(meta.get("labels"), whole=whole),
    )


def node_from(obj: Mapping[str, Any] | NodeShape) -> model.Node:
    if isinstance(obj, NodeShape):
        return model.Node(
            name=sys.intern(_required(obj.metadata.name, "name")),
            uid=_required(obj.metadata.uid, "uid"),
        )
    meta = obj.get("metadata") or {}
    return model.Node(name=sys.intern(_str(meta, "name")), uid=_str(meta, "uid"))


def service_account_from(obj: Mapping[str, Any] | ServiceAccountShape) -> model.ServiceAccount:
    if isinstance(obj, ServiceAccountShape):
        shaped = obj.metadata
        return model.ServiceAccount(
            namespace=sys.intern(_required(shaped.namespace, "namespace")),
            name=sys.intern(_required(shaped.name, "name")),
            uid=_required(shaped.uid, "uid"),
        )
    meta = obj.get("metadata") or {}
    return model.ServiceAccount(
        namespace=sys.intern(_str(meta, "namespace")),
        name=sys.intern(_str(meta, "name")),
        uid=_str(meta, "uid"),
    )


# --- Services: what gives a pod its DNS names --------------------------------------------------

ROUTING_SERVICE_TYPES: Final = frozenset({"ClusterIP", "NodePort", "LoadBalancer"})
"""The Service types whose name leads to the pods their selector picks (a headless Service is a
ClusterIP one with clusterIP None: its name resolves to the pods themselves). An ExternalName
Service's name is a CNAME to somewhere else, whatever selector it carries; a type this list does
not know gives no name either."""


class _ServiceSpec(msgspec.Struct, frozen=True, gc=False):
    type: Any = "ClusterIP"  # the API server's default, stored on every Service it admits
    selector: Any = None


class ServiceShape(msgspec.Struct, frozen=True, gc=False):
    """What the signer reads of a Service: its key, version, type and selector (annotations,
    ports and the rest are skipped unread)."""

    metadata: _Meta = _Meta()
    spec: _ServiceSpec = _ServiceSpec()


def service_selector(obj: ServiceShape) -> Mapping[str, str] | None:
    """The selector by which a Service gives its DNS name to pods, or None when it gives its
    name to none: a type that does not route to its pods (`ROUTING_SERVICE_TYPES`), or no
    selector (its endpoints are managed by hand), or one that is not a map of strings."""
    spec = obj.spec
    if spec.type not in ROUTING_SERVICE_TYPES or not isinstance(spec.selector, Mapping):
        return None
    selector = spec.selector
    if not selector or not all(isinstance(v, str) for v in selector.values()):
        return None
    return {str(k): v for k, v in selector.items()}


def service_names(
    services: Mapping[str, Mapping[str, str]],
    namespace: str,
    labels: Mapping[str, str],
    cluster_domain: str,
) -> frozenset[str]:
    """DNS names of every Service (name -> selector) in `namespace` whose selector selects the pod.

    A Service without a selector selects nothing (its endpoints are managed by hand).
    """
    names: set[str] = set()
    for service, selector in services.items():
        if selector and all(labels.get(k) == v for k, v in selector.items()):
            names.add(f"{service}.{namespace}.svc")
            names.add(f"{service}.{namespace}.svc.{cluster_domain}")
    return frozenset(names)


# --- as fresh as the request -------------------------------------------------------------------

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

        self.pods: Cache[Key, model.Pod] = cache("pods", PodShape, key_of, pod_from)
        self.nodes: Cache[str, model.Node] = cache("nodes", NodeShape, name_of, node_from)
        self.service_accounts: Cache[Key, model.ServiceAccount] = cache(
            "serviceaccounts",
            ServiceAccountShape,
            key_of,
            service_account_from,
        )
        self.fresh_pods: Fresh[Key, model.Pod] = Fresh(
            self.pods,
            self._read_pod,
            monotonic,
            live_reads.labels(resource="pods").inc,
            keep=kept,
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
        found = self.kube.get_as("pods", *key, PodShape)
        return pod_from(found, whole=True) if found is not None else None

    def _read_node(self, name: str) -> model.Node | None:
        found = self.kube.get_as("nodes", None, name, NodeShape)
        return node_from(found) if found is not None else None

    def _read_service_account(self, key: Key) -> model.ServiceAccount | None:
        found = self.kube.get_as("serviceaccounts", *key, ServiceAccountShape)
        return service_account_from(found) if found is not None else None
