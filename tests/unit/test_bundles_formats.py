"""bundles.formats: parsing what the kubelet writes, and refusing everything else with a type.

Also home of `Authority`, the small test CA the other bundles tests import: trustme cannot put a
URI SAN in a leaf, and writes keys in the traditional (non-PKCS#8) format.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import subprocess
import sys
from collections.abc import Callable, Sequence

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa, x25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

from bundles import formats
from bundles.formats import (
    BundleError,
    ChainError,
    Credential,
    EncryptedKeyError,
    KeyMismatchError,
    MalformedCertificateError,
    MalformedPemError,
    NoCertificateError,
    NoKeyError,
    NotCaError,
    NotPkcs8Error,
    PrivateKey,
    SeveralKeysError,
    TooLargeError,
    TrustBundle,
    UnexpectedBlockError,
    UnsupportedKeyError,
    dump_certificates,
    dump_credential,
    dump_roots,
    dump_trust_bundle,
    load_credential,
    load_credential_files,
    load_trust_bundle,
    verify_chain,
)
from bundles.spiffe import SpiffeId

# The fixed "now" of every validity check. Default validity windows are wide enough to contain
# both it and the real clock, which OpenSSL uses during the handshake tests.
NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
LONG_AGO = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
FAR_AHEAD = dt.datetime(2099, 12, 31, tzinfo=dt.UTC)
WORKLOAD = "spiffe://cluster.local/ns/shop/sa/checkout"


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def pkcs8(key: PrivateKey | x25519.X25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class Authority:
    """A test CA in the trustme spirit: times are arguments, never read from a clock."""

    def __init__(
        self,
        name: str = "podcert test root",
        *,
        parent: Authority | None = None,
        not_before: dt.datetime = LONG_AGO,
        not_after: dt.datetime = FAR_AHEAD,
    ) -> None:
        self.key = new_key()
        self.parent = parent
        self.cert: x509.Certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(parent.cert.subject if parent else _name(name))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            # A CA that may sign leaves and intermediates below it.
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            # Lets verifiers pick the right issuer when two CAs share a name (CA rotation).
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(parent.key if parent else self.key, hashes.SHA256())
        )

    def intermediate(self, name: str = "podcert test intermediate") -> Authority:
        return Authority(name, parent=self)

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def intermediates(self) -> tuple[x509.Certificate, ...]:
        """Certificates between a leaf of this CA and the root (the root excluded)."""
        chain: list[x509.Certificate] = []
        authority: Authority | None = self
        while authority is not None and authority.parent is not None:
            chain.append(authority.cert)
            authority = authority.parent
        return tuple(chain)

    def leaf(
        self,
        *uris: str,
        key: PrivateKey | None = None,
        dns_names: Sequence[str] = (),
        san: bool = True,
        not_before: dt.datetime = LONG_AGO,
        not_after: dt.datetime = FAR_AHEAD,
    ) -> x509.Certificate:
        key = key or new_key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))  # identity lives in the SAN, as for pod certificates
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            # mTLS: the same leaf serves as server and as client.
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if san:
            names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(u) for u in uris]
            names += [x509.DNSName(d) for d in dns_names]
            # Critical, as the subject is empty (RFC 5280 section 4.2.1.6).
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=True)
        return builder.sign(self.key, hashes.SHA256())

    def issue(
        self,
        spiffe_id: str = WORKLOAD,
        *,
        not_before: dt.datetime = LONG_AGO,
        not_after: dt.datetime = FAR_AHEAD,
    ) -> Credential:
        key = new_key()
        leaf = self.leaf(spiffe_id, key=key, not_before=not_before, not_after=not_after)
        return Credential(key, (leaf, *self.intermediates))


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


@pytest.fixture(scope="module")
def root() -> Authority:
    return Authority()


@pytest.fixture(scope="module")
def credential(root: Authority) -> Credential:
    return root.issue()


def key_secrets(key: PrivateKey) -> list[str]:
    """Strings that would betray key material if they appeared in a message or repr."""
    body = b"".join(pkcs8(key).splitlines()[1:-1]).decode()
    secrets = [body[i : i + 24] for i in range(0, len(body) - 24, 24)]
    if isinstance(key, ec.EllipticCurvePrivateKey):
        value = key.private_numbers().private_value
        secrets += [str(value), f"{value:x}"]
    return secrets


# --- loading credentials ----------------------------------------------------------------------


def test_credential_bundle_loads_key_then_chain_leaf_first(root: Authority) -> None:
    intermediate = root.intermediate()
    issued = intermediate.issue()
    loaded = load_credential(dump_credential(issued))
    assert loaded.chain == issued.chain
    assert loaded.leaf == issued.chain[0]
    assert len(loaded.chain) == 2
    assert loaded.spiffe_id == SpiffeId.parse(WORKLOAD)
    assert loaded.not_before == LONG_AGO
    assert loaded.not_after == FAR_AHEAD


def test_separate_key_and_chain_files_load(credential: Credential) -> None:
    loaded = load_credential_files(pkcs8(credential.key), dump_certificates(credential.chain))
    assert loaded == credential  # equality is by chain; the key was checked against the leaf


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(rsa.generate_private_key(65537, 2048), id="RSA"),
        pytest.param(ec.generate_private_key(ec.SECP384R1()), id="ECDSA P-384"),
        pytest.param(ed25519.Ed25519PrivateKey.generate(), id="Ed25519"),
    ],
)
def test_every_tls_key_type_loads(root: Authority, key: PrivateKey) -> None:
    leaf = root.leaf(WORKLOAD, key=key)
    loaded = load_credential(pkcs8(key) + dump_certificates([leaf]))
    assert loaded.leaf == leaf


def test_text_around_blocks_is_allowed(credential: Credential) -> None:
    bundle = b"# written by podcert\n" + dump_credential(credential) + b"\ntrailing note\n"
    assert load_credential(bundle) == credential


def test_repr_never_shows_key_material(credential: Credential) -> None:
    shown = repr(credential) + str(credential)
    assert "PRIVATE" not in shown
    assert not [s for s in key_secrets(credential.key) if s in shown]


def test_a_credential_built_directly_must_be_consistent(credential: Credential) -> None:
    with pytest.raises(NoCertificateError):
        Credential(credential.key, ())
    with pytest.raises(KeyMismatchError):
        Credential(new_key(), credential.chain)


def _encrypted_pkcs8(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )


def _relabel(pem: bytes, label: bytes) -> bytes:
    lines = pem.strip().splitlines()
    return b"\n".join(
        [b"-----BEGIN " + label + b"-----", *lines[1:-1], b"-----END " + label + b"-----"]
    )


def _der_as_pem(der: bytes, label: bytes) -> bytes:
    body = base64.encodebytes(der)
    return b"-----BEGIN " + label + b"-----\n" + body + b"-----END " + label + b"-----\n"


def _traditional(
    key: PrivateKey, encryption: serialization.KeySerializationEncryption | None = None
) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        encryption or serialization.NoEncryption(),
    )


def _rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(65537, 2048)


_GARBAGE_CERT = _der_as_pem(b"\x30\x00", b"CERTIFICATE")
_EMPTY_CERT = b"-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"
_LEGACY_ENCRYPTION = serialization.BestAvailableEncryption(b"secret")

# Each case builds bundle bytes from a fresh, valid (key, chain PEM).
Make = Callable[[PrivateKey, bytes], bytes]
BAD_BUNDLES: list[tuple[str, Make, type[BundleError]]] = [
    ("no key, only certificates", lambda k, c: c, NoKeyError),
    ("two keys", lambda k, c: pkcs8(k) + pkcs8(new_key()) + c, SeveralKeysError),
    ("PKCS#1 RSA key", lambda k, c: _traditional(_rsa_key()) + c, NotPkcs8Error),
    ("SEC1 EC key", lambda k, c: _traditional(k) + c, NotPkcs8Error),
    (
        "SEC1 EC key mislabelled as PRIVATE KEY",
        lambda k, c: _relabel(_traditional(k), b"PRIVATE KEY") + b"\n" + c,
        NotPkcs8Error,
    ),
    ("encrypted PKCS#8 key", lambda k, c: _encrypted_pkcs8(k) + c, EncryptedKeyError),
    (
        "encrypted PKCS#8 key mislabelled as PRIVATE KEY",
        lambda k, c: _relabel(_encrypted_pkcs8(k), b"PRIVATE KEY") + b"\n" + c,
        EncryptedKeyError,
    ),
    (
        "legacy encrypted PEM with Proc-Type headers",
        lambda k, c: _traditional(k, _LEGACY_ENCRYPTION) + c,
        EncryptedKeyError,
    ),
    (
        "key unusable for TLS (X25519)",
        lambda k, c: pkcs8(x25519.X25519PrivateKey.generate()) + c,
        UnsupportedKeyError,
    ),
    (
        "PRIVATE KEY block of garbage DER",
        lambda k, c: _der_as_pem(b"\x30\x03\x02\x01\x00", b"PRIVATE KEY") + c,
        NotPkcs8Error,
    ),
    ("no certificate", lambda k, c: pkcs8(k), NoCertificateError),
    ("key does not match the leaf", lambda k, c: pkcs8(new_key()) + c, KeyMismatchError),
    (
        "certificate of garbage DER",
        lambda k, c: pkcs8(k) + _GARBAGE_CERT,
        MalformedCertificateError,
    ),
    (
        "an unexpected PUBLIC KEY block",
        lambda k, c: pkcs8(k) + c + _der_as_pem(b"\x30\x00", b"PUBLIC KEY"),
        UnexpectedBlockError,
    ),
    ("empty input", lambda k, c: b"", MalformedPemError),
    ("random garbage", lambda k, c: b"\x00\xff garbage \x13\x37" * 10, MalformedPemError),
    (
        "truncated in the middle of the chain",
        lambda k, c: pkcs8(k) + c[: len(c) // 2],
        MalformedPemError,
    ),
    ("truncated inside the BEGIN line", lambda k, c: pkcs8(k) + c[:14], MalformedPemError),
    (
        "a body that is not base64",
        lambda k, c: pkcs8(k) + c.replace(b"M", b"!", 1),
        MalformedPemError,
    ),
    (
        "an END line without a BEGIN line",
        lambda k, c: pkcs8(k) + c + b"-----END CERTIFICATE-----\n",
        MalformedPemError,
    ),
    ("an empty block", lambda k, c: pkcs8(k) + c + _EMPTY_CERT, MalformedPemError),
    (
        "more than 4 MiB",
        lambda k, c: pkcs8(k) + c + b" " * formats.MAX_BUNDLE_BYTES,
        TooLargeError,
    ),
]


@pytest.mark.parametrize(
    ("make", "error"), [pytest.param(make, error, id=name) for name, make, error in BAD_BUNDLES]
)
def test_bad_credential_bundles_are_refused_with_a_typed_error(
    root: Authority,
    make: Make,
    error: type[BundleError],
) -> None:
    issued = root.issue()
    with pytest.raises(error) as raised:
        load_credential(make(issued.key, dump_certificates(issued.chain)))
    assert isinstance(raised.value, BundleError)
    message = str(raised.value)
    assert not [s for s in key_secrets(issued.key) if s in message]


@pytest.mark.parametrize(
    ("key_file", "chain_file", "error"),
    [
        pytest.param(
            "key+leaf", "chain", UnexpectedBlockError, id="key file holding a certificate"
        ),
        pytest.param("key", "key+chain", UnexpectedBlockError, id="chain file holding a key"),
        pytest.param("other key", "chain", KeyMismatchError, id="torn read across a rotation"),
        pytest.param("", "chain", MalformedPemError, id="empty key file"),
        pytest.param("key", "", MalformedPemError, id="empty chain file"),
    ],
)
def test_bad_separate_files_are_refused(
    credential: Credential, key_file: str, chain_file: str, error: type[BundleError]
) -> None:
    chain = dump_certificates(credential.chain)
    parts = {"key": pkcs8(credential.key), "other key": pkcs8(new_key()), "chain": chain}
    parts["key+leaf"] = parts["key"] + chain
    parts["key+chain"] = parts["key"] + chain
    with pytest.raises(error) as raised:
        load_credential_files(parts.get(key_file, b""), parts.get(chain_file, b""))
    assert not [s for s in key_secrets(credential.key) if s in str(raised.value)]


# --- trust bundles ----------------------------------------------------------------------------


def test_trust_bundle_drops_duplicates_and_keeps_order(root: Authority) -> None:
    other = Authority("another root")
    bundle = load_trust_bundle(root.pem + other.pem + root.pem + b"\n" + other.pem)
    assert bundle.roots == (root.cert, other.cert)
    assert load_trust_bundle(dump_trust_bundle(bundle)) == bundle


def test_dumped_roots_hold_each_root_once_in_first_order(root: Authority) -> None:
    other = Authority("another root")
    assert dump_roots([other.cert, root.cert, other.cert]) == other.pem + root.pem
    assert dump_roots([]) == b""


def test_trust_bundle_der_is_the_concatenation_of_roots(root: Authority) -> None:
    other = Authority("another root")
    bundle = TrustBundle((root.cert, other.cert))
    der = bundle.der()
    first = root.cert.public_bytes(serialization.Encoding.DER)
    assert der.startswith(first)
    assert x509.load_der_x509_certificate(der[len(first) :]) == other.cert


def test_trust_bundle_refuses_and_lists_non_ca_certificates(root: Authority) -> None:
    leaf = root.leaf(WORKLOAD)
    no_constraints = (
        x509.CertificateBuilder()
        .subject_name(_name("old v1-style root"))
        .issuer_name(_name("old v1-style root"))
        .public_key(root.key.public_key())
        .serial_number(1)
        .not_valid_before(LONG_AGO)
        .not_valid_after(FAR_AHEAD)
        .sign(root.key, hashes.SHA256())
    )
    with pytest.raises(NotCaError) as raised:
        load_trust_bundle(root.pem + dump_certificates([leaf, no_constraints]))
    message = str(raised.value)
    assert "2 non-CA certificate(s)" in message
    assert "old v1-style root" in message
    assert f"'{WORKLOAD}' (sha256 {leaf.fingerprint(hashes.SHA256()).hex()[:16]})" in message


@pytest.mark.parametrize(
    ("data", "error"),
    [
        pytest.param(b"", MalformedPemError, id="empty trust bundle"),
        pytest.param(b"just some text\n", MalformedPemError, id="no PEM block at all"),
        pytest.param(pkcs8(new_key()), UnexpectedBlockError, id="a private key instead of CAs"),
        pytest.param(
            _der_as_pem(b"\x30\x00", b"CERTIFICATE"), MalformedCertificateError, id="garbage DER"
        ),
    ],
)
def test_bad_trust_bundles_are_refused(data: bytes, error: type[BundleError]) -> None:
    with pytest.raises(error):
        load_trust_bundle(data)


def test_an_empty_trust_bundle_cannot_be_built() -> None:
    with pytest.raises(NoCertificateError):
        TrustBundle(())


def test_a_private_key_in_a_trust_bundle_is_named_but_not_shown(root: Authority) -> None:
    key = new_key()
    with pytest.raises(UnexpectedBlockError) as raised:
        load_trust_bundle(root.pem + pkcs8(key))
    assert "'PRIVATE KEY'" in str(raised.value)
    assert not [s for s in key_secrets(key) if s in str(raised.value)]


# --- chain verification -----------------------------------------------------------------------


def test_a_leaf_of_a_trusted_root_verifies(root: Authority) -> None:
    verify_chain(root.issue(), TrustBundle((root.cert,)), NOW)


def test_a_chain_through_an_intermediate_verifies(root: Authority) -> None:
    issuing = root.intermediate().intermediate("second intermediate")
    verify_chain(issuing.issue(), TrustBundle((root.cert,)), NOW)


def test_a_chain_that_carries_its_root_verifies(root: Authority) -> None:
    intermediate = root.intermediate()
    issued = intermediate.issue()
    with_root = Credential(issued.key, (*issued.chain, root.cert))
    verify_chain(with_root, TrustBundle((root.cert,)), NOW)


def test_a_renewed_root_with_the_same_name_is_found_among_several() -> None:
    old, new = Authority("podcert root"), Authority("podcert root")
    verify_chain(new.issue(), TrustBundle((old.cert, new.cert)), NOW)
    verify_chain(old.issue(), TrustBundle((old.cert, new.cert)), NOW)


BEFORE = NOW - dt.timedelta(days=1)
AFTER = NOW + dt.timedelta(days=1)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        pytest.param(
            lambda r: (r.issue(not_before=AFTER), r),
            "not valid before",
            id="leaf not yet valid",
        ),
        pytest.param(lambda r: (r.issue(not_after=BEFORE), r), "expired at", id="leaf expired"),
        pytest.param(
            lambda r: (Authority("stranger").issue(), r),
            "by no root in the trust bundle",
            id="leaf of an unknown CA",
        ),
        pytest.param(
            lambda r: (Authority("podcert test root").issue(), r),
            "by no root in the trust bundle",
            id="leaf of an impostor CA with the same name",
        ),
        pytest.param(
            lambda r: (Authority("intermediate", parent=r, not_after=BEFORE).issue(), r),
            "expired at",
            id="intermediate expired",
        ),
        pytest.param(
            lambda r: (Credential(*_without_intermediate(r.intermediate().issue())), r),
            "by no root in the trust bundle",
            id="intermediate missing from the chain",
        ),
    ],
)
def test_broken_chains_are_refused(
    root: Authority,
    build: Callable[[Authority], tuple[Credential, Authority]],
    message: str,
) -> None:
    issued, trusted = build(root)
    with pytest.raises(ChainError, match=message):
        verify_chain(issued, TrustBundle((trusted.cert,)), NOW)


def _without_intermediate(issued: Credential) -> tuple[PrivateKey, tuple[x509.Certificate, ...]]:
    return issued.key, issued.chain[:1]


def test_a_root_outside_its_validity_window_anchors_nothing() -> None:
    expired = Authority("expired root", not_after=BEFORE)
    key = new_key()
    outliving = Credential(key, (expired.leaf(WORKLOAD, key=key),))  # leaf valid until 2099
    with pytest.raises(ChainError, match="outside their validity window"):
        verify_chain(outliving, TrustBundle((expired.cert,)), NOW)


def test_chain_out_of_order_is_refused(root: Authority) -> None:
    intermediate = root.intermediate()
    second = intermediate.intermediate("second")
    issued = second.issue()
    swapped = (issued.chain[0], issued.chain[2], issued.chain[1])
    with pytest.raises(ChainError, match="leaf first"):
        verify_chain(Credential(issued.key, swapped), TrustBundle((root.cert,)), NOW)


def test_a_non_ca_in_the_middle_of_the_chain_is_refused(root: Authority) -> None:
    middle_key = new_key()
    middle = root.leaf(WORKLOAD, key=middle_key)
    key = new_key()
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(middle.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(LONG_AGO)
        .not_valid_after(FAR_AHEAD)
        .sign(middle_key, hashes.SHA256())
    )
    with pytest.raises(ChainError, match="is not a CA"):
        verify_chain(Credential(key, (leaf, middle)), TrustBundle((root.cert,)), NOW)


def test_a_naive_now_is_a_programming_error(root: Authority, credential: Credential) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        verify_chain(credential, TrustBundle((root.cert,)), NOW.replace(tzinfo=None))


# --- hostile input ----------------------------------------------------------------------------


def _only_bundle_errors(load: Callable[[bytes], object], data: bytes) -> None:
    with contextlib.suppress(BundleError):
        load(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096))
def test_random_bytes_only_ever_raise_bundle_errors(data: bytes) -> None:
    _only_bundle_errors(load_credential, data)
    _only_bundle_errors(load_trust_bundle, data)
    _only_bundle_errors(lambda d: load_credential_files(d, d), data)


_LABELS = ["PRIVATE KEY", "CERTIFICATE", "ENCRYPTED PRIVATE KEY", "EC PRIVATE KEY", "X"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(_LABELS), st.binary(max_size=300), st.booleans()),
        max_size=4,
    )
)
def test_pem_shaped_garbage_only_ever_raises_bundle_errors(
    blocks: list[tuple[str, bytes, bool]],
) -> None:
    # Well-formed PEM armour around random DER reaches the key and certificate parsers.
    data = b"".join(
        _der_as_pem(der, label.encode())[: None if whole else -10] for label, der, whole in blocks
    )
    _only_bundle_errors(load_credential, data)
    _only_bundle_errors(load_trust_bundle, data)


_VALID_KEY = new_key()
_VALID_BUNDLE = pkcs8(_VALID_KEY) + Authority().leaf(WORKLOAD, key=_VALID_KEY).public_bytes(
    serialization.Encoding.PEM
)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=0, max_value=len(_VALID_BUNDLE)),
    st.lists(st.tuples(st.integers(0, len(_VALID_BUNDLE) - 1), st.integers(0, 255)), max_size=3),
)
def test_truncated_or_corrupted_bundles_only_raise_bundle_errors(
    cut: int, flips: list[tuple[int, int]]
) -> None:
    data = bytearray(_VALID_BUNDLE[:cut])
    for position, value in flips:
        if position < len(data):
            data[position] = value
    try:
        load_credential(bytes(data))
    except BundleError as exc:
        assert not [s for s in key_secrets(_VALID_KEY) if s in str(exc)]


_VALID_LEAF_DER = x509.load_pem_x509_certificate(
    _VALID_BUNDLE[len(pkcs8(_VALID_KEY)) :]
).public_bytes(serialization.Encoding.DER)


# Hostile serial numbers draw a deprecation warning from cryptography; they are still refused.
@pytest.mark.filterwarnings(
    "ignore:Parsed a serial number:cryptography.utils.CryptographyDeprecationWarning"
)
@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, len(_VALID_LEAF_DER) - 1), st.integers(0, 255)), max_size=4)
)
def test_corrupted_certificate_der_only_raises_bundle_errors(flips: list[tuple[int, int]]) -> None:
    # Valid armour around a damaged certificate reaches the DER decoder, not just base64.
    der = bytearray(_VALID_LEAF_DER)
    for position, value in flips:
        der[position] = value
    bundle = pkcs8(_VALID_KEY) + _der_as_pem(bytes(der), b"CERTIFICATE")
    _only_bundle_errors(load_credential, bundle)
    _only_bundle_errors(load_trust_bundle, _der_as_pem(bytes(der), b"CERTIFICATE"))


def test_huge_input_is_refused_before_parsing() -> None:
    with pytest.raises(TooLargeError):
        load_trust_bundle(b"-----BEGIN CERTIFICATE-----\n" + b"A" * (formats.MAX_BUNDLE_BYTES + 1))


# --- layering ---------------------------------------------------------------------------------


def test_bundles_imports_neither_kubernetes_aiohttp_signer_nor_shim() -> None:
    code = (
        "import sys, bundles, bundles.formats, bundles.spiffe, bundles.authz, bundles.source\n"
        "bad = {'kubernetes', 'aiohttp', 'signer', 'kubelet_shim'} & {m.split('.')[0] for m in "
        "sys.modules}\n"
        "print(sorted(bad))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
