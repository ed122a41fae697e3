"""Hostile input never escapes as an exception: the parser raises CSRError, decide returns a Deny.

Anyone with `create` on podcertificaterequests controls every request field, so these tests feed
the pure signer modules garbage, mutated and mismatched DER, weak keys, absurd annotations,
lifetimes and names. Keys are generated once at import: RSA generation is slow. Set
PODCERT_FUZZ_EXAMPLES to run more (or fewer) examples per test.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from typing import Any, Final, get_args

import msgspec
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, rsa
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from podcert.api import keys
from podcert.api.requests import PodCertificateRequest
from signer import certs, model, policy, requested
from signer.authority import ca
from signer.issue import csr, decide
from tests import strategies
from tests.signer_world import (
    ISSUER,
    NOW,
    POLICY,
    SIGNER,
    assert_api_server_accepts,
    changed,
    make_facts,
    make_request,
)

FUZZ = settings(
    max_examples=int(os.environ.get("PODCERT_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

GOOD_KEYS = {key_type: keys.generate(key_type) for key_type in csr.KEY_TYPES}
GOOD_CSRS = [keys.stub_csr(key) for key in GOOD_KEYS.values()]


def _csr(key: object, algorithm: hashes.HashAlgorithm | None) -> bytes:
    request = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
    return request.sign(key, algorithm).public_bytes(serialization.Encoding.DER)  # type: ignore[arg-type]


def _spki(public_key: object) -> bytes:
    der: bytes = public_key.public_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def _swapped_key_csr() -> bytes:
    signer_key = GOOD_KEYS["ECDSAP256"]
    other = ec.generate_private_key(ec.SECP256R1())
    return keys.stub_csr(signer_key).replace(
        _spki(signer_key.public_key()), _spki(other.public_key())
    )


BAD_CSRS = [
    _csr(rsa.generate_private_key(65537, 2048), hashes.SHA256()),
    _csr(ec.generate_private_key(ec.SECP224R1()), hashes.SHA256()),
    _csr(dsa.generate_private_key(2048), hashes.SHA256()),
    _swapped_key_csr(),
]
KNOWN_DER = GOOD_CSRS + BAD_CSRS + [keys.public_der(key) for key in GOOD_KEYS.values()]


HOSTILE_DER = strategies.hostile_der(KNOWN_DER)


# v1beta1's other form: each good key, and its proof of possession over the base pod UID.
GOOD_SPKIS = [keys.public_der(key) for key in GOOD_KEYS.values()]
GOOD_PROOFS = [keys.sign_proof(key, "pod-uid-1") for key in GOOD_KEYS.values()]
MAYBE_DER = st.one_of(st.just(b""), HOSTILE_DER)


@FUZZ
@given(stub=MAYBE_DER, pkix=MAYBE_DER, proof=st.one_of(MAYBE_DER, st.sampled_from(GOOD_PROOFS)))
def test_parser_returns_a_supported_key_or_raises_csr_error(
    stub: bytes, pkix: bytes, proof: bytes
) -> None:
    request = make_request(stub_csr=stub, pkix_public_key=pkix, proof_of_possession=proof)
    try:
        parsed = csr.parse_public_key(request)
    except csr.CSRError as exc:
        assert exc.reason in (
            model.INVALID_REQUEST,
            model.UNSUPPORTED_KEY_TYPE,
            model.INVALID_PROOF_OF_POSSESSION,
        )
        assert 0 < len(exc.message) < 600
        return
    assert parsed.key_type in csr.KEY_TYPES
    assert csr.key_type_of(parsed.public_key) == parsed.key_type


# decide ----------------------------------------------------------------------------------------

# Read from the closed type, so a reason added to model.DenyReason is known here at once.
DENIED_REASONS: Final = frozenset(get_args(model.DenyReason))
DNS_KEY = requested.DNS_NAMES_ANNOTATION
ENTITLED = sorted(make_facts().service_dns_names)
POLICIES = [
    POLICY,
    dataclasses.replace(POLICY, dns=policy.DNSPolicy(services=True, allow_requested=True)),
    dataclasses.replace(POLICY, key_types=frozenset({"ED25519"}), allow=()),
    dataclasses.replace(POLICY, max_lifetime=dt.timedelta(hours=1)),
    dataclasses.replace(POLICY, allow=(policy.AllowRule(namespaces=("web",)),)),
]
ISSUERS = [
    ISSUER,
    None,
    ca.issuing_ca(
        ca.new_ca(
            "short", NOW - dt.timedelta(days=1), intermediate_lifetime=dt.timedelta(days=1, hours=2)
        )
    ),
]


dns_values = strategies.dns_values(ENTITLED)
annotation_keys = strategies.annotation_keys(DNS_KEY)
hostile_annotations = st.dictionaries(
    annotation_keys, st.one_of(dns_values, st.text(max_size=50)), max_size=3
)
names = st.one_of(st.just(""), st.text(max_size=300), st.just("../../admin"), st.just("WEB"))
# For each spec field, what a hostile or broken client might put there instead.
HOSTILE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "namespace": names,
    "uid": st.text(max_size=100),
    "pod_name": names,
    "pod_uid": names,
    "service_account_name": names,
    "service_account_uid": names,
    "node_name": st.one_of(names, st.just("node-b")),
    "node_uid": names,
    "max_expiration_seconds": st.one_of(
        st.integers(), st.sampled_from([0, -1, 3599, 7862401, 2**200])
    ),
    "stub_csr": st.one_of(st.sampled_from(BAD_CSRS), HOSTILE_DER, st.just(b"")),
    "pkix_public_key": HOSTILE_DER,
    "proof_of_possession": st.one_of(HOSTILE_DER, st.sampled_from(GOOD_PROOFS)),
    "user_annotations": hostile_annotations,
}


@st.composite
def requests(draw: st.DrawFn) -> PodCertificateRequest:
    """A valid request with a few fields made hostile, so every check gets reached."""
    index = draw(st.integers(0, len(GOOD_CSRS) - 1))
    if draw(st.booleans()):
        form: dict[str, bytes] = {"stub_csr": GOOD_CSRS[index]}
    else:  # v1beta1's other form (the only one on 1.35): the key and its proof
        form = {
            "stub_csr": b"",
            "pkix_public_key": GOOD_SPKIS[index],
            "proof_of_possession": GOOD_PROOFS[index],
        }
    valid = make_request(
        uid=draw(st.text(max_size=40)),
        max_expiration_seconds=draw(st.integers(3600, 7862400)),
        **form,
    )
    hostile = draw(st.sets(st.sampled_from(sorted(HOSTILE_FIELDS)), max_size=3))
    return changed(valid, **{name: draw(HOSTILE_FIELDS[name]) for name in hostile})


BASE_FACTS = make_facts()
assert BASE_FACTS.pod is not None
# For each fact, how live state may disagree with the request.
ODD_FACTS: dict[str, st.SearchStrategy[Any]] = {
    "pod": st.one_of(
        st.none(),
        st.builds(
            msgspec.structs.replace,
            st.just(BASE_FACTS.pod),
            uid=st.sampled_from(["pod-uid-1", "pod-uid-2", ""]),
            node_name=st.sampled_from(["node-a", "node-b"]),
            phase=st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"]),
            deleting=st.booleans(),
            service_account_name=st.sampled_from(["api", "default"]),
        ),
    ),
    "node": st.sampled_from([None, model.Node("node-a", "node-uid-2")]),
    "service_account": st.sampled_from([None, model.ServiceAccount("web", "api", "sa-uid-2")]),
    "service_dns_names": st.just(frozenset()),
    "ca": st.sampled_from(ISSUERS),
}


@st.composite
def facts(draw: st.DrawFn) -> model.Facts:
    odd = draw(st.sets(st.sampled_from(sorted(ODD_FACTS)), max_size=2))
    return dataclasses.replace(BASE_FACTS, **{name: draw(ODD_FACTS[name]) for name in odd})


@FUZZ
@given(
    request=requests(),
    facts=facts(),
    signer=st.sampled_from(POLICIES),
    now=st.datetimes(
        min_value=dt.datetime(2026, 11, 29),
        max_value=dt.datetime(2026, 12, 31),
        timezones=st.just(dt.UTC),
    ),
)
def test_decide_on_hostile_input_ends_in_a_typed_outcome(
    request: PodCertificateRequest,
    facts: model.Facts,
    signer: policy.SignerPolicy,
    now: dt.datetime,
) -> None:
    assert request.spec.signer_name == SIGNER
    decision = decide.decide(request, facts, signer, now)
    event(getattr(decision, "reason", type(decision).__name__))
    if isinstance(decision, model.Deny):
        assert decision.reason in DENIED_REASONS
        # Messages stay readable whatever the input's size.
        assert 0 < len(decision.message) < 1000
        return
    if isinstance(decision, model.Retry):
        assert decision.after > dt.timedelta(0)
        return
    assert isinstance(decision, model.Issue), decision
    plan = decision.plan
    assert_api_server_accepts(plan, request, now)
    # Whatever decide plans, the signer can sign, and the leaf carries the requested key.
    assert facts.ca is not None
    chain = x509.load_pem_x509_certificates(
        certs.sign_leaf(plan, facts.ca, certs.random_serial()).encode()
    )
    assert chain[0].public_key() == plan.public_key
    assert plan.spiffe_id == f"spiffe://cluster.local/ns/{request.namespace}/sa/api"


@FUZZ
@given(annotations=st.dictionaries(st.text(max_size=20_000), st.text(max_size=20_000), max_size=5))
def test_annotation_parser_never_raises(annotations: dict[str, str]) -> None:
    for signer in POLICIES[:2]:
        result = requested.parse_annotations(annotations, signer)
        if isinstance(result, model.Deny):
            assert len(result.message) < 1000
        else:
            assert all(policy.is_dns_name(name) for name in result.dns_names)


@FUZZ
@given(
    text=st.one_of(
        st.text(max_size=300),
        # Structured YAML gets past the top-level checks more often than random text.
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(
                    st.sampled_from(["signers", "name", "allow", "namespaces", "keyTypes", "x"]),
                    inner,
                    max_size=3,
                )
            ),
            max_leaves=12,
        ).map(lambda value: yaml.safe_dump({"signers": [value]})),
    )
)
def test_policy_loader_raises_only_policy_errors(text: str) -> None:
    try:
        policy.load_policy(text, "policy.yaml", [SIGNER], "cluster.local")
    except policy.PolicyError as exc:
        assert str(exc).startswith("policy.yaml:")
