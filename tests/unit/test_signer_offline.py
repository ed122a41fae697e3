"""signer.authority.offline: the CSR we hand out, and each reason a signed chain is refused."""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
from pathlib import Path
from typing import cast

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from signer import certs, model
from signer.authority import ca, offline, schedule
from signer.authority.castore import CAStore
from signer.kube import SignerKube
from signer.report import status
from tests.ca_secrets import HeldKeys, SecretKube

NOW = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)
TD = "example.org"
COVER = dt.timedelta(days=1, hours=1)
KEY = ec.generate_private_key(ec.SECP256R1())


def _usage(cert_sign: bool = True) -> x509.KeyUsage:
    return x509.KeyUsage(False, False, False, False, False, cert_sign, True, False, False)


def make_ca(
    name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None,
    *,
    ca: bool = True,
    path_length: int | None = None,
    cert_sign: bool = True,
    uris: tuple[str, ...] = (),
    not_before: dt.datetime = NOW - dt.timedelta(hours=1),
    not_after: dt.datetime = NOW + dt.timedelta(days=30),
) -> x509.Certificate:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_name, signing_key = (subject, key) if issuer is None else (issuer[0].subject, issuer[1])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=path_length), critical=True)
        .add_extension(_usage(cert_sign), critical=True)
    )
    if uris:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]),
            critical=False,
        )
    return builder.sign(signing_key, hashes.SHA256())


ROOT_KEY = ec.generate_private_key(ec.SECP256R1())
ROOT = make_ca("corp root", ROOT_KEY, path_length=None)
MID_KEY = ec.generate_private_key(ec.SECP256R1())
MID = make_ca("corp issuing", MID_KEY, (ROOT, ROOT_KEY), path_length=1)


def ours(**kwargs: object) -> x509.Certificate:
    return make_ca("podcert intermediate", KEY, (MID, MID_KEY), uris=(f"spiffe://{TD}",), **kwargs)  # type: ignore[arg-type]


def check(chain: list[x509.Certificate]) -> offline.SignedChain:
    return offline.check_signed_chain(chain, KEY, TD, NOW, COVER)


def test_csr_asks_for_a_leaf_only_ca_of_the_trust_domain_with_our_key() -> None:
    csr = offline.intermediate_csr(KEY, TD, "podcert intermediate")
    assert csr.is_signature_valid
    assert csr.public_key().public_numbers() == KEY.public_key().public_numbers()  # type: ignore[union-attr]
    bc = csr.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert (bc.ca, bc.path_length) == (True, 0)
    ku = csr.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.key_cert_sign and ku.crl_sign and not ku.digital_signature
    san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [f"spiffe://{TD}"]


def test_a_good_chain_is_split_into_ours_the_upstream_intermediates_and_the_root() -> None:
    mine = ours()
    got = check([mine, MID, ROOT])
    assert (got.intermediate, got.upstream, got.root) == (mine, (MID,), ROOT)


def test_an_intermediate_signed_by_the_root_directly_has_no_upstream_intermediates() -> None:
    mine = make_ca("podcert intermediate", KEY, (ROOT, ROOT_KEY))  # no SAN: allowed
    assert check([mine, ROOT]).upstream == ()


