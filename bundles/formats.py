"""Credential and trust bundles: the bytes the kubelet (or our shim) writes, as typed values.

A consuming application re-reads these files on every rotation, possibly while they are being
replaced, so parsing is strict and total: whatever the bytes, the result is a valid value or a
`BundleError` subclass that names the defect. Private key material never appears in a repr or an
exception message. Pure: bytes in, values out; reading files and the clock live in
`bundles.source`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from cryptography import x509
from cryptography.exceptions import InternalError, InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed448

from bundles import pem
from bundles.spiffe import CertificateIdError, SpiffeId, spiffe_id_of
from podcert.api import keys

# A credential bundle is a key and a short chain; a trust bundle a few dozen CAs. Anything far
# larger is an accident or an attack, and is refused before any parsing work is done.
MAX_BUNDLE_BYTES: Final = 4 * 1024 * 1024

# The keys a credential may hold: the Pod Certificates API's key types, and Ed448, which TLS
# stacks sign with too.
PrivateKey = keys.PrivateKey | ed448.Ed448PrivateKey

_KEY_LABEL: Final = "PRIVATE KEY"  # PKCS#8 PrivateKeyInfo, unencrypted
_ENCRYPTED_KEY_LABEL: Final = "ENCRYPTED PRIVATE KEY"
_CERT_LABEL: Final = "CERTIFICATE"


class BundleError(ValueError):
    """Bundle bytes cannot be used. Subclasses name the defect; messages never hold key bytes."""


class TooLargeError(BundleError):
    pass


class MalformedPemError(BundleError):
    """Not PEM at all, a truncated block, or a body that is not base64."""


class UnexpectedBlockError(BundleError):
    """A PEM block of a type that does not belong in this file."""


class NoKeyError(BundleError):
    pass


class SeveralKeysError(BundleError):
    pass


class UnsupportedKeyError(BundleError):
    """A key block that is present but unusable: not PKCS#8, encrypted, or an unusable algorithm."""


class NotPkcs8Error(UnsupportedKeyError):
    pass


class EncryptedKeyError(UnsupportedKeyError):
    pass


class NoCertificateError(BundleError):
    pass


class MalformedCertificateError(BundleError):
    pass


class KeyMismatchError(BundleError):
    """The private key is not the one the leaf certificate certifies."""


class NotCaError(BundleError):
    """A trust bundle holds certificates that are not CAs (they are listed in the message)."""


class ChainError(BundleError):
    """The chain does not lead, with valid signatures and validity windows, to a trusted root."""


@dataclass(frozen=True)
class Credential:
    """A private key and its certificate chain, leaf first. The key never shows in repr()."""

    key: PrivateKey = field(repr=False, compare=False)
    chain: tuple[x509.Certificate, ...]

    def __post_init__(self) -> None:
        # Every Credential, however built, is a consistent pair.
        if not self.chain:
            raise NoCertificateError("credential has no certificate")
        _check_key_matches(self.key, self.chain[0])

    @property
    def leaf(self) -> x509.Certificate:
        return self.chain[0]

    @property
    def spiffe_id(self) -> SpiffeId:
        """The leaf's SPIFFE ID; raises `bundles.spiffe.CertificateIdError` if it has none."""
        return spiffe_id_of(self.leaf)

    @property
    def not_before(self) -> dt.datetime:
        return self.leaf.not_valid_before_utc

    @property
    def not_after(self) -> dt.datetime:
        return self.leaf.not_valid_after_utc


@dataclass(frozen=True)
class TrustBundle:
    """Trust anchors: distinct CA certificates, in file order."""

    roots: tuple[x509.Certificate, ...]

    def __post_init__(self) -> None:
        if not self.roots:
            raise NoCertificateError("trust bundle has no certificate")

    def der(self) -> bytes:
        """Concatenated DER, the form `ssl.SSLContext.load_verify_locations(cadata=...)` takes."""
        return b"".join(root.public_bytes(serialization.Encoding.DER) for root in self.roots)


def load_credential(bundle: bytes) -> Credential:
    """Parse a credential bundle: one PKCS#8 `PRIVATE KEY` block and the chain, leaf first.

    The kubelet writes the key block first; the order of key vs. certificates is not enforced,
    the order of the certificates (leaf first) is kept as written.
    """
    blocks = _blocks(bundle, what="credential bundle")
    key = _one_key(blocks, what="credential bundle")
    chain = _certificates(blocks, what="credential bundle", allow_keys=True)
    return Credential(key, chain)


