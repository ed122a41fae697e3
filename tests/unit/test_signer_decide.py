"""signer.issue.decide: each check in order, each Denied reason, and what an Issue plans."""

from __future__ import annotations

import dataclasses
import datetime as dt
import subprocess
import sys
from typing import get_args

import pytest
from cryptography.hazmat.primitives import serialization

from podcert.api import keys
from podcert.api.requests import PodCertificateRequest
from signer import certs, model, policy
from signer.authority import ca
from signer.issue import decide
from tests.signer_world import (
    DNS_KEY,
    ED_KEY,
    ISSUER,
    KEY,
    NOW,
    OPEN_DNS,
    POLICY,
    RSA_2048,
    SERVICES_DNS,
    assert_api_server_accepts,
    changed,
    make_facts,
    make_request,
    pod,
    policy_with,
)


def issued(decision: model.Decision) -> model.LeafPlan:
    assert isinstance(decision, model.Issue), decision
    return decision.plan


def test_issues_the_spiffe_id_with_backdated_whole_second_times() -> None:
    request = make_request()
    plan = issued(decide.decide(request, make_facts(), POLICY, NOW))
    assert plan.spiffe_id == "spiffe://cluster.local/ns/web/sa/api"
    assert plan.dns_names == ()  # DNS names are off by default
    assert plan.not_before == dt.datetime(2026, 11, 29, 11, 59, 0, tzinfo=dt.UTC)
    assert plan.not_after == plan.not_before + dt.timedelta(days=1)
    assert plan.begin_refresh_at == certs.begin_refresh_at(
        request.uid, plan.not_before, plan.not_after
    )
    assert plan.public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == keys.public_der(KEY)
    assert_api_server_accepts(plan, request, NOW)


def test_plan_signs_into_a_leaf_the_api_server_would_accept() -> None:
    request = make_request()
    plan = issued(decide.decide(request, make_facts(), SERVICES_DNS, NOW))
    leaf_pem = certs.sign_leaf(plan, ISSUER, certs.random_serial())
    assert leaf_pem.count("BEGIN CERTIFICATE") == 2


def test_trust_domain_comes_from_the_policy() -> None:
    plan = issued(
        decide.decide(make_request(), make_facts(), policy_with(trust_domain="prod.corp"), NOW)
    )
    assert plan.spiffe_id == "spiffe://prod.corp/ns/web/sa/api"


def proven(key: keys.PrivateKey, pod_uid: str = "pod-uid-1") -> PodCertificateRequest:
    """A v1beta1 request in the 1.35 form: the key and its proof over `pod_uid`."""
    return make_request(
        stub_csr=b"",
        pkix_public_key=keys.public_der(key),
        proof_of_possession=keys.sign_proof(key, pod_uid),
    )


def test_v1beta1_request_with_a_pkix_key_and_its_proof_is_issued() -> None:
    decision = decide.decide(proven(ED_KEY), make_facts(), POLICY, NOW)
    assert isinstance(decision, model.Issue)
    assert keys.spki_der(decision.plan.public_key) == keys.public_der(ED_KEY)


# One row per Denied reason (several for reasons with several causes). -----------------------

