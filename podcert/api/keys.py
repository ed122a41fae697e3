"""The Pod Certificates API's key types, in one table: what each name means, how a node makes
such a key, what its stub PKCS#10 request is signed with, and how its proof of possession (the
v1beta1 form: `pkixPublicKey` + `proofOfPossession`) is signed and checked; and, for a signer,
the subject key read back out of either form (`read_csr_key`, `read_proven_key`).

Both halves of a node's proof live here, so the node and the signer cannot disagree on it. The
bytes a signer reads are its requester's (anyone with `create` on podcertificaterequests): every
failure is one typed `UnusableKey` naming what is wrong, never a parser's exception, and never
quoting key material.

`KeyType` lists the API's names and `_spec` gives each its row; `assert_never` makes mypy refuse
a name without a row, and the Literal refuses a row without a name. A new key type is one line in
`KeyType` and one `case` here. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, assert_never, get_args

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

KeyType = Literal["RSA3072", "RSA4096", "ECDSAP256", "ECDSAP384", "ECDSAP521", "ED25519"]
# In the API's order.
KEY_TYPES: Final[tuple[KeyType, ...]] = get_args(KeyType)

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey

Algorithm = Literal["RSA", "ECDSA", "Ed25519"]


@dataclass(frozen=True)
class KeySpec:
    algorithm: Algorithm
    bits: int  # RSA modulus size, or the curve's size
    curve: str | None  # the curve's name as cryptography reports it (ECDSA only)
    # What the key signs its stub CSR with: the digest matched to its strength; None for
    # Ed25519, which hashes internally.
    digest: type[hashes.SHA256 | hashes.SHA384 | hashes.SHA512] | None
    # The order in which a signer suggests a key type it accepts (1 first).
    preference: int


def _spec(key_type: KeyType) -> KeySpec:
    match key_type:
        case "ECDSAP256":
            return KeySpec("ECDSA", 256, "secp256r1", hashes.SHA256, 1)
        case "ED25519":
            return KeySpec("Ed25519", 256, None, None, 2)
        case "ECDSAP384":
            return KeySpec("ECDSA", 384, "secp384r1", hashes.SHA384, 3)
        case "ECDSAP521":
            return KeySpec("ECDSA", 521, "secp521r1", hashes.SHA512, 4)
        case "RSA3072":
            return KeySpec("RSA", 3072, None, hashes.SHA256, 5)
        case "RSA4096":
            return KeySpec("RSA", 4096, None, hashes.SHA256, 6)
        case _:
            assert_never(key_type)


KEY_SPECS: Final[Mapping[KeyType, KeySpec]] = {key_type: _spec(key_type) for key_type in KEY_TYPES}
# Best first: what a signer suggests when it refuses a request's key type.
BY_PREFERENCE: Final[tuple[KeyType, ...]] = tuple(
    sorted(KEY_TYPES, key=lambda key_type: KEY_SPECS[key_type].preference)
)
_CURVES: Final[Mapping[str, ec.EllipticCurve]] = {
    "secp256r1": ec.SECP256R1(),
    "secp384r1": ec.SECP384R1(),
    "secp521r1": ec.SECP521R1(),
}


def generate(key_type: KeyType) -> PrivateKey:
    """A new private key of `key_type` (ValueError for a name the API does not define)."""
    spec = KEY_SPECS.get(key_type)
    if spec is None:
        raise ValueError(
            f"keyType: unsupported key type {key_type!r}; one of {', '.join(KEY_TYPES)}"
        )
    if spec.algorithm == "RSA":
        return rsa.generate_private_key(public_exponent=65537, key_size=spec.bits)
    if spec.algorithm == "ECDSA":
        assert spec.curve is not None
        return ec.generate_private_key(_CURVES[spec.curve])
    return ed25519.Ed25519PrivateKey.generate()


def key_type_of(public_key: object) -> KeyType | None:
    """The API's name for `public_key`'s type, or None when the API does not define it."""
    if isinstance(public_key, rsa.RSAPublicKey):
        algorithm: Algorithm = "RSA"
        bits, curve = public_key.key_size, None
    elif isinstance(public_key, ec.EllipticCurvePublicKey):
        algorithm, bits, curve = "ECDSA", public_key.curve.key_size, public_key.curve.name
    elif isinstance(public_key, ed25519.Ed25519PublicKey):
        algorithm, bits, curve = "Ed25519", 256, None
    else:
        return None
    for key_type, spec in KEY_SPECS.items():
        if (spec.algorithm, spec.bits, spec.curve) == (algorithm, bits, curve):
            return key_type
    return None


def stub_csr(key: PrivateKey) -> bytes:
    """DER of an empty-subject PKCS#10 request signed by `key`: what the node sends as
    stubPKCS10Request to prove it holds the key. A key of no API type (tests make them, for a
    signer to refuse) signs with SHA-256."""
    key_type = key_type_of(key.public_key())
    if key_type is not None:
        digest = KEY_SPECS[key_type].digest
    elif isinstance(key, ed25519.Ed25519PrivateKey):
        digest = None
    else:
        digest = hashes.SHA256
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .sign(key, digest() if digest is not None else None)
    )
    return csr.public_bytes(serialization.Encoding.DER)


def spki_der(public_key: PublicKeyTypes) -> bytes:
    """SubjectPublicKeyInfo DER: how the API server compares an issued leaf's key with the
    requested one, and how we do."""
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def public_der(key: PrivateKey) -> bytes:
    """`spki_der` of a private key's public half."""
    return spki_der(key.public_key())


