"""The shim decodes its node's pods and requests into shapes (`kubelet_shim.kube`): what the agent
derives from a shaped object must be what it derives from the whole object, whatever else the
object holds."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, cast

import msgspec
import pytest

from kubelet_shim.kube import (
    ROTATE_ANNOTATION,
    ForeignRequest,
    PodRef,
    PodShape,
    ShimKube,
    pcr_body,
    pod_object,
    request_name,
)
from kubelet_shim.state import pod_from
from podcert.api import keys, requests
from podcert.api.pods import WorkKey
from podcert.api.requests import PROOF_OF_POSSESSION, STUB_CSR, KeyForm, key_fields, outcome
from podcert.client.rest import ApiError, Rest
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


@pytest.mark.parametrize(
    "pcr",
    [
        pytest.param(issued_request(), id="issued"),
        pytest.param({**issued_request(), "status": {}}, id="pending"),
        pytest.param({k: v for k, v in issued_request().items() if k != "status"}, id="no status"),
    ],
)
def test_a_request_the_shim_reads_means_what_the_whole_object_means(pcr: dict[str, Any]) -> None:
    [read] = ShimKube(cast(Rest, CannedRest([pcr])), "node-a").list_pcrs()[0]
    assert isinstance(read, requests.PodCertificateRequest)
    assert read == requests.parse_request(pcr)
    assert (read.namespace, read.name) == (pcr["metadata"]["namespace"], pcr["metadata"]["name"])
    assert read.spec.pod_uid == pcr["spec"]["podUID"]
    assert read.status.outcome == outcome(pcr)


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
    assert [r.status.outcome for r in kube.list_pcrs()[0]] == ["Issued"]
    assert [e["object"].name for e in kube.watch_pcrs("41")] == ["web-x7k2p"]
    assert rest.queries == [
        {"fieldSelector": "spec.nodeName=node-a"},
        {"fieldSelector": "spec.nodeName=node-a"},
    ]


# --- creates a replay cannot double -----------------------------------------------------------

POD = PodRef("shop", "web", "7d1c4c9e-0000-4000-8000-000000000001")
SOURCE = WorkKey(POD.uid, "identity", 0)


def body_for(key: keys.PrivateKey, form: KeyForm = STUB_CSR, **spec: Any) -> dict[str, Any]:
    body = pcr_body(
        POD,
        name=request_name(POD, SOURCE, "podcert.dev/workload", keys.public_der(key)),
        signer_name="podcert.dev/workload",
        service_account="web",
        service_account_uid="sa-1",
        node_name="node-a",
        node_uid="node-1",
        max_expiration_seconds=86400,
        key_fields=key_fields(form, key, POD.uid),
        user_annotations={},
    )
    body["spec"].update(spec)
    return body


class CreateRest:
    """POST: 409 AlreadyExists when `existing` holds the name; GET: the list it is found by."""

    def __init__(self, existing: list[dict[str, Any]]) -> None:
        self.existing = existing
        self.asked: list[tuple[str, str, Mapping[str, Any] | None]] = []

    def request(
        self, method: str, path: str, *, query: Mapping[str, Any] | None = None, body: Any = None
    ) -> dict[str, Any]:
        self.asked.append((method, path, query))
        if method == "POST":
            if any(e["metadata"]["name"] == body["metadata"]["name"] for e in self.existing):
                raise ApiError(409, "AlreadyExists", "already exists")
            return {**body, "metadata": {**body["metadata"], "uid": "new"}}
        return {"items": self.existing}


def stored(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "metadata": {**body["metadata"], "uid": "first"}, "status": {}}


def test_a_create_applied_before_is_adopted_when_it_asks_the_same_for_the_same_key() -> None:
    key = keys.generate("ECDSAP256")
    first = body_for(key)
    rest = CreateRest([stored(first)])
    again = body_for(key)  # the retry: its stub CSR signed anew
    assert again["spec"]["stubPKCS10Request"] != first["spec"]["stubPKCS10Request"]

    adopted = ShimKube(cast(Rest, rest), "node-a").create_pcr("shop", again)

    assert adopted["metadata"]["uid"] == "first"
    name = first["metadata"]["name"]
    assert rest.asked[-1] == (
        "GET",
        "/apis/certificates.k8s.io/v1/namespaces/shop/podcertificaterequests",
        {"fieldSelector": f"spec.nodeName=node-a,metadata.name={name}"},
    )


@pytest.mark.parametrize(
    "existing",
    [
        pytest.param(lambda key: body_for(keys.generate("ECDSAP256")), id="another key"),
        pytest.param(lambda key: body_for(key, podUID="another-pod"), id="another pod"),
        pytest.param(lambda key: body_for(key, signerName="evil.test/x"), id="another signer"),
        pytest.param(lambda key: body_for(key, maxExpirationSeconds=3600), id="another lifetime"),
        pytest.param(
            lambda key: body_for(key, stubPKCS10Request="bm90IGEgQ1NS"), id="a CSR unreadable"
        ),
    ],
)
def test_a_namesake_that_asks_something_else_is_not_adopted(
    existing: Callable[[keys.PrivateKey], dict[str, Any]],
) -> None:
    key = keys.generate("ECDSAP256")
    ours = body_for(key)
    namesake = stored(existing(key))
    namesake["metadata"]["name"] = ours["metadata"]["name"]
    with pytest.raises(ForeignRequest) as raised:
        ShimKube(cast(Rest, CreateRest([namesake])), "node-a").create_pcr("shop", ours)
    assert raised.value.status == 409


def test_a_proven_key_is_adopted_by_its_key_too() -> None:
    key = keys.generate("ED25519")
    rest = CreateRest([stored(body_for(key, PROOF_OF_POSSESSION))])
    kube = ShimKube(cast(Rest, rest), "node-a")
    assert kube.create_pcr("shop", body_for(key, PROOF_OF_POSSESSION))["metadata"]["uid"] == "first"


@pytest.mark.parametrize(
    "pod_name",
    [
        pytest.param("web", id="a short name"),
        pytest.param("a" * 253, id="the longest pod name"),
        pytest.param("x" * 37 + ".yz", id="cut just after a dot"),
        pytest.param("x" * 37 + "-yz", id="cut just after a dash"),
        pytest.param("api.v2.shop", id="a dotted name"),
    ],
)
def test_a_request_name_is_a_short_dns_name_fixed_by_pod_source_and_key(pod_name: str) -> None:
    pod = PodRef("shop", pod_name, POD.uid)
    key = keys.generate("ECDSAP256")
    name = request_name(pod, SOURCE, "podcert.dev/workload", keys.public_der(key))
    label = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
    assert re.fullmatch(rf"{label}(\.{label})*", name), "a DNS subdomain, as names must be"
    assert len(name) <= 63
    assert name == request_name(pod, SOURCE, "podcert.dev/workload", keys.public_der(key))
    other = keys.public_der(keys.generate("ECDSAP256"))
    assert name != request_name(pod, SOURCE, "podcert.dev/workload", other)
    assert name != request_name(
        pod, SOURCE._replace(source_index=1), "podcert.dev/workload", keys.public_der(key)
    )