DENIALS = [
    pytest.param(
        make_request(stub_csr=b"\x30\x82\x01"),
        make_facts(),
        POLICY,
        model.INVALID_REQUEST,
        "not a valid DER",
        id="denied when the stub CSR is truncated",
    ),
    pytest.param(
        proven(ED_KEY, pod_uid="pod-uid-2"),
        make_facts(),
        POLICY,
        model.INVALID_PROOF_OF_POSSESSION,
        "spec.proofOfPossession does not verify",
        id="denied when the proof of possession is for another pod",
    ),
    pytest.param(
        changed(proven(ED_KEY), pkix_public_key=keys.public_der(KEY)),
        make_facts(),
        POLICY,
        model.INVALID_PROOF_OF_POSSESSION,
        "spec.proofOfPossession does not verify",
        id="denied when the proof of possession was made by another key",
    ),
    pytest.param(
        make_request(stub_csr=b""),
        make_facts(key_not_served=True),
        POLICY,
        model.KEY_NOT_SERVED,
        "--runtime-config=certificates.k8s.io/v1beta1/podcertificaterequests=true",
        id="denied when no served version shows the key (v1 view of a 1.35 request, no v1beta1)",
    ),
    pytest.param(
        make_request(stub_csr=keys.stub_csr(RSA_2048)),
        make_facts(),
        POLICY,
        model.UNSUPPORTED_KEY_TYPE,
        "RSA 2048-bit key, which this signer does not support",
        id="denied when the key is RSA-2048",
    ),
    pytest.param(
        make_request(),
        make_facts(),
        policy_with(key_types=frozenset({"ED25519", "RSA4096"})),
        model.UNSUPPORTED_KEY_TYPE,
        "Key type ECDSAP256 is not accepted by signer example.com/podcert (it accepts "
        "RSA4096, ED25519); use ED25519.",
        id="denied when policy refuses the key type, suggesting one it accepts",
    ),
    pytest.param(
        make_request(),
        make_facts(pod=None),
        POLICY,
        model.POD_NOT_FOUND,
        "Pod web/api-0 does not exist.",
        id="denied when the pod is gone",
    ),
    pytest.param(
        make_request(),
        make_facts(pod=pod(uid="pod-uid-2")),
        POLICY,
        model.POD_UID_MISMATCH,
        "Pod web/api-0 has UID pod-uid-2, not 'pod-uid-1'",
        id="denied when the pod was replaced by one with the same name",
    ),
    pytest.param(
        make_request(),
        make_facts(pod=pod(node_name="node-b")),
        POLICY,
        model.POD_NOT_ON_NODE,
        "Pod web/api-0 runs on node 'node-b', not on 'node-a'",
        id="denied when pod moved to another node",
    ),
    pytest.param(
        make_request(),
        make_facts(pod=pod(deleting=True)),
        POLICY,
        model.POD_NOT_RUNNABLE,
        "Pod web/api-0 is being deleted",
        id="denied when the pod is being deleted",
    ),
    pytest.param(
        make_request(),
        make_facts(pod=pod(phase="Succeeded")),
        POLICY,
        model.POD_NOT_RUNNABLE,
        "finished (phase Succeeded)",
        id="denied when the pod has succeeded",
    ),
    pytest.param(
        make_request(),
        make_facts(pod=pod(phase="Failed")),
        POLICY,
        model.POD_NOT_RUNNABLE,
        "finished (phase Failed)",
        id="denied when the pod has failed",
    ),
    pytest.param(
        make_request(),
        make_facts(node=None),
        POLICY,
        model.NODE_NOT_FOUND,
        "Node 'node-a' does not exist.",
        id="denied when the node is gone",
    ),
    pytest.param(
        make_request(),
        make_facts(node=model.Node("node-a", "node-uid-2")),
        POLICY,
        model.NODE_UID_MISMATCH,
        "Node 'node-a' has UID node-uid-2, not 'node-uid-1'",
        id="denied when the node was re-registered",
    ),
    pytest.param(
        make_request(),
        make_facts(pod=pod(service_account_name="other")),
        POLICY,
        model.SERVICE_ACCOUNT_MISMATCH,
        "runs as service account 'other', not 'api'",
        id="denied when the pod runs as another service account",
    ),
    pytest.param(
        make_request(),
        make_facts(service_account=None),
        POLICY,
        model.SERVICE_ACCOUNT_MISMATCH,
        "Service account web/api does not exist.",
        id="denied when the service account is gone",
    ),
    pytest.param(
        make_request(),
        make_facts(service_account=model.ServiceAccount("web", "api", "sa-uid-2")),
        POLICY,
        model.SERVICE_ACCOUNT_MISMATCH,
        "has UID sa-uid-2, not 'sa-uid-1'",
        id="denied when the service account was re-created",
    ),
    pytest.param(
        make_request(),
        make_facts(),
        policy_with(allow=(policy.AllowRule(namespaces=("prod-*",)),)),
        model.POLICY_DENIED,
        "no certificates to service account 'api' in namespace 'web'",
        id="denied when no allow rule matches",
    ),
    pytest.param(
        make_request(user_annotations={"example.com/team": "red"}),
        make_facts(),
        POLICY,
        model.UNKNOWN_ANNOTATION,
        "'example.com/team'",
        id="denied for an annotation the signer does not know",
    ),
    pytest.param(
        make_request(user_annotations={DNS_KEY: "api.web.svc,,"}),
        make_facts(),
        OPEN_DNS,
        model.INVALID_ANNOTATION,
        "empty entry",
        id="denied for a malformed dns-names annotation",
    ),
    pytest.param(
        make_request(user_annotations={DNS_KEY: "api.web.svc"}),
        make_facts(),
        POLICY,
        model.DNS_NAME_NOT_ALLOWED,
        "does not issue requested DNS names",
        id="denied when policy does not honour requested names",
    ),
    pytest.param(
        make_request(user_annotations={DNS_KEY: "api.web.svc,payments.prod.svc"}),
        make_facts(),
        OPEN_DNS,
        model.DNS_NAME_NOT_ALLOWED,
        "not entitled to DNS name 'payments.prod.svc'",
        id="denied when asking for another service's name",
    ),
]


