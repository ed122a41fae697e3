"""The SPIFFE bundle a trust domain publishes: a JWK Set per the SPIFFE Trust Domain and Bundle
spec (4.1, 4.2) and the X509-SVID spec (6.1), and a sequence number that moves on every change
of roots and never goes back."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from podcert.api.keys import KeyType
from signer.authority import ca, schedule, spiffebundle

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
HINT = dt.timedelta(minutes=5)
SETTINGS = schedule.Settings(overlap=dt.timedelta(hours=1), max_leaf_lifetime=dt.timedelta(days=1))


def root(key_type: KeyType = "ECDSAP256", at: dt.datetime = T0) -> x509.Certificate:
    return ca.new_ca(f"td {key_type}", at, key_type=key_type).root


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def uint(text: str) -> int:
    return int.from_bytes(unb64url(text), "big")


# --- the JWK of one root ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key_type", "crv", "size"),
    [
        pytest.param("ECDSAP256", "P-256", 32, id="P-256 root: 32-byte coordinates"),
        pytest.param("ECDSAP384", "P-384", 48, id="P-384 root: 48-byte coordinates"),
        pytest.param("ECDSAP521", "P-521", 66, id="P-521 root: 66-byte coordinates"),
    ],
)
def test_an_ec_root_is_an_ec_jwk_with_fixed_length_coordinates(
    key_type: KeyType, crv: str, size: int
) -> None:
    cert = root(key_type)
    entry = spiffebundle.jwk(cert)
    public = cert.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    assert (entry["kty"], entry["crv"], entry["use"]) == ("EC", crv, "x509-svid")
    assert len(unb64url(entry["x"])) == len(unb64url(entry["y"])) == size
    assert (uint(entry["x"]), uint(entry["y"])) == (
        public.public_numbers().x,
        public.public_numbers().y,
    )


def test_an_rsa_root_is_an_rsa_jwk() -> None:
    cert = root("RSA3072")
    entry = spiffebundle.jwk(cert)
    public = cert.public_key()
    assert isinstance(public, rsa.RSAPublicKey)
    assert entry["kty"] == "RSA"
    assert entry["e"] == "AQAB"
    assert uint(entry["n"]) == public.public_numbers().n
    assert unb64url(entry["n"])[0] != 0  # minimal: no leading zero octet (RFC 7518 6.3.1.1)


def test_an_ed25519_root_is_an_okp_jwk() -> None:
    cert = root("ED25519")
    entry = spiffebundle.jwk(cert)
    public = cert.public_key()
    assert isinstance(public, ed25519.Ed25519PublicKey)
    assert (entry["kty"], entry["crv"]) == ("OKP", "Ed25519")
    assert unb64url(entry["x"]) == public.public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )


@pytest.mark.parametrize("key_type", ["ECDSAP256", "RSA3072", "ED25519"])
def test_x5c_holds_exactly_the_root_in_standard_base64_and_there_is_no_kid(
    key_type: KeyType,
) -> None:
    cert = root(key_type)
    entry = spiffebundle.jwk(cert)
    (der,) = entry["x5c"]
    assert base64.b64decode(der, validate=True) == cert.public_bytes(serialization.Encoding.DER)
    assert "kid" not in entry  # X509-SVID 6.1: MUST NOT be set
    # SPIFFE bundle 4.2: only parameters the specs define.
    assert set(entry) <= {"use", "kty", "crv", "x", "y", "n", "e", "x5c"}


# --- the document ----------------------------------------------------------------------------


def test_the_document_lists_every_root_with_the_sequence_and_the_refresh_hint() -> None:
    roots = [root("ECDSAP256"), root("RSA3072", T0 + dt.timedelta(days=1))]
    doc = json.loads(spiffebundle.bundle_body(roots, 42, HINT))
    assert doc["spiffe_sequence"] == 42
    assert doc["spiffe_refresh_hint"] == 300
    assert [k["x5c"] for k in doc["keys"]] == [spiffebundle.jwk(r)["x5c"] for r in roots]
    assert set(doc) == {"keys", "spiffe_sequence", "spiffe_refresh_hint"}


def test_the_refresh_hint_is_whole_seconds_and_never_zero() -> None:
    doc = spiffebundle.bundle_document([root()], 1, dt.timedelta(milliseconds=10))
    assert doc["spiffe_refresh_hint"] == 1


# --- the sequence number -----------------------------------------------------------------------


def test_the_sequence_stays_while_the_roots_do_and_moves_when_they_change() -> None:
    a, b = root(), root(at=T0 + dt.timedelta(days=1))
    assert spiffebundle.next_sequence(7, [a], [a], T0) == 7
    later = T0 + dt.timedelta(days=2)
    assert spiffebundle.next_sequence(7, [a], [b, a], later) == int(later.timestamp())
    # A clock behind the stored number cannot take it back.
    big = int(later.timestamp()) + 1000
    assert spiffebundle.next_sequence(big, [a], [b], later) == big + 1


def test_a_new_secret_starts_at_the_time_so_a_recreated_one_never_goes_back() -> None:
    assert spiffebundle.initial_sequence(T0) == int(T0.timestamp())


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(b"1767268800", 1767268800, id="a number"),
        pytest.param(b" 12\n", 12, id="whitespace around it"),
        pytest.param(b"-1", None, id="negative: ignored"),
        pytest.param(b"twelve", None, id="not a number: ignored"),
        pytest.param(b"\xff", None, id="not ASCII: ignored"),
    ],
)
def test_the_stored_sequence_is_read_strictly(raw: bytes, expected: int | None) -> None:
    assert spiffebundle.read_sequence({spiffebundle.SEQUENCE_KEY: raw}) == expected
    assert spiffebundle.read_sequence({}) is None


def test_a_secret_without_a_sequence_gets_one_from_what_it_holds() -> None:
    bundle = ca.new_ca("op", T0)
    operator = schedule.from_secret(ca.to_secret_data(bundle), T0 + dt.timedelta(days=3))
    # An operator's CA: its root's notBefore, not the moment it was read.
    assert spiffebundle.fallback_sequence(operator) == int(
        bundle.root.not_valid_before_utc.timestamp()
    )
    gens = schedule.apply([], schedule.Prepare(), T0, SETTINGS, bundle)
    assert spiffebundle.fallback_sequence(gens) == int(T0.timestamp())


def test_through_a_whole_rotation_every_trusted_root_is_served_and_the_sequence_only_rises() -> (
    None
):
    """prepare -> activate -> remove, as CAStore.step applies them: the bundle holds both roots
    from prepare until the old one is removed, and each change of roots moves the sequence."""
    first = ca.new_ca("first", T0)
    second = ca.new_ca("second", T0 + dt.timedelta(days=45))
    now = T0
    gens = schedule.apply([], schedule.Prepare(), now, SETTINGS, first)
    sequence = spiffebundle.initial_sequence(now)
    served: list[tuple[list[x509.Certificate], int]] = []

    def step(step: schedule.Step, at: dt.datetime, fresh: ca.CABundle | None = None) -> None:
        nonlocal gens, sequence
        after = schedule.apply(gens, step, at, SETTINGS, fresh)
        sequence = spiffebundle.next_sequence(
            sequence, schedule.trusted_roots(gens), schedule.trusted_roots(after), at
        )
        gens = after
        served.append((schedule.trusted_roots(gens), sequence))

    step(schedule.Prepare(), now := now + dt.timedelta(days=45), second)
    prepared = next(g.id for g in gens if g.state == "prepared")
    step(schedule.Activate(prepared), now := now + dt.timedelta(hours=1))
    retired = next(g.id for g in gens if g.state == "retired")
    step(schedule.Remove(retired), now := now + dt.timedelta(days=1))

    def ids(roots: list[x509.Certificate]) -> set[bytes]:
        return {r.public_bytes(serialization.Encoding.DER) for r in roots}

    both = ids([first.root, second.root])
    assert [ids(roots) for roots, _ in served] == [both, both, ids([second.root])]
    sequences = [spiffebundle.initial_sequence(T0)] + [s for _, s in served]
    assert sequences[1] > sequences[0]  # prepare added a root
    assert sequences[3] > sequences[2]  # remove dropped one
    assert sequences == sorted(sequences)


def roundtrip(doc: dict[str, Any]) -> list[x509.Certificate]:
    """What a consumer takes from the bundle (X509-SVID 6.2): the first x5c of each entry."""
    return [
        x509.load_der_x509_certificate(base64.b64decode(k["x5c"][0]))
        for k in doc["keys"]
        if k.get("use") == "x509-svid"
    ]


def test_a_consumer_reads_back_exactly_the_roots() -> None:
    roots = [root("ECDSAP256"), root("ED25519"), root("RSA3072")]
    assert roundtrip(spiffebundle.bundle_document(roots, 1, HINT)) == roots
