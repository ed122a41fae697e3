"""Creators that are not the node are refused at admission, by the signer's
webhook and by the webhook-free ValidatingAdmissionPolicy; other signers pass untouched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import kube
from devcluster.supervise import free_port
from devcluster.testing import DevCluster, eventually
from podcert.api import keys
from podcert.client.rest import ApiError, Rest, path_of
from tests.integration.conftest import StartSigner
from tests.integration.helpers import create_pcr, make_pod, pcr_spec, request_as_node

WEBHOOK_SIGNER = "adm.podcert.dev/webhook"
VAP_SIGNER = "adm.podcert.dev/vap"
OTHER_SIGNER = "adm.podcert.dev/somebody-else"
POLICY_FILE = Path(__file__).resolve().parents[2] / "manifests" / "signer" / "admission-policy.yaml"


def grant_create(devcluster: DevCluster, user: str) -> None:
    kube.apply(
        devcluster.admin,
        [
            {
                "kind": "ClusterRole",
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "metadata": {"name": f"{user}-pcr-create"},
                "rules": [
                    {
                        "apiGroups": ["certificates.k8s.io"],
                        "resources": ["podcertificaterequests"],
                        "verbs": ["create"],
                    }
                ],
            },
            {
                "kind": "ClusterRoleBinding",
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "metadata": {"name": f"{user}-pcr-create"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": f"{user}-pcr-create",
                },
                "subjects": [
                    {"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}
                ],
            },
        ],
    )


@pytest.fixture(scope="module")
def webhook(devcluster: DevCluster, start_signer: StartSigner) -> Iterator[Any]:
    port = free_port()
    proc = start_signer(
        WEBHOOK_SIGNER,
        namespace="podcert-adm",
        webhook_port=port,
        webhook_host="127.0.0.1",
        webhook_dns_name="localhost",
    )
    secret = Rest(devcluster.admin).request(
        "GET", path_of("v1", "secrets", "podcert-adm", "podcert-ca")
    )
    config = yaml.safe_load((POLICY_FILE.parent / "admission-webhook.yaml").read_text())
    config["metadata"]["name"] = "podcert-test-webhook"
    hook = config["webhooks"][0]
    hook["matchConditions"][0]["expression"] = f"object.spec.signerName in ['{WEBHOOK_SIGNER}']"
    hook["clientConfig"] = {
        "url": f"https://localhost:{port}/validate-podcertificaterequests",
        "caBundle": secret["data"]["ca.crt"],
    }
    kube.apply(devcluster.admin, [config])
    try:
        yield proc
    finally:
        kube.delete(devcluster.admin, [config])


@pytest.fixture(scope="module")
def vap(devcluster: DevCluster) -> Iterator[None]:
    docs = [d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d]
    for doc in docs:
        doc["metadata"]["name"] = "podcert-test-vap"
        if doc["kind"] == "ValidatingAdmissionPolicy":
            doc["spec"]["matchConditions"][0]["expression"] = (
                f"object.spec.signerName in ['{VAP_SIGNER}']"
            )
        else:
            doc["spec"]["policyName"] = "podcert-test-vap"
    kube.apply(devcluster.admin, docs)
    try:
        yield
    finally:
        kube.delete(devcluster.admin, docs)


def refused(devcluster: DevCluster, user: str, namespace: str, spec: dict[str, Any]) -> str | None:
    """The API server's refusal message, or None when the request was admitted."""
    try:
        create_pcr(devcluster.user(user), namespace, spec)
    except ApiError as err:
        return err.message
    return None


@pytest.mark.parametrize(
    "signer", [pytest.param(WEBHOOK_SIGNER, id="webhook"), pytest.param(VAP_SIGNER, id="policy")]
)
def test_a_non_node_creator_is_refused_for_another_identity(
    devcluster: DevCluster, webhook: Any, vap: None, signer: str
) -> None:
    grant_create(devcluster, "mallory")
    ns = devcluster.namespace("adm")
    pod = make_pod(devcluster, ns, "victim", signer)
    kube.ensure_service_account(devcluster.admin, ns, "payments")
    sa = Rest(devcluster.admin).request("GET", path_of("v1", "serviceaccounts", ns, "payments"))
    spec = pcr_spec(
        devcluster,
        pod,
        signer,
        keys.generate("ECDSAP256"),
        serviceAccountName="payments",
        serviceAccountUID=sa["metadata"]["uid"],
    )
    # Admission configuration reaches the API server's caches within moments.
    message = eventually(lambda: refused(devcluster, "mallory", ns, spec), timeout=15)
    assert "only the node the pod runs on may request its certificate" in message
    assert "mallory" in message


@pytest.mark.parametrize(
    "signer", [pytest.param(WEBHOOK_SIGNER, id="webhook"), pytest.param(VAP_SIGNER, id="policy")]
)
def test_a_node_asking_for_its_own_pod_is_admitted(
    devcluster: DevCluster, webhook: Any, vap: None, signer: str
) -> None:
    ns = devcluster.namespace("adm")
    pod = make_pod(devcluster, ns, "web", signer)
    _, pcr = request_as_node(devcluster, pod, signer)
    assert pcr["metadata"]["name"]