@pytest.mark.parametrize(("request_", "facts", "signer", "reason", "fragment"), DENIALS)
def test_denials(
    request_: PodCertificateRequest,
    facts: model.Facts,
    signer: policy.SignerPolicy,
    reason: str,
    fragment: str,
) -> None:
    decision = decide.decide(request_, facts, signer, NOW)
    assert isinstance(decision, model.Deny), decision
    assert decision.reason == reason
    assert fragment in decision.message
    # A sentence for a human, never key material.
    assert decision.message.endswith(".")
    assert "BEGIN" not in decision.message


def test_every_denied_reason_has_a_test() -> None:
    assert {param.values[3] for param in DENIALS} == set(get_args(model.DenyReason))


@pytest.mark.parametrize(
    ("request_", "facts", "signer", "reason"),
    [
        pytest.param(
            make_request(stub_csr=b"junk"),
            make_facts(pod=None, node=None, ca=None),
            POLICY,
            model.INVALID_REQUEST,
            id="key is checked before the pod",
        ),
        pytest.param(
            make_request(),
            make_facts(pod=None),
            policy_with(key_types=frozenset({"ED25519"}), allow=()),
            model.POD_NOT_FOUND,
            id="node restriction is checked before policy",
        ),
        pytest.param(
            make_request(),
            make_facts(pod=pod(uid="x", node_name="node-b", deleting=True)),
            POLICY,
            model.POD_UID_MISMATCH,
            id="pod UID is checked before its node",
        ),
        pytest.param(
            make_request(user_annotations={"bad/key": "x"}),
            make_facts(),
            policy_with(allow=()),
            model.POLICY_DENIED,
            id="allow rules are checked before annotations",
        ),
        pytest.param(
            make_request(user_annotations={"bad/key": "x"}),
            make_facts(ca=None),
            POLICY,
            model.UNKNOWN_ANNOTATION,
            id="a request is denied even while no CA is loaded",
        ),
    ],
)
def test_order_of_checks(
    request_: PodCertificateRequest,
    facts: model.Facts,
    signer: policy.SignerPolicy,
    reason: str,
) -> None:
    decision = decide.decide(request_, facts, signer, NOW)
    assert isinstance(decision, model.Deny)
    assert decision.reason == reason


def test_unsupported_key_message_suggests_what_policy_accepts() -> None:
    decision = decide.decide(
        make_request(stub_csr=keys.stub_csr(RSA_2048)),
        make_facts(),
        POLICY,
        NOW,
    )
    assert isinstance(decision, model.Deny)
    assert decision.message.endswith("Use ECDSAP256.")


# DNS names -----------------------------------------------------------------------------------


def test_service_names_are_issued_when_policy_says_so() -> None:
    plan = issued(decide.decide(make_request(), make_facts(), SERVICES_DNS, NOW))
    assert plan.dns_names == ("api.web.svc", "api.web.svc.cluster.local")


def test_requested_names_are_issued_when_entitled() -> None:
    request = make_request(user_annotations={DNS_KEY: "api.web.svc"})
    plan = issued(decide.decide(request, make_facts(), OPEN_DNS, NOW))
    assert plan.dns_names == ("api.web.svc",)


def test_entitlement_comes_from_live_services_not_from_policy() -> None:
    request = make_request(user_annotations={DNS_KEY: "api.web.svc"})
    decision = decide.decide(request, make_facts(service_dns_names=frozenset()), OPEN_DNS, NOW)
    assert isinstance(decision, model.Deny)
    assert decision.reason == model.DNS_NAME_NOT_ALLOWED


# Lifetime and the CA ------------------------------------------------------------------------


