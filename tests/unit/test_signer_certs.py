"""signer.certs: what a leaf says, how it chains, and when it should be refreshed."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from typing import TypeVar

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID
from hypothesis import given, settings
from hypothesis import strategies as st

from podcert.api import keys
from signer import certs, model
from signer.authority import ca

NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)
BUNDLE = ca.new_ca("podcert test", NOW)
ISSUER = ca.issuing_ca(BUNDLE)
LEAF_KEY = keys.generate("ECDSAP256")
RSA_LEAF_KEY = keys.generate("RSA3072")
PLAN = model.LeafPlan(
    public_key=LEAF_KEY.public_key(),
    spiffe_id="spiffe://cluster.local/ns/web/sa/frontend",
    dns_names=("frontend.web.svc", "frontend.web.svc.cluster.local"),
    not_before=NOW - dt.timedelta(minutes=1),
    not_after=NOW + dt.timedelta(hours=24) - dt.timedelta(minutes=1),
    begin_refresh_at=NOW + dt.timedelta(hours=12),
)


def chain_of(pem: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem.encode())


def der(cert_or_key: x509.Certificate) -> bytes:
    return cert_or_key.public_bytes(serialization.Encoding.DER)


E = TypeVar("E", bound=x509.ExtensionType)


def ext(cert: x509.Certificate, kind: type[E]) -> x509.Extension[E]:
    return cert.extensions.get_extension_for_class(kind)


LEAF, INTERMEDIATE = chain_of(certs.sign_leaf(PLAN, ISSUER, serial=12345))


def test_chain_is_leaf_then_intermediate_without_the_root() -> None:
    assert der(INTERMEDIATE) == der(BUNDLE.intermediate)
    assert LEAF.issuer == BUNDLE.intermediate.subject


def test_leaf_carries_the_planned_key_serial_and_exact_times() -> None:
    assert LEAF.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == keys.public_der(LEAF_KEY)
    assert LEAF.serial_number == 12345
    assert LEAF.not_valid_before_utc == PLAN.not_before
    assert LEAF.not_valid_after_utc == PLAN.not_after


def test_identity_is_in_a_critical_san_with_an_empty_subject() -> None:
    san = ext(LEAF, x509.SubjectAlternativeName)
    assert LEAF.subject == x509.Name([])
    assert san.critical
    assert san.value.get_values_for_type(x509.UniformResourceIdentifier) == [PLAN.spiffe_id]
    assert san.value.get_values_for_type(x509.DNSName) == list(PLAN.dns_names)


def test_leaf_is_a_tls_client_and_server_end_entity() -> None:
    constraints = ext(LEAF, x509.BasicConstraints)
    assert constraints.critical and not constraints.value.ca
    eku = ext(LEAF, x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH}
    usage = ext(LEAF, x509.KeyUsage)
    assert usage.critical
    assert usage.value.digital_signature
    assert not usage.value.key_encipherment  # an ECDSA key cannot encrypt
    assert not usage.value.key_cert_sign


def test_rsa_leaf_may_also_encipher_keys() -> None:
    plan = dataclasses.replace(PLAN, public_key=RSA_LEAF_KEY.public_key())
    leaf = chain_of(certs.sign_leaf(plan, ISSUER, serial=1))[0]
    usage = ext(leaf, x509.KeyUsage).value
    assert usage.digital_signature and usage.key_encipherment


def test_key_identifiers_link_leaf_key_and_issuer() -> None:
    assert ext(LEAF, x509.SubjectKeyIdentifier).value == (
        x509.SubjectKeyIdentifier.from_public_key(LEAF_KEY.public_key())
    )
    issuer_ski = ext(BUNDLE.intermediate, x509.SubjectKeyIdentifier).value
    assert ext(LEAF, x509.AuthorityKeyIdentifier).value.key_identifier == issuer_ski.digest


def test_chain_verifies_to_the_root_as_client_and_as_server() -> None:
    builder = verification.PolicyBuilder().store(verification.Store([BUNDLE.root])).time(NOW)
    client = builder.build_client_verifier().verify(LEAF, [INTERMEDIATE])
    assert client.subjects is not None
    assert x509.UniformResourceIdentifier(PLAN.spiffe_id) in client.subjects
    assert len(client.chain) == 3
    server = builder.build_server_verifier(x509.DNSName("frontend.web.svc"))
    assert len(server.verify(LEAF, [INTERMEDIATE])) == 3


def test_chain_from_a_single_self_signed_ca_is_the_leaf_alone() -> None:
    assert BUNDLE.root_key is not None
    single = dataclasses.replace(ISSUER, certificate=BUNDLE.root, key=BUNDLE.root_key)
    plan = dataclasses.replace(PLAN, not_after=NOW + dt.timedelta(hours=2))
    chain = chain_of(certs.sign_leaf(plan, single, serial=7))
    assert len(chain) == 1
    chain[0].verify_directly_issued_by(BUNDLE.root)


def setter_built(plan: model.LeafPlan, issuer: model.IssuingCA, serial: int) -> bytes:
    """The leaf's to-be-signed part as CertificateBuilder's own setters build it (each checking
    its argument), for the same plan: what `sign_leaf` must equal byte for byte."""
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(plan.spiffe_id)]
    sans += [x509.DNSName(name) for name in plan.dns_names]
    rsa_key = isinstance(plan.public_key, rsa.RSAPublicKey)
    ski = issuer.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(issuer.certificate.subject)
        .public_key(plan.public_key)
        .serial_number(serial)
        .not_valid_before(plan.not_before)
        .not_valid_after(plan.not_after)
        .add_extension(x509.SubjectAlternativeName(sans), critical=True)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=rsa_key,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(plan.public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski.value),
            critical=False,
        )
        .sign(issuer.key, certs.signature_hash(issuer.key))
    )
    return leaf.tbs_certificate_bytes


@pytest.mark.parametrize(
    "plan",
    [
        pytest.param(PLAN, id="ECDSA leaf with DNS names"),
        pytest.param(
            dataclasses.replace(PLAN, public_key=RSA_LEAF_KEY.public_key(), dns_names=()),
            id="RSA leaf, SPIFFE ID alone",
        ),
        pytest.param(
            dataclasses.replace(
                PLAN,
                not_before=PLAN.not_before.astimezone(dt.timezone(dt.timedelta(hours=-5))),
            ),
            id="times in another zone",
        ),
    ],
)
def test_leaf_is_byte_for_byte_what_the_builders_setters_make(plan: model.LeafPlan) -> None:
    leaf = chain_of(certs.sign_leaf(plan, ISSUER, serial=2**128 - 1))[0]
    assert leaf.tbs_certificate_bytes == setter_built(plan, ISSUER, 2**128 - 1)


@pytest.mark.parametrize(
    "serial",
    [
        pytest.param(0, id="zero"),
        pytest.param(-1, id="negative"),
        pytest.param(2**159, id="more than 20 octets"),
    ],
)
def test_serials_rfc_5280_forbids_are_refused(serial: int) -> None:
    with pytest.raises(ValueError, match="serial"):
        certs.sign_leaf(PLAN, ISSUER, serial=serial)


@pytest.mark.parametrize(
    ("ca_key_type", "expected"),
    [
        pytest.param("ECDSAP256", hashes.SHA256, id="P-256 CA signs with SHA-256"),
        pytest.param("ECDSAP384", hashes.SHA384, id="P-384 CA signs with SHA-384"),
        pytest.param("RSA3072", hashes.SHA256, id="RSA CA signs with SHA-256"),
        pytest.param("ED25519", type(None), id="Ed25519 CA signs with no separate hash"),
    ],
)
def test_signature_hash_follows_the_issuer_key(
    ca_key_type: ca.CAKeyType, expected: type[object]
) -> None:
    issuer = ca.issuing_ca(ca.new_ca("hash test", NOW, key_type=ca_key_type))
    leaf = chain_of(certs.sign_leaf(PLAN, issuer, serial=1))[0]
    assert isinstance(leaf.signature_hash_algorithm, expected)
    leaf.verify_directly_issued_by(issuer.certificate)


@pytest.mark.parametrize(
    "plan",
    [
        pytest.param(
            dataclasses.replace(PLAN, not_before=PLAN.not_before.replace(microsecond=5)),
            id="refuses fractional seconds",
        ),
        pytest.param(
            dataclasses.replace(PLAN, not_after=PLAN.not_after.replace(tzinfo=None)),
            id="refuses naive datetimes",
        ),
        pytest.param(
            dataclasses.replace(PLAN, not_after=PLAN.not_before), id="refuses an empty window"
        ),
        pytest.param(
            dataclasses.replace(
                PLAN, not_after=BUNDLE.intermediate.not_valid_after_utc + dt.timedelta(seconds=1)
            ),
            id="refuses to outlive the issuer",
        ),
    ],
)
def test_plans_decide_never_makes_are_programming_errors(plan: model.LeafPlan) -> None:
    with pytest.raises(ValueError, match="plan"):
        certs.sign_leaf(plan, ISSUER, serial=1)


def test_random_serial_is_positive_128_bit_and_reproducible_with_an_rng() -> None:
    assert certs.random_serial(random.Random(1)) == certs.random_serial(random.Random(1))
    serials = {certs.random_serial() for _ in range(100)}
    assert len(serials) == 100
    assert all(0 < s < 2**128 for s in serials)


def test_lifetime_window_backdates_truncates_and_caps() -> None:
    now = NOW + dt.timedelta(microseconds=999_999)
    not_before, not_after = certs.lifetime_window(
        now,
        backdate=dt.timedelta(seconds=60),
        max_lifetime=dt.timedelta(hours=24),
        issuer_not_after=NOW + dt.timedelta(days=30),
    )
    assert not_before == NOW - dt.timedelta(seconds=60)
    assert not_after == not_before + dt.timedelta(hours=24)


def test_lifetime_window_ends_with_the_issuer() -> None:
    issuer_end = NOW + dt.timedelta(hours=5, microseconds=10)
    _, not_after = certs.lifetime_window(
        NOW,
        backdate=dt.timedelta(seconds=60),
        max_lifetime=dt.timedelta(hours=24),
        issuer_not_after=issuer_end,
    )
    assert not_after == NOW + dt.timedelta(hours=5)


def test_begin_refresh_at_is_a_function_of_the_request_uid() -> None:
    start, end = NOW, NOW + dt.timedelta(hours=24)
    first = certs.begin_refresh_at("uid-1", start, end)
    assert first == certs.begin_refresh_at("uid-1", start, end)
    others = {certs.begin_refresh_at(f"uid-{i}", start, end) for i in range(50)}
    assert len(others) > 40  # jitter spreads pods started together
    # Half the lifetime, +/- 10 %.
    assert all(
        start + dt.timedelta(hours=9.6) <= t <= start + dt.timedelta(hours=14.4) for t in others
    )


def test_begin_refresh_at_refuses_windows_without_room_for_the_margins() -> None:
    with pytest.raises(ValueError, match="too short"):
        certs.begin_refresh_at("uid", NOW, NOW + dt.timedelta(minutes=19))


@settings(max_examples=300, deadline=None)
@given(
    uid=st.text(),
    not_before=st.datetimes(
        min_value=dt.datetime(2000, 1, 1),
        max_value=dt.datetime(2100, 1, 1),
        timezones=st.just(dt.UTC),
    ),
    # At least 20 min + 2 s, so whole seconds remain inside both margins for any sub-second ends.
    lifetime=st.integers(min_value=(20 * 60 + 2) * 1_000_000, max_value=7862400 * 1_000_000).map(
        lambda us: dt.timedelta(microseconds=us)
    ),
    fraction=st.floats(min_value=0.0, max_value=1.0),
    jitter=st.floats(min_value=0.0, max_value=1.0),
)
def test_begin_refresh_at_always_lies_in_the_window_the_api_server_accepts(
    uid: str,
    not_before: dt.datetime,
    lifetime: dt.timedelta,
    fraction: float,
    jitter: float,
) -> None:
    not_after = not_before + lifetime
    refresh = certs.begin_refresh_at(uid, not_before, not_after, fraction, jitter)
    assert refresh.microsecond == 0
    assert not_before + certs.REFRESH_MARGIN <= refresh <= not_after - certs.REFRESH_MARGIN
