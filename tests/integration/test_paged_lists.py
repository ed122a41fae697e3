"""Whole-cluster lists are paged and decoded into shapes, against the real API server.

`Rest.list` follows the continue tokens to the end, gives the list's resourceVersion from the first
page (a watch from it misses nothing), and decodes each object into a shape with only the fields
the signer keeps; the audit keeps only pods that can own a projection.
"""

from __future__ import annotations

import pytest

from audit.snapshot import read_cluster
from devcluster.testing import DevCluster
from podcert.client.rest import Rest, path_of
from signer.issue import facts as objects
from tests.integration.helpers import make_pod

pytestmark = pytest.mark.integration

SIGNER = "test.podcert.dev/paging"


def test_a_paged_list_of_shapes_is_every_pod_and_watches_on_from_its_version(
    devcluster: DevCluster,
) -> None:
    namespace = devcluster.namespace("paging")
    for i in range(7):
        devcluster.pod(namespace, f"p{i}", node="node-a", labels={"app": "paging"})
    rest = Rest(devcluster.admin)
    path = path_of("v1", "pods", namespace)
    items, version = rest.list(path, objects.PodShape, limit=2)
    pods = [objects.pod_from(shape) for shape in items]
    assert sorted(p.name for p in pods) == [f"p{i}" for i in range(7)]
    assert {p.node_name for p in pods} == {"node-a"}
    assert all(dict(p.labels) == {"app": "paging"} for p in pods)
    as_dicts = sorted(
        (objects.pod_from(d) for d in rest.request("GET", path)["items"]), key=lambda p: p.name
    )
    assert sorted(pods, key=lambda p: p.name) == as_dicts
    # A pod created after the list is the first thing a watch from its version sees.
    devcluster.pod(namespace, "late", node="node-a")
    first = next(rest.watch(path, version, timeout_seconds=10, shape=objects.PodShape))
    assert first["type"] == "ADDED"
    assert objects.pod_from(first["object"]).name == "late"


def test_the_audit_keeps_only_pods_that_can_own_a_projection(devcluster: DevCluster) -> None:
    namespace = devcluster.namespace("paging-audit")
    make_pod(devcluster, namespace, "with-identity", SIGNER)
    devcluster.pod(namespace, "plain", node="node-a")
    found = read_cluster(Rest(devcluster.admin), namespaces=[namespace])
    assert found.pods_listed == 2
    assert [p["metadata"]["name"] for p in found.pods] == ["with-identity"]
    (volume,) = found.pods[0]["spec"]["volumes"]
    assert "podCertificate" in volume["projected"]["sources"][0]
