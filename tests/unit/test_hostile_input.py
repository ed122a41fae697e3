"""Hostile input through every parser a stranger can feed: only typed errors ever come out.

One property-based target per parser that reads bytes or objects someone else controls, each with
the exception types it may raise (anything else is a bug):

    target                                          fed by                      may raise
    signer.issue.csr.parse_public_key                     anyone who creates PCRs     CSRError
    podcert.api.requests.decode_request, then       same, as the API returns it nothing; decide
      invalid and decide                                                        nothing
    signer.requested.parse_annotations                 same (userAnnotations)      nothing
    signer.policy.load_policy                       the operator's policy file  PolicyError
    bundles.formats.load_credential(_files),        files in a pod volume       BundleError,
      load_trust_bundle, then spiffe_id and                                     CertificateIdError
      verify_chain on what loaded
    podcert.auditlog.verify                         an audit log on disk        nothing
    podcert.auditlog.iter_entries                   same                        AuditLogError
    podcert.api.pods.parse_pod                      pod specs                   nothing

The strategies start from valid inputs and damage them where the parsers look, so most examples
get past the first check: DER trees re-encoded with correct lengths around one damaged element
(dropped, duplicated, retagged, emptied, grafted from another structure, nested hundreds deep),
raw length fields set to huge or indefinite values, PEM blocks duplicated, dropped, relabelled and
re-armoured, audit lines edited, re-chained, or forged as checkpoints signed by a rogue key with
hostile claims, and JSON objects with fields deleted, retyped, renamed or blown up past the API's
size limits. Random bytes are only one strategy among many.

Example counts come from the `podcert-fuzz` hypothesis profile: a quick run by default, so that
`make test` stays fast. The full run, 10,000 examples per target:

    PODCERT_FUZZ_EXAMPLES=10000 .venv/bin/pytest tests/unit/test_hostile_input.py \
        --hypothesis-show-statistics

The per-test timeout grows with the example count, so no other flag is needed.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import datetime as dt
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, get_args

import jwt
import msgspec
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, rsa, x25519
from hypothesis import event, given
from hypothesis import strategies as st

from bundles import formats, spiffe
from podcert import auditlog
from podcert.api import fields, keys, pods, requests
from podcert.api.requests import issued_status, settled_status
from podcert.api.volumes import path_problem
from signer import certs, model, policy, requested
from signer.auditlog.writer import AuditLog
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
    request_of,
)
from tests.strategies import (
    FUZZ,
    FUZZ_TIMEOUT,
    HUGE_CONTENT,
    TREES,
    der_mutant,
    hostile_der,
    hostile_json,
    json_mutant,
    tree_of,
)
from tests.unit.test_auditlog import Pki, make_pki
from tests.unit.test_auditlog import entry as audit_entry
from tests.unit.test_bundles_formats import WORKLOAD, Authority, key_secrets

pytestmark = FUZZ_TIMEOUT

# === seeds: keys, requests, certificates =========================================================

GOOD_KEYS = {key_type: keys.generate(key_type) for key_type in csr.KEY_TYPES}
GOOD_CSRS = [keys.stub_csr(key) for key in GOOD_KEYS.values()]
GOOD_SPKIS = [keys.public_der(key) for key in GOOD_KEYS.values()]
ODD_KEYS: Final = [
    rsa.generate_private_key(65537, 2048),
    ec.generate_private_key(ec.SECP224R1()),
    ec.generate_private_key(ec.SECP256K1()),
    dsa.generate_private_key(2048),
    ed448.Ed448PrivateKey.generate(),
]


def _csr(key: Any, algorithm: hashes.SHA256 | None) -> bytes:
    request = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
    return request.sign(key, algorithm).public_bytes(serialization.Encoding.DER)


def _spki(key: Any) -> bytes:
    der: bytes = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def _named_csr(key: Any) -> bytes:
    """A CSR with a subject and an extension request: more structure for the mutator."""
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "web")]))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("a.web.svc")]), critical=False)
    )
    return request.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


ODD_CSRS: Final = [
    _csr(ODD_KEYS[0], hashes.SHA256()),
    _csr(ODD_KEYS[1], hashes.SHA256()),
    _csr(ODD_KEYS[2], hashes.SHA256()),
    _csr(ODD_KEYS[3], hashes.SHA256()),
    _csr(ODD_KEYS[4], None),
    _named_csr(GOOD_KEYS["ECDSAP256"]),
]
CSR_SEEDS: Final = GOOD_CSRS + ODD_CSRS
SPKI_SEEDS: Final = GOOD_SPKIS + [_spki(key) for key in ODD_KEYS]
# v1beta1's proofs of possession, each good key's over BASE_REQUEST's pod UID.
GOOD_PROOFS: Final = [keys.sign_proof(key, "pod-uid-1") for key in GOOD_KEYS.values()]

# Certificates and keys for the bundle parsers: root -> intermediate -> leaf, and look-alikes.
ROOT = Authority("fuzz root")
INTERMEDIATE = ROOT.intermediate("fuzz intermediate")
OTHER_ROOT = Authority("fuzz other root")
LEAF_KEY = ec.generate_private_key(ec.SECP256R1())
LEAF = INTERMEDIATE.leaf(WORKLOAD, key=LEAF_KEY)
ED_KEY = GOOD_KEYS["ED25519"]
ED_LEAF = ROOT.leaf(WORKLOAD, "spiffe://cluster.local/ns/a/sa/b", key=ED_KEY)
NO_SAN_LEAF = ROOT.leaf(key=ec.generate_private_key(ec.SECP256R1()), san=False)


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def _pkcs8(key: Any, encryption: Any = None) -> bytes:
    der: bytes = key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        encryption or serialization.NoEncryption(),
    )
    return der


def _traditional(key: Any) -> bytes:
    der: bytes = key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    return der


CERT_SEEDS: Final = [_der(c) for c in (LEAF, INTERMEDIATE.cert, ROOT.cert, ED_LEAF, NO_SAN_LEAF)]
KEY_SEEDS: Final = [
    _pkcs8(LEAF_KEY),
    _pkcs8(ED_KEY),
    _pkcs8(GOOD_KEYS["RSA3072"]),
    _pkcs8(ODD_KEYS[3]),  # DSA
    _pkcs8(ODD_KEYS[4]),  # Ed448
    _pkcs8(x25519.X25519PrivateKey.generate()),
]
# Blocks that are not what the bundle wants, each under its honest label.
FOREIGN_BLOCKS: Final = [
    (b"EC PRIVATE KEY", _traditional(LEAF_KEY)),
    (b"RSA PRIVATE KEY", _traditional(ODD_KEYS[0])),
    (
        b"ENCRYPTED PRIVATE KEY",
        _pkcs8(LEAF_KEY, serialization.BestAvailableEncryption(b"pw")),
    ),
    (b"CERTIFICATE REQUEST", GOOD_CSRS[2]),
    (b"PUBLIC KEY", GOOD_SPKIS[2]),
    (b"X509 CRL", b"\x30\x03\x02\x01\x00"),
]
SECRETS: Final = frozenset(
    secret for key in (LEAF_KEY, ED_KEY, GOOD_KEYS["ECDSAP384"]) for secret in key_secrets(key)
)

# Grafts come from every kind of seed: an RSA SPKI in an EC CSR, a certificate in a key, ...
DONORS: Final = [*CSR_SEEDS, *SPKI_SEEDS, *CERT_SEEDS, *KEY_SEEDS, *(d for _, d in FOREIGN_BLOCKS)]
for _seed in DONORS:
    tree_of(_seed)  # every seed must round-trip; `TREES` then says which DER is a seed


# === the stub CSR parser ========================================================================


@FUZZ
@given(
    stub=st.one_of(hostile_der(CSR_SEEDS, DONORS), st.sampled_from(CSR_SEEDS)),
    pkix=st.one_of(st.just(b""), hostile_der(SPKI_SEEDS, DONORS), st.sampled_from(GOOD_SPKIS)),
    proof=st.one_of(st.sampled_from(GOOD_PROOFS), st.binary(max_size=600)),
)
def test_stub_csr_parser_raises_only_csr_error_on_damaged_der(
    stub: bytes, pkix: bytes, proof: bytes
) -> None:
    for request in (
        changed(BASE_REQUEST, stub_csr=stub, pkix_public_key=b""),
        # v1beta1's other form (1.35's only): no stub CSR, the key as bare SubjectPublicKeyInfo
        # with its signature over the pod UID.
        changed(BASE_REQUEST, stub_csr=b"", pkix_public_key=pkix, proof_of_possession=proof),
    ):
        try:
            parsed = csr.parse_public_key(request)
        except csr.CSRError as exc:
            event(f"CSRError {exc.reason}")
            assert exc.reason in (
                model.INVALID_REQUEST,
                model.UNSUPPORTED_KEY_TYPE,
                model.INVALID_PROOF_OF_POSSESSION,
            )
            assert 0 < len(exc.message) < 600
            continue
        event(f"parsed {parsed.key_type}")
        assert csr.key_type_of(parsed.public_key) == parsed.key_type
        if request.spec.stub_pkcs10_request:
            # Whatever parsed proved possession: the CSR verifies under the key it names.
            loaded = x509.load_der_x509_csr(request.spec.stub_pkcs10_request)
            assert loaded.is_signature_valid
            assert _spki(loaded) == _spki_of(parsed.public_key)
        else:
            assert keys.proof_verifies(parsed.public_key, request.spec.pod_uid, proof)


def _spki_of(public_key: Any) -> bytes:
    der: bytes = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


# === decide: the request off the wire, then the decision, as the controller runs them =========

BASE_FACTS = make_facts()
assert BASE_FACTS.pod is not None
BASE_REQUEST = make_request(stub_csr=GOOD_CSRS[0])
DNS_KEY = requested.DNS_NAMES_ANNOTATION
ENTITLED: Final = sorted(BASE_FACTS.service_dns_names)


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


POLICIES: Final = [
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


# Read from the closed type, so a reason added to model.DenyReason is known here at once.
DENIED_REASONS: Final = frozenset(get_args(model.DenyReason))


@FUZZ
@given(data=st.data(), pcr=pcrs(), signer=st.sampled_from(POLICIES))
def test_damaged_requests_end_in_object_error_or_a_typed_decision(
    data: st.DataObject, pcr: Any, signer: policy.SignerPolicy
) -> None:
    assert requests.outcome(pcr) in (None, "Issued", "Denied", "Failed")
    read = requests.decode_request(msgspec.json.encode(pcr))
    problem = requests.invalid(read)
    if problem is not None:
        # The controller denies these with InvalidRequest and this message.
        event(f"InvalidRequest at {problem.field.split('.')[0]}")
        assert 0 < len(str(problem)) < 200
        json.dumps(settled_status("Denied", model.INVALID_REQUEST, str(problem), None, NOW))
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
        json.dumps(settled_status("Denied", decision.reason, decision.message, generation, now))
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
    json.dumps(
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
@given(annotations=annotation_maps, signer=st.sampled_from(POLICIES[:2]))
def test_annotation_parser_returns_valid_names_or_a_denial_naming_the_annotation(
    annotations: dict[str, str], signer: policy.SignerPolicy
) -> None:
    result = requested.parse_annotations(annotations, signer)
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
    assert len(result.dns_names) <= requested.MAX_REQUESTED_DNS_NAMES
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


# === credential and trust bundles ===============================================================

Block = tuple[bytes, bytes, bytes]  # label, DER, RFC 1421 headers
LABELS: Final = [
    b"PRIVATE KEY",
    b"CERTIFICATE",
    b"ENCRYPTED PRIVATE KEY",
    b"EC PRIVATE KEY",
    b"TRUSTED CERTIFICATE",
    b"X509 CERTIFICATE",
    b"PRIVATE  KEY",
    b"certificate",
    b"CERTIFICATE ",
    b"",
    b"X" * 65,
    b"CERT-IFICATE",
    b"\xc3\xa9",
]
BETWEEN: Final = [
    b"",
    b"",
    b"Subject: CN=x\n",
    b"\n\n\n",
    b"-----END CERTIFICATE-----\n",
    b"-----BEGIN \n",
    b"-----BEGIN CERTIFICATE-----",
    b"\x00\xff\xfe",
    b"-----",
]


def armour(block: Block, *, width: int, newline: bytes) -> bytes:
    label, der, headers = block
    body = base64.b64encode(der)
    lines = [body[i : i + width] for i in range(0, len(body), width)]
    return (
        b"-----BEGIN "
        + label
        + b"-----"
        + newline
        + headers
        + newline.join(lines)
        + newline
        + b"-----END "
        + label
        + b"-----"
        + newline
    )


POOL: Final[list[Block]] = [
    *((b"CERTIFICATE", der, b"") for der in CERT_SEEDS),
    *((b"PRIVATE KEY", der, b"") for der in KEY_SEEDS),
    *((label, der, b"") for label, der in FOREIGN_BLOCKS),
]
CREDENTIAL_SEEDS: Final[list[list[Block]]] = [
    [(b"PRIVATE KEY", _pkcs8(LEAF_KEY), b""), *((b"CERTIFICATE", _der(c), b"") for c in (LEAF,))],
    [
        (b"PRIVATE KEY", _pkcs8(LEAF_KEY), b""),
        (b"CERTIFICATE", _der(LEAF), b""),
        (b"CERTIFICATE", _der(INTERMEDIATE.cert), b""),
    ],
    [(b"PRIVATE KEY", _pkcs8(ED_KEY), b""), (b"CERTIFICATE", _der(ED_LEAF), b"")],
]
TRUST_SEEDS: Final[list[list[Block]]] = [
    [(b"CERTIFICATE", _der(c), b"") for c in (ROOT.cert, OTHER_ROOT.cert)],
    [(b"CERTIFICATE", _der(c), b"") for c in (ROOT.cert, INTERMEDIATE.cert, ROOT.cert)],
]


@dataclass(frozen=True)
class Pem:
    """A bundle to build: the blocks, their armour and one raw edit. Strategies return this
    recipe, not the bytes, because Hypothesis keeps each example's drawn bytes for the rest of
    the run, and 10,000 bundles of up to 4 MiB do not fit in memory."""

    blocks: tuple[Block, ...]
    width: int = 64
    newline: bytes = b"\n"
    between: bytes = b""  # text before each block
    edit: str = "none"
    at: int = 0  # where the edit goes, modulo the length
    inserted: bytes = b""

    def build(self) -> bytes:
        data = b"".join(
            self.between + armour(block, width=self.width, newline=self.newline)
            for block in self.blocks
        )
        at = self.at % len(data) if data else 0
        if self.edit == "truncate":
            return data[:at]
        if self.edit == "flip" and data:
            return data[:at] + bytes([data[at] ^ self.inserted[0]]) + data[at + 1 :]
        if self.edit == "insert":
            return data[:at] + self.inserted + data[at:]
        if self.edit == "oversize":
            return data + b"\n" * (formats.MAX_BUNDLE_BYTES + 1 - len(data))
        return data


HUGE_BLOCKS: Final = [content * 10 for content in HUGE_CONTENT]  # 700 KB, under the size limit


@st.composite
def pem_mutant(draw: st.DrawFn, seeds: list[list[Block]]) -> Pem:
    """Seed blocks with edits to the block list, the armour and the DER inside, then maybe one
    raw edit to the bytes."""
    blocks = list(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, 3))):
        how = draw(
            st.sampled_from(
                ["drop", "dup", "move", "insert", "relabel", "der", "headers", "many", "huge"]
            )
        )
        at = draw(st.integers(0, max(len(blocks) - 1, 0)))
        if not blocks:
            blocks.append(draw(st.sampled_from(POOL)))
        elif how == "drop":
            del blocks[at]
        elif how == "dup":
            blocks.insert(draw(st.integers(0, len(blocks))), blocks[at])
        elif how == "move":
            blocks.insert(draw(st.integers(0, len(blocks))), blocks.pop(at))
        elif how == "insert":
            blocks.insert(draw(st.integers(0, len(blocks))), draw(st.sampled_from(POOL)))
        elif how == "relabel":
            blocks[at] = (draw(st.sampled_from(LABELS)), *blocks[at][1:])
        elif how == "der":
            label, der, headers = blocks[at]
            damaged = (
                draw(der_mutant([der], DONORS)) if der in TREES else draw(st.binary(max_size=64))
            )
            blocks[at] = (label, damaged, headers)
        elif how == "headers":
            headers = draw(
                st.sampled_from([b"Proc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\n", b":\n"])
            )
            blocks[at] = (*blocks[at][:2], headers)
        elif how == "many":  # hundreds of copies: duplicate roots, or keys
            copies = min(draw(st.sampled_from([50, 300])), 2**21 // (len(blocks[at][1]) + 1))
            blocks += [blocks[at]] * copies
        else:  # one enormous block, still under the size limit
            blocks[at] = (blocks[at][0], draw(st.sampled_from(HUGE_BLOCKS)), b"")
    width = draw(st.sampled_from([64, 64, 76, 1, 10_000]))
    if width == 1 and sum(len(block[1]) for block in blocks) > 2**16:
        width = 64  # a bytes object per base64 character: keep an example's memory bounded
    edit = draw(
        st.sampled_from(
            ["none"] * 8 + ["truncate", "flip", "insert", "bad64", "truncate", "flip", "oversize"]
        )
    )
    inserted = b""
    if edit == "flip":
        inserted = bytes([1 << draw(st.integers(0, 7))])
    elif edit == "insert":
        inserted = draw(st.binary(min_size=1, max_size=24))
    elif edit == "bad64":
        edit, inserted = "insert", draw(st.sampled_from([b"=", b"*", b"==", b"\x00", b"-"]))
    return Pem(
        blocks=tuple(blocks),
        width=width,
        newline=draw(st.sampled_from([b"\n", b"\r\n", b"\n", b" "])),
        # Text before each block; one draw for all of them.
        between=draw(st.sampled_from(BETWEEN)) if draw(st.booleans()) else b"",
        edit=edit,
        at=draw(st.integers(0, 2**32)),
        inserted=inserted,
    )


def built(bundle: Pem | bytes) -> bytes:
    return bundle.build() if isinstance(bundle, Pem) else bundle


# A hostile certificate's non-positive serial draws a deprecation warning from cryptography
# (a future release refuses it outright); it is refused or loaded either way.
serial_warning = pytest.mark.filterwarnings(
    "ignore:Parsed a serial number:cryptography.utils.CryptographyDeprecationWarning"
)


def _clean(message: str) -> None:
    assert not [secret for secret in SECRETS if secret in message], "key material in a message"


@serial_warning
@FUZZ
@given(bundle=st.one_of(pem_mutant(CREDENTIAL_SEEDS), st.binary(max_size=200)))
def test_damaged_credential_bundles_raise_only_bundle_errors(bundle: Pem | bytes) -> None:
    try:
        credential = formats.load_credential(built(bundle))
    except formats.BundleError as exc:
        event(type(exc).__name__)
        _clean(str(exc))
        return
    event("loaded")
    _clean(repr(credential))
    _check_loaded_credential(credential)


KEY_FILE_SEEDS: Final[list[list[Block]]] = [[(b"PRIVATE KEY", _pkcs8(LEAF_KEY), b"")]]
CHAIN_FILE_SEEDS: Final[list[list[Block]]] = [
    [(b"CERTIFICATE", _der(LEAF), b"")],
    [(b"CERTIFICATE", _der(LEAF), b""), (b"CERTIFICATE", _der(INTERMEDIATE.cert), b"")],
]


@serial_warning
@FUZZ
@given(key=pem_mutant(KEY_FILE_SEEDS), chain=pem_mutant(CHAIN_FILE_SEEDS))
def test_damaged_key_and_chain_files_raise_only_bundle_errors(key: Pem, chain: Pem) -> None:
    # The kubelet's keyPath/certificateChainPath pair, each damaged on its own.
    try:
        credential = formats.load_credential_files(key.build(), chain.build())
    except formats.BundleError as exc:
        event(type(exc).__name__)
        _clean(str(exc))
        return
    event("loaded")
    _check_loaded_credential(credential)


def _check_loaded_credential(credential: formats.Credential) -> None:
    """What a consumer does next with a loaded credential raises only typed errors too."""
    assert credential.chain
    formats.describe(credential.leaf)
    try:
        credential.spiffe_id  # noqa: B018 - the property parses the SAN
    except spiffe.CertificateIdError as exc:
        event(f"no SPIFFE ID: {type(exc).__name__}")
    try:
        formats.verify_chain(credential, formats.TrustBundle((ROOT.cert,)), NOW)
    except formats.ChainError:
        event("chain refused")


@serial_warning
@FUZZ
@given(bundle=st.one_of(pem_mutant(TRUST_SEEDS), st.binary(max_size=200)))
def test_damaged_trust_bundles_raise_only_bundle_errors(bundle: Pem | bytes) -> None:
    try:
        trust = formats.load_trust_bundle(built(bundle))
    except formats.BundleError as exc:
        event(type(exc).__name__)
        return
    event(f"{len(trust.roots)} roots")
    assert len(set(trust.roots)) == len(trust.roots)
    assert formats.load_trust_bundle(formats.dump_trust_bundle(trust)) == trust
    assert trust.der()


# === the audit log reader =======================================================================

AUDIT_PKI: Final = make_pki("fuzz")
ROGUE_PKI: Final = make_pki("rogue")
AUDIT_NOW: Final = dt.datetime(2026, 5, 1, 13, 0, tzinfo=dt.UTC)


def _write_log() -> list[bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "audit.jsonl"
        with AuditLog(path, checkpoint_every=4) as log:
            log.set_checkpoint_signer(AUDIT_PKI.key, AUDIT_PKI.chain)
            for i in range(1, 15):
                log.append(audit_entry(i, "denied" if i % 5 == 0 else "issued"))
        return path.read_bytes().splitlines()


LOG: Final = _write_log()
LAST_CHECKPOINT: Final = max(
    i for i, line in enumerate(LOG) if json.loads(line)["kind"] == "checkpoint"
)
assert auditlog.verify(LOG, [AUDIT_PKI.root], AUDIT_NOW).ok


def _x5c(pki: Pki) -> list[str]:
    return [base64.b64encode(_der(cert)).decode() for cert in pki.chain]


IATS: Final[list[Any]] = [
    int(AUDIT_NOW.timestamp()) - 60,
    0,
    -1,
    2**31,
    2**63,
    2**70,
    -(2**62),
    10**18,
    253402300800,
    1.5,
    "1",
    None,
    True,
]


@st.composite
def forged_checkpoint(draw: st.DrawFn, seq: int, prev: str) -> bytes:
    """A checkpoint line signed by a rogue key (or none) with hostile header and claims."""
    claims: dict[str, Any] = {
        "head": draw(st.sampled_from([prev, "0" * 64, "zz", 5, None])),
        "lines": draw(st.sampled_from([seq - 1, 0, -1, 2**64, "3", 1.0, None])),
        "iat": draw(st.sampled_from(IATS)),
    }
    if draw(st.booleans()):
        claims[draw(st.text(max_size=6))] = draw(hostile_json)
    x5c: Any = draw(
        st.one_of(
            st.just(_x5c(ROGUE_PKI)),
            st.just(_x5c(AUDIT_PKI)),  # the real chain, but a rogue signature
            der_mutant([_der(ROGUE_PKI.chain[0])], DONORS).map(
                lambda der: [base64.b64encode(der).decode(), *_x5c(ROGUE_PKI)[1:]]
            ),
            st.sampled_from([[], ["!!"], [5], "abc", None, ["AAAA"] * 100]),
        )
    )
    headers = {"x5c": x5c} if x5c is not None else {}
    token = _sign(
        claims, headers, draw(st.sampled_from(["ES256", "ES256", "none", "HS256", "ES384"]))
    )
    if draw(st.booleans()):  # damage the compact form itself
        parts = token.split(".")
        i = draw(st.integers(0, len(parts) - 1))
        parts[i] = draw(
            st.sampled_from(
                [
                    "",
                    "e30",
                    "W10",
                    base64.urlsafe_b64encode(b"[" * 5000).decode(),
                    parts[i][:-1],
                    parts[i] + "A",
                    "%%%",
                ]
            )
        )
        token = ".".join(parts)
    line = {"seq": seq, "prev": prev, "kind": "checkpoint", "jwt": token}
    return auditlog.encode_line(line)


P384_KEY: Final = ec.generate_private_key(ec.SECP384R1())
# ECDSA signatures are random: one token per input, so that replaying an example's choices
# (Hypothesis does, to shrink) rebuilds the same lines and draws the same way.
_TOKENS: dict[str, str] = {}


def _sign(claims: dict[str, Any], headers: dict[str, Any], algorithm: str) -> str:
    key = json.dumps([claims, headers, algorithm], sort_keys=True)
    if key not in _TOKENS:
        signing_key: Any = {
            "ES256": ROGUE_PKI.key,
            "none": "",
            "HS256": "a shared secret" * 3,
            "ES384": P384_KEY,
        }[algorithm]
        _TOKENS[key] = jwt.encode(claims, signing_key, algorithm=algorithm, headers=headers)
    return _TOKENS[key]


GARBAGE_LINES: Final = [
    b"",
    b"null",
    b'"line"',
    b"[]",
    b"{}",
    b"[" * 100_000,
    b'{"seq":' * 50_000,
    b"1" * 5000,
    b'{"seq":1,"seq":2}',
    b"\xff\xfe",
    b"\xef\xbb\xbf" + LOG[0],
    LOG[0].decode().encode("utf-16"),
    LOG[0] + b"\r",
    LOG[0] + b"\n",
    b"x" * 300_000,
]


def rechain(lines: list[bytes], start: int) -> list[bytes]:
    """What a forger with write access does after an edit: renumber and recompute each prev."""
    out = lines[:start]
    for line in lines[start:]:
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            out.append(line)
            continue
        if isinstance(obj, dict):
            obj["seq"] = len(out) + 1
            obj["prev"] = auditlog.line_hash(out[-1]) if out else auditlog.GENESIS
            line = auditlog.encode_line(obj)
        out.append(line)
    return out


@st.composite
def log_mutant(draw: st.DrawFn) -> list[bytes]:
    lines = list(LOG)
    for _ in range(draw(st.integers(1, 3))):
        how = draw(
            st.sampled_from(
                [
                    "drop",
                    "dup",
                    "swap",
                    "truncate",
                    "flip",
                    "splice",
                    "field",
                    "extra-field",
                    "garbage",
                    "forge",
                    "forge",
                ]
            )
        )
        if not lines:
            lines.append(draw(st.sampled_from(GARBAGE_LINES)))
            continue
        i = draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        if how == "drop":
            del lines[i]
        elif how == "dup":
            lines.insert(draw(st.integers(0, len(lines))), line)
        elif how == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif how == "truncate" and line:
            lines[i] = line[: draw(st.integers(0, len(line) - 1))]
        elif how == "flip" and line:
            at = draw(st.integers(0, len(line) - 1))
            flipped = bytes([line[at] ^ (1 << draw(st.integers(0, 7)))])
            lines[i] = line[:at] + flipped + line[at + 1 :]
        elif how == "splice":
            at = draw(st.integers(0, len(line)))
            lines[i] = line[:at] + draw(st.binary(min_size=1, max_size=16)) + line[at:]
        elif how in ("field", "extra-field"):
            obj = json.loads(line) if line[:1] == b"{" and _is_json(line) else None
            if isinstance(obj, dict):
                name = (
                    draw(st.sampled_from(sorted(obj)))
                    if how == "field" and obj
                    else draw(st.sampled_from(["private_key", "csr", "x", ""]))
                )
                obj[name] = draw(hostile_json.filter(_json_encodable))
                lines[i] = auditlog.encode_line(obj)
        elif how == "garbage":
            lines.insert(i, draw(st.sampled_from(GARBAGE_LINES)))
        else:
            prev = auditlog.line_hash(lines[i - 1]) if i else auditlog.GENESIS
            lines.insert(i, draw(forged_checkpoint(i + 1, prev)))
        if draw(st.booleans()):
            lines = rechain(lines, max(i, 0))
    return lines


def _is_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


def _json_encodable(value: Any) -> bool:
    try:
        auditlog.encode_line({"v": value})
    except (ValueError, TypeError, RecursionError):
        return False
    return True


@st.composite
def as_read(draw: st.DrawFn, lines: list[bytes]) -> list[bytes | str]:
    """The lines as bytes (how `podcert audit` reads them) or as text, as a caller that opened
    the file in text mode (undecodable bytes as surrogates) would pass them."""
    if draw(st.booleans()):
        return list(lines)
    return [line.decode("utf-8", "surrogateescape") for line in lines]


@FUZZ
@given(data=st.data(), lines=log_mutant(), anchored=st.booleans())
def test_audit_log_verify_reports_every_damage_and_never_raises(
    data: st.DataObject, lines: list[bytes], anchored: bool
) -> None:
    roots = [AUDIT_PKI.root] if anchored else None
    result = auditlog.verify(data.draw(as_read(lines)), roots, AUDIT_NOW)
    event("ok" if result.ok else "problems")
    assert result.ok == (result.first_broken_line is None)
    if result.first_broken_line is not None:
        assert 1 <= result.first_broken_line <= len(lines)
    assert result.entries + result.checkpoints <= len(lines)
    # Any change before the last checkpoint is caught, unless what is left is a true prefix of
    # the log (a truncated log is still a log; its tail is just not vouched for), or a prefix
    # followed by lines chained to it (anyone can chain an entry; no one without the key can sign
    # a checkpoint): then every changed line must be in the tail the log reports as unsigned.
    first_change = next(
        (i for i, (a, b) in enumerate(zip(lines, LOG, strict=False)) if a != b),
        min(len(lines), len(LOG)),
    )
    changed = roots is not None and first_change < LAST_CHECKPOINT and lines != LOG[: len(lines)]
    if changed and result.ok and result.anchored:
        assert len(lines) - first_change <= result.unsigned_tail, (first_change, result)


@FUZZ
@given(data=st.data(), lines=log_mutant())
def test_audit_log_iter_entries_raises_only_audit_log_errors(
    data: st.DataObject, lines: list[bytes]
) -> None:
    read = 0
    try:
        for found in auditlog.iter_entries(data.draw(as_read(lines))):
            assert found.time.utcoffset() is not None
            assert found.decision in get_args(auditlog.Decision)
            read += 1
    except auditlog.AuditLogError as exc:
        event("AuditLogError")
        assert exc.line_no is not None and read < exc.line_no <= len(lines)
        return
    event("read")


# === pods ========================================================================================


def _pod(sources: list[Any], *, extra_volumes: Sequence[Any] = ()) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop", "uid": "pod-uid", "labels": {"a": "b"}},
        "spec": {
            "nodeName": "node-a",
            "serviceAccountName": "web",
            "containers": [{"name": "app", "image": "x"}],
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {
                    "name": "identity",
                    "projected": {"defaultMode": 0o640, "defaultUser": 1000, "sources": sources},
                },
                *extra_volumes,
            ],
        },
    }


_BUNDLE_SOURCE: Final = {
    "podCertificate": {
        "signerName": SIGNER,
        "keyType": "ECDSAP256",
        "credentialBundlePath": "credentialbundle.pem",
        "maxExpirationSeconds": 3600,
        "userAnnotations": {DNS_KEY: "a.web.svc"},
    }
}
_SPLIT_SOURCE: Final = {
    "podCertificate": {
        "signerName": SIGNER,
        "keyType": "ED25519",
        "keyPath": "tls/key.pem",
        "certificateChainPath": "tls/chain.pem",
        "user": 1001,
    }
}
_TRUST_SOURCES: Final = [
    {"clusterTrustBundle": {"name": "roots", "path": "trust/by-name.pem"}},
    {
        "clusterTrustBundle": {
            "signerName": SIGNER,
            "labelSelector": {
                "matchLabels": {"tier": "prod"},
                "matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a", "b"]},
                    {"key": "retired", "operator": "DoesNotExist"},
                ],
            },
            "optional": True,
            "path": "trust/by-signer.pem",
        }
    },
]
POD_SEEDS: Final = [
    _pod([_BUNDLE_SOURCE, _SPLIT_SOURCE, *_TRUST_SOURCES, {"configMap": {"name": "cm"}}]),
    _pod(
        [_BUNDLE_SOURCE],
        extra_volumes=[{"name": "more", "projected": {"sources": [_SPLIT_SOURCE]}}],
    ),
    # A hundred certificate sources in one volume, as the integration test sends the API.
    _pod(
        [
            {"podCertificate": {**_BUNDLE_SOURCE["podCertificate"], "credentialBundlePath": p}}
            for p in (f"c{i}.pem" for i in range(100))
        ]
    ),
]
VOLUME_ERROR_KINDS: Final = frozenset(get_args(fields.ErrorKind))


@FUZZ
@given(pod=st.one_of(json_mutant(POD_SEEDS, keep_root=False), hostile_json))
def test_damaged_pods_parse_into_work_items_and_field_errors_without_raising(pod: Any) -> None:
    parsed = pods.parse_pod(pod)
    event(f"{len(parsed.errors)} errors" if parsed.errors else "clean")
    for error in parsed.errors:
        assert error.kind in VOLUME_ERROR_KINDS
        assert error.field_path.startswith(("metadata", "spec")) or error.field_path == ""
        assert str(error)
    work = list(parsed.work_items())
    assert len({key for key, _ in work}) == len(work), "two work items share a key"
    for volume in parsed.volumes:
        paths: list[str] = []
        for source in volume.sources:
            if isinstance(source, pods.CertificateSource):
                assert source.key_type in csr.KEY_TYPES
                assert 3600 <= source.max_expiration_seconds <= 7862400
                paths += source.paths
            elif isinstance(source, pods.TrustBundleSource):
                paths.append(source.path)
        assert all(path_problem(p) is None for p in paths)
        # No two files of one volume at one path, and no file where another is a directory.
        for i, a in enumerate(paths):
            for b in paths[i + 1 :]:
                assert a != b and not a.startswith(b + "/") and not b.startswith(a + "/")


def test_the_seeds_are_valid_so_the_mutants_start_deep() -> None:
    """Each target's seeds pass its parser, so damage is found past the first check."""
    for stub in GOOD_CSRS:
        csr.parse_public_key(changed(BASE_REQUEST, stub_csr=stub))
    for seed in PCR_SEEDS:
        decision = decide.decide(request_of(seed), BASE_FACTS, POLICIES[1], NOW)
        assert isinstance(decision, model.Issue), decision
    for blocks in CREDENTIAL_SEEDS:
        formats.load_credential(Pem(tuple(blocks)).build())
    for blocks in TRUST_SEEDS:
        formats.load_trust_bundle(Pem(tuple(blocks)).build())
    assert list(auditlog.iter_entries(LOG))
    for seed in POD_SEEDS:
        assert not pods.parse_pod(seed).errors
    policy.load_policy(POLICY_SEED, "policy.yaml", [SIGNER], "cluster.local")


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b"[" * 100_000, id="a line nested 100000 deep"),
        pytest.param(b'{"seq":' * 50_000, id="an object nested 50000 deep"),
    ],
)
def test_a_deeply_nested_audit_line_is_a_malformed_line(line: bytes) -> None:
    result = auditlog.verify([LOG[0], line, *LOG[1:]], None, AUDIT_NOW)
    assert result.first_broken_line == 2
    with pytest.raises(auditlog.AuditLogError, match="line 2"):
        list(auditlog.iter_entries([LOG[0], line]))


