"""bundles' other contexts and outputs: a probe port's server context (client certificate
optional), a client context that checks hostnames too, and `pem()` with the `dump_*` helpers.

Real TLS over loopback: the servers behind our contexts record what reaches the application
(`tests.recording_peer.RecordingServer`), so "refused" means the application read nothing.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

import pytest

import bundles
from bundles import formats
from bundles.authz import allow_ids
from bundles.formats import Credential, dump_certificates, load_credential, load_trust_bundle
from bundles.handshake import PeerRefusedError
from bundles.source import TLSSource
from tests.recording_peer import (
    RecordingServer,
    Workload,
    answered,
    call,
    client_context_of,
    der,
)
from tests.unit.test_bundles_formats import Authority, key_secrets, new_key, pkcs8

LOCAL = "cluster.local"
API = f"spiffe://{LOCAL}/ns/shop/sa/api"
WEB = f"spiffe://{LOCAL}/ns/shop/sa/web"
OTHER = f"spiffe://{LOCAL}/ns/shop/sa/other"
ALLOW_WEB = allow_ids([WEB])
ALLOW_API = allow_ids([API])
DNS_NAME = "api.shop.svc"

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def ca() -> Authority:
    return Authority("context kinds root")


@pytest.fixture
def api(tmp_path: Path, ca: Authority) -> TLSSource:
    return Workload(tmp_path / "api", API, ca).source()


@pytest.fixture
def web(tmp_path: Path, ca: Authority) -> TLSSource:
    return Workload(tmp_path / "web", WEB, ca).source()


# --- a probe port: client certificate optional ---------------------------------------------------


CALLERS = [
    pytest.param(lambda ca: None, True, id="no certificate (a kubelet probe): let through"),
    pytest.param(lambda ca: ca.issue(WEB), True, id="an allowed ID: let through"),
    pytest.param(lambda ca: ca.issue(OTHER), False, id="another ID: refused in the handshake"),
    pytest.param(
        lambda ca: Authority("stranger").issue(WEB),
        False,
        id="a certificate no root vouches for: refused in the handshake",
    ),
]


@pytest.mark.parametrize(("holding", "admitted"), CALLERS)
def test_a_probe_context_admits_callers_without_a_certificate_and_judges_the_rest(
    api: TLSSource, ca: Authority, holding: Callable[[Authority], Credential | None], admitted: bool
) -> None:
    credential = holding(ca)
    context = api.server_context(ALLOW_WEB, client_certificate="optional")
    with RecordingServer(context=lambda: context).running() as server:
        assert answered(server.port, client_context_of(credential, ca.pem)) is admitted
        server.wait_ended(1)
    assert (server.received()[0] != b"") is admitted
    if admitted:
        assert server.client_ids() == [der(credential) if credential else None]


def test_the_strict_context_refuses_a_caller_without_a_certificate(
    api: TLSSource, ca: Authority
) -> None:
    strict = api.server_context(ALLOW_WEB)
    assert strict.verify_mode == ssl.CERT_REQUIRED
    with RecordingServer(context=lambda: strict).running() as server:
        assert not answered(server.port, client_context_of(None, ca.pem))
        server.wait_ended(1)
    assert server.received() == [b""]


def test_a_strict_context_made_optional_by_a_library_still_refuses_anonymous_callers(
    api: TLSSource, ca: Authority
) -> None:
    strict = api.server_context(ALLOW_WEB)
    strict.verify_mode = ssl.CERT_OPTIONAL  # what a careless framework might do
    with RecordingServer(context=lambda: strict).running() as server:
        assert not answered(server.port, client_context_of(None, ca.pem))
        server.wait_ended(1)
    assert server.received() == [b""]


def test_the_probe_and_strict_contexts_are_distinct_and_cached(api: TLSSource) -> None:
    probe = api.server_context(ALLOW_WEB, client_certificate="optional")
    assert probe is api.server_context(ALLOW_WEB, client_certificate="optional")
    assert probe is not api.server_context(ALLOW_WEB)
    assert probe.verify_mode == ssl.CERT_OPTIONAL


def test_a_bad_client_certificate_mode_is_refused_by_name(api: TLSSource) -> None:
    with pytest.raises(ValueError, match="client_certificate must be 'required' or 'optional'"):
        api.server_context(ALLOW_WEB, client_certificate="maybe")  # type: ignore[arg-type]


# --- hostname checks for DNS-SAN identities ------------------------------------------------------


def with_dns_name(ca: Authority, spiffe_id: str) -> Credential:
    key = new_key()
    return Credential(key, (ca.leaf(spiffe_id, key=key, dns_names=[DNS_NAME]),))


HOSTNAME_CASES = [
    pytest.param(API, DNS_NAME, None, id="the name and the ID match: answered"),
    pytest.param(API, "db.shop.svc", ssl.SSLCertVerificationError, id="another name: refused"),
    pytest.param(OTHER, DNS_NAME, PeerRefusedError, id="the name matches, the ID not: refused"),
]


@pytest.mark.parametrize(("server_id", "dialled", "refusal"), HOSTNAME_CASES)
def test_a_hostname_checking_client_context_checks_the_name_and_the_id(
    web: TLSSource, ca: Authority, server_id: str, dialled: str, refusal: type[Exception] | None
) -> None:
    context = web.client_context(ALLOW_API, check_hostname=True)
    assert context.check_hostname
    with RecordingServer.presenting(with_dns_name(ca, server_id)).running() as server:
        if refusal is None:
            assert answered(server.port, context, server_hostname=dialled)
        else:
            with pytest.raises(refusal) as caught:
                call(server.port, context, server_hostname=dialled)
            assert type(caught.value) is refusal
        server.wait_ended(1)
    assert (server.received()[0] != b"") is (refusal is None)


def test_the_default_client_context_ignores_hostnames(web: TLSSource, ca: Authority) -> None:
    context = web.client_context(ALLOW_API)
    assert not context.check_hostname
    assert context is not web.client_context(ALLOW_API, check_hostname=True)
    with RecordingServer.presenting(ca.issue(API)).running() as server:
        assert answered(server.port, context, server_hostname="anything.example")


# --- the material as PEM ---------------------------------------------------------------------


def test_pem_is_the_current_material_and_never_shows_the_key(tmp_path: Path, ca: Authority) -> None:
    partner = Authority("partner root")
    workload = Workload(tmp_path / "api", API, ca)
    federated = tmp_path / "partner.pem"
    federated.write_bytes(partner.pem + ca.pem)  # our own root listed there stays ours
    source = TLSSource(*workload.files, federated={"partner.test": federated})
    material = source.pem()
    assert material.private_key == pkcs8(workload.credential.key)
    assert material.certificate_chain == dump_certificates(workload.credential.chain)
    assert load_credential(material.private_key + material.certificate_chain).leaf == (
        workload.credential.leaf
    )
    assert material.trust_bundle == ca.pem
    assert load_trust_bundle(material.all_roots).roots == (ca.cert, partner.cert)
    for shown in (repr(material), str(material)):
        assert "private_key" not in shown
        assert not any(secret in shown for secret in key_secrets(workload.credential.key))
    new = workload.rotate_leaf(ca)
    assert source.refresh()
    assert source.pem().certificate_chain == dump_certificates(new.chain)


def test_the_dump_helpers_are_exported_from_bundles() -> None:
    assert bundles.dump_private_key is formats.dump_private_key
    assert bundles.dump_certificates is formats.dump_certificates
    assert bundles.dump_trust_bundle is formats.dump_trust_bundle
    assert bundles.PemMaterial is formats.PemMaterial