def load_credential_files(key: bytes, chain: bytes) -> Credential:
    """Parse separate key and chain files (the kubelet's keyPath / certificateChainPath).

    These two files can be read across a rotation; a torn read shows up as KeyMismatchError.
    """
    key_blocks = _blocks(key, what="key file")
    private_key = _one_key(key_blocks, what="key file")
    for block in key_blocks:
        if not _is_key_label(block.label):
            raise UnexpectedBlockError(f"key file holds a {block.label!r} block; only the key")
    certificates = _certificates(_blocks(chain, what="chain file"), what="chain file")
    return Credential(private_key, certificates)


def load_trust_bundle(data: bytes) -> TrustBundle:
    """Parse concatenated CERTIFICATE blocks; drops duplicates, refuses non-CA certificates."""
    roots = _certificates(_blocks(data, what="trust bundle"), what="trust bundle")
    distinct = tuple(dict.fromkeys(roots))  # Certificate equality is DER equality; keeps order
    not_ca = [cert for cert in distinct if not _is_ca(cert)]
    if not_ca:
        listed = "; ".join(describe(cert) for cert in not_ca)
        raise NotCaError(f"trust bundle holds {len(not_ca)} non-CA certificate(s): {listed}")
    return TrustBundle(distinct)


def dump_credential(credential: Credential) -> bytes:
    """The credential bundle bytes the kubelet writes: the key block, then the chain, leaf first."""
    return dump_private_key(credential.key) + dump_certificates(credential.chain)


def dump_private_key(key: PrivateKey) -> bytes:
    """One unencrypted PKCS#8 `PRIVATE KEY` block: a key file, or a credential bundle's start."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def dump_certificates(certificates: Iterable[x509.Certificate]) -> bytes:
    """Concatenated CERTIFICATE blocks, as given: a chain file, or a trust bundle from its roots.
    The one place certificates are joined into PEM text (`dump_roots` too goes through it)."""
    return b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in certificates)


def dump_roots(roots: Iterable[x509.Certificate]) -> bytes:
    """The CERTIFICATE blocks of `roots`, each distinct certificate once, in the order it first
    appears: what a published trust bundle holds. The API server refuses a ClusterTrustBundle
    that lists a certificate twice, and the same roots always give the same bytes."""
    return dump_certificates(dict.fromkeys(roots))


def dump_trust_bundle(bundle: TrustBundle) -> bytes:
    return dump_certificates(bundle.roots)


@dataclass(frozen=True)
class PemMaterial:
    """A credential and the roots to verify peers with, as PEM bytes (what grpcio and other
    stacks that take bytes want). The key never shows in repr() or str()."""

    private_key: bytes = field(repr=False)  # one PKCS#8 PRIVATE KEY block
    certificate_chain: bytes  # leaf first
    trust_bundle: bytes  # our own roots
    all_roots: bytes  # our own roots, then federated trust domains' (each once)


def pem_material(
    credential: Credential, trust_bundle: TrustBundle, all_roots: TrustBundle | None = None
) -> PemMaterial:
    return PemMaterial(
        dump_private_key(credential.key),
        dump_certificates(credential.chain),
        dump_trust_bundle(trust_bundle),
        dump_roots((all_roots or trust_bundle).roots),
    )


def verify_chain(credential: Credential, trust_bundle: TrustBundle, now: dt.datetime) -> None:
    """Check that the chain leads to a root of `trust_bundle`, every link valid at `now`.

    Checks what a TLS peer holding the same trust bundle will check at handshake time, so that
    material failing here is never served: signatures link by link, validity windows, CA flags on
    intermediates. Raises ChainError naming the first broken link.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    chain = credential.chain
    for position, cert in enumerate(chain):
        _check_window(cert, now, role=_role(position))
        if position > 0 and not _is_ca(cert):
            raise ChainError(f"{_role(position)} {describe(cert)} is not a CA")
        if position > 0 and cert in trust_bundle.roots:
            return  # the chain carries a trust anchor itself
        anchors = [root for root in trust_bundle.roots if root.subject == cert.issuer]
        if any(signed_by(cert, root) and _in_window(root, now) for root in anchors):
            return
        if position + 1 == len(chain):
            why = (
                "only by roots that are outside their validity window"
                if any(signed_by(cert, root) for root in anchors)
                else "by no root in the trust bundle"
            )
            raise ChainError(f"{_role(position)} {describe(cert)} is signed {why}")
        if not signed_by(cert, chain[position + 1]):
            raise ChainError(
                f"{_role(position)} {describe(cert)} is not signed by the next certificate in "
                "the chain (the chain must be in order, leaf first)"
            )


