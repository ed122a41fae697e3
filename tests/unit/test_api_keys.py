"""podcert.api.keys: the subject key read back out of a request (its stub CSR, or its key with
a proof of possession), as the signer reads it (`signer.issue.decide.parse_public_key`): every key
type the API defines, or a typed CSRError carrying the Denied reason, whatever the bytes."""

from __future__ import annotations

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, rsa, x25519

from podcert.api import keys
from podcert.api.requests import PodCertificateRequest
from signer import model
from signer.issue import decide
from tests.signer_world import changed, make_request

KEYS = {key_type: keys.generate(key_type) for key_type in keys.KEY_TYPES}
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


@pytest.mark.parametrize("key_type", keys.KEY_TYPES)
def test_parses_every_api_key_type_from_the_stub_csr(key_type: keys.KeyType) -> None:
    key = KEYS[key_type]
    parsed = decide.parse_public_key(with_csr(keys.stub_csr(key)))
    assert parsed.key_type == key_type
    assert spki(parsed.public_key) == keys.public_der(key)


@pytest.mark.parametrize("key_type", keys.KEY_TYPES)
def test_parses_every_api_key_type_from_a_v1beta1_pkix_key(key_type: keys.KeyType) -> None:
    key = KEYS[key_type]
    proof = keys.sign_proof(key, BASE.spec.pod_uid)
    parsed = decide.parse_public_key(with_spki(keys.public_der(key), proof))
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
    with pytest.raises(decide.CSRError) as caught:
        decide.parse_public_key(request)
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
    with pytest.raises(decide.CSRError) as caught:
        decide.parse_public_key(request_)
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
    with pytest.raises(decide.CSRError) as caught:
        decide.parse_public_key(request_)
    assert caught.value.reason == model.UNSUPPORTED_KEY_TYPE
    assert described in caught.value.message
    # The message tells the user what would work.
    assert all(key_type in caught.value.message for key_type in keys.KEY_TYPES)


def test_error_carries_reason_and_message_as_a_normal_exception() -> None:
    error = decide.CSRError(model.INVALID_REQUEST, "bad bytes")
    assert (error.reason, error.message, str(error)) == (
        model.INVALID_REQUEST,
        "bad bytes",
        "bad bytes",
    )
