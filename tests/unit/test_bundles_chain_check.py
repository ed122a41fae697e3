"""The check TLSSource makes before swapping in new material, pinned to a real TLS handshake.

`TLSSource` validates new files (key matches leaf, chain verifies to a root of the trust bundle
now) so that it never serves what its peers would refuse, and never refuses what they would
take. This differential test holds that promise: for generated materials, good ones and ones
with every defect we know (wrong key, missing or out-of-order intermediates, expired or not yet
valid links, a wrong or expired root, an intermediate that is no CA, a leaf signed by a
look-alike issuer, usages for one side only...), the source's verdict equals whether OpenSSL
completes real handshakes with that material: as a server to a client trusting the bundle, and
as a client to a server trusting it, both made the way `bundles` makes its contexts. Real
clock: OpenSSL reads it, so the source does too.
"""

from __future__ import annotations

import datetime as dt
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bundles.formats import (
    BundleError,
    Credential,
    dump_certificates,
    dump_private_key,
    load_trust_bundle,
)
from bundles.handshake import load_contexts
from bundles.source import SourceError, TLSSource

SPIFFE_ID = "spiffe://cluster.local/ns/shop/sa/api"
HOUR = dt.timedelta(hours=1)

# Each defect, and the chain depths (intermediates below the root) it applies to.
DEFECTS: dict[str, range] = {
    "wrong key": range(3),
    "leaf expired": range(3),
    "leaf not yet valid": range(3),
    "intermediate expired": range(1, 3),
    "intermediate not yet valid": range(1, 3),
    "root expired": range(3),
    "intermediate missing": range(1, 3),
    "intermediates out of order": range(2, 3),
    "wrong root": range(3),
    "intermediate not a CA": range(1, 3),
    "root allows no intermediate": range(1, 3),
    "leaf signed by a look-alike issuer": range(3),
    "leaf for servers only": range(3),
    "leaf for clients only": range(3),
    "unrelated certificate appended": range(3),
    "root inside the chain": range(3),
    "intermediate as the trust anchor": range(1, 3),
}


# Where the check is stricter than OpenSSL on purpose, and why; the tests assert the difference,
# so it cannot widen or vanish unnoticed.
STRICTER: dict[str, str] = {
    "intermediates out of order": "the API's chain is leaf first, then each issuer (RFC 5246 "
    "7.4.2); OpenSSL and Go build a path from any order, the signer and the audit do not",
}


def stricter(defects: frozenset[str]) -> bool:
    """Whether a STRICTER defect is in the part of the chain a peer uses: with the leaf's own
    issuer as the anchor, the order of the certificates above it does not matter."""
    return "intermediates out of order" in defects and (
        "intermediate as the trust anchor" not in defects
    )


@dataclass(frozen=True)
class Recipe:
    depth: int  # intermediates between the leaf and the root
    defects: frozenset[str]

    def __str__(self) -> str:
        return f"depth {self.depth}: {', '.join(sorted(self.defects)) or 'good'}"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None,
    now: dt.datetime,
    *,
    ca: bool,
    path_length: int | None = None,
    window: tuple[dt.timedelta, dt.timedelta] = (-24 * HOUR, 24 * HOUR),
    usages: tuple[x509.ObjectIdentifier, ...] = (),
) -> x509.Certificate:
    issuer_name, issuer_key = issuer or (subject, key)
    # A pod certificate's subject is empty: its SPIFFE ID names it.
    leaf = subject == "leaf"
    name = x509.Name([]) if leaf else x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    usage = x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip
    constraints = x509.BasicConstraints(ca=ca, path_length=path_length if ca else None)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now + window[0])
        .not_valid_after(now + window[1])
        .add_extension(constraints, critical=True)
        .add_extension(usage, critical=True)
    )
    if leaf:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(SPIFFE_ID)]), critical=True
        ).add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@dataclass(frozen=True)
class Material:
    credential_pem: bytes
    trust_pem: bytes