def expiring_ca(after: dt.timedelta) -> model.IssuingCA:
    """An issuing CA made a day ago that expires `after` from NOW."""
    made = NOW - dt.timedelta(days=1)
    return ca.issuing_ca(
        ca.new_ca("expiring", made, intermediate_lifetime=dt.timedelta(days=1) + after)
    )


@pytest.mark.parametrize(
    ("policy_seconds", "request_seconds", "ca_after", "expected"),
    [
        pytest.param(
            86400, 86400, dt.timedelta(days=30), dt.timedelta(days=1), id="policy default"
        ),
        pytest.param(7200, 86400, dt.timedelta(days=30), dt.timedelta(hours=2), id="policy caps"),
        pytest.param(86400, 3600, dt.timedelta(days=30), dt.timedelta(hours=1), id="request caps"),
        pytest.param(
            86400,
            86400,
            dt.timedelta(hours=5),
            # notBefore is 60.5 s before NOW (backdate, truncation); the CA ends at NOW + 5 h.
            dt.timedelta(hours=5, seconds=60),
            id="CA expiry caps",
        ),
    ],
)
def test_lifetime_is_the_least_of_policy_request_and_ca(
    policy_seconds: int, request_seconds: int, ca_after: dt.timedelta, expected: dt.timedelta
) -> None:
    request = make_request(max_expiration_seconds=request_seconds)
    signer = policy_with(max_lifetime=dt.timedelta(seconds=policy_seconds))
    issuer = expiring_ca(ca_after)
    plan = issued(decide.decide(request, make_facts(ca=issuer), signer, NOW))
    assert plan.not_after - plan.not_before == expected
    assert plan.not_after <= issuer.not_after
    assert_api_server_accepts(plan, request, NOW)


@pytest.mark.parametrize(
    ("issuer", "expected"),
    [
        pytest.param(
            None,
            model.Retry(dt.timedelta(seconds=5), decide.CA_NOT_LOADED),
            id="retries soon while no CA is loaded",
        ),
        pytest.param(
            expiring_ca(dt.timedelta(minutes=30)),
            model.Retry(dt.timedelta(seconds=60), decide.CA_TOO_SHORT),
            id="retries when the CA expires within the hour",
        ),
        pytest.param(
            expiring_ca(-dt.timedelta(hours=1)),
            model.Retry(dt.timedelta(seconds=60), decide.CA_TOO_SHORT),
            id="retries when the CA has expired",
        ),
        pytest.param(
            ca.issuing_ca(ca.new_ca("future", NOW + dt.timedelta(minutes=30))),
            model.Retry(dt.timedelta(seconds=60), decide.CA_NOT_YET_VALID),
            id="retries when the CA is not valid yet",
        ),
    ],
)
def test_trouble_with_the_ca_is_retried_never_denied(
    issuer: model.IssuingCA | None, expected: model.Retry
) -> None:
    assert decide.decide(make_request(), make_facts(ca=issuer), POLICY, NOW) == expected


def test_refresh_fraction_moves_the_refresh_point() -> None:
    request = make_request()
    early = issued(decide.decide(request, make_facts(), POLICY, NOW, refresh_fraction=0.2))
    late = issued(decide.decide(request, make_facts(), POLICY, NOW, refresh_fraction=0.8))
    assert early.begin_refresh_at < late.begin_refresh_at


def test_backdate_is_configurable() -> None:
    plan = issued(
        decide.decide(make_request(), make_facts(), POLICY, NOW, backdate=dt.timedelta(0))
    )
    assert plan.not_before == NOW.replace(microsecond=0)


def test_a_policy_for_another_signer_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="policy for"):
        decide.decide(make_request(signer_name="example.com/other"), make_facts(), POLICY, NOW)


