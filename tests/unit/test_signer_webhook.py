"""Admission verdicts: only the named node may ask; other signers are never touched."""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any

import pytest

from kubelet_shim import keys
from signer import model, policy
from signer.webhook import admit, review_response

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


def facts(_request: model.Request) -> model.Facts:
    return model.Facts(
        pod=model.Pod("shop", "web", "pod-uid", "node-a", "web"),
        node=model.Node("node-a", "node-uid"),
        service_account=model.ServiceAccount("shop", "web", "sa-uid"),
    )


def no_facts(_request: model.Request) -> model.Facts:
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
            model.POD_UID_MISMATCH,
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
    out = review_response({"request": {"uid": "r1"}}, verdict)
    assert out["response"]["uid"] == "r1"
    assert out["response"]["allowed"] is False
    assert "mallory" in out["response"]["status"]["message"]
