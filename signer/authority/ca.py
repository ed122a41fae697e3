"""The signer's CA: a root and an intermediate, made here or loaded from a Kubernetes Secret.

Leaves are signed by the intermediate; the root is the trust anchor published to pods and its
key (when we hold it) makes the next intermediate at rotation. The Secret layout is the one
cert-manager and `kubernetes.io/tls` tools already use, so an operator can bring their own CA:

    tls.crt  issuing CA certificate (PEM)      tls.key  its private key (PKCS#8 PEM)
    ca.crt   root certificate (PEM)            ca.key   root private key (optional)

With the keys in a PKCS#11 token, `tls.key-uri` and `ca.key-uri` name them instead of
`tls.key` and `ca.key` (`signer.authority.tokenkeys`).

A single self-signed CA is accepted too (tls.crt and ca.crt the same certificate). Times are
arguments; nothing here reads the clock or touches the disk.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol, runtime_checkable

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from bundles.formats import dump_private_key
from podcert.api import keys
from signer import certs, model

CAKey = keys.PrivateKey
# A CA may have any of the API's key types (`from_secret_data` loads each of them too).
CAKeyType = keys.KeyType

# Secret data keys.
TLS_CRT: Final = "tls.crt"
TLS_KEY: Final = "tls.key"
CA_CRT: Final = "ca.crt"
CA_KEY: Final = "ca.key"
# Instead of tls.key: the URI of the issuing CA's key in a PKCS#11 token (no private key at all).
TLS_KEY_URI: Final = "tls.key-uri"
# Instead of ca.key: the URI of the root's key in that token.
CA_KEY_URI: Final = "ca.key-uri"

# CA certificates start a little in the past: leaves are backdated too, and peers' clocks drift.
DEFAULT_BACKDATE: Final = dt.timedelta(minutes=5)


class CAError(Exception):
    """The CA material cannot be used; the message names the Secret field at fault."""


@runtime_checkable
class KeyReference(Protocol):
    """A key held elsewhere (a PKCS#11 token) that the Secret names by URI instead of holding."""

    @property
    def key_uri(self) -> str: ...


# Finds the key a Secret's URI names (the URI, the Secret field holding it); raises CAError
# naming that field and what is wrong.
KeyResolver = Callable[[str, str], CAKey]


@dataclass(frozen=True)
class CABundle:
    root: x509.Certificate
    intermediate: x509.Certificate
    intermediate_key: CAKey = field(repr=False)
    # None for an operator-provided CA whose root key stays elsewhere.
    root_key: CAKey | None = field(default=None, repr=False)
    # An upstream's intermediates between ours and its root (nearest first); empty when our
    # intermediate is signed by the root itself. Sent after our intermediate in every chain.
    upstream: tuple[x509.Certificate, ...] = ()

    @property
    def not_after(self) -> dt.datetime:
        """When this bundle stops being able to issue: the intermediate's expiry."""
        return self.intermediate.not_valid_after_utc


def new_ca(
    common_name_prefix: str,
    now: dt.datetime,
    *,
    key_type: CAKeyType = "ECDSAP256",
    root_lifetime: dt.timedelta = dt.timedelta(days=365),
    intermediate_lifetime: dt.timedelta = dt.timedelta(days=90),
    backdate: dt.timedelta = DEFAULT_BACKDATE,
    intermediate_key: CAKey | None = None,
    root_key: CAKey | None = None,
) -> CABundle:
    """A fresh root and an intermediate under it, both valid from `now` (minus `backdate`).
    `intermediate_key` and `root_key`, when given, are their keys (ones made in a token);
    otherwise keys of `key_type` are generated here."""
    if root_key is None:
        root_key = keys.generate(key_type)
    not_before = certs.truncate_to_second(now - backdate)
    root = _ca_certificate(
        subject=_name(f"{common_name_prefix} root"),
        public_key=root_key.public_key(),
        issuer=None,
        issuer_key=root_key,
        not_before=not_before,
        not_after=certs.truncate_to_second(now + root_lifetime),
        # The root may sign intermediates, which may sign only leaves.
        path_length=1,
    )
    return new_intermediate(
        CABundle(root=root, intermediate=root, intermediate_key=root_key, root_key=root_key),
        now,
        key_type=key_type,
        lifetime=intermediate_lifetime,
        backdate=backdate,
        common_name_prefix=common_name_prefix,
        key=intermediate_key,
    )


def new_intermediate(
    bundle: CABundle,
    now: dt.datetime,
    *,
    key_type: CAKeyType = "ECDSAP256",
    lifetime: dt.timedelta = dt.timedelta(days=90),
    backdate: dt.timedelta = DEFAULT_BACKDATE,
    common_name_prefix: str | None = None,
    key: CAKey | None = None,
) -> CABundle:
    """A new intermediate under `bundle`'s root (rotation); needs the root key.

    The intermediate never outlives the root. Its name carries the issue time so that
    successive intermediates are told apart in logs and chains. `key` is the intermediate's key
    when it is made elsewhere (in a PKCS#11 token); otherwise one of `key_type` is generated.
    """
    if bundle.root_key is None:
        raise CAError(f"{CA_KEY}: the root key is not available, so no intermediate can be made")
    if common_name_prefix is None:
        common_name_prefix = _common_name(bundle.root).removesuffix(" root")
    if key is None:
        key = keys.generate(key_type)
    intermediate = _ca_certificate(
        subject=_name(
            f"{common_name_prefix} intermediate {now.astimezone(dt.UTC):%Y-%m-%dT%H:%M:%SZ}"
        ),
        public_key=key.public_key(),
        issuer=bundle.root,
        issuer_key=bundle.root_key,
        not_before=certs.truncate_to_second(now - backdate),
        not_after=min(certs.truncate_to_second(now + lifetime), bundle.root.not_valid_after_utc),
        # Signs leaves only.
        path_length=0,
    )
    return CABundle(
        root=bundle.root, intermediate=intermediate, intermediate_key=key, root_key=bundle.root_key
    )


def issuing_ca(bundle: CABundle) -> model.IssuingCA:
    return model.IssuingCA(
        certificate=bundle.intermediate,
        key=bundle.intermediate_key,
        root=bundle.root,
        upstream=bundle.upstream,
    )


def to_secret_data(bundle: CABundle) -> dict[str, bytes]:
    """The bundle as Kubernetes Secret data (raw bytes; the API client base64-encodes)."""
    data = {
        TLS_CRT: b"".join(
            c.public_bytes(serialization.Encoding.PEM)
            for c in (bundle.intermediate, *bundle.upstream)
        ),
        CA_CRT: bundle.root.public_bytes(serialization.Encoding.PEM),
    }
    if isinstance(bundle.intermediate_key, KeyReference):
        data[TLS_KEY_URI] = bundle.intermediate_key.key_uri.encode()
    else:
        data[TLS_KEY] = dump_private_key(bundle.intermediate_key)
    root_key: object = bundle.root_key
    if isinstance(root_key, KeyReference):
        data[CA_KEY_URI] = root_key.key_uri.encode()
    elif bundle.root_key is not None:
        data[CA_KEY] = dump_private_key(bundle.root_key)
    return data


def from_secret_data(
    data: Mapping[str, bytes], resolve: KeyResolver | None = None, *, unopened: bool = False
) -> CABundle:
    """Load and check a CA Secret; raises CAError naming the field for anything unusable.
    `resolve` finds a key the Secret names by URI (tls.key-uri, ca.key-uri); without it such a
    Secret is refused, unless `unopened`: then such a key is an `Unopened` one, for a reader of
    the certificates alone (`podcert status`), which has no token."""
    root = _one_certificate(data, CA_CRT)
    issuing = _certificates(data, TLS_CRT)
    # tls.crt is the issuing CA, then any upstream intermediates up to the root (an offline
    # upstream's chain), optionally followed by the root itself (a common "full chain" habit).
    if len(issuing) > 1 and _same(issuing[-1], root):
        issuing = issuing[:-1]
    intermediate, upstream = issuing[0], tuple(issuing[1:])
    for n, (child, parent) in enumerate(zip(issuing, [*upstream, root], strict=True)):
        if n > 0:
            _check_is_ca(child, TLS_CRT)
        if n + 1 < len(issuing):
            try:
                child.verify_directly_issued_by(parent)
            except (ValueError, TypeError, InvalidSignature) as exc:
                raise CAError(
                    f"{TLS_CRT}: certificate {n + 1} ({_common_name(child)!r}) is not signed by "
                    f"the one after it ({_common_name(parent)!r}): {exc or type(exc).__name__}"
                ) from exc
    key_field = TLS_KEY_URI if TLS_KEY_URI in data else TLS_KEY
    if key_field == TLS_KEY_URI:
        intermediate_key = _referenced_key(
            data, resolve, TLS_KEY_URI, TLS_KEY, intermediate, unopened
        )
    else:
        intermediate_key = _private_key(data, TLS_KEY)
    _check_is_ca(intermediate, TLS_CRT)
    _check_is_ca(root, CA_CRT)
    _check_key_matches(intermediate_key, intermediate, key_field, TLS_CRT)
    last = issuing[-1]
    if not _same(last, root):
        try:
            last.verify_directly_issued_by(root)
        except (ValueError, TypeError, InvalidSignature) as exc:
            raise CAError(
                f"{TLS_CRT}: the issuing CA {_common_name(last)!r} is not signed by "
                f"the root in {CA_CRT} ({_common_name(root)!r}): {exc or type(exc).__name__}"
            ) from exc
    root_key: CAKey | None = None
    if CA_KEY_URI in data:
        root_key = _referenced_key(data, resolve, CA_KEY_URI, CA_KEY, root, unopened)
        _check_key_matches(root_key, root, CA_KEY_URI, CA_CRT)
    elif data.get(CA_KEY):
        root_key = _private_key(data, CA_KEY)
        _check_key_matches(root_key, root, CA_KEY, CA_CRT)
    return CABundle(
        root=root,
        intermediate=intermediate,
        intermediate_key=intermediate_key,
        root_key=root_key,
        upstream=upstream,
    )


def _referenced_key(
    data: Mapping[str, bytes],
    resolve: KeyResolver | None,
    name: str,
    instead_of: str,
    certificate: x509.Certificate,
    unopened: bool,
) -> CAKey:
    """The key `data[name]` names by URI (where `instead_of` would hold the key itself), for
    `certificate`."""
    uri = _field(data, name).decode("utf-8", "replace")
    if instead_of in data:
        raise CAError(f"{name}: given with {instead_of}; a CA key lives in one place")
    if unopened:
        public = certificate.public_key()
        if not isinstance(public, ec.EllipticCurvePublicKey):
            raise CAError(f"{name}: a key in a token is an EC key; the certificate's is not")
        return Unopened(public, uri)
    if resolve is None:
        raise CAError(
            f"{name}: the CA's key is in a PKCS#11 token ({uri}); start the "
            "signer with --ca-key-uri and --ca-key-pin-file"
        )
    return resolve(uri, name)


class Unopened(ec.EllipticCurvePrivateKey):
    """A key the Secret names by URI, read without its token: its public half is its
    certificate's, and it signs nothing (model.KeyUnavailable)."""

    def __init__(self, public: ec.EllipticCurvePublicKey, uri: str) -> None:
        self._public, self.key_uri = public, uri

    @property
    def curve(self) -> ec.EllipticCurve:
        return self._public.curve

    @property
    def key_size(self) -> int:
        return self._public.key_size

    def public_key(self) -> ec.EllipticCurvePublicKey:
        return self._public

    def sign(self, data: object, signature_algorithm: object) -> bytes:
        raise model.KeyUnavailable(f"{self.key_uri}: read without its token, signs nothing")

    def exchange(self, algorithm: ec.ECDH, peer_public_key: ec.EllipticCurvePublicKey) -> bytes:
        raise model.KeyUnavailable(f"{self.key_uri}: signs nothing")

    def private_numbers(self) -> ec.EllipticCurvePrivateNumbers:
        raise model.KeyUnavailable(f"{self.key_uri}: not here")

    def private_bytes(self, *args: object, **kwargs: object) -> bytes:
        raise model.KeyUnavailable(f"{self.key_uri}: not here")

    def __copy__(self) -> Unopened:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Unopened:
        return self


def _ca_certificate(
    *,
    subject: x509.Name,
    public_key: keys.PublicKey,
    issuer: x509.Certificate | None,
    issuer_key: CAKey,
    not_before: dt.datetime,
    not_after: dt.datetime,
    path_length: int,
) -> x509.Certificate:
    """A CA certificate; self-signed when `issuer` is None."""
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if issuer is None else issuer.subject)
        .public_key(public_key)
        .serial_number(certs.random_serial())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        # A CA, limited in how many CAs may follow it in a chain.
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        # Signs certificates and CRLs, nothing else.
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        # Names this key, so certificates it signs can point at it through their AKI.
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
    )
    if issuer is not None:
        # Points at the root's key; a self-signed root needs none.
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                issuer.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
            ),
            critical=False,
        )
    return builder.sign(issuer_key, certs.signature_hash(issuer_key))


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _common_name(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = names[0].value if names else cert.subject.rfc4514_string()
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


def _same(a: x509.Certificate, b: x509.Certificate) -> bool:
    return a.public_bytes(serialization.Encoding.DER) == b.public_bytes(serialization.Encoding.DER)


def _field(data: Mapping[str, bytes], name: str) -> bytes:
    value = data.get(name)
    if not value:
        raise CAError(f"{name}: missing or empty")
    if not isinstance(value, bytes):
        raise CAError(f"{name}: expected bytes, got {type(value).__name__}")
    return value


def _certificates(data: Mapping[str, bytes], name: str) -> list[x509.Certificate]:
    try:
        found = x509.load_pem_x509_certificates(_field(data, name))
    except CAError:
        raise
    except Exception as exc:  # cryptography's parse errors vary in type; all mean "garbage"
        raise CAError(f"{name}: not a PEM certificate ({exc or type(exc).__name__})") from exc
    if not found:
        raise CAError(f"{name}: holds no certificate")
    return found


def _one_certificate(data: Mapping[str, bytes], name: str) -> x509.Certificate:
    found = _certificates(data, name)
    if len(found) != 1:
        raise CAError(f"{name}: holds {len(found)} certificates; expected exactly one")
    return found[0]


def _private_key(data: Mapping[str, bytes], name: str) -> CAKey:
    try:
        key = serialization.load_pem_private_key(_field(data, name), password=None)
    except CAError:
        raise
    except TypeError as exc:
        raise CAError(f"{name}: the private key is encrypted; store it unencrypted") from exc
    except Exception as exc:
        # Never echo the parser's message here: it may quote the key material it choked on.
        raise CAError(f"{name}: not a PEM private key") from exc
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name not in (
        "secp256r1",
        "secp384r1",
        "secp521r1",
    ):
        raise CAError(f"{name}: the ECDSA curve {key.curve.name} is not supported")
    if isinstance(key, rsa.RSAPrivateKey) and key.key_size < 2048:
        raise CAError(f"{name}: a {key.key_size}-bit RSA key is too weak; use at least 2048")
    if isinstance(key, CAKey):
        return key
    raise CAError(f"{name}: {type(key).__name__} keys are not supported; use ECDSA, RSA or Ed25519")


def load_private_key(data: Mapping[str, bytes], name: str) -> CAKey:
    """The private key in `data[name]`, checked as a CA key is; CAError naming `name`."""
    return _private_key(data, name)


def _check_is_ca(cert: x509.Certificate, name: str) -> None:
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    except Exception as exc:  # a malformed extension is as unusable as a missing one
        raise CAError(f"{name}: the certificate's extensions cannot be read ({exc})") from exc
    if constraints is None or not constraints.ca:
        raise CAError(
            f"{name}: {_common_name(cert)!r} is not a CA certificate (BasicConstraints ca=true)"
        )


def _check_key_matches(key: CAKey, cert: x509.Certificate, key_name: str, cert_name: str) -> None:
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
        raise CAError(
            f"{key_name}: the private key does not match the certificate in {cert_name} "
            f"({_common_name(cert)!r})"
        )