@pytest.mark.parametrize(
    ("chain", "field"),
    [
        pytest.param(
            lambda: [make_ca("x", MID_KEY, (MID, MID_KEY)), MID, ROOT],
            "chain[0].subjectPublicKeyInfo",
            id="another-key",
        ),
        pytest.param(lambda: [ours(ca=False), MID, ROOT], "chain[0].basicConstraints", id="not-ca"),
        pytest.param(
            lambda: [ours(cert_sign=False), MID, ROOT], "chain[0].keyUsage", id="no-keyCertSign"
        ),
        pytest.param(
            lambda: [
                make_ca("p", KEY, (MID, MID_KEY), uris=("spiffe://other.org",)),
                MID,
                ROOT,
            ],
            "chain[0].subjectAltName",
            id="other-trust-domain",
        ),
        pytest.param(
            lambda: [ours(not_after=NOW + dt.timedelta(hours=2)), MID, ROOT],
            "chain[0].notAfter",
            id="too-short-for-leaf-plus-overlap",
        ),
        pytest.param(
            lambda: [ours(not_before=NOW + dt.timedelta(hours=1)), MID, ROOT],
            "chain[0].notBefore",
            id="not-yet-valid",
        ),
        pytest.param(
            lambda: [
                ours(),
                make_ca(
                    "corp issuing", MID_KEY, (ROOT, ROOT_KEY), not_after=NOW + dt.timedelta(hours=3)
                ),
                ROOT,
            ],
            "chain[1].notAfter",
            id="upstream-intermediate-ends-too-soon",
        ),
        pytest.param(
            lambda: [ours(), MID],
            "chain[1]: 'corp issuing' is not a self-signed root",
            id="no-root",
        ),
        pytest.param(
            lambda: [ours(), ROOT], "chain[0].signature", id="wrong-order-or-missing-link"
        ),
        pytest.param(
            lambda: [
                ours(),
                make_ca("corp issuing", MID_KEY, (ROOT, ROOT_KEY), path_length=0),
                ROOT,
            ],
            "chain[1].basicConstraints: pathlen 0",
            id="upstream-pathlen-too-small",
        ),
        pytest.param(
            lambda: [ours(), make_ca("corp issuing", MID_KEY, (ROOT, ROOT_KEY), ca=False), ROOT],
            "chain[1].basicConstraints",
            id="upstream-not-ca",
        ),
    ],
)
def test_each_refusal_is_one_line_naming_the_field(chain: object, field: str) -> None:
    with pytest.raises(offline.ChainError) as err:
        check(chain())  # type: ignore[operator]
    message = str(err.value)
    assert message.startswith(field)
    assert "\n" not in message


