"""podcert.api.requests: one typed request off the wire, every broken one named by its field,
and the status a signer writes."""

from __future__ import annotations

import base64
import datetime as dt
import re
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from podcert.api import requests
from podcert.client import pages
from podcert.client.rest import REQUESTS
from signer import model
from signer.issue import settle

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


def pcr(**spec: Any) -> dict[str, Any]:
    base = {
        "signerName": "example.com/podcert",
        "podName": "web",
        "podUID": "pod-uid",
        "serviceAccountName": "default",
        "serviceAccountUID": "sa-uid",
        "nodeName": "node-a",
        "nodeUID": "node-uid",
        "maxExpirationSeconds": 3600,
        "stubPKCS10Request": base64.b64encode(b"csr").decode(),
    }
    base.update(spec)
    return {
        "metadata": {
            "namespace": "ns",
            "name": "req-1",
            "uid": "u1",
            "resourceVersion": "42",
            "generation": 1,
            "creationTimestamp": "2026-11-29T11:59:59Z",
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": base,
    }


def test_a_request_is_read_with_its_csr_bytes_and_creation_time() -> None:
    request = requests.decode_request(msgspec.json.encode(pcr()))
    assert isinstance(request, requests.PodCertificateRequest)
    assert request.spec.stub_pkcs10_request == b"csr"
    assert request.created == dt.datetime(2026, 11, 29, 11, 59, 59, tzinfo=dt.UTC)
    assert request.spec.max_expiration_seconds == 3600
    assert (request.metadata.resource_version, request.metadata.generation) == ("42", 1)
    assert requests.invalid(request) is None
    assert request == requests.parse_request(pcr())  # a dict reads as the wire does


def test_a_null_creation_time_is_unknown_never_a_refusal() -> None:
    obj = pcr()
    obj["metadata"]["creationTimestamp"] = None  # Go's zero time, before it is stored
    request = requests.parse_request(obj)
    assert request.created is None and requests.invalid(request) is None


def test_a_creation_time_that_is_no_time_names_the_field() -> None:
    obj = pcr()
    obj["metadata"]["creationTimestamp"] = "yesterday"
    read = requests.decode_request(msgspec.json.encode(obj))
    assert isinstance(read, requests.Unreadable)
    assert str(read.problem) == "metadata.creationTimestamp: expected an RFC 3339 time"


# Names reach messages, and namespace and service account the SPIFFE ID's path: a request that
# bypassed the API server's validation cannot be decided on, and the problem names the field.


@pytest.mark.parametrize(
    ("where", "value", "problem"),
    [
        pytest.param(
            "spec",
            {"serviceAccountName": "../admin"},
            "spec.serviceAccountName: '../admin' is not a lowercase RFC 1123 name",
            id="a service account name that could escape the SPIFFE path",
        ),
        pytest.param(
            "spec",
            {"podName": "Web"},
            "spec.podName: 'Web' is not a lowercase RFC 1123 name",
            id="an uppercase pod name",
        ),
        pytest.param(
            "spec",
            {"nodeName": "a\n"},
            "spec.nodeName: 'a\\n' is not a lowercase RFC 1123 name",
            id="a name with a newline",
        ),
        pytest.param(
            "spec",
            {"podName": "a" * 254},
            f"spec.podName: {'a' * 100!r}... (254 characters) is not a lowercase RFC 1123 name",
            id="a pod name over 253 characters",
        ),
        pytest.param(
            "metadata",
            {"namespace": "a.b"},
            "metadata.namespace: 'a.b' is not a lowercase RFC 1123 name",
            id="a dotted namespace",
        ),
        pytest.param(
            "spec",
            {"maxExpirationSeconds": 3599},
            "spec.maxExpirationSeconds: 3599 is not in [3600, 7862400]",
            id="a lifetime below the API minimum",
        ),
        pytest.param(
            "spec",
            {"maxExpirationSeconds": 7862401},
            "spec.maxExpirationSeconds: 7862401 is not in [3600, 7862400]",
            id="a lifetime one second over 91 days",
        ),
        pytest.param(
            "spec",
            {"maxExpirationSeconds": -1},
            "spec.maxExpirationSeconds: -1 is not in [3600, 7862400]",
            id="a negative lifetime",
        ),
        pytest.param(
            "spec",
            {"maxExpirationSeconds": 2**63},
            f"spec.maxExpirationSeconds: {2**63} is not in [3600, 7862400]",
            id="an absurd lifetime",
        ),
    ],
)
def test_what_the_api_server_would_not_admit_cannot_be_decided_on(
    where: str, value: dict[str, Any], problem: str
) -> None:
    obj = pcr()
    obj[where].update(value)
    read = requests.decode_request(msgspec.json.encode(obj))
    assert isinstance(read, requests.PodCertificateRequest), "it decodes: a request, not a misfit"
    assert str(requests.invalid(read)) == problem


@pytest.mark.parametrize("field", ["podUID", "nodeUID", "serviceAccountUID", "podName"])
def test_an_empty_field_the_api_server_always_sets_is_invalid(field: str) -> None:
    problem = requests.invalid(requests.parse_request(pcr(**{field: ""})))
    assert str(problem) == f"spec.{field}: expected a non-empty string"


@pytest.mark.parametrize(
    ("spec", "field", "problem"),
    [
        pytest.param({"podUID": 7}, "spec.podUID", "expected str, got int", id="a number UID"),
        pytest.param(
            {"stubPKCS10Request": "!!!"}, "spec.stubPKCS10Request", "not valid base64", id="CSR"
        ),
        pytest.param(
            {"maxExpirationSeconds": "long"},
            "spec.maxExpirationSeconds",
            "expected int, got str",
            id="lifetime text",
        ),
        pytest.param(
            {"maxExpirationSeconds": True},
            "spec.maxExpirationSeconds",
            "expected int, got bool",
            id="lifetime a boolean",
        ),
        pytest.param(
            {"unverifiedUserAnnotations": {"a.b/c": 1}},
            "spec.unverifiedUserAnnotations[...]",
            "expected str, got int",
            id="annotation value not a string",
        ),
    ],
)
def test_broken_requests_name_the_field(spec: dict[str, Any], field: str, problem: str) -> None:
    read = requests.decode_request(msgspec.json.encode(pcr(**spec)))
    assert isinstance(read, requests.Unreadable)
    assert (read.problem.field, read.problem.problem) == (field, problem)
    assert requests.invalid(read) is read.problem
    # What reads of it still does: its key and names, for the denial and its audit entry.
    assert (read.namespace, read.name, read.metadata.resource_version) == ("ns", "req-1", "42")
    assert (read.spec.signer_name, read.spec.node_name) == ("example.com/podcert", "node-a")
    with pytest.raises(requests.RequestError, match=f"^{re.escape(field)}"):
        requests.parse_request(pcr(**spec))


@pytest.mark.parametrize(
    ("status", "field"),
    [
        pytest.param({"conditions": "garbage"}, "status.conditions", id="conditions not a list"),
        pytest.param({"notAfter": "soon"}, "status.notAfter", id="a time that is none"),
        pytest.param(
            {"notAfter": "2026-11-29T12:00:00"}, "status.notAfter", id="a time without a zone"
        ),
        pytest.param(
            {"conditions": [{"type": 1}]}, "status.conditions[0].type", id="condition type"
        ),
    ],
)
def test_broken_statuses_name_the_field(status: dict[str, Any], field: str) -> None:
    with pytest.raises(requests.RequestError) as caught:
        requests.parse_status(status)
    assert caught.value.field == field
    read = requests.read_request({**pcr(), "status": status})
    assert isinstance(read, requests.Unreadable) and read.problem.field == field


def test_an_unreadable_request_that_is_settled_stays_settled() -> None:
    """Its outcome read as tolerantly as `outcome` reads a dict: a settled one is never
    denied again over the terminal status (the API server would refuse the write forever)."""
    obj = {**pcr(podUID=7), "status": {"conditions": [{"type": "Denied", "status": "True"}]}}
    read = requests.decode_request(msgspec.json.encode(obj))
    assert isinstance(read, requests.Unreadable)
    assert read.status.outcome == "Denied"
    assert requests.read_request(pcr(podUID=7)).status.outcome is None


def test_the_key_form_v1beta1_does_not_use_is_null_and_reads_as_absent() -> None:
    """v1beta1 writes the unused key fields as null (an admission review of a 1.36 node's
    request carries them so): decoded typed in one pass, no key read from them."""
    obj = pcr(pkixPublicKey=None, proofOfPossession=None, unverifiedUserAnnotations=None)
    read = requests.decode_request(msgspec.json.encode(obj))
    assert isinstance(read, requests.PodCertificateRequest)
    assert (read.spec.pkix_public_key, read.spec.proof_of_possession) == (None, None)
    assert read.spec.stub_pkcs10_request == b"csr" and read.spec.holds_key


@pytest.mark.parametrize(
    ("where", "value"),
    [
        pytest.param("spec", {"podName": None}, id="a string"),
        pytest.param("metadata", {"generation": None}, id="a number"),
        pytest.param("status", {"conditions": None, "notAfter": None}, id="a list and a time"),
    ],
)
def test_any_other_null_reads_as_absent_as_go_reads_it(where: str, value: dict[str, Any]) -> None:
    obj = pcr()
    obj.setdefault(where, {}).update(value)
    read = requests.decode_request(msgspec.json.encode(obj))
    assert isinstance(read, requests.PodCertificateRequest)
    assert read == requests.parse_request(obj)
    if where == "spec":
        assert str(requests.invalid(read)) == "spec.podName: expected a non-empty string"
    else:
        assert requests.invalid(read) is None


def test_a_hostile_nesting_is_unreadable_and_costs_no_recursion() -> None:
    obj = pcr()
    deep: Any = None
    for _ in range(100_000):
        deep = {"a": deep}
    obj["spec"]["unverifiedUserAnnotations"] = deep
    read = requests.read_request(obj)
    assert isinstance(read, requests.Unreadable)
    assert read.problem.field.startswith("spec.unverifiedUserAnnotations")


def test_a_missing_field_the_api_server_always_sets_is_invalid() -> None:
    request = requests.parse_request(pcr(nodeUID=""))
    assert str(requests.invalid(request)) == "spec.nodeUID: expected a non-empty string"


def test_one_unreadable_request_costs_a_page_nothing_else() -> None:
    """A list page of typed requests with one hostile object among them: every other element
    is decoded typed, the hostile one is Unreadable in its place, naming its field."""
    items = [pcr(podUID=f"pod-{i}") for i in range(5)]
    items[2] = pcr(podUID=["not", "a", "uid"])
    page = msgspec.json.encode({"metadata": {"resourceVersion": "7"}, "items": items})
    shape = REQUESTS  # as the signer and the shim read requests
    read = list(pages.Page([page[i : i + 64] for i in range(0, len(page), 64)], shape))
    assert [type(r).__name__ for r in read] == ["PodCertificateRequest"] * 2 + ["Unreadable"] + [
        "PodCertificateRequest"
    ] * 2
    assert [r.spec.pod_uid for r in read if isinstance(r, requests.PodCertificateRequest)] == [
        "pod-0",
        "pod-1",
        "pod-3",
        "pod-4",
    ]
    unreadable = read[2]
    assert isinstance(unreadable, requests.Unreadable)
    assert unreadable.problem.field == "spec.podUID"


def test_bytes_that_are_not_json_are_a_list_error_not_an_unreadable_request() -> None:
    shape = REQUESTS  # as the signer and the shim read requests
    with pytest.raises(pages.ListError):
        shape.element(b'{"metadata": {', "items")


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param({}, None, id="no status: pending"),
        pytest.param({"conditions": [{"type": "Denied", "status": "True"}]}, "Denied", id="denied"),
        pytest.param({"conditions": [{"type": "Issued", "status": "False"}]}, None, id="false"),
        pytest.param({"certificateChain": "pem"}, "Issued", id="chain without condition"),
        pytest.param(
            {
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "Failed", "status": "True"},
                ]
            },
            "Failed",
            id="the terminal one among others",
        ),
    ],
)
def test_outcome(status: dict[str, Any], expected: str | None) -> None:
    """The typed status and the tolerant reading of a dict agree."""
    assert requests.outcome({**pcr(), "status": status}) == expected
    assert requests.parse_request({**pcr(), "status": status}).status.outcome == expected


