"""The admission webhook's world for its unit tests: a PodCertificateRequest as a node of
`SIGNER` sends it, the facts the cluster holds (`facts`, or `live` ones with real-looking UIDs a
caller must not learn), a `forged` request from someone who knows names but not UIDs, the
AdmissionReview the API server wraps it in, and the `MALFORMED` bodies anyone who reaches the
port may send instead. Shared by the verdict's tests (`test_signer_review`) and the server's
(`test_signer_webhook`).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import pytest

from podcert.api import keys
from podcert.api.requests import PodCertificateRequest
from signer import model, policy

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
SIGNER = "example.com/podcert"
POLICY = policy.default_policy([SIGNER], "td.test")
CSR = base64.b64encode(keys.stub_csr(keys.generate("ECDSAP256"))).decode()


def pcr(signer: str = SIGNER, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "shop", "generateName": "web-"},
        "spec": {
            "signerName": signer,
            "podName": "web",
            "podUID": "pod-uid",
            "serviceAccountName": "web",
            "serviceAccountUID": "sa-uid",
            "nodeName": "node-a",
            "nodeUID": "node-uid",
            "maxExpirationSeconds": 86400,
            "stubPKCS10Request": CSR,
            **spec,
        },
    }


def facts(_request: PodCertificateRequest) -> model.Facts:
    return model.Facts(
        pod=model.Pod("shop", "web", "pod-uid", "node-a", "web"),
        node=model.Node("node-a", "node-uid"),
        service_account=model.ServiceAccount("shop", "web", "sa-uid"),
    )


def no_facts(_request: PodCertificateRequest) -> model.Facts:
    raise AssertionError("facts must not be read for this request")


# --- what someone who can reach the port sends ----------------------------------------------------

POD_UID = "0d1f6c55-2f0a-4d1e-9a5b-6f3d8e0c1a01"
NODE_UID = "5b2e8a71-9c44-4f0e-8d1a-7e6c2b9f3d02"
SA_UID = "9e7c3b12-5d6a-4e8f-b1c2-3a4d5e6f7a03"
FORGED = "11111111-2222-4333-8444-555555555555"


LIVE_POD = model.Pod("shop", "web", POD_UID, "node-a", "web")
LIVE_NODE = model.Node("node-a", NODE_UID)
LIVE_ACCOUNT = model.ServiceAccount("shop", "web", SA_UID)


def live(
    pod: model.Pod | None = LIVE_POD,
    node: model.Node | None = LIVE_NODE,
    account: model.ServiceAccount | None = LIVE_ACCOUNT,
) -> Any:
    """Facts as the cluster holds them now (real-looking UIDs the caller must not learn)."""

    def read(_request: PodCertificateRequest) -> model.Facts:
        return model.Facts(pod=pod, node=node, service_account=account)

    return read


def forged(namespace: str = "shop", **spec: Any) -> dict[str, Any]:
    """What someone who knows names but not UIDs sends, as node-a."""
    obj = pcr(**{"podUID": FORGED, "nodeUID": FORGED, "serviceAccountUID": FORGED, **spec})
    obj["metadata"]["namespace"] = namespace
    return obj


def admission_review(**request: Any) -> dict[str, Any]:
    """A well-formed AdmissionReview as the API server sends it; `request` overrides fields."""
    body: dict[str, Any] = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "certificates.k8s.io", "version": "v1", "kind": "PodCertificateRequest"},
        "resource": {
            "group": "certificates.k8s.io",
            "version": "v1",
            "resource": "podcertificaterequests",
        },
        "namespace": "shop",
        "operation": "CREATE",
        "userInfo": {"username": "system:node:node-a", "groups": ["system:nodes"]},
        "object": pcr(),
        "oldObject": None,
        "dryRun": False,
    }
    body.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}


def encode(value: Any) -> bytes:
    return json.dumps(value).encode()


def nested(depth: int, inner: str = "[]") -> bytes:
    return ("[" * (depth - 1) + inner + "]" * (depth - 1)).encode()


MALFORMED = [
    pytest.param(b"not json", 400, "NotJSON", id="not JSON"),
    pytest.param(b"\xff\xfe{}", 400, "NotJSON", id="not UTF-8"),
    pytest.param(b'{"a": 1' + b"9" * 5000 + b"}", 400, "NotJSON", id="an integer too long"),
    pytest.param(b"", 400, "NotJSON", id="an empty body"),
    pytest.param(b"[]", 400, "NotAdmissionReview", id="a list"),
    pytest.param(
        encode({**admission_review(), "apiVersion": "admission.k8s.io/v1beta1"}),
        400,
        "NotAdmissionReview",
        id="wrong apiVersion",
    ),
    pytest.param(
        encode({**admission_review(), "kind": "Pod"}), 400, "NotAdmissionReview", id="wrong kind"
    ),
    pytest.param(
        encode({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
        400,
        "MissingField",
        id="missing request",
    ),
    pytest.param(
        encode({**admission_review(), "request": "x"}), 400, "WrongType", id="request not an object"
    ),
    pytest.param(encode(admission_review(uid=None)), 400, "MissingField", id="missing uid"),
    pytest.param(encode(admission_review(uid=7)), 400, "WrongType", id="uid not a string"),
    pytest.param(encode(admission_review(uid="")), 400, "WrongType", id="empty uid"),
    pytest.param(encode(admission_review(uid="u" * 129)), 400, "WrongType", id="uid too long"),
    pytest.param(
        encode(admission_review(kind={"group": "", "version": "v1", "kind": "Pod"})),
        400,
        "WrongResource",
        id="another kind",
    ),
    pytest.param(
        encode(admission_review(resource={"group": "", "version": "v1", "resource": "pods"})),
        400,
        "WrongResource",
        id="another resource",
    ),
    pytest.param(
        encode(admission_review(subResource="status")), 400, "WrongResource", id="a subresource"
    ),
    pytest.param(encode(admission_review(kind="x")), 400, "WrongType", id="kind not an object"),
    pytest.param(
        encode(admission_review(operation=None)), 400, "MissingField", id="missing operation"
    ),
    pytest.param(
        encode(admission_review(operation="PATCH")), 400, "WrongType", id="unknown operation"
    ),
    pytest.param(
        encode(admission_review(userInfo=None)), 400, "MissingField", id="missing userInfo"
    ),
    pytest.param(
        encode(admission_review(userInfo=["x"])), 400, "WrongType", id="userInfo not an object"
    ),
    pytest.param(
        encode(admission_review(userInfo={"username": 1})),
        400,
        "WrongType",
        id="username not a string",
    ),
    pytest.param(
        encode(admission_review(object=None)), 400, "MissingField", id="a CREATE without object"
    ),
    pytest.param(encode(admission_review(object="x")), 400, "WrongType", id="object not an object"),
    pytest.param(nested(100_000), 400, "TooDeep", id="deep nesting of arrays"),
    pytest.param(
        b'{"a":' * 50_000 + b"1" + b"}" * 50_000, 400, "TooDeep", id="deep nesting of objects"
    ),
    pytest.param(
        encode(admission_review(object={"spec": "SPOT"})).replace(b'"SPOT"', nested(40)),
        400,
        "TooDeep",
        id="deep nesting inside the object",
    ),
    pytest.param(b"[" * 200_000, 400, "TooDeep", id="unclosed brackets"),
    pytest.param(b"{" + b" " * (1024 * 1024), 413, "TooLarge", id="a body over 1 MiB"),
]
