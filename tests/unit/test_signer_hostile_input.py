"""Hostile input to the signer never escapes as an exception: the key parser raises CSRError,
a request off the wire is Unreadable or decided, decide returns a typed outcome, the annotation
parser a denial, the policy loader a PolicyError naming the file.

Anyone with `create` on podcertificaterequests controls every request field, so these tests feed
the pure signer modules garbage, mutated and mismatched DER, weak keys, absurd annotations,
lifetimes and names, and the request objects themselves damaged (`tests.strategies`); the
workload's parsers have `test_hostile_input.py`. Both draw on `tests.hostile_seeds`. Set
PODCERT_FUZZ_EXAMPLES to run more (or fewer) examples per test (the `podcert-fuzz` profile).
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import datetime as dt
from typing import Any, Final, get_args

import msgspec
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, rsa
from hypothesis import event, given
from hypothesis import strategies as st

from podcert.api import keys, requests
from podcert.api.requests import PodCertificateRequest
from signer import certs, model, policy
from signer.authority import ca
from signer.issue import decide
from signer.issue.settle import issued_status, settled_status
from tests import strategies
from tests.hostile_seeds import (
    CSR_SEEDS,
    DONORS,
    GOOD_CSRS,
    GOOD_KEYS,
    GOOD_PROOFS,
    GOOD_SPKIS,
    SPKI_SEEDS,
    spki,
)
from tests.signer_world import (
    ISSUER,
    NOW,
    POLICY,
    SIGNER,
    assert_api_server_accepts,
    changed,
    make_facts,
    make_request,
    request_of,
)
from tests.strategies import FUZZ, FUZZ_TIMEOUT, hostile_der, json_mutant

pytestmark = FUZZ_TIMEOUT


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


# decide ----------------------------------------------------------------------------------------

# Read from the closed type, so a reason added to model.DenyReason is known here at once.
DENIED_REASONS: Final = frozenset(get_args(model.DenyReason))
DNS_KEY = decide.DNS_NAMES_ANNOTATION
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
def hostile_requests(draw: st.DrawFn) -> PodCertificateRequest:
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
    request=hostile_requests(),
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
    # As the signer takes it: off the wire, then refused naming the field where the API server
    # would not admit it (`invalid`: a name that is none, a lifetime out of range), or decided.
    read = requests.decode_request(msgspec.json.encode(request))
    problem = requests.invalid(read)
    if problem is not None:
        event("InvalidRequest before the decision")
        assert 0 < len(str(problem)) < 200
        return
    assert isinstance(read, PodCertificateRequest)
    request = read
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
        result = decide.parse_annotations(annotations, signer)
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


# === the key parser ========================================================================


@FUZZ
@given(
    stub=st.one_of(
        st.just(b""),
        hostile_der(CSR_SEEDS, DONORS),
        st.sampled_from(CSR_SEEDS + BAD_CSRS),
        HOSTILE_DER,
    ),
    pkix=st.one_of(
        st.just(b""), hostile_der(SPKI_SEEDS, DONORS), st.sampled_from(GOOD_SPKIS), HOSTILE_DER
    ),
    proof=st.one_of(st.sampled_from(GOOD_PROOFS), st.binary(max_size=600), HOSTILE_DER),
)
def test_key_parser_returns_a_proven_supported_key_or_raises_csr_error(
    stub: bytes, pkix: bytes, proof: bytes
) -> None:
    for request in (
        changed(BASE_REQUEST, stub_csr=stub, pkix_public_key=b""),
        # v1beta1's other form (1.35's only): no stub CSR, the key as bare SubjectPublicKeyInfo
        # with its signature over the pod UID.
        changed(BASE_REQUEST, stub_csr=b"", pkix_public_key=pkix, proof_of_possession=proof),
        # Both forms, or neither, at once: the API server admits exactly one.
        changed(BASE_REQUEST, stub_csr=stub, pkix_public_key=pkix, proof_of_possession=proof),
    ):
        try:
            parsed = decide.parse_public_key(request)
        except decide.CSRError as exc:
            event(f"CSRError {exc.reason}")
            assert exc.reason in (
                model.INVALID_REQUEST,
                model.UNSUPPORTED_KEY_TYPE,
                model.INVALID_PROOF_OF_POSSESSION,
            )
            assert 0 < len(exc.message) < 600
            continue
        event(f"parsed {parsed.key_type}")
        assert parsed.key_type in keys.KEY_TYPES
        assert keys.key_type_of(parsed.public_key) == parsed.key_type
        if request.spec.stub_pkcs10_request:
            # Whatever parsed proved possession: the CSR verifies under the key it names.
            loaded = x509.load_der_x509_csr(request.spec.stub_pkcs10_request)
            assert loaded.is_signature_valid
            assert spki(loaded) == _spki_of(parsed.public_key)
        else:
            assert keys.proof_verifies(
                parsed.public_key, request.spec.pod_uid, request.spec.proof_of_possession or b""
            )


def _spki_of(public_key: Any) -> bytes:
    der: bytes = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


# === decide: the request off the wire, then the decision, as the controller runs them =========

BASE_REQUEST = make_request(stub_csr=GOOD_CSRS[0])


def pcr_object(stub: bytes, annotations: dict[str, str]) -> dict[str, Any]:
    """A PodCertificateRequest as the API server returns it."""
    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "PodCertificateRequest",
        "metadata": {
            "name": "api-0-x7k2p",
            "namespace": "web",
            "uid": "3f1c0a52-1d2e-4b7a-9c1e-6a1f2b3c4d5e",
            "generation": 1,
            "creationTimestamp": "2026-11-29T11:59:58Z",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "api-0", "uid": "u"}],
        },
        "spec": {
            "signerName": SIGNER,
            "podName": "api-0",
            "podUID": "pod-uid-1",
            "serviceAccountName": "api",
            "serviceAccountUID": "sa-uid-1",
            "nodeName": "node-a",
            "nodeUID": "node-uid-1",
            "maxExpirationSeconds": 86400,
            "stubPKCS10Request": base64.b64encode(stub).decode(),
            "unverifiedUserAnnotations": annotations,
        },
        "status": {},
    }


PCR_SEEDS: Final = [
    pcr_object(stub, annotations)
    for stub in GOOD_CSRS
    for annotations in ({}, {DNS_KEY: ENTITLED[0]}, {DNS_KEY: ",".join(ENTITLED)})
]


@st.composite
def pcrs(draw: st.DrawFn) -> Any:
    """A request object with its fields damaged, its key damaged, or both."""
    obj = draw(json_mutant(PCR_SEEDS)) if draw(st.booleans()) else copy.deepcopy(PCR_SEEDS[0])
    spec = obj.get("spec") if isinstance(obj, dict) else None
    if isinstance(spec, dict) and draw(st.booleans()):
        stub = draw(hostile_der(CSR_SEEDS, DONORS))
        spec["stubPKCS10Request"] = base64.b64encode(stub).decode()
    if isinstance(spec, dict) and draw(st.booleans()):
        spec["unverifiedUserAnnotations"] = draw(annotation_maps)
    return obj


REQUEST_POLICIES: Final = [
    POLICY,
    dataclasses.replace(POLICY, dns=policy.DNSPolicy(services=True, allow_requested=True)),
    dataclasses.replace(POLICY, key_types=frozenset({"ED25519", "RSA4096"})),
    dataclasses.replace(POLICY, allow=()),
    dataclasses.replace(POLICY, max_lifetime=dt.timedelta(hours=1)),
]
SHORT_CA = ca.issuing_ca(
    ca.new_ca("short", NOW - dt.timedelta(days=1), intermediate_lifetime=dt.timedelta(days=1))
)


@st.composite
def facts_for(draw: st.DrawFn, request: requests.PodCertificateRequest) -> model.Facts:
    """Live state as the controller would read it for `request`: matching it, or disagreeing on
    one or two points (lagging caches, replaced pods, a pod on another node, no CA yet)."""
    pod = model.Pod(
        namespace=request.namespace,
        name=request.spec.pod_name,
        uid=request.spec.pod_uid,
        node_name=request.spec.node_name,
        service_account_name=request.spec.service_account_name,
        phase="Running",
    )
    facts = model.Facts(
        pod=pod,
        node=model.Node(request.spec.node_name, request.spec.node_uid),
        service_account=model.ServiceAccount(
            request.namespace, request.spec.service_account_name, request.spec.service_account_uid
        ),
        service_dns_names=BASE_FACTS.service_dns_names,
        ca=ISSUER,
    )
    odd: dict[str, st.SearchStrategy[Any]] = {
        "pod": st.one_of(
            st.none(),
            st.builds(
                msgspec.structs.replace,
                st.just(pod),
                uid=st.sampled_from([request.spec.pod_uid, "other-uid"]),
                node_name=st.sampled_from([request.spec.node_name, "node-z"]),
                phase=st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"]),
                deleting=st.booleans(),
                service_account_name=st.sampled_from(
                    [request.spec.service_account_name, "default"]
                ),
            ),
        ),
        "node": st.sampled_from([None, model.Node(request.spec.node_name, "re-registered")]),
        "service_account": st.sampled_from(
            [None, model.ServiceAccount(request.namespace, "api", "re-created")]
        ),
        "service_dns_names": st.just(frozenset()),
        "ca": st.sampled_from([None, SHORT_CA]),
    }
    changed = draw(st.sets(st.sampled_from(sorted(odd)), max_size=2))
    return dataclasses.replace(facts, **{name: draw(odd[name]) for name in changed})


@FUZZ
@given(data=st.data(), pcr=pcrs(), signer=st.sampled_from(REQUEST_POLICIES))
def test_damaged_requests_end_in_an_invalid_request_or_a_typed_decision(
    data: st.DataObject, pcr: Any, signer: policy.SignerPolicy
) -> None:
    assert requests.outcome(pcr) in (None, "Issued", "Denied", "Failed")
    try:
        wire = msgspec.json.encode(pcr)
    except UnicodeEncodeError:  # a lone surrogate: no API server writes one; read as a dict
        event("not UTF-8, read as a dict")
        read = requests.read_request(pcr)
    else:
        read = requests.decode_request(wire)
    problem = requests.invalid(read)
    if problem is not None:
        # The controller denies these with InvalidRequest and this message.
        event(f"InvalidRequest at {problem.field.split('.')[0]}")
        assert 0 < len(str(problem)) < 200
        msgspec.json.encode(
            settled_status("Denied", model.INVALID_REQUEST, str(problem), None, NOW)
        )
        return
    assert isinstance(read, requests.PodCertificateRequest)
    request = read
    if request.spec.signer_name != signer.name:
        event("another signer's request (the controller skips it)")
        return
    facts = data.draw(facts_for(request))
    now = NOW + dt.timedelta(seconds=data.draw(st.integers(0, 30 * 86400)))
    decision = decide.decide(request, facts, signer, now)
    event(f"{type(decision).__name__} {getattr(decision, 'reason', '')}")
    if isinstance(decision, model.Deny):
        assert decision.reason in DENIED_REASONS
        assert 0 < len(decision.message) < 1000
        generation = request.metadata.generation
        msgspec.json.encode(
            settled_status("Denied", decision.reason, decision.message, generation, now)
        )
        return
    if isinstance(decision, model.Retry):
        assert decision.after > dt.timedelta(0)
        return
    assert isinstance(decision, model.Issue), decision
    assert facts.ca is not None
    assert_api_server_accepts(decision.plan, request, now)
    chain = certs.sign_leaf(decision.plan, facts.ca, certs.random_serial())
    leaf = x509.load_pem_x509_certificates(chain.encode())[0]
    assert leaf.public_key() == decision.plan.public_key
    plan = decision.plan
    msgspec.json.encode(
        issued_status(
            None, chain, plan.not_before, plan.not_after, plan.begin_refresh_at, "issued", now
        )
    )


# === the annotation parser and the policy loader ================================================

dns_values = strategies.dns_values(ENTITLED)
annotation_keys = strategies.annotation_keys(DNS_KEY)
valid_dns_values = st.lists(
    st.one_of(
        st.sampled_from(ENTITLED),
        st.from_regex(r"[a-z0-9]{1,10}(\.[a-z0-9]{1,10}){0,3}", fullmatch=True),
    ),
    min_size=1,
    max_size=110,
).map(",".join)
annotation_maps = st.one_of(
    # Most requests carry only the annotation the signer knows: its value is what gets parsed.
    st.builds(lambda value: {DNS_KEY: value}, st.one_of(dns_values, valid_dns_values)),
    st.dictionaries(annotation_keys, st.one_of(dns_values, st.text(max_size=30)), max_size=4),
)
ANNOTATION_DENIALS: Final = frozenset(
    {model.UNKNOWN_ANNOTATION, model.INVALID_ANNOTATION, model.DNS_NAME_NOT_ALLOWED}
)


@FUZZ
@given(annotations=annotation_maps, signer=st.sampled_from(REQUEST_POLICIES[:2]))
def test_annotation_parser_returns_valid_names_or_a_denial_naming_the_annotation(
    annotations: dict[str, str], signer: policy.SignerPolicy
) -> None:
    result = decide.parse_annotations(annotations, signer)
    if isinstance(result, model.Deny):
        event(f"Deny {result.reason}")
        assert result.reason in ANNOTATION_DENIALS
        assert 0 < len(result.message) < 1000
        # The reason names the field: the offending key, or the one annotation understood.
        assert "Annotation" in result.message or DNS_KEY in result.message
        return
    event(f"{len(result.dns_names)} names")
    if not annotations:
        assert result.dns_names == ()
        return
    assert set(annotations) == {DNS_KEY}
    entries = [entry.strip() for entry in annotations[DNS_KEY].split(",")]
    assert signer.dns.allow_requested
    assert result.dns_names == tuple(dict.fromkeys(entries))
    assert len(result.dns_names) <= decide.MAX_REQUESTED_DNS_NAMES
    assert all(policy.is_dns_name(name) for name in result.dns_names)


POLICY_SEED: Final = f"""\
signers:
  - name: {SIGNER}
    trustDomain: td.example
    maxLifetimeSeconds: 43200
    keyTypes: [ECDSAP256, ED25519]
    dnsNames:
      services: true
      clusterDomain: cluster.local
      allowRequested: false
    rateLimit:
      perNode:
        requestsPerSecond: 0.5
        burst: 100
    allow:
      - namespaces: ["prod-*", web]
        serviceAccounts: ["*"]
      - namespaces: [batch]
