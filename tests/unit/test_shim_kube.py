"""The shim decodes its node's pods and requests into shapes (`kubelet_shim.kube`): what the agent
derives from a shaped object must be what it derives from the whole object, whatever else the
object holds."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

import msgspec
import pytest

from kubelet_shim.kube import (
    ROTATE_ANNOTATION,
    PodShape,
    RequestShape,
    ShimKube,
    pod_object,
    request_object,
)
from kubelet_shim.state import object_key, pod_from, pod_uid
from podcert.api.requests import outcome
from podcert.rest import Rest
from tests.canned_rest import CannedRest

MANAGED = [
    {
        "manager": "kube-apiserver",
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-01-01T00:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:status": {"f:conditions": {}}},
    }
]

IDENTITY = {
    "name": "identity",
    "projected": {
        "defaultMode": 0o440,
        "sources": [
            {
                "podCertificate": {
                    "signerName": "podcert.dev/workload",
                    "keyType": "ECDSAP256",
                    "credentialBundlePath": "credentialbundle.pem",
                }
            },
            {
                "clusterTrustBundle": {
                    "signerName": "podcert.dev/workload",
                    "labelSelector": {},
                    "path": "trust-bundle.pem",
                }
            },
        ],
    },
}


def full_pod(**changes: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "uid": "7d1c4c9e-0000-4000-8000-000000000001",
            "resourceVersion": "812",
            "labels": {"app": "web"},
            "annotations": {ROTATE_ANNOTATION: "2026-01-01T00:00:00.000000Z", "other": "x"},
            "managedFields": MANAGED,
        },
        "spec": {
            "nodeName": "node-a",
            "serviceAccountName": "web",
            "containers": [{"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}]}],
            "volumes": [{"name": "data", "emptyDir": {}}, IDENTITY],
        },
        "status": {"phase": "Running", "containerStatuses": [{"name": "app", "ready": True}]},
    }
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = pod
        for part in parents:
            target = target[part]
        if value is None:
            target.pop(last, None)
        else:
            target[last] = value
    return pod


def shaped_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    return pod_object(msgspec.json.decode(json.dumps(pod).encode(), type=PodShape))


@pytest.mark.parametrize(
    "pod",
    [
        pytest.param(full_pod(), id="running pod with a rotation annotation"),
        pytest.param(full_pod(status__phase="Succeeded"), id="finished pod"),
        pytest.param(full_pod(metadata__annotations=None), id="no annotations"),
        pytest.param(full_pod(spec__serviceAccountName=None), id="no service account named"),
        pytest.param(full_pod(spec__volumes=None), id="no volumes"),
        pytest.param(
            full_pod(spec__volumes=["not an object", {"name": "p", "projected": "nor this"}]),
            id="malformed volumes are reported the same",
        ),
        pytest.param(
            full_pod(metadata__annotations={ROTATE_ANNOTATION: "yesterday"}),
            id="unparsable rotation time",
        ),
        pytest.param(full_pod(status=None), id="no status"),
    ],
)
def test_a_shaped_pod_reads_as_the_whole_pod(pod: dict[str, Any]) -> None:
    assert pod_from(shaped_pod(pod)) == pod_from(pod)


def issued_request() -> dict[str, Any]:
    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "PodCertificateRequest",
        "metadata": {
            "name": "web-x7k2p",
            "generateName": "web-",
            "namespace": "shop",
            "uid": "0f5e-1",
            "resourceVersion": "913",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": "u"}],
            "managedFields": MANAGED,
        },
        "spec": {
            "signerName": "podcert.dev/workload",
            "podName": "web",
            "podUID": "7d1c4c9e-0000-4000-8000-000000000001",
            "serviceAccountName": "web",
            "serviceAccountUID": "sa-1",
            "nodeName": "node-a",
            "nodeUID": "node-1",
            "maxExpirationSeconds": 86400,
            "stubPKCS10Request": "TUlJQg==",
        },
        "status": {
            "conditions": [{"type": "Issued", "status": "True", "reason": "Issued", "message": ""}],
            "certificateChain": "-----BEGIN CERTIFICATE-----\n...\n-----END CERTIFICATE-----\n",
            "notBefore": "2026-01-01T00:00:00Z",
            "beginRefreshAt": "2026-01-01T18:00:00Z",
            "notAfter": "2026-01-02T00:00:00Z",
        },
    }


def shaped_request(pcr: Mapping[str, Any]) -> dict[str, Any]:
    return request_object(msgspec.json.decode(json.dumps(pcr).encode(), type=RequestShape))


@pytest.mark.parametrize(
    "pcr",
    [
        pytest.param(issued_request(), id="issued"),
        pytest.param({**issued_request(), "status": {}}, id="pending"),
        pytest.param({k: v for k, v in issued_request().items() if k != "status"}, id="no status"),
    ],
)
def test_a_shaped_request_keeps_what_the_agent_reads(pcr: dict[str, Any]) -> None:
    shaped = shaped_request(pcr)
    assert object_key(shaped) == object_key(pcr)
    assert pod_uid(shaped) == pod_uid(pcr)
    assert outcome(shaped) == outcome(pcr)
    assert shaped["status"] == (pcr.get("status") or {})
    assert shaped["metadata"]["uid"] == pcr["metadata"]["uid"]
    assert "managedFields" not in shaped["metadata"]
    assert "stubPKCS10Request" not in shaped["spec"]


def test_the_node_lists_and_watches_only_its_own_objects_as_shapes() -> None:
    rest = CannedRest([full_pod()])
    kube = ShimKube(cast(Rest, rest), "node-a")
    items, version = kube.list_pods()
    assert version == "41"
    assert [pod_from(p) for p in items] == [pod_from(full_pod())]
    events = list(kube.watch_pods("41"))
    assert [(e["type"], pod_from(e["object"])) for e in events] == [
        ("MODIFIED", pod_from(full_pod()))
    ]
    rest = CannedRest([issued_request()])
    kube = ShimKube(cast(Rest, rest), "node-a")
    assert [outcome(r) for r in kube.list_pcrs()[0]] == ["Issued"]
    assert [e["object"]["metadata"]["name"] for e in kube.watch_pcrs("41")] == ["web-x7k2p"]
    assert rest.queries == [
        {"fieldSelector": "spec.nodeName=node-a"},
        {"fieldSelector": "spec.nodeName=node-a"},
    ]