def test_the_tolerant_outcome_reads_garbage_as_pending() -> None:
    assert requests.outcome({**pcr(), "status": {"conditions": "garbage"}}) is None


def test_issued_status_carries_the_leaf_times_and_one_condition() -> None:
    plan = model.LeafPlan(
        public_key=ec.generate_private_key(ec.SECP256R1()).public_key(),
        spiffe_id="spiffe://td/ns/ns/sa/default",
        dns_names=(),
        not_before=NOW,
        not_after=NOW + dt.timedelta(hours=2),
        begin_refresh_at=NOW + dt.timedelta(hours=1),
    )
    status = msgspec.to_builtins(
        settle.issued_status(
            1, "PEM", plan.not_before, plan.not_after, plan.begin_refresh_at, "issued", NOW
        )
    )
    assert status["notBefore"] == "2026-11-29T12:00:00Z"
    assert status["beginRefreshAt"] == "2026-11-29T13:00:00Z"
    assert [c["type"] for c in status["conditions"]] == ["Issued"]
    assert status["conditions"][0]["observedGeneration"] == 1
    # What the signer writes reads back as what it means.
    written = requests.parse_status(status)
    assert written.outcome == "Issued" and written.issued_at == NOW
    assert written.not_after == plan.not_after


def test_a_settled_status_is_one_condition_with_a_bounded_message() -> None:
    status = msgspec.to_builtins(
        settle.settled_status("Denied", "PolicyDenied", "x" * 40000, None, NOW)
    )
    assert set(status) == {"conditions"}, "no chain and no times: left out, not written empty"
    (condition,) = status["conditions"]
    assert len(condition["message"]) == settle.MAX_MESSAGE
    assert "observedGeneration" not in condition
    assert requests.parse_status(status).reason == "PolicyDenied"