"""
YAML_TOKENS: Final = [
    "&a ",
    "*a",
    "<<: *a\n",
    "!!python/object/apply:os.system ['true']",
    "!!binary ",
    "!!str ",
    "!!int ",
    "{",
    "}",
    "[",
    "]",
    ": ",
    "- ",
    "\t",
    "'",
    '"',
    "\\",
    "? ",
    "%YAML 1.1\n",
    "---\n",
    "...\n",
    "~",
    "0x10",
    "1e3",
    "yes",
    ".inf",
    "\x00",
    "\ufeff",
    "é",
    "\n  ",
    "#",
    "|\n",
    ">-\n",
    "99999999999999999999999",
]


@st.composite
def policy_texts(draw: st.DrawFn) -> str:
    text = POLICY_SEED
    for _ in range(draw(st.integers(1, 4))):
        lines = text.splitlines(keepends=True)
        how = draw(st.sampled_from(["insert", "insert", "delete", "dup-line", "drop-line", "cut"]))
        at = draw(st.integers(0, len(text)))
        if how == "insert":
            text = text[:at] + draw(st.sampled_from(YAML_TOKENS)) + text[at:]
        elif how == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 8)) :]
        elif how == "dup-line" and lines:
            i = draw(st.integers(0, len(lines) - 1))
            text = "".join([*lines[: i + 1], lines[i], *lines[i + 1 :]])
        elif how == "drop-line" and lines:
            i = draw(st.integers(0, len(lines) - 1))
            text = "".join([*lines[:i], *lines[i + 1 :]])
        else:
            text = text[:at]
    return text


NESTED_YAML: Final = "a: " + "[" * 20_000 + "]" * 20_000
LAUGHS: Final = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


@FUZZ
@given(text=st.one_of(policy_texts(), st.sampled_from([NESTED_YAML, LAUGHS, "signers: " + LAUGHS])))
def test_policy_loader_raises_only_policy_errors_naming_the_file(text: str) -> None:
    try:
        loaded = policy.load_policy(text, "policy.yaml", [SIGNER], "cluster.local")
    except policy.PolicyError as exc:
        event("PolicyError")
        assert str(exc).startswith("policy.yaml:")
        return
    event("loaded")
    assert set(loaded.signers) == {SIGNER}


def test_the_seeds_are_valid_so_the_mutants_start_deep() -> None:
    """Each target's seeds pass its parser, so damage is found past the first check."""
    for stub in GOOD_CSRS:
        decide.parse_public_key(changed(BASE_REQUEST, stub_csr=stub))
    for seed in PCR_SEEDS:
        decision = decide.decide(request_of(seed), BASE_FACTS, REQUEST_POLICIES[1], NOW)
        assert isinstance(decision, model.Issue), decision
    policy.load_policy(POLICY_SEED, "policy.yaml", [SIGNER], "cluster.local")