def test_pure_modules_import_neither_kubernetes_nor_aiohttp() -> None:
    modules = [
        "podcert.api.keys",
        "signer.certs",
        "signer.authority.ca",
        "signer.policy",
        "signer.issue.decide",
    ]
    code = (
        f"import sys\nfor m in {modules!r}: __import__(m)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'aiohttp'))\n"
        "print(','.join(bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == ""


def test_key_types_named_by_csr_and_policy_agree() -> None:
    assert POLICY.key_types == frozenset(keys.KEY_TYPES)


# --- what the annotations ask for ----------------------------------------------------------------

SIGNER_NAME = "example.com/podcert"
DNS_CLOSED = policy.default_policy([SIGNER_NAME], "cluster.local").for_signer(SIGNER_NAME)
DNS_OPEN = dataclasses.replace(
    DNS_CLOSED, dns=dataclasses.replace(DNS_CLOSED.dns, allow_requested=True)
)
ANNOTATION = decide.DNS_NAMES_ANNOTATION


def test_no_annotations_request_nothing() -> None:
    assert decide.parse_annotations({}, DNS_CLOSED) == decide.RequestedNames(())


def test_requested_names_are_trimmed_and_deduplicated_in_order() -> None:
    parsed = decide.parse_annotations(
        {ANNOTATION: " b.web.svc,\n  a.web.svc ,b.web.svc\n"}, DNS_OPEN
    )
    assert parsed == decide.RequestedNames(("b.web.svc", "a.web.svc"))


@pytest.mark.parametrize(
    ("annotations", "reason", "fragment"),
    [
        pytest.param(
            {"example.com/color": "blue"},
            model.UNKNOWN_ANNOTATION,
            "'example.com/color'",
            id="unknown domain-prefixed key",
        ),
        pytest.param(
            {"dns-names": "a.svc"},
            model.UNKNOWN_ANNOTATION,
            "'dns-names'",
            id="key without the podcert.dev prefix",
        ),
        pytest.param(
            {"z.example/a": "", "a.example/b": "", ANNOTATION: "x.svc"},
            model.UNKNOWN_ANNOTATION,
            "'a.example/b' (and 1 more)",
            id="several unknown keys name the first and count the rest",
        ),
        pytest.param(
            {"x" * 5000: "v"},
            model.UNKNOWN_ANNOTATION,
            "'" + "x" * 100 + "'... (5000 characters)",
            id="absurdly long key is cut in the message",
        ),
        pytest.param({ANNOTATION: ""}, model.INVALID_ANNOTATION, "empty entry", id="empty value"),
        pytest.param(
            {ANNOTATION: "a.svc,,b.svc"}, model.INVALID_ANNOTATION, "empty entry", id="double comma"
        ),
        pytest.param(
            {ANNOTATION: "a.svc,"}, model.INVALID_ANNOTATION, "empty entry", id="trailing comma"
        ),
        pytest.param(
            {ANNOTATION: "*.web.svc"}, model.INVALID_ANNOTATION, "'*.web.svc'", id="wildcard name"
        ),
        pytest.param(
            {ANNOTATION: "Web.svc"}, model.INVALID_ANNOTATION, "'Web.svc'", id="uppercase name"
        ),
        pytest.param(
            {ANNOTATION: "a" * 64 + ".svc"},
            model.INVALID_ANNOTATION,
            "not a valid DNS",
            id="long label",
        ),
        pytest.param(
            {ANNOTATION: "a.svc."}, model.INVALID_ANNOTATION, "not a valid DNS", id="trailing dot"
        ),
        pytest.param(
            {ANNOTATION: "ok.svc,evil\n.svc"},
            model.INVALID_ANNOTATION,
            r"'evil\n.svc'",
            id="newline escaped",
        ),
        pytest.param(
            {ANNOTATION: ",".join(f"n{i}.svc" for i in range(101))},
            model.INVALID_ANNOTATION,
            "lists 101 names; at most 100",
            id="more than 100 names",
        ),
    ],
)
def test_bad_annotations_are_denied_with_the_offending_value(
    annotations: dict[str, str], reason: str, fragment: str
) -> None:
    denial = decide.parse_annotations(annotations, DNS_OPEN)
    assert isinstance(denial, model.Deny)
    assert denial.reason == reason
    assert fragment in denial.message
    assert len(denial.message) < 500


def test_requested_names_are_denied_when_policy_does_not_allow_requests() -> None:
    denial = decide.parse_annotations({ANNOTATION: "a.web.svc"}, DNS_CLOSED)
    assert isinstance(denial, model.Deny)
    assert denial.reason == model.DNS_NAME_NOT_ALLOWED
    assert "allowRequested" in denial.message


def test_exactly_100_names_are_fine() -> None:
    names = [f"n{i}.svc" for i in range(100)]
    assert decide.parse_annotations(
        {ANNOTATION: ",".join(names)}, DNS_OPEN
    ) == decide.RequestedNames(tuple(names))
