"""One owner per federated root: a domain's bundle publishes only
self-signed CA certificates, and a root this signer holds, or another federated domain holds, is
refused for the domain that lists it later, each refusal naming the domain and the certificate.
The pure rules (`federation.root_problem`, `parse_bundle`, `claim`), then the poller applying
them across domains (the fetch injected)."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from signer.authority import spiffebundle
from signer.federation import domains
from signer.federation.domains import Bundle, FederatedDomain, Federation, Rejected, RootRefused
from signer.federation.poller import Federator, load_bootstraps

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)
TD = "spire.test"


def pem_cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def built(
    *,
    ca: bool | None = True,
    key_cert_sign: bool | None = None,
    signed_by: ec.EllipticCurvePrivateKey | None = None,
) -> x509.Certificate:
    """A self-issued certificate (issuer = subject) with the given basicConstraints (None:
    none), keyUsage (None: none) and signing key (None: its own)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "odd one")])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - dt.timedelta(hours=1))
        .not_valid_after(NOW + dt.timedelta(days=1))
    )
    if ca is not None:
        builder = builder.add_extension(x509.BasicConstraints(ca=ca, path_length=None), True)
    if key_cert_sign is not None:
        usage = x509.KeyUsage(
            digital_signature=True,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=key_cert_sign,
            crl_sign=True,
            encipher_only=False,
            decipher_only=False,
        )
        builder = builder.add_extension(usage, True)
    return builder.sign(signed_by or key, hashes.SHA256())


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def root_of(ca: trustme.CA) -> x509.Certificate:
    return pem_cert(ca.cert_pem.bytes())


def der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def body(*certs: x509.Certificate, sequence: int = 1) -> bytes:
    doc = spiffebundle.bundle_document(list(certs), sequence, dt.timedelta(seconds=60))
    return json.dumps(doc).encode()


# --- what a root is -------------------------------------------------------------------------------

NOT_ROOTS: list[object] = [
    pytest.param(
        lambda ca: pem_cert(ca.issue_cert("leaf.test").cert_chain_pems[0].bytes()),
        "not-a-ca",
        "CA:FALSE",
        id="a leaf",
    ),
    pytest.param(
        lambda ca: root_of(ca.create_child_ca()),
        "not-self-signed",
        "intermediate",
        id="an intermediate",
    ),
    pytest.param(
        lambda ca: built(ca=None), "not-a-ca", "no basicConstraints", id="no basicConstraints"
    ),
    pytest.param(
        lambda ca: built(key_cert_sign=False),
        "not-a-ca",
        "keyCertSign",
        id="a CA that may not sign certificates",
    ),
    pytest.param(
        lambda ca: built(signed_by=ec.generate_private_key(ec.SECP256R1())),
        "not-self-signed",
        "does not verify",
        id="self-issued but signed by another key",
    ),
]


@pytest.mark.parametrize(("make", "problem", "detail"), NOT_ROOTS)
def test_only_self_signed_ca_certificates_are_roots(
    ca: trustme.CA, make: Callable[[trustme.CA], x509.Certificate], problem: str, detail: str
) -> None:
    assert domains.root_problem(root_of(ca)) is None
    assert domains.root_problem(built(key_cert_sign=True)) is None
    found = domains.root_problem(make(ca))
    assert found is not None and found[0] == problem and detail in found[1], found


@pytest.mark.parametrize(("make", "problem", "detail"), NOT_ROOTS)
def test_a_bundle_keeps_its_roots_and_refuses_the_rest_naming_each(
    ca: trustme.CA, make: Callable[[trustme.CA], x509.Certificate], problem: str, detail: str
) -> None:
    root, odd = root_of(ca), make(ca)
    got = domains.accept(body(root, odd), TD, None, NOW)
    assert isinstance(got, Bundle), got
    assert list(got.roots) == [root]
    [refusal] = got.refused
    assert refusal.trust_domain == TD and refusal.problem == problem
    assert odd.fingerprint(hashes.SHA256()).hex() in refusal.certificate
    assert TD in str(refusal) and refusal.certificate in str(refusal)
    # Nothing but it: the bundle is refused, the last good one stays.
    alone = domains.accept(body(odd), TD, None, NOW)
    assert isinstance(alone, Rejected) and alone.field == "keys"
    assert [r.problem for r in alone.refused] == [problem]
    assert "no root left" in alone.reason


# --- one owner per root ---------------------------------------------------------------------------


