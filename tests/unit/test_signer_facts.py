"""What the signer reads of the cluster beside requests (`signer.issue.facts`).

Shapes: pods, nodes, ServiceAccounts and Services in, the signer's model out; broken objects
name the field; a pod's labels are kept only within their bound.

Freshness: a change made before the signer saw a request is never missed, however far the
watched caches lag, and a start-up backlog costs no GET. The order comes from the signer's own
monotonic clock (resourceVersions compare only within one resource): a cache whose list was
asked for after the request was seen is fresh enough, and so is a live answer asked for after
it; anything older is read again. In CI this was a real miss: a ServiceAccount deleted just
before the request still stood in the cache, and the signer issued
(tests/integration/test_signer_facts.py, "service account deleted", under load)."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from collections.abc import Iterator
from typing import Any, cast

import msgspec
import pytest

from podcert.api import requests
from podcert.reconcile.reflector import Reflector
from signer import model
from signer.authority.castore import CAStore
from signer.issue import facts as shapes
from signer.issue.controller import Controller, utcnow
from signer.issue.decide import decide
from signer.issue.facts import Fresh
from signer.kube import SignerKube
from signer.metrics import Metrics
from signer.policy import Policy, default_policy
from tests.signer_world import (
    ISSUER,
    NOW,
    POLICY,
    SERVICES_DNS,
    SIGNER,
    LiveKube,
    make_request,
)

# --- shapes --------------------------------------------------------------------------------------


def test_service_names_come_only_from_selecting_services() -> None:
    services = {"api": {"app": "api"}, "manual": {}, "other": {"app": "x"}}
    names = shapes.service_names(services, "ns", {"app": "api", "tier": "1"}, "cluster.local")
    assert names == {"api.ns.svc", "api.ns.svc.cluster.local"}


# --- the caches read pods, nodes and ServiceAccounts as shapes ------------------------------------

POD = {
    "metadata": {
        "namespace": "shop",
        "name": "web-1",
        "uid": "pod-uid",
        "resourceVersion": "41",
        "labels": {"app": "web", "tier": "front"},
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
    },
    "spec": {"nodeName": "node-a", "serviceAccountName": "web", "containers": [{"name": "c"}]},
    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
}


def test_a_pod_read_as_a_shape_is_the_pod_read_as_a_dict() -> None:
    shape = msgspec.json.decode(json.dumps(POD), type=shapes.PodShape)
    assert shapes.pod_from(shape) == shapes.pod_from(POD)
    assert shapes.key_of(shape) == shapes.key_of(POD) == ("shop", "web-1")
    deleting = {**POD, "metadata": {**POD["metadata"], "deletionTimestamp": "2026-11-29T12:00:00Z"}}
    shape = msgspec.json.decode(json.dumps(deleting), type=shapes.PodShape)
    assert shapes.pod_from(shape).deleting


def test_pods_with_the_same_labels_share_one_read_only_mapping() -> None:
    other = {**POD, "metadata": {**POD["metadata"], "name": "web-2", "uid": "u2"}}
    first, second = shapes.pod_from(POD), shapes.pod_from(other)
    assert first.labels is second.labels
    assert dict(first.labels) == {"app": "web", "tier": "front"}
    with pytest.raises(TypeError):
        first.labels["app"] = "db"  # type: ignore[index]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param(
            {"metadata": {"name": "p", "uid": "u"}}, "namespace", id="pod without namespace"
        ),
        pytest.param({"metadata": {"namespace": "n", "name": "p"}}, "uid", id="pod without UID"),
    ],
)
def test_a_pod_shape_missing_a_field_names_it(body: dict[str, Any], field: str) -> None:
    with pytest.raises(shapes.ObjectError, match=field):
        shapes.pod_from(msgspec.json.decode(json.dumps(body), type=shapes.PodShape))


def test_nodes_and_service_accounts_read_as_shapes() -> None:
    node = msgspec.json.decode(
        b'{"metadata": {"name": "node-a", "uid": "n1"}, "status": {"images": [{"names": ["x"]}]}}',
        type=shapes.NodeShape,
    )
    assert shapes.node_from(node) == model.Node("node-a", "n1")
    assert shapes.name_of(node) == "node-a"
    sa = msgspec.json.decode(
        b'{"metadata": {"namespace": "shop", "name": "web", "uid": "s1"}}',
        type=shapes.ServiceAccountShape,
    )
    assert shapes.service_account_from(sa) == model.ServiceAccount("shop", "web", "s1")


# --- a pod's labels are kept only while small; Services give names by type ------------------------

HUGE_LABELS = {f"tenant.example/k{i:05d}": "v" * 40 for i in range(7000)}


def pod_json(labels: Any) -> bytes:
    """A pod as the API server writes it (no spaces)."""
    body = {**POD, "metadata": {**POD["metadata"], "labels": labels}}
    return json.dumps(body, separators=(",", ":")).encode()


def test_labels_size_is_the_bytes_the_api_server_writes() -> None:
    for labels in ({}, {"app": "web"}, {"app": "web", "tier": "front"}, HUGE_LABELS):
        assert shapes.labels_size(labels) == len(json.dumps(labels, separators=(",", ":")))


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda body: msgspec.json.decode(body, type=shapes.PodShape), id="shape"),
        pytest.param(lambda body: json.loads(body), id="dict"),
    ],
)
def test_a_pod_holds_its_labels_only_up_to_the_bound(read: Any) -> None:
    def labels_at(size: int) -> dict[str, str]:
        """One label whose map is `size` bytes of JSON."""
        return {"k": "v" * (size - len('{"k":""}'))}

    at_bound = labels_at(shapes.LABELS_KEPT)
    assert shapes.pod_from(read(pod_json(at_bound))).labels == at_bound
    assert shapes.pod_from(read(pod_json(labels_at(shapes.LABELS_KEPT + 1)))).labels is None
    pod = shapes.pod_from(read(pod_json(HUGE_LABELS)))
    assert pod.labels is None
    assert (pod.namespace, pod.name, pod.uid, pod.node_name) == (
        "shop",
        "web-1",
        "pod-uid",
        "node-a",
    )


def test_labels_over_the_bound_are_never_decoded_from_a_shape() -> None:
    """Not even read as strings: a map of numbers this large fails nothing, and builds nothing."""
    numbers = {f"k{i:05d}": i for i in range(1000)}
    shape = msgspec.json.decode(pod_json(numbers), type=shapes.PodShape)
    assert shapes.pod_from(shape).labels is None
    wrong = msgspec.json.decode(pod_json({"app": 1}), type=shapes.PodShape)
    with pytest.raises(shapes.ObjectError, match=r"metadata\.labels"):
        shapes.pod_from(wrong)


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda body: msgspec.json.decode(body, type=shapes.PodShape), id="shape"),
        pytest.param(lambda body: json.loads(body), id="dict"),
    ],
)
def test_a_pod_read_whole_has_every_label_and_kept_drops_them(read: Any) -> None:
    whole = shapes.pod_from(read(pod_json(HUGE_LABELS)), whole=True)
    assert whole.labels == HUGE_LABELS
    kept = shapes.kept(whole)
    assert kept is not None and kept.labels is None
    assert msgspec.structs.replace(kept, labels=whole.labels) == whole
    small = shapes.pod_from(POD, whole=True)
    assert shapes.kept(small) is small
    assert shapes.kept(None) is None


def service(type_: str | None, selector: Any, **spec: Any) -> shapes.ServiceShape:
    body: dict[str, Any] = {"selector": selector, **spec}
    if type_ is not None:
        body["type"] = type_
    obj = {"metadata": {"namespace": "shop", "name": "api", "resourceVersion": "9"}, "spec": body}
    return msgspec.json.decode(json.dumps(obj), type=shapes.ServiceShape)


@pytest.mark.parametrize(
    ("shape", "gives"),
    [
        pytest.param(service("ClusterIP", {"app": "api"}), True, id="ClusterIP gives its name"),
        pytest.param(
            service("ClusterIP", {"app": "api"}, clusterIP="None"),
            True,
            id="headless gives its name",
        ),
        pytest.param(service("NodePort", {"app": "api"}), True, id="NodePort gives its name"),
        pytest.param(
            service("LoadBalancer", {"app": "api"}), True, id="LoadBalancer gives its name"
        ),
        pytest.param(service(None, {"app": "api"}), True, id="no type is ClusterIP"),
        pytest.param(
            service("ExternalName", {"app": "api"}, externalName="evil.example"),
            False,
            id="ExternalName with a selector gives no name",
        ),
        pytest.param(service("Tunnel", {"app": "api"}), False, id="an unknown type gives none"),
        pytest.param(service("ClusterIP", None), False, id="no selector gives none"),
        pytest.param(service("ClusterIP", {}), False, id="an empty selector gives none"),
        pytest.param(service("ClusterIP", {"app": 1}), False, id="a broken selector gives none"),
        pytest.param(service("ClusterIP", ["app"]), False, id="a selector not a map gives none"),
    ],
)
def test_only_services_that_route_to_their_pods_give_names(
    shape: shapes.ServiceShape, gives: bool
) -> None:
    assert shapes.service_selector(shape) == ({"app": "api"} if gives else None)


# --- as fresh as the request ---------------------------------------------------------------------


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Listed:
    """A cache: its entries, and when the list they rest on was asked for."""

    def __init__(self, listed_at: float, items: dict[Any, Any]) -> None:
        self.listed_at, self.items = listed_at, items

    def get(self, key: Any) -> Any:
        return self.items.get(key)


def fresh(
    listed_at: float, cached: str | None, live: list[str | None], clock: Clock
) -> tuple[Fresh[str, str], list[str]]:
    """A Fresh over a cache holding `cached` for "k", whose live reads answer `live` in turn."""
    answers = iter(live)
    reads: list[str] = []

    def read(key: str) -> str | None:
        reads.append(key)
        return next(answers)

    cache = Listed(listed_at, {"k": cached} if cached is not None else {})
    return Fresh(cache, read, clock), reads


def test_a_cache_listed_after_the_request_was_seen_answers() -> None:
    facts, reads = fresh(listed_at=50.0, cached="cached", live=[], clock=Clock())
    assert facts.get("k", seen_at=50.0) == ("cached", True)
    assert facts.get("k", seen_at=10.0) == ("cached", True)
    assert reads == []


def test_a_request_seen_after_the_cache_listed_is_read_live() -> None:
    """The cache still holds what a change made before the request removed: not trusted."""
    clock = Clock(100.0)
    facts, reads = fresh(listed_at=50.0, cached="deleted since", live=[None], clock=clock)
    assert facts.get("k", seen_at=60.0) == (None, False)
    assert reads == ["k"]


def test_a_live_answer_serves_the_requests_seen_before_it_was_asked() -> None:
    """A node's many pods re-keying at once: one GET, not one each; a request seen after the
    GET was asked for gets a GET of its own."""
    clock = Clock(100.0)
    facts, reads = fresh(listed_at=0.0, cached="old", live=["one", "two"], clock=clock)
    assert facts.get("k", seen_at=90.0) == ("one", False)  # asked at 100
    clock.now = 120.0
    assert facts.get("k", seen_at=95.0) == ("one", False)
    assert facts.get("k", seen_at=100.0) == ("one", False)
    assert reads == ["k"]
    assert facts.get("k", seen_at=110.0) == ("two", False), "asked before the request was seen"
    assert reads == ["k", "k"]


def test_of_two_reads_at_once_the_answer_asked_later_stays() -> None:
    """Worker A asks first and is answered last: B's later answer is kept."""
    clock = Clock(100.0)
    answers: list[str] = []
    facts: Fresh[str, str]

    def read(key: str) -> str:
        if not answers:
            answers.append("A")
            clock.now = 110.0
            facts.read(key)  # B, asked at 110, answered while A is still out
            return "A (asked at 100)"
        return "B (asked at 110)"

    facts = Fresh(Listed(0.0, {}), read, clock)
    assert facts.read("k") == "A (asked at 100)"
    assert facts.get("k", seen_at=105.0) == ("B (asked at 110)", False)


