"""Admission verdicts: only the named node may ask; other signers are never touched. And the
webhook as an unauthenticated caller meets it: malformed bodies get a typed 400 and one
log line, denials reveal nothing the caller did not send."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st

from podcert.api import keys
from podcert.api.requests import PodCertificateRequest
from signer import model, policy
from signer.admission import review, webhook
from signer.admission.review import admit, review_response
from signer.admission.webhook import PATH, WebhookServer

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


@pytest.mark.parametrize(
    ("user", "obj", "allowed", "reason"),
    [
        pytest.param("system:node:node-a", pcr(), True, "", id="the pod's own node is admitted"),
        pytest.param("mallory", pcr(), False, "CreatorNotNode", id="a user is refused"),
        pytest.param(
            "system:node:node-b", pcr(), False, "CreatorNotNode", id="another node is refused"
        ),
        pytest.param(
            "system:node:node-a",
            pcr(unverifiedUserAnnotations={"x.example/y": "1"}),
            False,
            model.UNKNOWN_ANNOTATION,
            id="what the signer would deny is refused early",
        ),
        pytest.param(
            "system:node:node-a",
            pcr(podUID="other"),
            False,
            review.BINDING_MISMATCH,
            id="UID mismatch refused",
        ),
    ],
)
def test_verdicts(user: str, obj: dict[str, Any], allowed: bool, reason: str) -> None:
    verdict = admit(user, "CREATE", obj, [SIGNER], facts, POLICY, NOW)
    assert (verdict.allowed, verdict.reason) == (allowed, reason)


def test_other_signers_are_allowed_without_looking() -> None:
    verdict = admit("mallory", "CREATE", pcr("other.example/x"), [SIGNER], no_facts, POLICY, NOW)
    assert verdict.allowed


def test_a_denial_is_a_403_with_the_message() -> None:
    verdict = admit("mallory", "CREATE", pcr(), [SIGNER], facts, POLICY, NOW)
    out = review_response("r1", verdict)
    assert out["response"]["uid"] == "r1"
    assert out["response"]["allowed"] is False
    assert "mallory" in out["response"]["status"]["message"]


# --- the webhook as anyone who can reach its port meets it ----------------------------------------

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


BINDING_CASES = [
    pytest.param(live(pod=None), id="the pod does not exist"),
    pytest.param(live(), id="the pod exists with another UID"),
    pytest.param(
        live(pod=model.Pod("shop", "web", FORGED, "node-b", "web")), id="the pod is on another node"
    ),
    pytest.param(
        live(pod=model.Pod("shop", "web", FORGED, "node-a", "web", deleting=True)),
        id="the pod is being deleted",
    ),
    pytest.param(
        live(pod=model.Pod("shop", "web", FORGED, "node-a", "web"), node=None),
        id="the node does not exist",
    ),
    pytest.param(
        live(pod=model.Pod("shop", "web", FORGED, "node-a", "web")), id="the node has another UID"
    ),
    pytest.param(
        live(
            pod=model.Pod("shop", "web", FORGED, "node-a", "web"),
            node=model.Node("node-a", FORGED),
        ),
        id="the service account has another UID",
    ),
    pytest.param(
        live(
            pod=model.Pod("shop", "web", FORGED, "node-a", "other"),
            node=model.Node("node-a", FORGED),
        ),
        id="the pod runs as another service account",
    ),
]


@pytest.mark.parametrize("facts_now", BINDING_CASES)
def test_every_binding_failure_reads_the_same_and_names_no_fact(facts_now: Any) -> None:
    verdict = admit("system:node:node-a", "CREATE", forged(), [SIGNER], facts_now, POLICY, NOW)
    reference = admit(
        "system:node:node-a", "CREATE", forged(), [SIGNER], live(pod=None), POLICY, NOW
    )
    assert not verdict.allowed
    assert (verdict.message, verdict.reason) == (reference.message, reference.reason)
    assert verdict.reason == review.BINDING_MISMATCH
    for fact in (POD_UID, NODE_UID, SA_UID, "node-b", "other", "deleted"):
        assert fact not in verdict.message
    assert "shop/web" in verdict.message and "node-a" in verdict.message
    # The signer's log keeps the precise reason for the operator.
    assert verdict.detail and verdict.detail != verdict.message


DENIALS = [
    pytest.param(forged(), id="binding"),
    pytest.param(forged(nodeName="node-b"), id="creator not the node"),
    pytest.param(forged(podUID=""), id="empty podUID"),
    pytest.param(forged(stubPKCS10Request="bm90IGEgQ1NS"), id="unusable CSR"),
    pytest.param(forged(namespace="Not_A_Name"), id="odd field"),
    pytest.param(
        pcr(podUID=POD_UID, nodeUID=NODE_UID, serviceAccountUID=SA_UID),
        id="every UID right (only the caller's UIDs may show)",
    ),
    pytest.param(
        pcr(
            podUID=POD_UID,
            nodeUID=NODE_UID,
            serviceAccountUID=SA_UID,
            unverifiedUserAnnotations={"evil.example/x": "y"},
        ),
        id="a policy denial after the binding matched",
    ),
]


@pytest.mark.parametrize("obj", DENIALS)
def test_a_denial_holds_no_uid_the_request_did_not_send(obj: dict[str, Any]) -> None:
    verdict = admit("system:node:node-a", "CREATE", obj, [SIGNER], live(), POLICY, NOW)
    sent = str(obj)
    if verdict.allowed:
        return
    for uid in review._UID_SHAPED.findall(verdict.message):
        assert uid in sent, f"{uid} leaked in {verdict.message!r}"
    for uid in (POD_UID, NODE_UID, SA_UID):
        assert uid not in verdict.message or uid in sent


def test_a_message_holding_a_uid_the_caller_did_not_send_is_caught() -> None:
    assert review._leaks(f"Pod has UID {POD_UID}", forged())
    assert not review._leaks(f"asked for {FORGED}", forged())


def test_a_malformed_request_is_refused_before_any_api_read() -> None:
    for obj in (forged(podUID=""), forged(stubPKCS10Request="bm90IGEgQ1NS")):
        verdict = admit("system:node:node-a", "CREATE", obj, [SIGNER], no_facts, POLICY, NOW)
        assert not verdict.allowed


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


@pytest.mark.parametrize(("body", "status", "reason"), MALFORMED)
def test_parse_review_refuses_malformed_input_with_a_typed_reason(
    body: bytes, status: int, reason: str
) -> None:
    with pytest.raises(review.MalformedReview) as caught:
        review.parse_review(body)
    assert (caught.value.status, caught.value.reason) == (status, reason)


def test_a_well_formed_review_is_parsed() -> None:
    parsed = review.parse_review(encode(admission_review()))
    assert (parsed.uid, parsed.operation, parsed.username) == (
        "705ab4f5-6393-11e8-b7cc-42010a800002",
        "CREATE",
        "system:node:node-a",
    )
    assert parsed.object == pcr()
    # Brackets inside strings do not count as nesting.
    deep_text = admission_review(
        object=pcr(unverifiedUserAnnotations={"a.example/b": "[{" * 10_000})
    )
    assert review.parse_review(encode(deep_text)).object["spec"]["unverifiedUserAnnotations"]
    # Versions the API server may convert to (matchPolicy Equivalent) are all fine.
    beta = admission_review(
        kind={"group": "certificates.k8s.io", "version": "v1beta1", "kind": "PodCertificateRequest"}
    )
    assert review.parse_review(encode(beta)).uid


@given(
    st.recursive(
        st.none() | st.text(alphabet='[]{}"\\ab'),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(alphabet='[]{}"\\'), inner),
        max_leaves=60,
    )
)
def test_too_deep_agrees_with_the_parsed_depth(value: Any) -> None:
    def depth(v: Any) -> int:
        if isinstance(v, list):
            return 1 + max((depth(x) for x in v), default=0)
        if isinstance(v, dict):
            return 1 + max((depth(x) for x in v.values()), default=0)
        return 0

    text = json.dumps(value).encode()
    for limit in (1, 2, 3, 5):
        assert review.too_deep(text, limit) == (depth(value) > limit)


def test_an_unterminated_string_of_escaped_quotes_is_measured_in_linear_time() -> None:
    body = b'"' + b'\\"' * 400_000  # quadratic for a regex that fails once per quote
    started = time.monotonic()
    assert not review.too_deep(body)
    assert time.monotonic() - started < 2.0


# --- the same, through the HTTP server ------------------------------------------------------------


def server(facts_now: Any = facts) -> WebhookServer:
    return WebhookServer("127.0.0.1", 0, None, [SIGNER], facts_now, POLICY, lambda: NOW)  # type: ignore[arg-type]


def post(hook: WebhookServer, body: bytes, *, chunked: bool = False) -> tuple[int, Any]:
    async def run() -> tuple[int, Any]:
        app = web.Application(client_max_size=review.MAX_BODY_BYTES)
        app.router.add_post(PATH, hook.handle)
        async with TestClient(TestServer(app)) as client:
            data: Any = body
            if chunked:

                async def stream() -> Any:
                    for i in range(0, len(body), 65536):
                        yield body[i : i + 65536]

                data = stream()
            resp = await client.post(PATH, data=data)
            return resp.status, await resp.json()

    return asyncio.run(run())


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    assert [r for r in caplog.records if r.exc_info] == []
    assert "Traceback" not in caplog.text
    assert "RecursionError" not in caplog.text


@pytest.mark.parametrize(("body", "status", "reason"), MALFORMED)
def test_the_server_answers_malformed_input_with_a_typed_error_and_one_line(
    caplog: pytest.LogCaptureFixture, body: bytes, status: int, reason: str
) -> None:
    caplog.set_level(logging.INFO)
    code, answer = post(server(no_facts), body)
    assert (code, answer["reason"]) == (status, reason)
    assert set(answer) == {"reason", "message"} and len(answer["message"]) < 100
    no_tracebacks(caplog)
    lines = [r for r in caplog.records if r.name == "podcert.signer.webhook"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert len(lines[0].getMessage()) < 200


def test_a_chunked_body_over_the_limit_is_refused_without_reading_it_all(
    caplog: pytest.LogCaptureFixture,
) -> None:
    code, answer = post(server(no_facts), b" " * (3 * 1024 * 1024), chunked=True)
    assert (code, answer["reason"]) == (413, "TooLarge")
    no_tracebacks(caplog)


def test_a_body_that_stalls_is_refused_at_the_deadline(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(webhook, "_READ_TIMEOUT", 0.05)

    async def run() -> tuple[int, Any]:
        app = web.Application()
        app.router.add_post(PATH, server(no_facts).handle)
        never = asyncio.Event()

        async def stall() -> Any:
            yield b'{"apiVersion": '
            await never.wait()

        async with TestClient(TestServer(app)) as client:
            resp = await client.post(PATH, data=stall())
            return resp.status, await resp.json()

    assert asyncio.run(run()) == (
        408,
        {"reason": "TooSlow", "message": "the body did not arrive in time"},
    )
    no_tracebacks(caplog)


def test_the_server_answers_a_forged_review_with_the_uid_and_no_facts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    code, answer = post(
        server(live(pod=None)), encode(admission_review(object=forged(namespace="bank")))
    )
    reference_code, reference = post(
        server(live()), encode(admission_review(object=forged(namespace="bank")))
    )
    assert code == reference_code == 200
    assert answer == reference, "a missing pod and a UID mismatch read the same"
    response = answer["response"]
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert response["allowed"] is False
    assert set(response) == {"uid", "allowed", "status"}
    for uid in (POD_UID, NODE_UID, SA_UID):
        assert uid not in json.dumps(answer)
    no_tracebacks(caplog)


def test_the_server_admits_the_pods_own_node() -> None:
    code, answer = post(server(), encode(admission_review()))
    assert code == 200 and answer["response"]["allowed"] is True


# --- the NetworkPolicy in front of the port -------------------------------------------------------

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "signer"


def test_only_the_api_server_may_reach_the_webhook_port_and_only_monitoring_the_metrics() -> None:
    listed = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    assert "networkpolicy.yaml" in listed
    policy = yaml.safe_load((MANIFESTS / "networkpolicy.yaml").read_text())
    deployment = yaml.safe_load((MANIFESTS / "deployment.yaml").read_text())
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert spec["policyTypes"] == ["Ingress"]
    ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    by_port = {rule["ports"][0]["port"]: rule for rule in spec["ingress"]}
    assert set(by_port) == ports == {"webhook", "metrics"}
    [source] = by_port["webhook"]["from"]
    assert set(source) == {"ipBlock"}, "the webhook port: from the API server's addresses only"
    # The metrics port was open to every pod. Probes come from the pod's own
    # node, which NetworkPolicy never filters.
    assert by_port["metrics"]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ], "metrics: from the monitoring namespace only"