def make(recipe: Recipe, now: dt.datetime) -> Material:
    defects = recipe.defects
    expired, early = (-48 * HOUR, -HOUR), (HOUR, 48 * HOUR)
    root_key = _key()
    root = _certificate(
        "root", root_key, None, now, ca=True,
        path_length=0 if "root allows no intermediate" in defects else None,
        window=expired if "root expired" in defects else (-24 * HOUR, 24 * HOUR),
    )  # fmt: skip
    issuers: list[tuple[str, ec.EllipticCurvePrivateKey, x509.Certificate]] = [
        ("root", root_key, root)
    ]
    for level in range(recipe.depth):
        lowest = level == recipe.depth - 1  # the defects below name the leaf's issuer
        key, name = _key(), f"intermediate {level + 1}"
        window = (-24 * HOUR, 24 * HOUR)
        if lowest and "intermediate expired" in defects:
            window = expired
        if lowest and "intermediate not yet valid" in defects:
            window = early
        cert = _certificate(
            name, key, issuers[-1][:2], now,
            ca=not (lowest and "intermediate not a CA" in defects), window=window,
        )  # fmt: skip
        issuers.append((name, key, cert))
    usages: tuple[x509.ObjectIdentifier, ...] = (
        ExtendedKeyUsageOID.SERVER_AUTH,
        ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    if "leaf for servers only" in defects:
        usages = (ExtendedKeyUsageOID.SERVER_AUTH,)
    if "leaf for clients only" in defects:
        usages = (ExtendedKeyUsageOID.CLIENT_AUTH,)
    window = (-24 * HOUR, 24 * HOUR)
    if "leaf expired" in defects:
        window = expired
    if "leaf not yet valid" in defects:
        window = early
    leaf_key = _key()
    signer_name, signer_key, _ = issuers[-1]
    if "leaf signed by a look-alike issuer" in defects:
        signer_key = _key()  # the issuer's name, another key
    leaf = _certificate(
        "leaf", leaf_key, (signer_name, signer_key), now, ca=False, window=window, usages=usages
    )
    intermediates = [cert for _, _, cert in reversed(issuers[1:])]  # lowest first
    if "intermediate missing" in defects:
        intermediates = intermediates[1:]
    if "intermediates out of order" in defects:
        intermediates.reverse()
    chain = [leaf, *intermediates]
    if "root inside the chain" in defects:
        chain.append(root)
    if "unrelated certificate appended" in defects:
        other = _key()
        chain.append(_certificate("unrelated", other, None, now, ca=True))
    key = _key() if "wrong key" in defects else leaf_key
    anchors = [root]
    if "wrong root" in defects:
        stranger = _key()
        anchors = [_certificate("root", stranger, None, now, ca=True)]  # same name, other key
    if "intermediate as the trust anchor" in defects:
        anchors = [issuers[-1][2]]
    # Credential() itself refuses a mismatched pair, so the bundle is written by hand.
    return Material(dump_private_key(key) + dump_certificates(chain), dump_certificates(anchors))


# --- the two verdicts ---------------------------------------------------------------------------


def preswap_accepts(material: Material, folder: Path) -> bool:
    (folder / "credential.pem").write_bytes(material.credential_pem)
    (folder / "trust.pem").write_bytes(material.trust_pem)
    try:
        TLSSource(folder / "credential.pem", folder / "trust.pem")
    except SourceError:
        return False
    return True


@dataclass(frozen=True)
class Peer:
    """The other side of each handshake: a credential of its own CA, which the material's
    holder does not check (only the material is on trial)."""

    credential: Credential
    path: Path


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Peer:
    now = dt.datetime.now(dt.UTC)
    key, root_key = _key(), _key()
    both = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)
    leaf = _certificate("leaf", key, ("peer root", root_key), now, ca=False, usages=both)
    path = tmp_path_factory.mktemp("peer") / "peer.pem"
    path.write_bytes(dump_private_key(key) + dump_certificates([leaf]))
    return Peer(Credential(key, (leaf,)), path)


