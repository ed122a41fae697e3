"""A 1.35 node's request on a 1.37 API server. Its key (pkixPublicKey +
proofOfPossession, made through v1beta1) is stored, but the v1 view the signer lists and watches
has no key at all; the signer reads that one request through v1beta1 when v1beta1 serves
requests, checks the proof as on 1.35, and otherwise denies it `KeyNotServed`. The common
request (a stub CSR, visible at v1) costs no extra read. The adapter runs over an API server
that answers discovery and GETs from a table (`Served`); the integration test
tests/integration/test_skewed_request_forms.py holds the same against a real 1.37 server."""

from __future__ import annotations

import base64
import json
from typing import Any, cast

import msgspec
import pytest
from cryptography import x509

from podcert.api import keys, requests, versions
from podcert.client import discovery, pages
from podcert.client.rest import ApiError, Rest
from signer import model
from signer.admission import review
from signer.authority.castore import CAStore
from signer.issue.controller import Controller, utcnow
from signer.issue.settle import Settlement
from signer.kube import KeyNotServed, SignerKube
from signer.metrics import Metrics
from signer.policy import Policy
from tests.signer_world import ED_KEY, KEY, NOW, POLICY, SIGNER, make_facts, make_request

BETA = "/apis/certificates.k8s.io/v1beta1"
NAME = "/namespaces/web/podcertificaterequests/api-0-x7k2p"
REQUEST = make_request()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def view(**key: str) -> dict[str, Any]:
    """The request of `make_request()` as an API object, carrying `key`'s fields."""
    return {
        "metadata": {
            "namespace": REQUEST.namespace,
            "name": REQUEST.name,
            "uid": REQUEST.uid,
            "resourceVersion": "812",
            "generation": 1,
        },
        "spec": {
            "signerName": SIGNER,
            "podName": REQUEST.spec.pod_name,
            "podUID": REQUEST.spec.pod_uid,
            "serviceAccountName": REQUEST.spec.service_account_name,
            "serviceAccountUID": REQUEST.spec.service_account_uid,
            "nodeName": REQUEST.spec.node_name,
            "nodeUID": REQUEST.spec.node_uid,
            "maxExpirationSeconds": 86400,
            **key,
        },
    }


V1_VIEW = view()  # what v1 shows of a 1.35 node's request: no key
STUB_VIEW = view(stubPKCS10Request=b64(keys.stub_csr(KEY)))
V1 = requests.parse_request(V1_VIEW)


def proven(pod_uid: str = REQUEST.spec.pod_uid) -> dict[str, Any]:
    """The v1beta1 view of the same request: the key and its proof over `pod_uid`."""
    return view(
        pkixPublicKey=b64(keys.public_der(ED_KEY)),
        proofOfPossession=b64(keys.sign_proof(ED_KEY, pod_uid)),
    )


class Served:
    """Discovery and GETs answered from a table; every GET recorded. `beta` is whether
    certificates.k8s.io/v1beta1 serves podcertificaterequests (what --runtime-config says)."""

    def __init__(self, *, beta: bool, beta_view: dict[str, Any] | None = None) -> None:
        self.beta = beta
        self.beta_view = beta_view if beta_view is not None else proven()
        self.gets: list[str] = []

    def get(self, path: str) -> dict[str, Any] | None:
        self.gets.append(path)
        names = {"podcertificaterequests", "clustertrustbundles"}
        if path == "/apis/certificates.k8s.io/v1":
            return {"resources": [{"name": n} for n in sorted(names)]}
        if path == BETA:
            return {"resources": [{"name": n} for n in sorted(names)]} if self.beta else None
        if path == BETA + NAME:
            return self.beta_view if self.beta else None
        raise AssertionError(f"unexpected GET {path}")

    def get_as(self, path: str, shape: pages.Shape[Any]) -> Any:
        found = self.get(path)
        return None if found is None else shape.element(msgspec.json.encode(found), "object")


def kube_over(served: Served) -> SignerKube:
    kube = SignerKube(cast(Rest, served))
    assert kube.discover() == "v1"
    served.gets.clear()
    return kube


# --- reading: pure parts --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "holds"),
    [
        pytest.param(STUB_VIEW, True, id="a stub CSR is a key"),
        pytest.param(proven(), True, id="a pkix key with its proof is a key"),
        pytest.param(V1_VIEW, False, id="the v1 view of a 1.35 request holds none"),
        pytest.param({"spec": "junk"}, False, id="a spec of the wrong shape holds none"),
        pytest.param({}, False, id="no spec holds none"),
    ],
)
def test_holds_key_tells_a_view_without_key(obj: dict[str, Any], holds: bool) -> None:
    assert requests.read_request(obj).spec.holds_key is holds