def test_requests_for_other_signers_pass_untouched(
    devcluster: DevCluster, webhook: Any, vap: None
) -> None:
    grant_create(devcluster, "mallory")
    ns = devcluster.namespace("adm")
    pod = make_pod(devcluster, ns, "other", OTHER_SIGNER)
    spec = pcr_spec(devcluster, pod, OTHER_SIGNER, keys.generate("ECDSAP256"))
    assert refused(devcluster, "mallory", ns, spec) is None


def test_the_webhook_refuses_what_the_signer_would_deny_anyway(
    devcluster: DevCluster, webhook: Any
) -> None:
    ns = devcluster.namespace("adm")
    pod = make_pod(devcluster, ns, "odd", WEBHOOK_SIGNER)
    spec = pcr_spec(
        devcluster,
        pod,
        WEBHOOK_SIGNER,
        keys.generate("ECDSAP256"),
        unverifiedUserAnnotations={"evil.example/escalate": "yes"},
    )
    node = devcluster.node("node-a")
    body = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "PodCertificateRequest",
        "metadata": {"generateName": "req-"},
        "spec": spec,
    }

    def attempt() -> str | None:
        try:
            Rest(node).request(
                "POST", path_of("certificates.k8s.io/v1", "podcertificaterequests", ns), body=body
            )
        except ApiError as err:
            return err.message
        return None

    message = eventually(attempt, timeout=15)
    assert "UnknownAnnotation" in message and "evil.example/escalate" in message


# --- the webhook port is no oracle ----------------------------------------------------------------


def _post(port: int, ca_pem: bytes, body: bytes) -> tuple[int, dict[str, Any]]:
    """POST straight to the webhook, as anyone who can reach its port could."""
    import json
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cadata=ca_pem.decode())
    request = urllib.request.Request(
        f"https://localhost:{port}/validate-podcertificaterequests",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as resp:  # noqa: S310
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def _review(user: str, pcr: dict[str, Any]) -> bytes:
    import json

    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "forged-1",
                "kind": {
                    "group": "certificates.k8s.io",
                    "version": "v1",
                    "kind": "PodCertificateRequest",
                },
                "resource": {
                    "group": "certificates.k8s.io",
                    "version": "v1",
                    "resource": "podcertificaterequests",
                },
                "operation": "CREATE",
                "userInfo": {"username": user},
                "object": pcr,
            },
        }
    ).encode()


def test_a_forged_review_learns_nothing_and_hostile_bodies_get_typed_answers(
    devcluster: DevCluster, webhook: Any
) -> None:
    import base64

    port = next(int(a.split("=", 1)[1]) for a in webhook.args if a.startswith("--webhook-port="))
    secret = Rest(devcluster.admin).request(
        "GET", path_of("v1", "secrets", "podcert-adm", "podcert-ca")
    )
    ca_pem = base64.b64decode(secret["data"]["ca.crt"])
    ns = devcluster.namespace("adm-oracle")
    pod = make_pod(devcluster, ns, "victim", WEBHOOK_SIGNER)
    key = keys.generate("ECDSAP256")
    spec = pcr_spec(devcluster, pod, WEBHOOK_SIGNER, key)
    real = {spec["podUID"], spec["nodeUID"], spec["serviceAccountUID"]}
    # The attacker guesses UIDs and poses as the node.
    guessed = {
        **spec,
        "podUID": "11111111-1111-1111-1111-111111111111",
        "nodeUID": "22222222-2222-2222-2222-222222222222",
        "serviceAccountUID": "33333333-3333-3333-3333-333333333333",
    }
    pcr = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "PodCertificateRequest",
        "metadata": {"namespace": ns, "generateName": "req-"},
        "spec": guessed,
    }

    status, answer = _post(port, ca_pem, _review(f"system:node:{spec['nodeName']}", pcr))

    assert status == 200
    verdict = answer["response"]
    assert verdict["allowed"] is False
    text = str(verdict)
    assert not any(uid in text for uid in real), text  # nothing the caller did not send
    assert "PodBindingMismatch" in verdict["status"]["message"]

    # Hostile bodies: a typed 400/413 each, one log line, no traceback.
    deep = b"[" * 5000 + b"]" * 5000
    cases = {
        "deep": (deep, 400),
        "not json": (b"\xff{not json", 400),
        "not a review": (b'{"apiVersion": "v1", "kind": "Pod"}', 400),
        "too large": (b'{"a": "' + b"x" * (2 * 1024 * 1024) + b'"}', 413),
    }
    for name, (body, expected) in cases.items():
        status, answer = _post(port, ca_pem, body)
        assert status == expected, (name, status, answer)
    log = webhook.output()
    assert "Traceback" not in log and "RecursionError" not in log
