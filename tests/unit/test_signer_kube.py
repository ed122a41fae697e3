"""The signer reads PodCertificateRequests decoded into the fields it uses (`signer.kube`): what it
derives from such a request (the request, its outcome, the status it writes) must be what it
derives from the whole object, whatever else the object holds; and the status it PUTs carries
only what the status subresource reads (identity, the resourceVersion guard, the status), so
neither spec nor managedFields is sent back."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any, cast

import msgspec
import pytest

from podcert.api import keys, requests
from podcert.client.rest import Rest
from signer import certs, model
from signer.issue import facts
from signer.issue.settle import settle
from signer.kube import SignerKube
from tests.canned_rest import CannedRest
from tests.signer_world import ISSUER, KEY, NOW, SIGNER, make_request

START = certs.truncate_to_second(NOW)
PLAN = model.LeafPlan(
    public_key=KEY.public_key(),
    spiffe_id="spiffe://cluster.local/ns/web/sa/api",
    dns_names=(),
    not_before=START,
    not_after=START + dt.timedelta(hours=2),
    begin_refresh_at=START + dt.timedelta(hours=1),
)
SIGNED = model.Signed(PLAN, certs.sign_leaf(PLAN, ISSUER, 7), 7)
STUB_CSR = base64.b64encode(keys.stub_csr(KEY)).decode()

MANAGED = [
    {
        "manager": "kubelet",
        "operation": "Update",
        "apiVersion": "certificates.k8s.io/v1",
        "time": "2026-11-29T12:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:podName": {}, "f:stubPKCS10Request": {}}},
    }
]


def pending() -> dict[str, Any]:
    request = make_request()
    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "PodCertificateRequest",
        "metadata": {
            "name": request.name,
            "generateName": "api-0-",
            "namespace": request.namespace,
            "uid": request.uid,
            "resourceVersion": "812",
            "generation": 1,
            "creationTimestamp": "2026-11-29T11:59:58Z",
            "labels": {"app": "api"},
            "managedFields": MANAGED,
        },
        "spec": {
            "signerName": SIGNER,
            "podName": request.spec.pod_name,
            "podUID": request.spec.pod_uid,
            "serviceAccountName": request.spec.service_account_name,
            "serviceAccountUID": request.spec.service_account_uid,
            "nodeName": request.spec.node_name,
            "nodeUID": request.spec.node_uid,
            "maxExpirationSeconds": 86400,
            "stubPKCS10Request": STUB_CSR,
        },
        "status": {},
    }


def issued() -> dict[str, Any]:
    obj = pending()
    obj["metadata"]["resourceVersion"] = "813"
    obj["status"] = {
        "conditions": [
            {
                "type": "Issued",
                "status": "True",
                "reason": "Issued",
                "message": "issued",
                "lastTransitionTime": "2026-11-29T12:00:00Z",
            }
        ],
        "certificateChain": "-----BEGIN CERTIFICATE-----\n...",
    }
    return obj


def read(items: list[dict[str, Any]]) -> tuple[SignerKube, CannedRest]:
    rest = CannedRest(items, bookmark="900")
    return SignerKube(cast(Rest, rest)), rest


@pytest.mark.parametrize(
    "whole", [pytest.param(pending(), id="pending"), pytest.param(issued(), id="issued")]
)
def test_a_request_read_as_a_shape_means_what_the_whole_object_means(
    whole: dict[str, Any],
) -> None:
    kube, _ = read([whole])
    items, version = kube.list_pcrs(SIGNER)
    [listed] = list(items)
    [watched, bookmark] = [e["object"] for e in kube.watch_pcrs(SIGNER, "41")]
    got = kube.get_pcr("web", "api-0-x7k2p")
    assert version == "41"
    assert bookmark.metadata.resource_version == "900"
    parsed = requests.parse_request(whole)  # the dict read whole, as a test reads it
    for shaped in (listed, watched, got):
        assert isinstance(shaped, requests.PodCertificateRequest)
        assert shaped == parsed
        assert shaped.status.outcome == requests.outcome(whole)
        assert shaped.metadata.resource_version == whole["metadata"]["resourceVersion"]


def test_the_status_put_carries_identity_guard_and_status_only() -> None:
    kube, rest = read([pending()])
    [request] = list(kube.list_pcrs(SIGNER)[0])
    assert isinstance(request, requests.PodCertificateRequest)
    settled = settle(request, SIGNED, NOW)
    kube.write_status(settled.target, settled.status)
    [(method, path, sent)] = rest.sent
    body = msgspec.json.decode(msgspec.json.encode(sent))  # as the Rest writes it
    assert (method, path) == (
        "PUT",
        "/apis/certificates.k8s.io/v1/namespaces/web/podcertificaterequests/api-0-x7k2p/status",
    )
    assert body.keys() == {"apiVersion", "kind", "metadata", "status"}
    assert body["apiVersion"] == "certificates.k8s.io/v1"
    assert body["kind"] == "PodCertificateRequest"
    assert body["metadata"] == {
        "name": "api-0-x7k2p",
        "namespace": "web",
        "uid": request.uid,
        "resourceVersion": "812",
    }
    assert body["status"]["conditions"][0]["observedGeneration"] == 1
    assert body["status"]["notBefore"].endswith("Z"), "metav1.Time, in UTC"
    assert requests.parse_status(body["status"]) == settled.status


def test_an_unreadable_request_in_a_list_is_kept_to_be_denied_by_name() -> None:
    broken = pending()
    broken["spec"]["podUID"] = 7
    kube, _ = read([pending(), broken])
    good, bad = list(kube.list_pcrs(SIGNER)[0])
    assert isinstance(good, requests.PodCertificateRequest)
    assert isinstance(bad, requests.Unreadable)
    assert str(bad.problem) == "spec.podUID: expected str, got int"
    assert (bad.namespace, bad.metadata.resource_version) == ("web", "812")


def test_lists_and_watches_ask_for_the_signer_name_only() -> None:
    kube, rest = read([pending()])
    list(kube.list_pcrs(SIGNER)[0])
    list(kube.watch_pcrs(SIGNER, "41"))
    assert rest.queries == [
        {"fieldSelector": f"spec.signerName={SIGNER}"},
        {"fieldSelector": f"spec.signerName={SIGNER}"},
    ]


# --- a live read costs the object's bytes, never its labels built twice ---------------------------


def huge_pod() -> dict[str, Any]:
    labels = {f"tenant.example/k{n:05d}": "v" * 40 for n in range(3000)} | {"app": "api"}
    return {
        "metadata": {
            "namespace": "web",
            "name": "api-0",
            "uid": "pod-uid-1",
            "labels": labels,
            "annotations": {f"tenant.example/a{n}": "a" * 60_000 for n in range(4)},
            "managedFields": MANAGED,
        },
        "spec": {"nodeName": "node-a", "serviceAccountName": "api", "containers": []},
        "status": {"phase": "Running"},
    }


def test_a_live_pod_read_is_decoded_as_the_cache_decodes_it() -> None:
    """The pod comes as the cache's shape (labels raw, annotations never decoded) and means
    what the whole object means, its labels whole for the one decision."""
    rest = CannedRest([huge_pod()])
    found = SignerKube(cast(Rest, rest)).get_as("pods", "web", "api-0", facts.PodShape)
    assert isinstance(found, facts.PodShape)
    assert rest.sent == [("GET", "/api/v1/namespaces/web/pods/api-0", None)]
    assert facts.pod_from(found, whole=True) == facts.pod_from(huge_pod(), whole=True)
    assert facts.pod_from(found).labels is None, "over the bound: not for a cache"


def test_a_live_node_and_account_read_are_their_shapes() -> None:
    node = {"metadata": {"name": "node-a", "uid": "n1"}, "status": {"images": [{"x": 1}] * 100}}
    found = SignerKube(cast(Rest, CannedRest([node]))).get_as(
        "nodes", None, "node-a", facts.NodeShape
    )
    assert isinstance(found, facts.NodeShape)
    assert facts.node_from(found) == facts.node_from(node)
    account = {"metadata": {"namespace": "web", "name": "api", "uid": "s1"}, "secrets": []}
    got = SignerKube(cast(Rest, CannedRest([account]))).get_as(
        "serviceaccounts", "web", "api", facts.ServiceAccountShape
    )
    assert isinstance(got, facts.ServiceAccountShape)
    assert facts.service_account_from(got) == facts.service_account_from(account)