def test_only_v1_hides_a_key_and_v1beta1_shows_it() -> None:
    assert versions.key_fallback("v1") == "v1beta1"
    assert versions.key_fallback("v1beta1") is None


def test_discovery_says_whether_a_version_serves_requests() -> None:
    assert discovery.serves(cast(Rest, Served(beta=True)), "v1beta1")
    assert not discovery.serves(cast(Rest, Served(beta=False)), "v1beta1")


# --- the adapter ----------------------------------------------------------------------------


def test_a_view_without_key_is_read_through_v1beta1_once() -> None:
    served = Served(beta=True)
    kube = kube_over(served)
    assert kube.fallback_served
    found = kube.keyed_pcr(V1)
    assert served.gets == [BETA + NAME], "one GET of the request, no discovery on the way"
    assert found is not None and found.spec.holds_key
    assert found.spec.pkix_public_key == keys.public_der(ED_KEY)


def test_without_v1beta1_the_key_is_not_served_after_asking_discovery_again() -> None:
    served = Served(beta=False)
    kube = kube_over(served)
    assert not kube.fallback_served
    with pytest.raises(KeyNotServed):
        kube.keyed_pcr(V1)
    assert served.gets == [BETA], "asked again before an answer that ends in a denial"


def test_a_server_that_starts_serving_v1beta1_is_noticed() -> None:
    served = Served(beta=False)
    kube = kube_over(served)
    served.beta = True
    found = kube.keyed_pcr(V1)
    assert found is not None and found.spec.holds_key
    assert served.gets == [BETA, BETA + NAME]


def test_a_404_from_a_server_that_stopped_serving_v1beta1_is_not_served() -> None:
    served = Served(beta=True)
    kube = kube_over(served)
    served.beta = False
    with pytest.raises(KeyNotServed):
        kube.keyed_pcr(V1)
    assert served.gets == [BETA + NAME, BETA]
    assert not kube.fallback_served


def test_a_404_while_v1beta1_still_serves_is_a_request_gone() -> None:
    class Gone(Served):
        def get(self, path: str) -> dict[str, Any] | None:
            return None if path == BETA + NAME else super().get(path)

    served = Gone(beta=True)
    kube = kube_over(served)
    assert kube.keyed_pcr(V1) is None
    assert kube.fallback_served


def test_a_v1beta1_server_shows_every_form_and_reads_nothing_more() -> None:
    served = Served(beta=True)
    kube = SignerKube(cast(Rest, served))
    kube.pcr_version = "v1beta1"
    assert kube.keyed_pcr(V1) is V1
    assert served.gets == []


def test_a_discovery_that_fails_is_an_api_error_to_retry() -> None:
    class Unwell(Served):
        def get(self, path: str) -> dict[str, Any] | None:
            if path == BETA:
                raise ApiError(503, "ServiceUnavailable", "etcd is unwell")
            return super().get(path)

    kube = SignerKube(cast(Rest, Unwell(beta=True)))
    kube.pcr_version = "v1"
    with pytest.raises(ApiError):
        kube.keyed_pcr(V1)


# --- the controller: decides on the view that shows the key ---------------------------------


