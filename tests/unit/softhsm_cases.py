"""signer.authority.tokenkeys against a real SoftHSM2 token: the CA key is made inside it,
cannot leave it, and signs certificates that chain and verify like in-memory ones.

Run in a process of their own by test_signer_tokenkeys.py: SoftHSM2, once loaded, changes
OpenSSL's process-wide state (encrypted PEM keys of later tests then fail to decrypt)."""

from __future__ import annotations

import datetime as dt
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import verification

from podcert.api import keys
from podcert.errors import ConfigError
from signer import build, certs, model
from signer.authority import ca, pkcs11uri, schedule, tokenkeys
from signer.authority.tokenkeys import TokenConfigError, TokenError, TokenSession
from tests import softhsm

NOW = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)
# SoftHSM reads its token directory once per process: every token this module uses is made
# before the first is opened; each test then makes keys of its own names in them.
TOKEN = "podcert-unit"
UNTOUCHED = "podcert-unit-untouched"


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[softhsm.Tokens]:
    made = softhsm.make(tmp_path_factory.mktemp("softhsm"))
    made.init_token(TOKEN)
    made.init_token(UNTOUCHED)
    before = os.environ.get("SOFTHSM2_CONF")
    os.environ["SOFTHSM2_CONF"] = str(made.conf)
    yield made
    if before is None:
        del os.environ["SOFTHSM2_CONF"]
    else:
        os.environ["SOFTHSM2_CONF"] = before


def _session(tokens: softhsm.Tokens, object_label: str | None = None) -> TokenSession:
    uri = pkcs11uri.parse(f"pkcs11:token={TOKEN};object={object_label or uuid.uuid4().hex}")
    return TokenSession(uri, tokenkeys.read_pin(tokens.pin_file), module_path=softhsm.MODULE)


def test_a_generated_key_is_p256_sensitive_and_never_extractable(tokens: softhsm.Tokens) -> None:
    key = _session(tokens).generate()
    assert key.curve.name == "secp256r1"
    assert key.protected
    with pytest.raises(TokenError, match="not extractable"):
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    with pytest.raises(TokenError, match="not extractable"):
        key.private_numbers()


def test_a_key_is_found_again_by_its_uri_and_not_generated_twice(tokens: softhsm.Tokens) -> None:
    label = uuid.uuid4().hex
    made = _session(tokens, label).generate()
    found = _session(tokens, label).key()
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert found.public_key().public_bytes(*spki) == made.public_key().public_bytes(*spki)
    with pytest.raises(TokenConfigError, match="already holds"):
        _session(tokens, label).generate()


def test_a_missing_key_stops_with_one_line_naming_the_token(tokens: softhsm.Tokens) -> None:
    with pytest.raises(TokenConfigError, match=f"token '{TOKEN}' holds no such EC key") as info:
        _session(tokens).key()
    assert "\n" not in str(info.value)


def test_a_wrong_pin_stops_with_one_line_naming_the_pin(tokens: softhsm.Tokens) -> None:
    uri = pkcs11uri.parse(f"pkcs11:token={UNTOUCHED};object=ca")
    with pytest.raises(TokenConfigError, match=f"token '{UNTOUCHED}': the PIN is wrong") as info:
        TokenSession(uri, "not-the-pin", module_path=softhsm.MODULE)
    assert "not-the-pin" not in str(info.value)


def test_an_unknown_token_or_module_is_named(tokens: softhsm.Tokens, tmp_path: Path) -> None:
    uri = pkcs11uri.parse("pkcs11:token=nowhere;object=ca")
    with pytest.raises(TokenConfigError, match="no token labelled 'nowhere'"):
        TokenSession(uri, softhsm.PIN, module_path=softhsm.MODULE)
    with pytest.raises(TokenConfigError, match=r"PKCS#11 module .*nothing\.so"):
        TokenSession(uri, softhsm.PIN, module_path=str(tmp_path / "nothing.so"))


def test_a_pin_file_is_read_without_its_newline_and_an_empty_one_is_named(tmp_path: Path) -> None:
    (tmp_path / "pin").write_text("1234\n")
    assert tokenkeys.read_pin(tmp_path / "pin") == "1234"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(TokenConfigError, match="empty"):
        tokenkeys.read_pin(tmp_path / "empty")
    with pytest.raises(TokenConfigError, match="cannot be read"):
        tokenkeys.read_pin(tmp_path / "absent")


