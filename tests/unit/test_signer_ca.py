"""signer.authority.ca: the hierarchy we make, and the Secret we load it from or store it in."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bundles.formats import dump_private_key
from podcert.api import keys
from signer import certs, model
from signer.authority import ca
from tests.ca_secrets import Held

NOW = dt.datetime(2026, 11, 29, 12, 0, 30, 250_000, tzinfo=dt.UTC)
BUNDLE = ca.new_ca("podcert test", NOW)
OTHER = ca.new_ca("someone else", NOW)


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def constraints(cert: x509.Certificate) -> x509.Extension[x509.BasicConstraints]:
    return cert.extensions.get_extension_for_class(x509.BasicConstraints)


def key_usage(cert: x509.Certificate) -> x509.Extension[x509.KeyUsage]:
    return cert.extensions.get_extension_for_class(x509.KeyUsage)


def ski(cert: x509.Certificate) -> bytes:
    return cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest


def test_root_is_a_self_signed_ca_that_may_sign_one_level_of_cas() -> None:
    root = BUNDLE.root
    root.verify_directly_issued_by(root)
    assert constraints(root).critical
    assert constraints(root).value.ca and constraints(root).value.path_length == 1
    assert root.subject.rfc4514_string() == "CN=podcert test root"


def test_intermediate_is_signed_by_the_root_and_signs_only_leaves() -> None:
    intermediate = BUNDLE.intermediate
    intermediate.verify_directly_issued_by(BUNDLE.root)
    assert constraints(intermediate).critical
    assert constraints(intermediate).value.ca
    assert constraints(intermediate).value.path_length == 0
    aki = intermediate.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == ski(BUNDLE.root)


@pytest.mark.parametrize("which", ["root", "intermediate"])
def test_ca_keys_only_sign_certificates_and_crls(which: str) -> None:
    usage = key_usage(getattr(BUNDLE, which))
    assert usage.critical
    assert usage.value.key_cert_sign and usage.value.crl_sign
    assert not usage.value.digital_signature and not usage.value.key_encipherment


def test_validity_comes_from_now_and_the_lifetimes_in_whole_seconds() -> None:
    start = dt.datetime(2026, 11, 29, 11, 55, 30, tzinfo=dt.UTC)  # backdated 5 min, truncated
    assert BUNDLE.root.not_valid_before_utc == start
    assert BUNDLE.root.not_valid_after_utc == start + dt.timedelta(days=365, minutes=5)
    assert BUNDLE.intermediate.not_valid_before_utc == start
    assert BUNDLE.intermediate.not_valid_after_utc == start + dt.timedelta(days=90, minutes=5)
    assert BUNDLE.not_after == BUNDLE.intermediate.not_valid_after_utc


def test_intermediate_never_outlives_the_root() -> None:
    bundle = ca.new_ca(
        "short",
        NOW,
        root_lifetime=dt.timedelta(days=10),
        intermediate_lifetime=dt.timedelta(days=90),
    )
    assert bundle.intermediate.not_valid_after_utc == bundle.root.not_valid_after_utc


def test_default_keys_are_p256() -> None:
    key = BUNDLE.intermediate_key
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    assert key.curve.name == "secp256r1"


@pytest.mark.parametrize("key_type", ["ECDSAP384", "ECDSAP521", "ED25519"])
def test_other_ca_key_types(key_type: ca.CAKeyType) -> None:
    bundle = ca.new_ca("typed", NOW, key_type=key_type)
    bundle.intermediate.verify_directly_issued_by(bundle.root)
    assert ca.from_secret_data(ca.to_secret_data(bundle)).intermediate == bundle.intermediate


def test_new_intermediate_rotates_under_the_same_root() -> None:
    later = NOW + dt.timedelta(days=60)
    rotated = ca.new_intermediate(BUNDLE, later)
    rotated.intermediate.verify_directly_issued_by(BUNDLE.root)
    assert rotated.root == BUNDLE.root
    assert rotated.intermediate != BUNDLE.intermediate
    assert "intermediate 2027-01-28T12:00:30Z" in rotated.intermediate.subject.rfc4514_string()
    assert rotated.intermediate.subject.rfc4514_string().startswith("CN=podcert test ")


def test_new_intermediate_needs_the_root_key() -> None:
    with pytest.raises(ca.CAError, match=r"ca\.key"):
        ca.new_intermediate(dataclasses.replace(BUNDLE, root_key=None), NOW)


def test_issuing_ca_is_the_intermediate_with_its_key_and_root() -> None:
    issuing = ca.issuing_ca(BUNDLE)
    assert issuing == model.IssuingCA(BUNDLE.intermediate, BUNDLE.intermediate_key, BUNDLE.root)
    assert issuing.not_after == BUNDLE.intermediate.not_valid_after_utc


@pytest.mark.parametrize(
    "holder",
    [
        pytest.param(BUNDLE, id="CABundle"),
        pytest.param(ca.issuing_ca(BUNDLE), id="IssuingCA"),
    ],
)
def test_repr_never_shows_a_private_key(holder: object) -> None:
    text = repr(holder) + str(holder)
    assert "key" not in text.lower()
    assert "PRIVATE" not in text


def test_secret_data_round_trips() -> None:
    data = ca.to_secret_data(BUNDLE)
    assert set(data) == {"tls.crt", "tls.key", "ca.crt", "ca.key"}
    assert data["tls.crt"] == pem(BUNDLE.intermediate)
    assert data["ca.crt"] == pem(BUNDLE.root)
    assert data["tls.key"].startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8
    loaded = ca.from_secret_data(data)
    assert ca.to_secret_data(loaded) == data


def test_operator_ca_without_root_key_loads_with_root_key_none() -> None:
    data = ca.to_secret_data(BUNDLE)
    del data["ca.key"]
    loaded = ca.from_secret_data(data)
    assert loaded.root_key is None
    assert "ca.key" not in ca.to_secret_data(loaded)


def test_single_self_signed_ca_issues_chains_of_one() -> None:
    root_only = {
        "tls.crt": pem(BUNDLE.root),
        "tls.key": ca.to_secret_data(BUNDLE)["ca.key"],
        "ca.crt": pem(BUNDLE.root),
    }
    loaded = ca.from_secret_data(root_only)
    assert loaded.root == loaded.intermediate
    plan = model.LeafPlan(
        public_key=keys.generate("ED25519").public_key(),
        spiffe_id="spiffe://cluster.local/ns/a/sa/b",
        dns_names=(),
        not_before=dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC),
        not_after=dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC),
        begin_refresh_at=dt.datetime(2026, 11, 30, 0, 0, tzinfo=dt.UTC),
    )
    chain = x509.load_pem_x509_certificates(
        certs.sign_leaf(plan, ca.issuing_ca(loaded), 1).encode()
    )
    assert len(chain) == 1


def test_full_chain_in_tls_crt_is_accepted() -> None:
    data = ca.to_secret_data(BUNDLE)
    data["tls.crt"] += pem(BUNDLE.root)
    assert ca.from_secret_data(data).intermediate == BUNDLE.intermediate


def broken(**changes: bytes | None) -> dict[str, bytes]:
    data = ca.to_secret_data(BUNDLE)
    for name, value in changes.items():
        field = name.replace("_", ".")
        if value is None:
            del data[field]
        else:
            data[field] = value
    return data


OTHER_DATA = ca.to_secret_data(OTHER)
ENCRYPTED_KEY = BUNDLE.intermediate_key.private_bytes(
    serialization.Encoding.PEM,
    serialization.PrivateFormat.PKCS8,
    serialization.BestAvailableEncryption(b"secret"),
)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(broken(tls_crt=None), r"^tls\.crt: missing", id="missing tls.crt"),
        pytest.param(broken(tls_key=None), r"^tls\.key: missing", id="missing tls.key"),
        pytest.param(broken(ca_crt=None), r"^ca\.crt: missing", id="missing ca.crt"),
        pytest.param(broken(tls_crt=b""), r"^tls\.crt: missing or empty", id="empty tls.crt"),
        pytest.param(broken(tls_crt=b"garbage"), r"^tls\.crt: not a PEM", id="garbage tls.crt"),
        pytest.param(broken(ca_crt=b"\x00\xff"), r"^ca\.crt: not a PEM", id="binary ca.crt"),
        pytest.param(broken(tls_key=b"garbage"), r"^tls\.key: not a PEM", id="garbage tls.key"),
        pytest.param(broken(ca_key=b"garbage"), r"^ca\.key: not a PEM", id="garbage ca.key"),
        pytest.param(
            broken(tls_key=ENCRYPTED_KEY), r"^tls\.key: .*encrypted", id="encrypted tls.key"
        ),
        pytest.param(
            broken(tls_key=OTHER_DATA["tls.key"]),
            r"^tls\.key: the private key does not match the certificate in tls\.crt",
            id="tls.key belongs to another CA",
        ),
        pytest.param(
            broken(ca_key=OTHER_DATA["ca.key"]),
            r"^ca\.key: the private key does not match the certificate in ca\.crt",
            id="ca.key belongs to another root",
        ),
        pytest.param(
            broken(ca_crt=OTHER_DATA["ca.crt"]),
            r"^tls\.crt: the issuing CA .* is not signed by the root in ca\.crt",
            id="intermediate not signed by the root",
        ),
        pytest.param(
            broken(ca_crt=pem(BUNDLE.root) + pem(OTHER.root)),
            r"^ca\.crt: holds 2 certificates",
            id="two roots",
        ),
        pytest.param(
            broken(tls_crt=pem(BUNDLE.intermediate) + pem(OTHER.intermediate)),
            r"^tls\.crt: certificate 1 .* is not signed by the one after it",
            id="deeper chain in tls.crt that does not chain",
        ),
    ],
)
def test_unusable_secrets_name_the_field(data: dict[str, bytes], message: str) -> None:
    with pytest.raises(ca.CAError, match=message):
        ca.from_secret_data(data)


def test_a_leaf_certificate_is_not_accepted_as_the_issuing_ca() -> None:
    leaf_key = keys.generate("ECDSAP256")
    plan = model.LeafPlan(
        public_key=leaf_key.public_key(),
        spiffe_id="spiffe://cluster.local/ns/a/sa/b",
        dns_names=(),
        not_before=dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC),
        not_after=dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC),
        begin_refresh_at=dt.datetime(2026, 11, 30, 0, 0, tzinfo=dt.UTC),
    )
    leaf_pem = certs.sign_leaf(plan, ca.issuing_ca(BUNDLE), 1).encode()
    data = broken(
        tls_crt=leaf_pem.split(b"-----END CERTIFICATE-----")[0] + b"-----END CERTIFICATE-----\n"
    )
    data["tls.key"] = dump_private_key(leaf_key)
    with pytest.raises(ca.CAError, match=r"^tls\.crt: .* is not a CA certificate"):
        ca.from_secret_data(data)


def test_key_errors_never_quote_the_key() -> None:
    key_pem = ca.to_secret_data(BUNDLE)["tls.key"]
    mangled = key_pem[:60] + b"!!" + key_pem[62:]
    with pytest.raises(ca.CAError) as caught:
        ca.from_secret_data(broken(tls_key=mangled))
    assert key_pem[30:50].decode() not in str(caught.value)


def test_keys_held_elsewhere_are_stored_as_uris_and_found_again_by_field() -> None:
    intermediate, root = Held("pkcs11:token=t;object=i"), Held("pkcs11:token=t;object=r")
    bundle = ca.new_ca("held", NOW, intermediate_key=intermediate, root_key=root)
    bundle.intermediate.verify_directly_issued_by(bundle.root)
    data = ca.to_secret_data(bundle)
    assert data[ca.TLS_KEY_URI] == b"pkcs11:token=t;object=i"
    assert data[ca.CA_KEY_URI] == b"pkcs11:token=t;object=r"
    assert ca.TLS_KEY not in data and ca.CA_KEY not in data
    assert b"PRIVATE KEY" not in b"".join(data.values())

    asked: list[tuple[str, str]] = []

    def resolve(uri: str, field: str) -> ca.CAKey:
        asked.append((uri, field))
        return {"pkcs11:token=t;object=i": intermediate, "pkcs11:token=t;object=r": root}[uri]

    loaded = ca.from_secret_data(data, resolve)
    assert loaded.root_key is root and loaded.intermediate_key is intermediate
    assert sorted(asked) == [
        ("pkcs11:token=t;object=i", ca.TLS_KEY_URI),
        ("pkcs11:token=t;object=r", ca.CA_KEY_URI),
    ]
    with pytest.raises(ca.CAError, match=r"^ca\.key-uri: the private key does not match"):
        ca.from_secret_data(data, lambda uri, field: intermediate)
    with pytest.raises(ca.CAError, match=r"^ca\.key-uri: given with ca\.key"):
        ca.from_secret_data(
            {**data, ca.CA_KEY: dump_private_key(keys.generate("ECDSAP256"))}, resolve
        )
    only_root_held = ca.to_secret_data(ca.new_ca("held", NOW, root_key=Held("pkcs11:token=t")))
    assert ca.TLS_KEY in only_root_held and ca.CA_KEY not in only_root_held
    with pytest.raises(ca.CAError, match=r"^ca\.key-uri: the CA's key is in a PKCS#11 token"):
        ca.from_secret_data(only_root_held)


def test_a_secret_of_keys_in_a_token_reads_without_it_for_its_certificates_only() -> None:
    intermediate, root = Held("pkcs11:token=t;object=i"), Held("pkcs11:token=t;object=r")
    bundle = ca.new_ca("held", NOW, intermediate_key=intermediate, root_key=root)
    loaded = ca.from_secret_data(ca.to_secret_data(bundle), unopened=True)
    assert (loaded.root, loaded.intermediate) == (bundle.root, bundle.intermediate)
    assert isinstance(loaded.intermediate_key, ca.Unopened)
    assert loaded.intermediate_key.public_key() == intermediate.public_key()
    assert ca.to_secret_data(loaded) == ca.to_secret_data(bundle)  # the same URIs
    with pytest.raises(model.KeyUnavailable, match="signs nothing"):
        ca.new_intermediate(loaded, NOW)