# --- proof of possession (v1beta1: 1.35 only takes this form; 1.36 takes it or the stub CSR) ----
#
# The API server checks it at creation (pkg/apis/certificates/validation, v1.35 and v1.36) and
# the 1.35 kubelet makes it (pkg/kubelet/podcertificate, generateKeyAndProof): a signature over
# the pod UID's bytes. ECDSA signs their SHA-256 whatever the curve (ASN.1 DER); RSA signs it
# with PSS (MGF1 with SHA-256) and the longest salt (Go's rsa.SignPSS with nil options), and the
# check accepts any salt length (rsa.VerifyPSS with nil options); Ed25519 signs the bytes.
PROOF_DIGEST: Final = hashes.SHA256


def sign_proof(key: PrivateKey, pod_uid: str) -> bytes:
    """`proofOfPossession` for `key` in a request for the pod with UID `pod_uid`."""
    message = pod_uid.encode()
    if isinstance(key, rsa.RSAPrivateKey):
        pss = padding.PSS(mgf=padding.MGF1(PROOF_DIGEST()), salt_length=padding.PSS.MAX_LENGTH)
        return key.sign(message, pss, PROOF_DIGEST())
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.sign(message, ec.ECDSA(PROOF_DIGEST()))
    return key.sign(message)


def proof_verifies(public_key: PublicKeyTypes, pod_uid: str, proof: bytes) -> bool:
    """Whether `proof` is `public_key`'s proof of possession for the pod with UID `pod_uid`.
    False for a wrong UID, another key, a key of no type that has a proof, or bytes that are no
    signature at all; never raises."""
    message = pod_uid.encode()
    try:
        if isinstance(public_key, rsa.RSAPublicKey):
            pss = padding.PSS(mgf=padding.MGF1(PROOF_DIGEST()), salt_length=padding.PSS.AUTO)
            public_key.verify(proof, message, pss, PROOF_DIGEST())
        elif isinstance(public_key, ec.EllipticCurvePublicKey):
            public_key.verify(proof, message, ec.ECDSA(PROOF_DIGEST()))
        elif isinstance(public_key, ed25519.Ed25519PublicKey):
            public_key.verify(proof, message)
        else:
            return False
    except (InvalidSignature, ValueError):
        return False
    return True