def test_a_root_another_domain_holds_or_our_own_is_refused_for_the_later_one() -> None:
    mine, theirs, local = (root_of(trustme.CA()) for _ in range(3))
    bundle = Bundle(TD, (mine, theirs, local), sequence=4)
    got = domains.claim(bundle, {"other.test": {der(theirs)}, TD: {der(mine)}}, {der(local)})
    assert isinstance(got, Bundle)
    assert list(got.roots) == [mine] and got.sequence == 4  # its own earlier roots stay its own
    assert {(r.problem, r.certificate) for r in got.refused} == {
        ("owned-by-another-domain", domains.describe(theirs)),
        ("local-root", domains.describe(local)),
    }
    owned = next(r for r in got.refused if r.problem == "owned-by-another-domain")
    assert "other.test" in owned.detail and owned.trust_domain == TD
    nothing = domains.claim(Bundle(TD, (theirs,)), {"other.test": {der(theirs)}}, set())
    assert isinstance(nothing, Rejected) and nothing.refused[0].problem == "owned-by-another-domain"


def poller(
    peers: list[FederatedDomain],
    answers: dict[str, bytes],
    bootstraps: dict[str, Bundle] | None = None,
    local: tuple[x509.Certificate, ...] = (),
) -> Federator:
    return Federator(
        None,  # type: ignore[arg-type]  # polling does not touch the API; publishing does
        Federation("example.com/federated", tuple(peers)),
        bootstraps or {},
        lambda: True,
        threading.Event(),
        lambda: NOW,
        fetch=lambda domain, trusted: answers[domain.trust_domain],
        local_roots=lambda: local,
    )


def web(td: str) -> FederatedDomain:
    return FederatedDomain(td, f"https://{td}/", "https_web")


@pytest.mark.parametrize(
    "first",
    [
        pytest.param("a-contester.test", id="the contester sorts first"),
        pytest.param("z-contester.test", id="the contester sorts last"),
    ],
)
def test_the_domain_that_held_a_root_first_keeps_it_whatever_the_names(
    first: str, caplog: pytest.LogCaptureFixture
) -> None:
    owner_td = "m-owner.test"
    owner_root, contester_root = root_of(trustme.CA()), root_of(trustme.CA())
    peers = [web(first), web(owner_td)]  # the contester listed first too
    answers = {owner_td: body(owner_root), first: body(contester_root, owner_root)}
    p = poller(peers, answers)
    p.poll(owner_td)
    p.poll(first)
    assert p.bundles[owner_td].ders() == {der(owner_root)}
    assert p.bundles[first].ders() == {der(contester_root)}
    [refusal] = p.bundles[first].refused
    assert refusal == RootRefused(
        first,
        domains.describe(owner_root),
        "owned-by-another-domain",
        f"a root of federated trust domain {owner_td}",
    )
    assert str(refusal) in caplog.text
    # The owner polled again keeps its root; the contester's refusal is not logged again.
    caplog.clear()
    p.poll(owner_td)
    p.poll(first)
    assert p.bundles[owner_td].ders() == {der(owner_root)}
    assert "refused" not in caplog.text


def test_a_bootstrap_bundle_makes_its_domain_the_owner_before_any_fetch() -> None:
    owner_root, contester_root = root_of(trustme.CA()), root_of(trustme.CA())
    owner = FederatedDomain("owner.test", "https://o/", "https_spiffe", "spiffe://owner.test/s")
    p = poller(
        [web("contester.test"), owner],
        {"contester.test": body(contester_root, owner_root)},
        bootstraps={"owner.test": Bundle("owner.test", (owner_root,))},
    )
    p.poll("contester.test")
    assert p.bundles["contester.test"].ders() == {der(contester_root)}
    assert p.bundles["contester.test"].refused[0].problem == "owned-by-another-domain"


def test_our_own_root_is_never_published_as_a_federated_one() -> None:
    local, theirs = root_of(trustme.CA()), root_of(trustme.CA())
    p = poller([web(TD)], {TD: body(theirs, local)}, local=(local,))
    p.poll(TD)
    assert p.bundles[TD].ders() == {der(theirs)}
    assert [r.problem for r in p.bundles[TD].refused] == ["local-root"]
    # A bundle of nothing but our root is not taken at all.
    only = poller([web(TD)], {TD: body(local)}, local=(local,))
    assert only.poll(TD) == 5  # refused: retried soon
    assert TD not in only.bundles


def test_a_root_in_two_bootstrap_bundles_stops_the_start(tmp_path: Path) -> None:
    shared = root_of(trustme.CA())
    pem = tmp_path / "shared.pem"
    pem.write_bytes(shared.public_bytes(serialization.Encoding.PEM))
    config = Federation(
        "example.com/federated",
        tuple(
            FederatedDomain(td, "https://x/", "https_spiffe", f"spiffe://{td}/s", pem)
            for td in ("a.test", "b.test")
        ),
    )
    message = load_bootstraps(config, NOW)
    assert isinstance(message, str)
    assert "b.test" in message and "a.test" in message
    assert domains.describe(shared) in message