def _signed_checkpoint(claims: dict[str, Any], chain: list[str]) -> bytes:
    token = jwt.encode(claims, ROGUE_PKI.key, algorithm="ES256", headers={"x5c": chain})
    return auditlog.encode_line(
        {"seq": 1, "prev": auditlog.GENESIS, "kind": "checkpoint", "jwt": token}
    )


_UNKNOWN_KEY_LEAF: Final = _der(ROGUE_PKI.chain[0]).replace(
    bytes.fromhex("2a8648ce3d0201"), bytes.fromhex("2a8648ce3d0209"), 1
)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        pytest.param(
            _signed_checkpoint({"head": auditlog.GENESIS, "lines": 0, "iat": 2**70}, []),
            "x5c",
            id="no certificate in x5c",
        ),
        *(
            pytest.param(
                _signed_checkpoint(
                    {"head": auditlog.GENESIS, "lines": 0, "n": 1, "iat": iat}, _x5c(ROGUE_PKI)
                ),
                "date",
                id=f"a signed checkpoint dated {iat}",
            )
            for iat in (2**70, 10**18, -(2**62))
        ),
        pytest.param(
            _signed_checkpoint(
                {"head": auditlog.GENESIS, "lines": 0, "iat": 1},
                [base64.b64encode(_UNKNOWN_KEY_LEAF).decode()],
            ),
            "key",
            id="an x5c leaf with an unknown key algorithm",
        ),
    ],
)
def test_hostile_checkpoints_are_problems_not_crashes(line: bytes, problem: str) -> None:
    for roots in (None, [AUDIT_PKI.root]):
        result = auditlog.verify([line], roots, AUDIT_NOW)
        assert result.first_broken_line == 1
        assert problem in " ".join(result.problems)


def test_a_text_line_that_is_not_utf8_is_a_malformed_line() -> None:
    text = [LOG[0].decode(), "\ud800", *(line.decode() for line in LOG[1:])]
    assert auditlog.verify(text, None, AUDIT_NOW).first_broken_line == 2