def test_garbage_and_empty_chains_are_refused_by_name() -> None:
    with pytest.raises(offline.ChainError, match=r"^chain: not PEM"):
        offline.parse_chain(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    with pytest.raises(offline.ChainError, match=r"^chain: holds no certificate"):
        offline.parse_chain(b"")
    with pytest.raises(offline.ChainError, match=r"^chain: holds no certificate"):
        check([])


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")
def test_a_chain_signed_by_openssl_from_our_csr_is_accepted(tmp_path: Path) -> None:
    """openssl plays the operator's CA, as the runbook in docs/upstream-ca.md shows."""
    (tmp_path / "csr.pem").write_bytes(
        offline.csr_pem(offline.intermediate_csr(KEY, TD, "podcert intermediate"))
    )
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", tmp_path / "root.key", "-out", tmp_path / "root.pem", "-days", "3650",
        "-subj", "/CN=corp offline root",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    (tmp_path / "ext.cnf").write_text(
        "basicConstraints=critical,CA:TRUE,pathlen:0\n"
        "keyUsage=critical,keyCertSign,cRLSign\n"
        f"subjectAltName=URI:spiffe://{TD}\n"
    )
    _openssl(
        "x509", "-req", "-in", tmp_path / "csr.pem", "-CA", tmp_path / "root.pem",
        "-CAkey", tmp_path / "root.key", "-CAcreateserial", "-days", "30",
        "-extfile", tmp_path / "ext.cnf", "-out", tmp_path / "mine.pem",
    )  # fmt: skip
    pem = (tmp_path / "mine.pem").read_bytes() + (tmp_path / "root.pem").read_bytes()
    now = dt.datetime.now(dt.UTC)
    got = offline.check_signed_chain(offline.parse_chain(pem), KEY, TD, now, COVER)
    assert got.root.subject.rfc4514_string() == "CN=corp offline root"
    assert got.upstream == ()
    root_pem = got.root.public_bytes(serialization.Encoding.PEM)
    assert root_pem == (tmp_path / "root.pem").read_bytes()


def test_an_imported_generation_round_trips_the_secret_and_its_leaves_carry_the_upstream() -> None:
    """Leaf, our intermediate, the upstream's intermediates; never the upstream's root."""
    mine = ours()
    pending = offline.Pending("g1", TD, NOW, KEY, offline.intermediate_csr(KEY, TD, "p"))
    bundle = offline.imported_bundle(pending, check([mine, MID, ROOT]))
    data = ca.to_secret_data(bundle)
    assert ca.CA_KEY not in data  # no root key of ours
    again = ca.from_secret_data(data)
    assert (again.intermediate, again.upstream, again.root) == (mine, (MID,), ROOT)
    plan = model.LeafPlan(
        spiffe_id=f"spiffe://{TD}/ns/a/sa/b",
        dns_names=(),
        public_key=ec.generate_private_key(ec.SECP256R1()).public_key(),
        not_before=NOW,
        not_after=NOW + dt.timedelta(hours=1),
        begin_refresh_at=NOW + dt.timedelta(minutes=30),
    )
    chain = x509.load_pem_x509_certificates(
        certs.sign_leaf(plan, ca.issuing_ca(again), certs.random_serial()).encode()
    )
    assert chain[1:] == [mine, MID]
    chain[0].verify_directly_issued_by(mine)


def test_no_leaf_outlives_an_upstream_intermediate_that_ends_before_ours() -> None:
    short = make_ca(
        "corp issuing",
        MID_KEY,
        (ROOT, ROOT_KEY),
        path_length=1,
        not_after=NOW + dt.timedelta(days=3),
    )
    mine = ours()  # 30 days
    pending = offline.Pending("g1", TD, NOW, KEY, offline.intermediate_csr(KEY, TD, "p"))
    issuing = ca.issuing_ca(offline.imported_bundle(pending, check([mine, short, ROOT])))
    assert issuing.not_after == short.not_valid_after_utc


def test_an_imported_generations_key_has_a_name_of_its_own_in_the_index_secret() -> None:
    """`<id>.upstream.tls.key`, so 0.1.0 refuses the Secret (test_release_compat.py); the
    usual name is still read, and both at once are refused by name."""
    pending = offline.Pending("g1", TD, NOW, KEY, offline.intermediate_csr(KEY, TD, "p"))
    bundle = offline.imported_bundle(pending, check([ours(), MID, ROOT]))
    gen = schedule.Generation("g1", bundle, "active", NOW)
    data = schedule.to_secret([gen])
    assert "g1.upstream.tls.key" in data and "g1.tls.key" not in data
    assert [g.bundle.intermediate for g in schedule.from_secret(data, NOW)] == [bundle.intermediate]
    old = {k.replace("g1.upstream.tls.key", "g1.tls.key"): v for k, v in data.items()}
    assert [g.id for g in schedule.from_secret(old, NOW)] == ["g1"]
    both = {**data, "g1.tls.key": data["g1.upstream.tls.key"]}
    with pytest.raises(ca.CAError, match=r"^g1\.upstream\.tls\.key: given with g1\.tls\.key"):
        schedule.from_secret(both, NOW)


def test_a_pending_generation_round_trips_the_secret_and_is_carried_over() -> None:
    pending = offline.Pending("g2", TD, NOW, KEY, offline.intermediate_csr(KEY, TD, "p"))
    data = offline.pending_to_secret(pending)
    again = offline.pending_from_secret({**data, "tls.crt": b"x"})
    assert again is not None
    assert (again.id, again.trust_domain, again.since, again.csr) == ("g2", TD, NOW, pending.csr)
    assert offline.carried_over({**data, "tls.crt": b"x"}) == data
    assert offline.pending_from_secret({"tls.crt": b"x"}) is None
    with pytest.raises(ca.CAError, match=r"^offline\.pending\.json: not valid JSON"):
        offline.pending_from_secret({offline.PENDING_INDEX: b"{"})


def _sign_csr(csr: x509.CertificateSigningRequest) -> x509.Certificate:
    """The upstream (ROOT) signs the CSR as asked, copying its extensions."""
    builder = (
        x509.CertificateBuilder()
        .subject_name(csr.subject)
        .issuer_name(ROOT.subject)
        .public_key(csr.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - dt.timedelta(minutes=5))
        .not_valid_after(NOW + dt.timedelta(days=30))
    )
    for ext in csr.extensions:
        builder = builder.add_extension(ext.value, ext.critical)
    return builder.sign(ROOT_KEY, hashes.SHA256())


def test_the_store_keeps_a_generation_awaiting_its_chain_out_of_the_schedule_until_imported() -> (
    None
):
    kube = SecretKube(None)
    clock = [NOW]
    cas = CAStore(
        cast(SignerKube, kube), "podcert-system", "podcert-ca", lambda: clock[0], create=True
    )
    assert cas.load() is not None
    pending = cas.prepare_offline(TD)
    with pytest.raises(schedule.RotationError, match="already awaits its signed chain"):
        cas.prepare_offline(TD)
    # The schedule neither sees it nor activates it; its steps carry it over.
    assert [g.state for g in cas.generations] == ["active"]
    assert cas.due() is None
    cas.step(schedule.Prepare())
    cas.step(schedule.Activate(cas.generations[-1].id))
    kept = cas.pending()
    assert kept is not None and (kept.id, kept.csr) == (pending.id, pending.csr)

    with pytest.raises(offline.ChainError, match=r"^chain\[0\]\.subjectPublicKeyInfo"):
        cas.import_chain(pending.id, pem_of(ours(), ROOT))
    gens = cas.import_chain(pending.id, pem_of(_sign_csr(pending.csr), ROOT))
    imported = next(g for g in gens if g.id == pending.id)
    assert imported.state == "prepared" and imported.root == ROOT
    assert cas.pending() is None
    cas.step(schedule.Activate(pending.id))
    # An upstream signs now: the schedule never prepares a root of its own.
    clock[0] = NOW + dt.timedelta(days=20)  # past half of the imported intermediate's life
    while isinstance(step := cas.due(), schedule.Remove):
        cas.step(step)
    assert [g.id for g in cas.generations] == [pending.id]
    assert schedule.ca_schedule(cas.generations, clock[0]) == schedule.Prepare()
    assert cas.due() is None


def test_with_a_token_the_awaiting_key_is_made_there_and_no_secret_holds_a_private_key() -> None:
    kube = SecretKube(None)
    keys = HeldKeys()
    cas = CAStore(
        cast(SignerKube, kube), "podcert-system", "podcert-ca", lambda: NOW, create=True, keys=keys
    )
    assert cas.load() is not None
    pending = cas.prepare_offline(TD)
    assert kube.data is not None
    assert f"{offline.PENDING_PREFIX}{pending.id}.{ca.TLS_KEY_URI}" in kube.data
    assert b"PRIVATE KEY" not in b"".join(kube.data.values())
    assert pending.csr.public_key() == pending.key.public_key()
    kept = cas.pending()
    assert kept is not None and kept.key.public_key() == pending.key.public_key()
    assert status.authority(kube.data, "ns/ca", NOW).problem is None  # read without the token

    cas.import_chain(pending.id, pem_of(_sign_csr(pending.csr), ROOT))
    # What the signer now holds is the token's key, found again by the URI the Secret keeps.
    imported = next(g for g in cas.generations if g.id == pending.id)
    uri = kube.data[f"{pending.id}.{ca.TLS_KEY_URI}"].decode()
    assert imported.bundle.intermediate_key is keys.made[uri]
    assert b"PRIVATE KEY" not in b"".join(kube.data.values())
    # The first generation (a root of ours) has both keys in the token too.
    assert len(keys.made) == 3


def pem_of(*chain: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chain)


def test_podcert_status_says_a_generation_awaits_its_signed_chain() -> None:
    kube = SecretKube(None)
    cas = CAStore(cast(SignerKube, kube), "podcert-system", "podcert-ca", lambda: NOW)
    assert cas.load() is not None
    pending = cas.prepare_offline(TD)
    assert kube.data is not None
    shown = status.authority(kube.data, "podcert-system/podcert-ca", NOW)
    assert shown.next_step is not None
    assert shown.next_step.startswith(f"{pending.id} awaiting signed chain since")
    assert [g.state for g in shown.generations] == ["active"]  # not a generation yet