def test_live_answers_kept_are_bounded_oldest_first() -> None:
    clock = Clock(100.0)
    facts = Fresh(Listed(0.0, {}), lambda key: f"live {key}", clock, kept=2)
    for key in ("a", "b", "c"):
        facts.read(key)
    calls: list[str] = []
    facts._read = lambda key: calls.append(key) or f"again {key}"  # type: ignore[method-assign]
    assert facts.get("c", seen_at=50.0) == ("live c", False)
    assert facts.get("b", seen_at=50.0) == ("live b", False)
    assert facts.get("a", seen_at=50.0) == ("again a", False)
    assert calls == ["a"]


# --- the reflector's listed_at and its `after` ----------------------------------------------------


def test_listed_at_is_when_the_list_was_asked_for_once_it_went_through() -> None:
    clock = Clock(10.0)
    stop = threading.Event()
    seen: list[float] = []

    def list_fn() -> tuple[Iterator[int], str]:
        clock.now = 12.0  # the answer takes time: the list was asked for at 10

        def items() -> Iterator[int]:
            yield 1
            seen.append(reflector.listed_at)  # still the old one, half way through
            yield 2

        return items(), "7"

    def watch(version: str) -> Iterator[dict[str, Any]]:
        stop.set()
        return iter(())

    reflector = Reflector(
        "nodes", list_fn, watch, lambda items: list(items), lambda k, o: None, stop, monotonic=clock
    )
    assert reflector.listed_at == -math.inf
    reflector.run()
    assert seen == [-math.inf]
    assert reflector.listed_at == 10.0


