"""signer.admission.review: the webhook's answer, decided without I/O. Only the named node may ask
for its pod's identity, other signers are never looked at; every failure of the pod/node/account
binding reads the same and a denial holds no UID the caller did not send; a body that is no
well-formed AdmissionReview about a PodCertificateRequest gets a typed reason, its nesting
measured before any parsing. The requests and bodies are `tests.admission_reviews`'.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from signer import model
from signer.admission import review
from signer.admission.review import admit, review_response
from tests.admission_reviews import (
    FORGED,
    MALFORMED,
    NODE_UID,
    NOW,
    POD_UID,
    POLICY,
    SA_UID,
    SIGNER,
    admission_review,
    encode,
    facts,
    forged,
    live,
    no_facts,
    pcr,
)


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