def _holder(side: ssl._SSLMethod, path: Path) -> ssl.SSLContext | None:
    """The material's holder, loaded the plain ssl way; None when OpenSSL refuses the files."""
    context = ssl.SSLContext(side)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        context.load_cert_chain(path)
    except ssl.SSLError:
        return None
    return context


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> bool:
    server_in, server_out, client_in, client_out = (ssl.MemoryBIO() for _ in range(4))
    server_side = server.wrap_bio(server_in, server_out, server_side=True)
    client_side = client.wrap_bio(client_in, client_out)
    pending = [client_side, server_side]
    try:
        for _ in range(10):
            for side in list(pending):
                try:
                    side.do_handshake()
                    pending.remove(side)
                except ssl.SSLWantReadError:
                    pass
            server_in.write(client_out.read())
            client_in.write(server_out.read())
            if not pending:
                break
        # TLS 1.3: the server judges the client's certificate once the client has finished.
        client_side.write(b"ping")
        server_in.write(client_out.read())
        return not pending and server_side.read(4) == b"ping"
    except ssl.SSLError:
        return False


def handshakes_succeed(material: Material, folder: Path, peer: Peer) -> bool:
    """As a server to a client trusting the bundle, and as a client to a server trusting it."""
    path = folder / "credential.pem"
    path.write_bytes(material.credential_pem)
    try:
        trust = load_trust_bundle(material.trust_pem)
    except BundleError:  # an anchor that is no CA: no peer takes it as a trust bundle
        return False
    verifying_server, verifying_client = load_contexts(
        peer.credential, trust, [("server", None), ("client", None)]
    )
    as_server = _holder(ssl.PROTOCOL_TLS_SERVER, path)
    as_client = _holder(ssl.PROTOCOL_TLS_CLIENT, path)
    if as_server is None or as_client is None:
        return False
    return _handshake(as_server, verifying_client) and _handshake(verifying_server, as_client)


# --- the differential tests ---------------------------------------------------------------------


def _each_recipe() -> Iterator[pytest.ParameterSet]:
    for depth in range(3):
        yield pytest.param(Recipe(depth, frozenset()), id=f"good, {depth} intermediates")
    for defect, depths in DEFECTS.items():
        for depth in depths:
            yield pytest.param(Recipe(depth, frozenset({defect})), id=f"{defect}, depth {depth}")


@pytest.mark.parametrize("recipe", list(_each_recipe()))
def test_the_preswap_check_agrees_with_a_real_handshake(
    recipe: Recipe, tmp_path: Path, peer: Peer
) -> None:
    material = make(recipe, dt.datetime.now(dt.UTC))
    handshakes = handshakes_succeed(material, tmp_path, peer)
    expected = handshakes and not stricter(recipe.defects)
    assert preswap_accepts(material, tmp_path) is expected, f"{recipe}: handshakes {handshakes}"
    if not recipe.defects:
        assert handshakes, "a good material must pass both handshakes"
    if recipe.defects <= STRICTER.keys() and recipe.defects:
        assert handshakes, f"{recipe}: no longer stricter than OpenSSL; drop it from STRICTER"


@st.composite
def recipes(draw: st.DrawFn) -> Recipe:
    depth = draw(st.integers(0, 2))
    usable = sorted(d for d, depths in DEFECTS.items() if depth in depths)
    return Recipe(depth, frozenset(draw(st.sets(st.sampled_from(usable), max_size=3))))


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(recipe=recipes())
def test_the_preswap_check_agrees_with_a_real_handshake_for_combined_defects(
    recipe: Recipe, tmp_path: Path, peer: Peer
) -> None:
    material = make(recipe, dt.datetime.now(dt.UTC))
    handshakes = handshakes_succeed(material, tmp_path, peer)
    expected = handshakes and not stricter(recipe.defects)
    assert preswap_accepts(material, tmp_path) is expected, f"{recipe}: handshakes {handshakes}"