class NotYet(threading.Event):
    """An event never set whose waits return at once; the second one stops the reflector."""

    def __init__(self, stop: threading.Event) -> None:
        super().__init__()
        self.stop, self.waits = stop, 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        if self.waits == 2:
            self.stop.set()
        return False


def test_a_reflector_lists_only_after_its_event() -> None:
    listed: list[str] = []

    def reflector(after: threading.Event, stop: threading.Event) -> Reflector:
        def list_fn() -> tuple[list[int], str]:
            listed.append("listed")
            stop.set()
            return [], "1"

        return Reflector(
            "pods",
            list_fn,
            lambda v: iter(()),
            lambda i: None,
            lambda k, o: None,
            stop,
            after=after,
        )

    stop = threading.Event()
    not_yet = NotYet(stop)
    reflector(not_yet, stop).run()  # returns once stopped, without listing
    assert (listed, not_yet.waits) == ([], 2)

    after = threading.Event()
    after.set()
    reflector(after, threading.Event()).run()
    assert listed == ["listed"]


# --- the controller -------------------------------------------------------------------------------


def controller(kube: object, signers: list[str], clock: Clock) -> Controller:
    k = cast(SignerKube, kube)
    return Controller(
        k,
        signers,
        default_policy(signers, "cluster.local"),
        CAStore(k, "podcert-system", "podcert-ca", utcnow),
        Metrics(),
        monotonic=clock,
    )


