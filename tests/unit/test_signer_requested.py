"""signer.issue.requested: the subject key and the annotations come out of the request, or a
typed CSRError or Deny does."""

from __future__ import annotations

import dataclasses

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, rsa, x25519

from podcert.api import keys
from podcert.api.requests import PodCertificateRequest
from signer import model, policy
from signer.issue import requested
from tests.signer_world import changed, make_request

KEYS = {key_type: keys.generate(key_type) for key_type in requested.KEY_TYPES}
BASE = make_request(stub_csr=b"")


def spki(public_key: object) -> bytes:
    assert hasattr(public_key, "public_bytes")
    der: bytes = public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def with_csr(der: bytes) -> PodCertificateRequest:
    return changed(BASE, stub_csr=der)


def with_spki(der: bytes, proof: bytes = b"a proof") -> PodCertificateRequest:
    return changed(BASE, pkix_public_key=der, proof_of_possession=proof)


def csr_der(key: object, algorithm: hashes.HashAlgorithm | None = None) -> bytes:
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
    request = builder.sign(key, algorithm)  # type: ignore[arg-type]
    return request.public_bytes(serialization.Encoding.DER)


def swapped_key_csr() -> bytes:
    """A P-256 stub CSR whose embedded public key is not the key that signed it."""
    signer_key, other = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    der = keys.stub_csr(signer_key)
    # Both SPKIs have the same length, so the DER structure stays intact.
    return der.replace(spki(signer_key.public_key()), spki(other.public_key()))


@pytest.mark.parametrize("key_type", requested.KEY_TYPES)
def test_parses_every_api_key_type_from_the_stub_csr(key_type: keys.KeyType) -> None:
    key = KEYS[key_type]
    parsed = requested.parse_public_key(with_csr(keys.stub_csr(key)))
    assert parsed.key_type == key_type
    assert spki(parsed.public_key) == keys.public_der(key)


@pytest.mark.parametrize("key_type", requested.KEY_TYPES)
def test_parses_every_api_key_type_from_a_v1beta1_pkix_key(key_type: keys.KeyType) -> None:
    key = KEYS[key_type]
    proof = keys.sign_proof(key, BASE.spec.pod_uid)
    parsed = requested.parse_public_key(with_spki(keys.public_der(key), proof))
    assert parsed.key_type == key_type
    assert spki(parsed.public_key) == keys.public_der(key)


def test_both_forms_at_once_are_an_invalid_request() -> None:
    # The API server allows exactly one form (1.36+), so such an object bypassed admission.
    key = KEYS["ECDSAP256"]
    request = changed(
        with_csr(keys.stub_csr(KEYS["ED25519"])),
        pkix_public_key=keys.public_der(key),
        proof_of_possession=keys.sign_proof(key, BASE.spec.pod_uid),
    )
    with pytest.raises(requested.CSRError) as caught:
        requested.parse_public_key(request)
    assert caught.value.reason == model.INVALID_REQUEST
    assert "spec.pkixPublicKey must be empty when stubPKCS10Request is set" in caught.value.message


def valid_p256_csr() -> bytes:
    return keys.stub_csr(KEYS["ECDSAP256"])


def flipped_signature() -> bytes:
    der = bytearray(valid_p256_csr())
    der[-5] ^= 0x01  # inside the ECDSA signature's INTEGER
    return bytes(der)


@pytest.mark.parametrize(
    ("request_", "fragment"),
    [
        pytest.param(BASE, "spec.stubPKCS10Request is required", id="neither form of key"),
        pytest.param(
            with_spki(keys.public_der(KEYS["ECDSAP256"]), b""),
            "spec.proofOfPossession is required",
            id="PKIX key without its proof",
        ),
        pytest.param(
            changed(BASE, proof_of_possession=b"a proof"),
            "spec.pkixPublicKey is required",
            id="proof without its PKIX key",
        ),
        pytest.param(with_csr(b"\x00"), "not a valid DER", id="one zero byte as CSR"),
        pytest.param(with_csr(b"garbage" * 10), "not a valid DER", id="ASCII garbage as CSR"),
        pytest.param(with_csr(valid_p256_csr()[:-10]), "not a valid DER", id="truncated CSR"),
        pytest.param(with_csr(valid_p256_csr() + b"\x00"), "not a valid DER", id="trailing byte"),
        pytest.param(
            with_csr(keys.public_der(KEYS["ECDSAP256"])), "not a valid DER", id="SPKI given as CSR"
        ),
        pytest.param(with_csr(flipped_signature()), "signature", id="CSR signature bit flipped"),
        pytest.param(with_csr(swapped_key_csr()), "signature", id="CSR signed by another key"),
        pytest.param(with_spki(b"\x30\x03\x02\x01"), "SubjectPublicKeyInfo", id="truncated SPKI"),
        pytest.param(with_spki(valid_p256_csr()), "SubjectPublicKeyInfo", id="CSR given as SPKI"),
    ],
)
def test_unusable_bytes_are_an_invalid_request(
    request_: PodCertificateRequest, fragment: str
) -> None:
    with pytest.raises(requested.CSRError) as caught:
        requested.parse_public_key(request_)
    assert caught.value.reason == model.INVALID_REQUEST
    assert fragment in caught.value.message