def reconcile(kube: SignerKube, obj: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Settlement:
    ctrl = Controller(
        kube,
        [SIGNER],
        Policy({SIGNER: POLICY}),
        CAStore(kube, "podcert-system", "podcert-ca", utcnow),
        Metrics(),
        clock=lambda: NOW,
    )
    applied: list[Settlement] = []
    monkeypatch.setattr(ctrl, "facts", lambda request, seen_at, **_: make_facts(**_))
    monkeypatch.setattr(ctrl, "apply", lambda settlement: applied.append(settlement))
    ctrl._store[(REQUEST.namespace, REQUEST.name)] = requests.parse_request(obj)
    assert ctrl.reconcile((REQUEST.namespace, REQUEST.name)) is None
    [settled] = applied
    return settled


def leaf_key(settled: Settlement) -> bytes:
    chain = settled.status.certificate_chain
    leaf = x509.load_pem_x509_certificates(chain.encode())[0]
    return keys.spki_der(leaf.public_key())


def test_a_1_35_request_seen_at_v1_is_issued_to_the_key_v1beta1_shows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    served = Served(beta=True)
    settled = reconcile(kube_over(served), V1_VIEW, monkeypatch)
    assert (settled.outcome, settled.reason) == ("Issued", "Issued")
    assert leaf_key(settled) == keys.public_der(ED_KEY)
    assert settled.target.resource_version == "812"


def test_its_proof_is_checked_as_on_1_35(monkeypatch: pytest.MonkeyPatch) -> None:
    served = Served(beta=True, beta_view=proven(pod_uid="another-pod"))
    settled = reconcile(kube_over(served), V1_VIEW, monkeypatch)
    assert (settled.outcome, settled.reason) == ("Denied", model.INVALID_PROOF_OF_POSSESSION)


def test_without_v1beta1_it_is_denied_saying_what_to_enable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settled = reconcile(kube_over(Served(beta=False)), V1_VIEW, monkeypatch)
    assert (settled.outcome, settled.reason) == ("Denied", "KeyNotServed")
    assert "spec.pkixPublicKey" in settled.message
    assert "certificates.k8s.io/v1beta1" in settled.message
    assert "1.35 kubelets" in settled.message


def test_the_common_request_costs_no_extra_read(monkeypatch: pytest.MonkeyPatch) -> None:
    served = Served(beta=True)
    settled = reconcile(kube_over(served), STUB_VIEW, monkeypatch)
    assert settled.outcome == "Issued"
    assert served.gets == []


def test_a_request_gone_from_v1beta1_is_forgotten_unsettled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Gone(Served):
        def get(self, path: str) -> dict[str, Any] | None:
            return None if path == BETA + NAME else super().get(path)

    kube = kube_over(Gone(beta=True))
    ctrl = Controller(
        kube,
        [SIGNER],
        Policy({SIGNER: POLICY}),
        CAStore(kube, "podcert-system", "podcert-ca", utcnow),
        Metrics(),
        clock=lambda: NOW,
    )
    ctrl._store[(REQUEST.namespace, REQUEST.name)] = V1
    monkeypatch.setattr(ctrl, "apply", lambda settlement: pytest.fail("nothing to write"))
    assert ctrl.reconcile((REQUEST.namespace, REQUEST.name)) is None
    assert (REQUEST.namespace, REQUEST.name) not in ctrl._store


# --- the webhook: the 1.35 form judged as the v1 form is ------------------------------------

NODE_USER = f"system:node:{REQUEST.spec.node_name}"
KIND_V1 = {"group": "certificates.k8s.io", "version": "v1", "kind": "PodCertificateRequest"}
KIND_BETA = {**KIND_V1, "version": "v1beta1"}


def admission_review(obj: dict[str, Any], kind: dict[str, str], made: dict[str, str]) -> bytes:
    """An AdmissionReview as kube-apiserver sends it: `kind` the object's version, `made`
    (requestKind) the version the request was made at."""
    request = {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": kind,
        "resource": {**kind, "resource": "podcertificaterequests"},
        "requestKind": made,
        "namespace": REQUEST.namespace,
        "operation": "CREATE",
        "userInfo": {"username": NODE_USER, "groups": ["system:nodes"]},
        "object": obj,
    }
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    return json.dumps(body).encode()


def verdict(body: bytes) -> review.Verdict:
    parsed = review.parse_review(body)
    return review.admit(
        parsed.username,
        parsed.operation,
        parsed.object,
        [SIGNER],
        lambda request: make_facts(),
        Policy({SIGNER: POLICY}),
        NOW,
        converted_from=parsed.converted_from,
    )


@pytest.mark.parametrize(
    ("obj", "kind", "made", "allowed", "reason"),
    [
        pytest.param(STUB_VIEW, KIND_V1, KIND_V1, True, "", id="the v1 form is admitted"),
        pytest.param(
            proven(), KIND_BETA, KIND_BETA, True, "", id="the 1.35 form sent as made is admitted"
        ),
        pytest.param(
            proven(pod_uid="another-pod"),
            KIND_BETA,
            KIND_BETA,
            False,
            model.INVALID_PROOF_OF_POSSESSION,
            id="the 1.35 form with a proof for another pod is refused",
        ),
        pytest.param(
            STUB_VIEW,
            KIND_V1,
            KIND_BETA,
            True,
            "",
            id="a 1.36 stub CSR converted to v1 keeps its key and is admitted",
        ),
        pytest.param(
            V1_VIEW,
            KIND_V1,
            KIND_BETA,
            False,
            model.KEY_NOT_SERVED,
            id="the 1.35 form converted to v1 (key dropped) is refused naming the registration",
        ),
    ],
)
def test_the_webhook_judges_each_form_as_the_api_server_sends_it(
    obj: dict[str, Any], kind: dict[str, str], made: dict[str, str], allowed: bool, reason: str
) -> None:
    got = verdict(admission_review(obj, kind, made))
    assert (got.allowed, got.reason) == (allowed, reason), got.message
    if reason == model.KEY_NOT_SERVED:
        assert "converted from 'v1beta1'" in got.message
        assert 'apiVersions: ["*"]' in got.message


def test_a_review_says_which_version_the_request_was_made_at() -> None:
    assert review.parse_review(admission_review(V1_VIEW, KIND_V1, KIND_BETA)).converted_from == (
        "v1beta1"
    )
    assert (
        review.parse_review(admission_review(proven(), KIND_BETA, KIND_BETA)).converted_from == ""
    )
