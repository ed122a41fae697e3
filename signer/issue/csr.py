"""The subject public key of a PodCertificateRequest, taken out of hostile bytes safely.

The node sends its key as a stub PKCS#10 request (v1; v1beta1 from 1.36) or as a bare DER
SubjectPublicKeyInfo with a proof of possession, its signature over the pod UID (v1beta1; the
only form on 1.35). Anyone with `create` on podcertificaterequests controls these bytes, so this
module turns every failure of the parser into one typed `CSRError` carrying the Denied reason;
the decision turns that into a Deny. The API server checked the CSR's signature or the proof at
creation; both are checked again here, so nothing that bypassed admission gets a certificate for
a key its requester does not hold. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes

from podcert.api.keys import KEY_TYPES, KeyType, key_type_of, proof_verifies
from podcert.api.requests import PodCertificateRequest, ProvenKey, RequestError, subject_key
from signer import model

_SUPPORTED: Final = ", ".join(KEY_TYPES)


class CSRError(Exception):
    """The request's key cannot be used; `reason` is the Denied reason to report."""

    def __init__(self, reason: model.DenyReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class ParsedKey:
    public_key: CertificatePublicKeyTypes
    key_type: KeyType


def parse_public_key(request: PodCertificateRequest) -> ParsedKey:
    """The subject key of `request`, from its stub CSR or from its PKIX public key whose proof
    of possession verifies over the request's pod UID.

    Raises CSRError, and nothing else, whatever the bytes are.
    """
    try:
        form = subject_key(
            request.spec.stub_pkcs10_request or b"",
            request.spec.pkix_public_key or b"",
            request.spec.proof_of_possession or b"",
        )
    except RequestError as err:
        raise CSRError(model.INVALID_REQUEST, f"{err.field} {err.problem}.") from None
    if not isinstance(form, ProvenKey):
        return _from_csr(form.der)
    parsed = _from_spki(form.pkix_public_key)
    if not proof_verifies(parsed.public_key, request.spec.pod_uid, form.proof_of_possession):
        raise CSRError(
            model.INVALID_PROOF_OF_POSSESSION,
            "spec.proofOfPossession does not verify: it must be the signature of the key in "
            "spec.pkixPublicKey over spec.podUID (ECDSA: ASN.1 over its SHA-256; RSA: PSS with "
            "SHA-256; Ed25519: over the UID itself).",
        )
    return parsed


def _from_csr(der: bytes) -> ParsedKey:
    # cryptography reports bad input as ValueError, UnsupportedAlgorithm, or (from its Rust
    # core) other exception types; any of them means the same thing here: unusable bytes.
    try:
        csr = x509.load_der_x509_csr(der)
        public_key = csr.public_key()
    except Exception as exc:
        raise CSRError(
            model.INVALID_REQUEST,
            f"spec.stubPKCS10Request is not a valid DER certificate request ({_why(exc)}).",
        ) from exc
    parsed = _classify(public_key, "stub PKCS#10 request")
    # The API server verified this signature at admission; checking again costs little and
    # keeps the signer safe if it ever reads objects that bypassed admission.
    try:
        valid = csr.is_signature_valid
    except Exception as exc:
        raise CSRError(
            model.INVALID_REQUEST,
            f"The stub PKCS#10 request's signature cannot be checked ({_why(exc)}).",
        ) from exc
    if not valid:
        raise CSRError(
            model.INVALID_REQUEST,
            "The stub PKCS#10 request's signature does not verify with the key it carries; "
            "it must be signed by the subject key.",
        )
    return parsed


def _from_spki(der: bytes) -> ParsedKey:
    try:
        public_key = serialization.load_der_public_key(der)
    except Exception as exc:
        raise CSRError(
            model.INVALID_REQUEST,
            f"spec.pkixPublicKey is not a valid DER SubjectPublicKeyInfo ({_why(exc)}).",
        ) from exc
    return _classify(public_key, "PKIX public key")


def _classify(public_key: object, where: str) -> ParsedKey:
    if isinstance(
        public_key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey
    ):
        key_type = key_type_of(public_key)
        if key_type is not None:
            return ParsedKey(public_key=public_key, key_type=key_type)
    raise CSRError(
        model.UNSUPPORTED_KEY_TYPE,
        f"The {where} holds {_describe(public_key)}, which this signer does not support; "
        f"supported key types are {_SUPPORTED}.",
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
