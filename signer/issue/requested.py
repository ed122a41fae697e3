"""What a request asks for: the key it carries and the names its annotations ask for, each
read out of bytes and strings its requester controls, into a typed value or a Deny reason.

The key. The node sends it as a stub PKCS#10 request (v1; v1beta1 from 1.36) or as a bare DER
SubjectPublicKeyInfo with a proof of possession, its signature over the pod UID (v1beta1; the
only form on 1.35). Anyone with `create` on podcertificaterequests controls these bytes, so every
failure of the parser becomes one typed `CSRError` carrying the Denied reason; the decision turns
that into a Deny. The API server checked the CSR's signature or the proof at creation; both are
checked again here, so nothing that bypassed admission gets a certificate for a key its requester
does not hold.

The annotations. Only `podcert.dev/dns-names`, a comma-separated list of DNS names; whether the
pod is entitled to them is decided against the Services that select it (`signer.issue.decide`),
and whether they are honoured at all is policy (`dnsNames.allowRequested`). Unknown keys are
denied rather than ignored: a key we do not understand may be a request the user believes is
honoured.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes

from podcert.api.keys import KEY_TYPES, KeyType, key_type_of, proof_verifies
from podcert.api.requests import PodCertificateRequest, ProvenKey, RequestError, subject_key
from podcert.api.validation import is_dns_name
from podcert.errors import show
from signer import model
from signer.policy import SignerPolicy

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


# --- the annotations ---------------------------------------------------------------------------

DNS_NAMES_ANNOTATION: Final = "podcert.dev/dns-names"
KNOWN_ANNOTATIONS: Final = frozenset({DNS_NAMES_ANNOTATION})
MAX_REQUESTED_DNS_NAMES: Final = 100


@dataclass(frozen=True)
class RequestedNames:
    """What the request's annotations ask for: syntax checked, entitlement not yet."""

    dns_names: tuple[str, ...] = ()


def parse_annotations(
    annotations: Mapping[str, str], policy: SignerPolicy
) -> RequestedNames | model.Deny:
    """The names a request's unverifiedUserAnnotations ask for, or the Deny they deserve.

    Unknown keys are denied rather than ignored: a key we do not understand may be a request
    the user believes is honoured.
    """
    unknown = sorted(key for key in annotations if key not in KNOWN_ANNOTATIONS)
    if unknown:
        others = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        return model.Deny(
            model.UNKNOWN_ANNOTATION,
            f"Annotation {show(unknown[0])}{others} is not understood by signer {policy.name}; "
            f"the only supported annotation is {DNS_NAMES_ANNOTATION}.",
        )
    value = annotations.get(DNS_NAMES_ANNOTATION)
    if value is None:
        return RequestedNames()
    entries = [entry.strip() for entry in value.split(",")]
    if len(entries) > MAX_REQUESTED_DNS_NAMES:
        return model.Deny(
            model.INVALID_ANNOTATION,
            f"Annotation {DNS_NAMES_ANNOTATION} lists {len(entries)} names; "
            f"at most {MAX_REQUESTED_DNS_NAMES} are allowed.",
        )
    if "" in entries:
        return model.Deny(
            model.INVALID_ANNOTATION,
            f"Annotation {DNS_NAMES_ANNOTATION} has an empty entry in {show(value)}; "
            "give a comma-separated list of DNS names.",
        )
    for entry in entries:
        if not is_dns_name(entry):
            return model.Deny(
                model.INVALID_ANNOTATION,
                f"Annotation {DNS_NAMES_ANNOTATION} holds {show(entry)}, which is not a valid "
                "DNS name (lowercase RFC 1123 labels joined by dots, no wildcards).",
            )
    if not policy.dns.allow_requested:
        return model.Deny(
            model.DNS_NAME_NOT_ALLOWED,
            f"Signer {policy.name} does not issue requested DNS names; remove the "
            f"{DNS_NAMES_ANNOTATION} annotation or ask for dnsNames.allowRequested in its policy.",
        )
    return RequestedNames(dns_names=tuple(dict.fromkeys(entries)))  # de-duplicated, in order