def test_a_certificate_signed_in_the_token_verifies_and_parses_as_cryptography_built_it(
    tokens: softhsm.Tokens,
) -> None:
    key = _session(tokens).generate()
    root = ca.new_ca("token test", NOW)
    bundle = ca.new_intermediate(root, NOW, key=key)
    intermediate = bundle.intermediate
    intermediate.verify_directly_issued_by(root.root)
    assert intermediate.public_key() == key.public_key()
    # A self-signed certificate pins the token's signature encoding (DER ECDSA-Sig-Value over
    # the TBS cryptography built): it verifies with the token key's own public key.
    self_signed = (
        x509.CertificateBuilder()
        .subject_name(intermediate.subject)
        .issuer_name(intermediate.subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(NOW)
        .not_valid_after(NOW + dt.timedelta(days=1))
        .sign(key, certs.signature_hash(key))
    )
    self_signed.verify_directly_issued_by(self_signed)
    reparsed = x509.load_der_x509_certificate(self_signed.public_bytes(serialization.Encoding.DER))
    assert reparsed.tbs_certificate_bytes == self_signed.tbs_certificate_bytes
    key.public_key().verify(
        self_signed.signature,
        self_signed.tbs_certificate_bytes,
        ec.ECDSA(self_signed.signature_hash_algorithm),  # type: ignore[arg-type]
    )


def test_a_leaf_signed_through_the_token_verifies_against_the_root(
    tokens: softhsm.Tokens,
) -> None:
    key = _session(tokens).generate()
    bundle = ca.new_intermediate(ca.new_ca("token test", NOW), NOW, key=key)
    leaf_key = keys.generate("ECDSAP256")
    plan = model.LeafPlan(
        public_key=leaf_key.public_key(),
        spiffe_id="spiffe://cluster.local/ns/web/sa/frontend",
        dns_names=(),
        not_before=NOW,
        not_after=NOW + dt.timedelta(hours=24),
        begin_refresh_at=NOW + dt.timedelta(hours=12),
    )
    leaf, intermediate = x509.load_pem_x509_certificates(
        certs.sign_leaf(plan, ca.issuing_ca(bundle), serial=4711).encode()
    )
    verifier = (
        verification.PolicyBuilder()
        .store(verification.Store([bundle.root]))
        .time(NOW + dt.timedelta(hours=1))
        .build_client_verifier()
    )
    verified = verifier.verify(leaf, [intermediate])
    assert verified.chain[-1] == bundle.root
    assert leaf.extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    ).value.get_values_for_type(x509.UniformResourceIdentifier) == [plan.spiffe_id]


def test_the_ca_secret_holds_the_token_keys_uris_and_no_private_key(
    tokens: softhsm.Tokens,
) -> None:
    source = tokenkeys.TokenKeys(
        pkcs11uri.parse(f"pkcs11:token={TOKEN};object=ca-{uuid.uuid4().hex}"), softhsm.PIN
    )
    key, root_key = source.new_key("gen1"), source.new_key("root-gen1")
    bundle = ca.new_ca("token test", NOW, intermediate_key=key, root_key=root_key)
    bundle.intermediate.verify_directly_issued_by(bundle.root)
    bundle.root.verify_directly_issued_by(bundle.root)
    data = ca.to_secret_data(bundle)
    assert ca.TLS_KEY not in data and ca.CA_KEY not in data
    assert data[ca.TLS_KEY_URI] == key.key_uri.encode()
    assert data[ca.CA_KEY_URI] == root_key.key_uri.encode()
    assert key.key_uri.startswith(f"pkcs11:token={TOKEN};object=ca-")
    assert "pin" not in key.key_uri + root_key.key_uri
    assert b"PRIVATE KEY" not in b"".join(data.values())

    loaded = ca.from_secret_data(data, source.resolve)
    assert loaded.intermediate_key.public_key() == key.public_key()
    assert loaded.root_key is not None and loaded.root_key.public_key() == root_key.public_key()
    assert loaded.intermediate == bundle.intermediate
    with pytest.raises(ca.CAError, match=r"tls\.key-uri: the CA's key is in a PKCS#11"):
        ca.from_secret_data(data)
    swapped = {**data, ca.CA_KEY_URI: data[ca.TLS_KEY_URI]}
    with pytest.raises(ca.CAError, match=r"ca\.key-uri: the private key does not match"):
        ca.from_secret_data(swapped, source.resolve)
    with pytest.raises(ca.CAError, match=r"ca\.key-uri: .*holds no such EC key"):
        ca.from_secret_data(
            {**data, ca.CA_KEY_URI: f"pkcs11:token={TOKEN};object=gone".encode()}, source.resolve
        )


def test_a_secret_naming_another_token_or_a_missing_key_is_refused_by_field(
    tokens: softhsm.Tokens,
) -> None:
    source = tokenkeys.TokenKeys(pkcs11uri.parse(f"pkcs11:token={TOKEN};object=ca"), softhsm.PIN)
    with pytest.raises(ca.CAError, match=r"tls\.key-uri: names token 'elsewhere'"):
        source.resolve("pkcs11:token=elsewhere;object=ca-x")
    with pytest.raises(ca.CAError, match=r"tls\.key-uri: .*holds no such EC key"):
        source.resolve(f"pkcs11:token={TOKEN};object=never-made")