@pytest.mark.parametrize(
    ("request_", "described"),
    [
        pytest.param(
            with_csr(csr_der(rsa.generate_private_key(65537, 2048), hashes.SHA256())),
            "RSA 2048-bit",
            id="RSA-2048 stub CSR",
        ),
        pytest.param(
            with_csr(csr_der(ec.generate_private_key(ec.SECP224R1()), hashes.SHA256())),
            "secp224r1",
            id="P-224 stub CSR",
        ),
        pytest.param(
            with_csr(csr_der(ec.generate_private_key(ec.SECP256K1()), hashes.SHA256())),
            "secp256k1",
            id="secp256k1 stub CSR",
        ),
        pytest.param(
            with_csr(csr_der(dsa.generate_private_key(2048), hashes.SHA256())),
            "DSA",
            id="DSA stub CSR",
        ),
        pytest.param(
            with_csr(csr_der(ed448.Ed448PrivateKey.generate())), "Ed448", id="Ed448 stub CSR"
        ),
        pytest.param(
            with_spki(spki(x25519.X25519PrivateKey.generate().public_key())),
            "X25519",
            id="X25519 PKIX key",
        ),
    ],
)
def test_keys_outside_the_api_list_are_unsupported(
    request_: PodCertificateRequest, described: str
) -> None:
    with pytest.raises(requested.CSRError) as caught:
        requested.parse_public_key(request_)
    assert caught.value.reason == model.UNSUPPORTED_KEY_TYPE
    assert described in caught.value.message
    # The message tells the user what would work.
    assert all(key_type in caught.value.message for key_type in requested.KEY_TYPES)


def test_error_carries_reason_and_message_as_a_normal_exception() -> None:
    error = requested.CSRError(model.INVALID_REQUEST, "bad bytes")
    assert (error.reason, error.message, str(error)) == (
        model.INVALID_REQUEST,
        "bad bytes",
        "bad bytes",
    )


# --- the annotations ------------------------------------------------------------------------------

NAME = "example.com/podcert"
CLOSED = policy.default_policy([NAME], "cluster.local").for_signer(NAME)
OPEN = dataclasses.replace(CLOSED, dns=dataclasses.replace(CLOSED.dns, allow_requested=True))
KEY = requested.DNS_NAMES_ANNOTATION


def test_no_annotations_request_nothing() -> None:
    assert requested.parse_annotations({}, CLOSED) == requested.RequestedNames(())


def test_requested_names_are_trimmed_and_deduplicated_in_order() -> None:
    parsed = requested.parse_annotations({KEY: " b.web.svc,\n  a.web.svc ,b.web.svc\n"}, OPEN)
    assert parsed == requested.RequestedNames(("b.web.svc", "a.web.svc"))


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
            {"z.example/a": "", "a.example/b": "", KEY: "x.svc"},
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
        pytest.param({KEY: ""}, model.INVALID_ANNOTATION, "empty entry", id="empty value"),
        pytest.param(
            {KEY: "a.svc,,b.svc"}, model.INVALID_ANNOTATION, "empty entry", id="double comma"
        ),
        pytest.param({KEY: "a.svc,"}, model.INVALID_ANNOTATION, "empty entry", id="trailing comma"),
        pytest.param(
            {KEY: "*.web.svc"}, model.INVALID_ANNOTATION, "'*.web.svc'", id="wildcard name"
        ),
        pytest.param({KEY: "Web.svc"}, model.INVALID_ANNOTATION, "'Web.svc'", id="uppercase name"),
        pytest.param(
            {KEY: "a" * 64 + ".svc"}, model.INVALID_ANNOTATION, "not a valid DNS", id="long label"
        ),
        pytest.param(
            {KEY: "a.svc."}, model.INVALID_ANNOTATION, "not a valid DNS", id="trailing dot"
        ),
        pytest.param(
            {KEY: "ok.svc,evil\n.svc"},
            model.INVALID_ANNOTATION,
            r"'evil\n.svc'",
            id="newline escaped",
        ),
        pytest.param(
            {KEY: ",".join(f"n{i}.svc" for i in range(101))},
            model.INVALID_ANNOTATION,
            "lists 101 names; at most 100",
            id="more than 100 names",
        ),
    ],
)
def test_bad_annotations_are_denied_with_the_offending_value(
    annotations: dict[str, str], reason: str, fragment: str
) -> None:
    denial = requested.parse_annotations(annotations, OPEN)
    assert isinstance(denial, model.Deny)
    assert denial.reason == reason
    assert fragment in denial.message
    assert len(denial.message) < 500


def test_requested_names_are_denied_when_policy_does_not_allow_requests() -> None:
    denial = requested.parse_annotations({KEY: "a.web.svc"}, CLOSED)
    assert isinstance(denial, model.Deny)
    assert denial.reason == model.DNS_NAME_NOT_ALLOWED
    assert "allowRequested" in denial.message


def test_exactly_100_names_are_fine() -> None:
    names = [f"n{i}.svc" for i in range(100)]
    assert requested.parse_annotations({KEY: ",".join(names)}, OPEN) == requested.RequestedNames(
        tuple(names)
    )