def describe(cert: x509.Certificate) -> str:
    """A short, safe name for a certificate in messages: subject and SHA-256 prefix.

    Pod certificates have an empty subject; their SPIFFE ID names them instead.
    """
    name = cert.subject.rfc4514_string()
    if not name:
        try:
            name = str(spiffe_id_of(cert))
        except CertificateIdError:
            name = "<empty subject>"
    return f"{name!r} (sha256 {cert.fingerprint(hashes.SHA256()).hex()[:16]})"


# --- PEM --------------------------------------------------------------------------------------


def _blocks(data: bytes, *, what: str) -> list[pem.Block]:
    if len(data) > MAX_BUNDLE_BYTES:
        raise TooLargeError(f"{what} is {len(data)} bytes; at most {MAX_BUNDLE_BYTES}")
    try:
        blocks = pem.read(bytes(data), what=what)
    except pem.PemError as err:
        raise MalformedPemError(str(err)) from None
    if not blocks:
        raise MalformedPemError(f"{what} holds no PEM block")
    return blocks


# --- keys -------------------------------------------------------------------------------------


def _is_key_label(label: str) -> bool:
    # "PRIVATE KEY", "ENCRYPTED PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH ..."
    return label.endswith(_KEY_LABEL)


def _one_key(blocks: list[pem.Block], *, what: str) -> PrivateKey:
    keys = [block for block in blocks if _is_key_label(block.label)]
    if not keys:
        raise NoKeyError(f"{what} holds no PRIVATE KEY block")
    if len(keys) > 1:
        raise SeveralKeysError(f"{what} holds {len(keys)} private key blocks; exactly one allowed")
    return _private_key(keys[0], what=what)


def _private_key(block: pem.Block, *, what: str) -> PrivateKey:
    # Every error below is raised `from None`: no library message or chained frame should ever
    # get near the key bytes.
    if block.label == _ENCRYPTED_KEY_LABEL or block.has_headers:
        raise EncryptedKeyError(f"{what}: the private key is encrypted; an unencrypted one needed")
    if block.label != _KEY_LABEL:
        raise NotPkcs8Error(
            f"{what}: a {block.label!r} block is not PKCS#8; expected a 'PRIVATE KEY' block"
        )
    shape = _pkcs8_shape(block.der)
    if shape == "encrypted":
        raise EncryptedKeyError(f"{what}: the PRIVATE KEY block holds an encrypted PKCS#8 key")
    if shape != "plain":
        raise NotPkcs8Error(f"{what}: the PRIVATE KEY block is not a PKCS#8 PrivateKeyInfo")
    try:
        key = serialization.load_der_private_key(block.der, password=None)
    except TypeError:
        raise EncryptedKeyError(f"{what}: the private key is encrypted") from None
    except (ValueError, UnsupportedAlgorithm, InternalError):
        # InternalError: OpenSSL refuses some malformed keys (an Ed448 OID over 32 bytes, found
        # by the fuzzer) without a ValueError.
        raise UnsupportedKeyError(f"{what}: the private key cannot be decoded") from None
    if not isinstance(key, PrivateKey):
        raise UnsupportedKeyError(
            f"{what}: a {type(key).__name__} cannot sign TLS handshakes; use RSA, ECDSA or Ed25519"
        )
    return key


def _pkcs8_shape(der: bytes) -> str:
    """Tell PKCS#8 from its look-alikes by the first two fields, before handing it to a parser.

    PrivateKeyInfo is SEQUENCE { INTEGER version, SEQUENCE algorithm, OCTET STRING key }; PKCS#1
    and SEC1 keys start with INTEGER then INTEGER / OCTET STRING; EncryptedPrivateKeyInfo starts
    with SEQUENCE then OCTET STRING. (The DER parser accepts PKCS#1 too, hence this check.)
    """
    outer = _tlv(der, 0)
    if outer is None or outer[0] != 0x30 or outer[2] != len(der):
        return "other"
    first = _tlv(der, outer[1])
    second = _tlv(der, first[2]) if first else None
    if first is None or second is None:
        return "other"
    if first[0] == 0x02 and second[0] == 0x30:
        return "plain"
    if first[0] == 0x30 and second[0] == 0x04:
        return "encrypted"
    return "other"