def test_rotations_secret_round_trips_token_keys_per_generation(tokens: softhsm.Tokens) -> None:
    source = tokenkeys.TokenKeys(
        pkcs11uri.parse(f"pkcs11:token={TOKEN};object=rot-{uuid.uuid4().hex}"), softhsm.PIN
    )

    def fresh(n: int) -> ca.CABundle:
        at = NOW + dt.timedelta(hours=n)
        intermediate, root = source.new_key(f"g{n}"), source.new_key(f"root-g{n}")
        return ca.new_ca("token test", at, intermediate_key=intermediate, root_key=root)

    settings = schedule.DEFAULT_SETTINGS
    gens = schedule.apply([], schedule.Prepare(), NOW, settings, fresh(0))
    later = NOW + dt.timedelta(hours=1)
    gens = schedule.apply(gens, schedule.Prepare(), later, settings, fresh(1))
    gens = schedule.apply(gens, schedule.Activate(gens[1].id), later, settings)
    data = schedule.to_secret(gens)
    assert [g.state for g in gens] == ["retired", "active"]
    assert not any(name.endswith((".key", "tls.key")) for name in data)
    assert b"PRIVATE KEY" not in b"".join(data.values())
    again = schedule.from_secret(data, NOW, source.resolve)
    assert [g.bundle.intermediate for g in again] == [g.bundle.intermediate for g in gens]
    assert all(isinstance(g.bundle.intermediate_key, tokenkeys.TokenKey) for g in again)
    assert all(isinstance(g.bundle.root_key, tokenkeys.TokenKey) for g in again)


def test_the_signer_start_up_stops_with_one_line_on_a_wrong_pin_or_uri(
    tokens: softhsm.Tokens, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong-pin"
    wrong.write_text("not-the-pin\n")
    uri = f"pkcs11:token={UNTOUCHED};object=ca"
    with pytest.raises(ConfigError, match=f"^--ca-key-uri: token '{UNTOUCHED}': the PIN is wrong$"):
        build.token_keys(uri, wrong)
    with pytest.raises(ConfigError, match=r"^--ca-key-uri: key URI: token= .* is required$"):
        build.token_keys("pkcs11:object=ca", wrong)
    with pytest.raises(ConfigError, match="--ca-key-pin-file or a pin-source"):
        build.token_keys(uri, None)
    assert build.token_keys("", None) is None


def test_a_signature_the_token_refuses_is_a_retryable_key_unavailable(
    tokens: softhsm.Tokens,
) -> None:
    session = _session(tokens)
    key = session.generate()
    session.close()  # the token's session is gone, as when the token is unplugged
    bundle = ca.new_intermediate(ca.new_ca("token test", NOW), NOW - dt.timedelta(days=1))
    plan = model.LeafPlan(
        public_key=keys.generate("ECDSAP256").public_key(),
        spiffe_id="spiffe://cluster.local/ns/web/sa/frontend",
        dns_names=(),
        not_before=NOW,
        not_after=NOW + dt.timedelta(hours=1),
        begin_refresh_at=NOW + dt.timedelta(minutes=30),
    )
    issuer = model.IssuingCA(certificate=bundle.intermediate, key=key, root=bundle.root)
    with pytest.raises(model.KeyUnavailable, match=f"token '{TOKEN}' refused a signature"):
        certs.sign_leaf(plan, issuer, serial=1)
    # The next signature opens a session again and finds the key by its label: the token is back.
    leaf = x509.load_pem_x509_certificates(certs.sign_leaf(plan, issuer, serial=2).encode())[0]
    assert leaf.public_key() == plan.public_key


def test_a_token_whose_files_went_away_signs_again_once_they_are_back(
    tokens: softhsm.Tokens, tmp_path: Path
) -> None:
    source = tokenkeys.TokenKeys(
        pkcs11uri.parse(f"pkcs11:token={TOKEN};object=away-{uuid.uuid4().hex}"), softhsm.PIN
    )
    key, root_key = source.new_key("g"), source.new_key("root-g")
    algorithm = ec.ECDSA(certs.signature_hash(key))  # type: ignore[arg-type]
    token_dirs = sorted(p for p in tokens.directory.iterdir() if p.is_dir())
    away = tmp_path / "away"
    away.mkdir()
    for found in token_dirs:
        found.rename(away / found.name)
    try:
        with pytest.raises(TokenError, match=f"token '{TOKEN}' refused a signature"):
            key.sign(b"tbs", algorithm)
        with pytest.raises(TokenError, match=f"token '{TOKEN}': cannot be reached again"):
            key.sign(b"tbs", algorithm)
    finally:
        for found in token_dirs:
            (away / found.name).rename(found)
    # Back: the module is initialised again (at most once a second) and both keys sign.
    deadline = time.monotonic() + 10
    while True:
        try:
            signature = key.sign(b"tbs", algorithm)
            break
        except TokenError:
            assert time.monotonic() < deadline, "the token never signed again"
            time.sleep(0.2)
    key.public_key().verify(signature, b"tbs", algorithm)
    root_key.public_key().verify(root_key.sign(b"tbs", algorithm), b"tbs", algorithm)
