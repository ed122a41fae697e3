"""Leaf certificates: the validity window, the refresh point, and the signing itself.

Everything the leaf says is fixed beforehand in a `model.LeafPlan` by the decision; this module
only turns a plan into DER and PEM, so what is issued can be reviewed by reading `decide`. Times
are arguments and randomness is injectable: no clock reads here.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import random
import secrets
from dataclasses import dataclass
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificateIssuerPrivateKeyTypes,
    CertificateIssuerPublicKeyTypes,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, ExtensionOID

from podcert.api.validation import REFRESH_MARGIN
from podcert.auditlog import AUDIT_SIGNING_EKU, AUDIT_SPIFFE_PATH
from signer import model

# A leaf's timing when the signer is told nothing else: the one place these defaults are
# written. `controller.Settings`, `decide` and the audit trail default to them, and so do
# `podcert signer`'s --backdate-seconds and --refresh-fraction, which read them from there.
DEFAULT_LEAF_BACKDATE: Final = dt.timedelta(seconds=60)
"""How far a leaf's notBefore lies before the moment it is signed: room for the clocks of the
signer, the API server and peers to disagree, well inside the 5 minutes the API server allows
(`podcert.api.validation.NOT_BEFORE_SKEW`)."""
DEFAULT_REFRESH_FRACTION: Final = 0.5
"""beginRefreshAt at this share of a leaf's lifetime, before jitter (`begin_refresh_at`)."""


def sign_leaf(plan: model.LeafPlan, ca: model.IssuingCA, serial: int) -> str:
    """The PEM chain for `plan` signed by `ca`: the leaf, then the intermediate.

    The root is never included (clients get it from the trust bundle), so when the issuing CA
    is itself the root the chain is the leaf alone.
    """
    _check_plan(plan, ca)
    _check_serial(serial)
    return _sign(plan, ca, serial, _TLS_USAGES)


def sign_audit_certificate(
    key: ec.EllipticCurvePublicKey,
    trust_domain: str,
    ca: model.IssuingCA,
    not_before: dt.datetime,
    not_after: dt.datetime,
    serial: int,
) -> str:
    """The PEM chain of the signer's own audit-log key: the one kind of certificate whose
    checkpoints `podcert audit` accepts. Its only EKU is AUDIT_SIGNING_EKU and its only name
    spiffe://<trust domain>/podcert/audit; `sign_leaf` can make neither, so no pod ever holds one.
    """
    plan = model.LeafPlan(
        public_key=key,
        spiffe_id=f"spiffe://{trust_domain}{AUDIT_SPIFFE_PATH}",
        dns_names=(),
        not_before=truncate_to_second(not_before),
        not_after=truncate_to_second(min(not_after, ca.not_after)),
        begin_refresh_at=truncate_to_second(min(not_after, ca.not_after)),
    )
    _check_serial(serial)
    return _sign(plan, ca, serial, _extended_key_usage([AUDIT_SIGNING_EKU]))


def _sign(
    plan: model.LeafPlan,
    ca: model.IssuingCA,
    serial: int,
    usages: x509.Extension[x509.ExtendedKeyUsage],
) -> str:
    issuer = ca.certificate
    fixed = _issuer_parts(issuer, ca.root, ca.upstream)
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(plan.spiffe_id)]
    sans += [x509.DNSName(name) for name in plan.dns_names]
    # One builder made whole, not step by step: each of its setters copies the builder and
    # checks its argument again, about a third of a leaf's cost. What they checked
    # is checked here once: the plan (`_check_plan`), the serial, the fixed parts per CA.
    leaf = x509.CertificateBuilder(
        issuer_name=issuer.subject,
        # Identity lives in the SAN alone; an empty subject makes that unambiguous.
        subject_name=_EMPTY_NAME,
        public_key=plan.public_key,
        serial_number=serial,
        not_valid_before=_naive_utc(plan.not_before),
        not_valid_after=_naive_utc(plan.not_after),
        extensions=[
            # The SPIFFE ID and DNS names; critical because the subject is empty (RFC 5280
            # 4.2.1.6).
            x509.Extension(_SAN, True, x509.SubjectAlternativeName(sans)),
            # An end entity: it may not sign other certificates.
            _END_ENTITY,
            # Signatures only; RSA keys may also be used for RSA key exchange.
            _RSA_KEY_USAGE if isinstance(plan.public_key, rsa.RSAPublicKey) else _KEY_USAGE,
            # What the key is for: TLS (workloads) or audit checkpoints (the signer), never both.
            usages,
            # Names the leaf's key, so tools can match certificate and key files.
            x509.Extension(_SKI, False, x509.SubjectKeyIdentifier.from_public_key(plan.public_key)),
            # Lets path builders find the issuer quickly, even across CA rotations.
            fixed.authority_key_identifier,
        ],
    ).sign(ca.key, signature_hash(ca.key))
    return leaf.public_bytes(serialization.Encoding.PEM).decode("ascii") + fixed.chain_tail