# --- the subject key, read back by a signer ------------------------------------------------------

KeyFault = Literal["malformed", "unsupported", "unproven"]
"""Why a requested key is unusable: its bytes do not parse (or its CSR's signature does not
verify), its type is none the API defines, or its proof of possession does not verify."""


class UnusableKey(Exception):
    """The key a request carries cannot be used; `fault` says how, `message` for a person."""

    def __init__(self, fault: KeyFault, message: str) -> None:
        super().__init__(message)
        self.fault = fault
        self.message = message


@dataclass(frozen=True)
class RequestedKey:
    public_key: PublicKey
    key_type: KeyType


def read_csr_key(der: bytes) -> RequestedKey:
    """The subject key of a stub PKCS#10 request, whose signature must verify with it.

    The API server verified that signature at admission; checking again costs little and keeps
    a signer safe if it ever reads objects that bypassed admission. Raises UnusableKey, and
    nothing else, whatever the bytes are."""
    # cryptography reports bad input as ValueError, UnsupportedAlgorithm, or (from its Rust
    # core) other exception types; any of them means the same thing here: unusable bytes.
    try:
        csr = x509.load_der_x509_csr(der)
        public_key = csr.public_key()
    except Exception as exc:
        raise UnusableKey(
            "malformed",
            f"spec.stubPKCS10Request is not a valid DER certificate request ({_why(exc)}).",
        ) from exc
    requested = _classify(public_key, "stub PKCS#10 request")
    try:
        valid = csr.is_signature_valid
    except Exception as exc:
        raise UnusableKey(
            "malformed", f"The stub PKCS#10 request's signature cannot be checked ({_why(exc)})."
        ) from exc
    if not valid:
        raise UnusableKey(
            "malformed",
            "The stub PKCS#10 request's signature does not verify with the key it carries; "
            "it must be signed by the subject key.",
        )
    return requested


def read_proven_key(pkix_public_key: bytes, proof: bytes, pod_uid: str) -> RequestedKey:
    """The key in DER SubjectPublicKeyInfo whose `proof` of possession verifies over `pod_uid`.
    Raises UnusableKey, and nothing else, whatever the bytes are."""
    try:
        public_key = serialization.load_der_public_key(pkix_public_key)
    except Exception as exc:
        raise UnusableKey(
            "malformed",
            f"spec.pkixPublicKey is not a valid DER SubjectPublicKeyInfo ({_why(exc)}).",
        ) from exc
    requested = _classify(public_key, "PKIX public key")
    if not proof_verifies(requested.public_key, pod_uid, proof):
        raise UnusableKey(
            "unproven",
            "spec.proofOfPossession does not verify: it must be the signature of the key in "
            "spec.pkixPublicKey over spec.podUID (ECDSA: ASN.1 over its SHA-256; RSA: PSS with "
            "SHA-256; Ed25519: over the UID itself).",
        )
    return requested


def _classify(public_key: object, where: str) -> RequestedKey:
    if isinstance(public_key, PublicKey):
        key_type = key_type_of(public_key)
        if key_type is not None:
            return RequestedKey(public_key=public_key, key_type=key_type)
    raise UnusableKey(
        "unsupported",
        f"The {where} holds {_describe(public_key)}, which this signer does not support; "
        f"supported key types are {', '.join(KEY_TYPES)}.",
    )


def _describe(public_key: object) -> str:
    """A short human name for a key, for messages (never the key material)."""
    if isinstance(public_key, rsa.RSAPublicKey):
        return f"an RSA {public_key.key_size}-bit key"
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        return f"an ECDSA key on curve {public_key.curve.name}"
    name = type(public_key).__name__.removeprefix("_").removesuffix("PublicKey")
    return f"a {name} key"


def _why(exc: Exception) -> str:
    # Parser messages are short and describe the DER structure, not key material; still cap
    # them so a message never grows with the input.
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."
