"""Pods, nodes, ServiceAccounts and Services in, the signer's model out. Broken objects name
the field."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import msgspec
import pytest

from signer import model, objects

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


def test_service_names_come_only_from_selecting_services() -> None:
    services = {"api": {"app": "api"}, "manual": {}, "other": {"app": "x"}}
    names = objects.service_names(services, "ns", {"app": "api", "tier": "1"}, "cluster.local")
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
    shape = msgspec.json.decode(json.dumps(POD), type=objects.PodShape)
    assert objects.pod_from(shape) == objects.pod_from(POD)
    assert objects.key_of(shape) == objects.key_of(POD) == ("shop", "web-1")
    deleting = {**POD, "metadata": {**POD["metadata"], "deletionTimestamp": "2026-11-29T12:00:00Z"}}
    shape = msgspec.json.decode(json.dumps(deleting), type=objects.PodShape)
    assert objects.pod_from(shape).deleting


def test_pods_with_the_same_labels_share_one_read_only_mapping() -> None:
    other = {**POD, "metadata": {**POD["metadata"], "name": "web-2", "uid": "u2"}}
    first, second = objects.pod_from(POD), objects.pod_from(other)
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
    with pytest.raises(objects.ObjectError, match=field):
        objects.pod_from(msgspec.json.decode(json.dumps(body), type=objects.PodShape))


def test_nodes_and_service_accounts_read_as_shapes() -> None:
    node = msgspec.json.decode(
        b'{"metadata": {"name": "node-a", "uid": "n1"}, "status": {"images": [{"names": ["x"]}]}}',
        type=objects.NodeShape,
    )
    assert objects.node_from(node) == model.Node("node-a", "n1")
    assert objects.name_of(node) == "node-a"
    sa = msgspec.json.decode(
        b'{"metadata": {"namespace": "shop", "name": "web", "uid": "s1"}}',
        type=objects.ServiceAccountShape,
    )
    assert objects.service_account_from(sa) == model.ServiceAccount("shop", "web", "s1")


# --- a pod's labels are kept only while small; Services give names by type ------------------------

HUGE_LABELS = {f"tenant.example/k{i:05d}": "v" * 40 for i in range(7000)}


def pod_json(labels: Any) -> bytes:
    """A pod as the API server writes it (no spaces)."""
    body = {**POD, "metadata": {**POD["metadata"], "labels": labels}}
    return json.dumps(body, separators=(",", ":")).encode()


def test_labels_size_is_the_bytes_the_api_server_writes() -> None:
    for labels in ({}, {"app": "web"}, {"app": "web", "tier": "front"}, HUGE_LABELS):
        assert objects.labels_size(labels) == len(json.dumps(labels, separators=(",", ":")))


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda body: msgspec.json.decode(body, type=objects.PodShape), id="shape"),
        pytest.param(lambda body: json.loads(body), id="dict"),
    ],
)
def test_a_pod_holds_its_labels_only_up_to_the_bound(read: Any) -> None:
    def labels_at(size: int) -> dict[str, str]:
        """One label whose map is `size` bytes of JSON."""
        return {"k": "v" * (size - len('{"k":""}'))}

    at_bound = labels_at(objects.LABELS_KEPT)
    assert objects.pod_from(read(pod_json(at_bound))).labels == at_bound
    assert objects.pod_from(read(pod_json(labels_at(objects.LABELS_KEPT + 1)))).labels is None
    pod = objects.pod_from(read(pod_json(HUGE_LABELS)))
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
    shape = msgspec.json.decode(pod_json(numbers), type=objects.PodShape)
    assert objects.pod_from(shape).labels is None
    wrong = msgspec.json.decode(pod_json({"app": 1}), type=objects.PodShape)
    with pytest.raises(objects.ObjectError, match=r"metadata\.labels"):
        objects.pod_from(wrong)


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda body: msgspec.json.decode(body, type=objects.PodShape), id="shape"),
        pytest.param(lambda body: json.loads(body), id="dict"),
    ],
)
def test_a_pod_read_whole_has_every_label_and_kept_drops_them(read: Any) -> None:
    whole = objects.pod_from(read(pod_json(HUGE_LABELS)), whole=True)
    assert whole.labels == HUGE_LABELS
    kept = objects.kept(whole)
    assert kept is not None and kept.labels is None
    assert msgspec.structs.replace(kept, labels=whole.labels) == whole
    small = objects.pod_from(POD, whole=True)
    assert objects.kept(small) is small
    assert objects.kept(None) is None


def service(type_: str | None, selector: Any, **spec: Any) -> objects.ServiceShape:
    body: dict[str, Any] = {"selector": selector, **spec}
    if type_ is not None:
        body["type"] = type_
    obj = {"metadata": {"namespace": "shop", "name": "api", "resourceVersion": "9"}, "spec": body}
    return msgspec.json.decode(json.dumps(obj), type=objects.ServiceShape)


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
    shape: objects.ServiceShape, gives: bool
) -> None:
    assert objects.service_selector(shape) == ({"app": "api"} if gives else None)