def signature_hash(
    key: CertificateIssuerPrivateKeyTypes,
) -> hashes.SHA256 | hashes.SHA384 | hashes.SHA512 | None:
    """The digest to sign with for an issuer key: matched to the key's strength."""
    if isinstance(key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey):
        return None  # EdDSA hashes internally
    if isinstance(key, ec.EllipticCurvePrivateKey):
        if key.curve.key_size >= 521:
            return hashes.SHA512()
        if key.curve.key_size >= 384:
            return hashes.SHA384()
    return hashes.SHA256()


def random_serial(rng: random.Random | None = None) -> int:
    """A positive 128-bit serial number; from `secrets` unless an RNG is injected (tests)."""
    while True:
        serial = rng.getrandbits(128) if rng is not None else secrets.randbits(128)
        if serial > 0:
            return serial


def truncate_to_second(moment: dt.datetime) -> dt.datetime:
    """`moment` without its microseconds: certificate times are whole seconds."""
    return moment.replace(microsecond=0)


def lifetime_window(
    now: dt.datetime,
    *,
    backdate: dt.timedelta,
    max_lifetime: dt.timedelta,
    issuer_not_after: dt.datetime,
) -> tuple[dt.datetime, dt.datetime]:
    """(notBefore, notAfter) for a leaf issued at `now`, in whole seconds.

    notBefore is backdated to absorb clock skew between the signer, the API server and peers;
    notAfter is the earlier of notBefore + `max_lifetime` and the issuer's own expiry, since a
    leaf must never outlive the CA that vouches for it. The result may be shorter than the API
    minimum of 1 h (or even empty) when the issuer is about to expire; callers check.
    """
    not_before = truncate_to_second(now - backdate)
    not_after = truncate_to_second(min(not_before + max_lifetime, issuer_not_after))
    return not_before, max(not_after, not_before)