def stale_caches(ctrl: Controller, listed_at: float) -> None:
    """Caches that listed at `listed_at` and still show the request's ServiceAccount."""
    ctrl.bindings.pods._on_list(
        [
            {
                "metadata": {"namespace": "web", "name": "api-0", "uid": "pod-uid-1"},
                "spec": {"nodeName": "node-a", "serviceAccountName": "api"},
                "status": {"phase": "Running"},
            }
        ]
    )
    ctrl.bindings.nodes._on_list([{"metadata": {"name": "node-a", "uid": "node-uid-1"}}])
    ctrl.bindings.service_accounts._on_list(
        [{"metadata": {"namespace": "web", "name": "api", "uid": "sa-uid-1"}}]
    )
    for cache in ctrl.bindings.caches:
        cache.reflector.listed_at = listed_at


def test_a_service_account_deleted_before_the_request_was_seen_denies_it() -> None:
    live = LiveKube(gone=frozenset({"serviceaccount"}))
    clock = Clock(100.0)
    ctrl = controller(live, [SIGNER], clock)
    stale_caches(ctrl, listed_at=50.0)
    request = make_request()
    facts = ctrl.facts(request, seen_at=60.0)
    assert live.reads == ["pod", "node", "serviceaccount"]
    decision = decide(request, facts, POLICY, NOW)
    assert isinstance(decision, model.Deny)
    assert decision.reason == model.SERVICE_ACCOUNT_MISMATCH
    read = {"resource": "serviceaccounts"}
    assert ctrl.metrics.registry.get_sample_value("podcert_signer_live_reads_total", read) == 1.0