def _tlv(der: bytes, offset: int) -> tuple[int, int, int] | None:
    """(tag, value start, value end) of the DER element at offset, or None if it does not fit."""
    if offset + 2 > len(der):
        return None
    tag, length = der[offset], der[offset + 1]
    start = offset + 2
    if length & 0x80:
        octets = length & 0x7F
        if octets == 0 or octets > 4 or start + octets > len(der):
            return None
        length = int.from_bytes(der[start : start + octets], "big")
        start += octets
    end = start + length
    return (tag, start, end) if end <= len(der) else None


def _check_key_matches(key: PrivateKey, leaf: x509.Certificate) -> None:
    try:
        leaf_spki = keys.spki_der(leaf.public_key())
    except (ValueError, UnsupportedAlgorithm):
        raise MalformedCertificateError(
            f"leaf {describe(leaf)} has a public key that cannot be decoded"
        ) from None
    if keys.spki_der(key.public_key()) != leaf_spki:
        raise KeyMismatchError(f"the private key does not belong to leaf {describe(leaf)}")


# --- certificates -----------------------------------------------------------------------------


def _certificates(
    blocks: list[pem.Block], *, what: str, allow_keys: bool = False
) -> tuple[x509.Certificate, ...]:
    certificates: list[x509.Certificate] = []
    for block in blocks:
        if block.label == _CERT_LABEL and not block.has_headers:
            certificates.append(_certificate(block.der, what=what, index=len(certificates)))
        elif not (allow_keys and _is_key_label(block.label)):
            # Key-shaped blocks are named only by label: their content stays out of messages.
            raise UnexpectedBlockError(
                f"{what} holds a {block.label!r} block; expected CERTIFICATE"
            )
    if not certificates:
        raise NoCertificateError(f"{what} holds no CERTIFICATE block")
    return tuple(certificates)


# Everything cryptography raises for undecodable certificate bytes; not all are ValueErrors.
_DECODE_ERRORS: Final = (
    ValueError,
    x509.InvalidVersion,
    x509.DuplicateExtension,
    x509.UnsupportedGeneralNameType,
    UnsupportedAlgorithm,
)


def load_certificate(der: bytes) -> x509.Certificate:
    """One DER certificate (e.g. a TLS peer's), or MalformedCertificateError."""
    return _certificate(der, what="certificate", index=0)


def _certificate(der: bytes, *, what: str, index: int) -> x509.Certificate:
    try:
        cert = x509.load_der_x509_certificate(der)
        # Decode the fields later code relies on now, so a lazily-parsed defect cannot surface
        # as a stray exception far from here.
        _ = cert.not_valid_before_utc, cert.not_valid_after_utc, cert.subject, cert.issuer
        _ = cert.extensions
    except _DECODE_ERRORS as exc:
        raise MalformedCertificateError(f"{what} #{index + 1}: {exc}") from exc
    return cert


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return False
    return constraints.ca


def _role(position: int) -> str:
    return "leaf" if position == 0 else f"chain certificate #{position + 1}"


def _in_window(cert: x509.Certificate, now: dt.datetime) -> bool:
    return cert.not_valid_before_utc <= now <= cert.not_valid_after_utc


def _check_window(cert: x509.Certificate, now: dt.datetime, *, role: str) -> None:
    if now < cert.not_valid_before_utc:
        raise ChainError(
            f"{role} {describe(cert)} is not valid before "
            f"{cert.not_valid_before_utc.isoformat()} (now {now.isoformat()})"
        )
    if now > cert.not_valid_after_utc:
        raise ChainError(
            f"{role} {describe(cert)} expired at "
            f"{cert.not_valid_after_utc.isoformat()} (now {now.isoformat()})"
        )


def signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    """Whether `issuer`'s key made `cert`'s signature (False, never an error, for any other key
    or an algorithm the library cannot check)."""
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False
    return True