def begin_refresh_at(
    request_uid: str,
    not_before: dt.datetime,
    not_after: dt.datetime,
    fraction: float = DEFAULT_REFRESH_FRACTION,
    jitter_fraction: float = 0.1,
) -> dt.datetime:
    """When the node should start replacing this leaf.

    At `fraction` of the lifetime, moved by up to +/- `jitter_fraction` of the lifetime so pods
    started together do not all refresh together. The jitter comes from sha256(request_uid), so
    the same request always gets the same answer (replicas and retries agree). Clamped into the
    window the API server accepts, [notBefore + 10 min, notAfter - 10 min], in whole seconds.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be within [0, 1], got {fraction}")
    if not 0.0 <= jitter_fraction <= 1.0:
        raise ValueError(f"jitter_fraction must be within [0, 1], got {jitter_fraction}")
    # Whole seconds inside the margins: round the lower bound up and the upper bound down.
    earliest = _ceil_to_second(not_before + REFRESH_MARGIN)
    latest = truncate_to_second(not_after - REFRESH_MARGIN)
    if earliest > latest:
        raise ValueError(
            f"lifetime {not_after - not_before} is too short for a refresh point "
            f"{REFRESH_MARGIN} inside each end"
        )
    # UIDs come from API objects; surrogatepass keeps a hostile, unencodable one hashable.
    digest = hashlib.sha256(request_uid.encode("utf-8", "surrogatepass")).digest()
    unit = int.from_bytes(digest[:8], "big") / 2**64  # uniform in [0, 1)
    jitter = (2.0 * unit - 1.0) * jitter_fraction  # uniform in [-jitter, +jitter)
    lifetime = not_after - not_before
    target = truncate_to_second(not_before + lifetime * (fraction + jitter))
    return min(max(target, earliest), latest)


def _ceil_to_second(moment: dt.datetime) -> dt.datetime:
    whole = truncate_to_second(moment)
    return whole if whole == moment else whole + dt.timedelta(seconds=1)


# --- the parts of every leaf that do not change from one leaf to the next -------------------------

_EMPTY_NAME: Final = x509.Name([])
_SAN: Final = ExtensionOID.SUBJECT_ALTERNATIVE_NAME
_SKI: Final = ExtensionOID.SUBJECT_KEY_IDENTIFIER
_END_ENTITY: Final = x509.Extension(
    ExtensionOID.BASIC_CONSTRAINTS, True, x509.BasicConstraints(ca=False, path_length=None)
)


def _key_usage(*, key_encipherment: bool) -> x509.Extension[x509.KeyUsage]:
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )
    return x509.Extension(ExtensionOID.KEY_USAGE, True, usage)


_KEY_USAGE: Final = _key_usage(key_encipherment=False)
_RSA_KEY_USAGE: Final = _key_usage(key_encipherment=True)


def _extended_key_usage(
    usages: list[x509.ObjectIdentifier],
) -> x509.Extension[x509.ExtendedKeyUsage]:
    return x509.Extension(ExtensionOID.EXTENDED_KEY_USAGE, False, x509.ExtendedKeyUsage(usages))


# Workloads are both clients and servers in mutual TLS.
_TLS_USAGES: Final = _extended_key_usage(
    [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]
)


@dataclass(frozen=True)
class _IssuerParts:
    """What every leaf of one issuing CA carries of it."""

    authority_key_identifier: x509.Extension[x509.AuthorityKeyIdentifier]
    # What follows the leaf in the chain: the intermediate and an upstream's intermediates, or
    # nothing when the issuer is the root itself (clients get roots from the trust bundle).
    chain_tail: str


# The issuer's parts of every leaf are the same until the CA changes: worked out once per CA.
@functools.lru_cache(maxsize=16)
def _issuer_parts(
    issuer: x509.Certificate,
    root: x509.Certificate,
    upstream: tuple[x509.Certificate, ...] = (),
) -> _IssuerParts:
    tail = (
        ""
        if _same_certificate(issuer, root)
        else "".join(
            c.public_bytes(serialization.Encoding.PEM).decode("ascii") for c in (issuer, *upstream)
        )
    )
    return _IssuerParts(
        x509.Extension(
            ExtensionOID.AUTHORITY_KEY_IDENTIFIER, False, _authority_key_identifier(issuer)
        ),
        tail,
    )


def _authority_key_identifier(issuer: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    # Copy the issuer's own SKI when it has one, so the two always match byte for byte.
    try:
        ski = issuer.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(_issuer_public_key(issuer))
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def _naive_utc(moment: dt.datetime) -> dt.datetime:
    """A certificate time as the builder's setters hand it on: UTC, without a zone."""
    return moment.astimezone(dt.UTC).replace(tzinfo=None)


def _issuer_public_key(issuer: x509.Certificate) -> CertificateIssuerPublicKeyTypes:
    key = issuer.public_key()
    if isinstance(
        key,
        rsa.RSAPublicKey
        | ec.EllipticCurvePublicKey
        | ed25519.Ed25519PublicKey
        | ed448.Ed448PublicKey,
    ):
        return key
    raise ValueError(f"issuer key {type(key).__name__} cannot sign certificates")


def _same_certificate(a: x509.Certificate, b: x509.Certificate) -> bool:
    return a.public_bytes(serialization.Encoding.DER) == b.public_bytes(serialization.Encoding.DER)


def _check_serial(serial: int) -> None:
    """What `CertificateBuilder.serial_number` refuses: RFC 5280's positive, at most 20 octets."""
    if not isinstance(serial, int) or not 0 < serial < 1 << 159:
        raise ValueError(f"a serial number must be positive and below 2**159, got {serial!r}")


def _check_plan(plan: model.LeafPlan, ca: model.IssuingCA) -> None:
    """Refuse plans `decide` would never make: these are bugs, not hostile input."""
    for name, moment in (("not_before", plan.not_before), ("not_after", plan.not_after)):
        if moment.tzinfo is None:
            raise ValueError(f"plan.{name} must be timezone-aware, got {moment}")
        if moment.microsecond:
            raise ValueError(f"plan.{name} must be whole seconds, got {moment}")
    if plan.spiffe_id.split("://", 1)[-1].partition("/")[2] == AUDIT_SPIFFE_PATH.lstrip("/"):
        raise ValueError("a workload plan may not carry the audit log's own SPIFFE ID")
    if plan.not_after <= plan.not_before:
        raise ValueError(f"plan ends ({plan.not_after}) before it starts ({plan.not_before})")
    if plan.not_after > ca.not_after:
        raise ValueError(
            f"plan.not_after {plan.not_after} is past the issuing CA's expiry {ca.not_after}"
        )