def test_a_backlog_seen_before_the_caches_listed_reads_nothing_live() -> None:
    live = LiveKube()
    ctrl = controller(live, [SIGNER], Clock(100.0))
    stale_caches(ctrl, listed_at=50.0)
    facts = ctrl.facts(make_request(), seen_at=40.0)
    assert live.reads == []
    assert facts.service_account is not None


def pcr(name: str, signer: str) -> requests.Read:
    return requests.read_request(
        {
            "metadata": {"namespace": "web", "name": name, "resourceVersion": "1"},
            "spec": {"signerName": signer},
        }
    )


def test_the_caches_list_once_every_signer_name_has_listed_its_requests() -> None:
    clock = Clock(10.0)
    other = "podcert.dev/other"
    ctrl = controller(object(), [SIGNER, other], clock)
    ctrl._on_pcr_list(SIGNER, [pcr("a", SIGNER)])
    assert not ctrl._pcrs_listed.is_set(), "the caches would list before the other's requests"
    clock.now = 20.0
    ctrl._on_pcr_list(other, [pcr("b", other)])
    assert ctrl._pcrs_listed.is_set()
    assert ctrl._seen == {("web", "a"): 10.0, ("web", "b"): 20.0}


def test_a_signer_names_relist_keeps_the_others_requests_and_first_seen_times() -> None:
    clock = Clock(10.0)
    other = "podcert.dev/other"
    ctrl = controller(object(), [SIGNER, other], clock)
    ctrl._on_pcr_list(SIGNER, [pcr("a", SIGNER), pcr("gone", SIGNER)])
    ctrl._on_pcr_list(other, [pcr("b", other)])
    clock.now = 30.0
    ctrl._on_pcr_event("ADDED", pcr("c", SIGNER))
    clock.now = 40.0
    ctrl._on_pcr_list(SIGNER, [pcr("a", SIGNER), pcr("c", SIGNER), pcr("d", SIGNER)])
    assert set(ctrl._store) == {("web", "a"), ("web", "b"), ("web", "c"), ("web", "d")}
    assert ctrl._seen == {
        ("web", "a"): 10.0,
        ("web", "b"): 10.0,
        ("web", "c"): 30.0,
        ("web", "d"): 40.0,
    }


# --- labels a cache does not keep are read live, whole, for that decision only --------------------

HUGE = {f"tenant.example/k{i:05d}": "v" * 40 for i in range(3000)} | {"app": "api"}


class LabelledKube(LiveKube):
    """The live pod carries `labels`."""

    def __init__(self, labels: dict[str, str]) -> None:
        super().__init__()
        self.labels = labels

    def objects(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        found = super().objects(resource, namespace, name)
        if resource == "pods" and found is not None:
            found["metadata"]["labels"] = self.labels
        return found

    def list_all(self, resource: str, shape: Any) -> Any:
        raise AssertionError("the tests hand the Services in")

    def watch_all(self, resource: str, resource_version: str, shape: Any) -> Any:
        raise AssertionError("the tests hand the Services in")

    def list_in(self, resource: str, namespace: str, shape: Any) -> Any:
        self.reads.append(f"{resource} in {namespace}")
        return iter(SERVICES)


SERVICES = [
    msgspec.json.decode(
        json.dumps(
            {
                "metadata": {"namespace": "web", "name": name},
                "spec": {"type": kind, "selector": sel},
            }
        ),
        type=shapes.ServiceShape,
    )
    for name, kind, sel in [
        ("api", "ClusterIP", {"app": "api"}),
        ("deep", "ClusterIP", {"tenant.example/k02999": "v" * 40}),
        ("out", "ExternalName", {"app": "api"}),
        ("other", "ClusterIP", {"app": "db"}),
    ]
]


def services_controller(kube: object, clock: Clock, *, listed: bool = True) -> Controller:
    k = cast(SignerKube, kube)
    ctrl = Controller(
        k,
        [SIGNER],
        Policy({SIGNER: SERVICES_DNS}),
        CAStore(k, "podcert-system", "podcert-ca", utcnow),
        Metrics(),
        monotonic=clock,
    )
    if listed:  # the Services reflector has listed them
        ctrl._on_service_list(SERVICES)
        assert ctrl._services_reflector is not None
        ctrl._services_reflector.synced.set()
    return ctrl


def test_a_pod_whose_labels_the_cache_does_not_keep_is_read_live_for_its_names() -> None:
    live = LabelledKube(HUGE)
    ctrl = services_controller(live, Clock(100.0))
    stale_caches(ctrl, listed_at=50.0)
    pod = live.objects("pods", "web", "api-0")
    live.reads.clear()
    ctrl.bindings.pods._on_event("MODIFIED", pod)
    assert (cached := ctrl.bindings.pods.get(("web", "api-0"))) is not None
    assert cached.labels is None, "the cache keeps no labels this large"

    facts = ctrl.facts(make_request(), seen_at=40.0)  # a backlog: the cache is fresh enough
    assert live.reads == ["pod"]
    assert facts.service_dns_names == {
        "api.web.svc",
        "api.web.svc.cluster.local",
        "deep.web.svc",
        "deep.web.svc.cluster.local",
    }
    decision = decide(make_request(), dataclasses.replace(facts, ca=ISSUER), SERVICES_DNS, NOW)
    assert isinstance(decision, model.Issue)
    assert "deep.web.svc" in decision.plan.dns_names
    answer = ctrl.bindings.fresh_pods.get(("web", "api-0"), seen_at=40.0)[0]
    assert answer is not None and answer.labels is None, "the live answer kept without them"


def test_a_live_read_gives_the_decision_every_label_and_keeps_none_over_the_bound() -> None:
    """In steady state each request's pod is read live: one GET gives the names."""
    live = LabelledKube(HUGE)
    ctrl = services_controller(live, Clock(100.0))
    stale_caches(ctrl, listed_at=50.0)
    facts = ctrl.facts(make_request(), seen_at=60.0)
    assert live.reads == ["pod", "node", "serviceaccount"]
    assert "deep.web.svc" in facts.service_dns_names
    kept = ctrl.bindings.fresh_pods._answers[("web", "api-0")][1]
    assert kept is not None and kept.labels is None


def test_small_labels_come_from_the_cache_with_no_live_read() -> None:
    live = LabelledKube({"app": "api"})
    ctrl = services_controller(live, Clock(100.0))
    stale_caches(ctrl, listed_at=50.0)
    ctrl.bindings.pods._on_event("MODIFIED", live.objects("pods", "web", "api-0"))
    live.reads.clear()
    facts = ctrl.facts(make_request(), seen_at=40.0)
    assert live.reads == []
    assert facts.service_dns_names == {"api.web.svc", "api.web.svc.cluster.local"}


def test_without_service_names_a_pod_without_kept_labels_costs_no_read() -> None:
    live = LabelledKube(HUGE)
    ctrl = controller(live, [SIGNER], Clock(100.0))
    stale_caches(ctrl, listed_at=50.0)
    ctrl.bindings.pods._on_event("MODIFIED", live.objects("pods", "web", "api-0"))
    live.reads.clear()
    facts = ctrl.facts(make_request(), seen_at=40.0)
    assert live.reads == []
    assert facts.pod is not None and facts.service_dns_names == frozenset()


def test_before_the_services_are_listed_a_decision_reads_its_namespaces_services_live() -> None:
    """An empty Services index at start-up is not "no Services": a backlog request settled
    before the list came in was issued without the names its pod is entitled to."""
    live = LabelledKube({"app": "api"})
    ctrl = services_controller(live, Clock(100.0), listed=False)
    stale_caches(ctrl, listed_at=50.0)
    ctrl.bindings.pods._on_event("MODIFIED", live.objects("pods", "web", "api-0"))
    live.reads.clear()
    facts = ctrl.facts(make_request(), seen_at=40.0)
    assert live.reads == ["services in web"]
    assert facts.service_dns_names == {"api.web.svc", "api.web.svc.cluster.local"}
