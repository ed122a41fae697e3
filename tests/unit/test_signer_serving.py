"""signer.serving: the TLS identities the signer serves with. A certificate from the active CA
naming the SPIFFE ID and DNS names asked for, cut to the issuer's life and issued again past half
of its own or when another CA signs; a listener that hands each handshake the certificate current
then, with or without SNI; and a key that touches the disk only in a private file for the moment
`ssl` reads it. Handshakes run in memory; the clock is injected."""

from __future__ import annotations

import datetime as dt
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509

from signer import model, serving
from signer.authority import ca

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
SPIFFE_ID = "spiffe://td.test/podcert/webhook"
DNS_NAMES = ("podcert-signer.podcert.svc", "podcert-signer.podcert.svc.cluster.local")


class Clock:
    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


class Signing:
    """The CA that signs now, changed by the test (None: no CA loaded yet)."""

    def __init__(self, issuer: model.IssuingCA | None = None) -> None:
        self.issuer = issuer

    def __call__(self) -> model.IssuingCA | None:
        return self.issuer


def issuer(
    name: str, intermediate_lifetime: dt.timedelta = dt.timedelta(days=90)
) -> model.IssuingCA:
    return ca.issuing_ca(
        ca.new_ca(name, T0 - dt.timedelta(days=1), intermediate_lifetime=intermediate_lifetime)
    )


def own_cert(signing: Signing, clock: Clock, lifetime: dt.timedelta) -> serving.OwnCert:
    return serving.OwnCert(signing, SPIFFE_ID, DNS_NAMES, clock, lifetime, "the test certificate")


def served(server: ssl.SSLContext, sni: str | None = DNS_NAMES[0]) -> x509.Certificate:
    """The certificate `server` presents to a client in one in-memory handshake."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE  # what was served, not trust
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    ours = client.wrap_bio(to_client, to_server, server_hostname=sni)
    theirs = server.wrap_bio(to_server, to_client, server_side=True)
    done = [False, False]
    for _ in range(10):
        for i, side in enumerate((ours, theirs)):
            if not done[i]:
                try:
                    side.do_handshake()
                    done[i] = True
                except ssl.SSLWantReadError:
                    pass
        if all(done):
            break
    der = ours.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def names(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return san.get_values_for_type(x509.UniformResourceIdentifier), san.get_values_for_type(
        x509.DNSName
    )


def test_the_certificate_names_the_identity_and_is_cut_to_its_issuers_life() -> None:
    short = issuer("short", intermediate_lifetime=dt.timedelta(days=3))  # ends 2 days after T0
    own = own_cert(Signing(short), Clock(T0), lifetime=dt.timedelta(days=7))

    context = own.current()

    assert context is not None
    cert = served(context)
    assert names(cert) == ([SPIFFE_ID], list(DNS_NAMES))
    assert cert.issuer == short.certificate.subject
    assert cert.not_valid_before_utc == T0 - dt.timedelta(minutes=1)
    assert cert.not_valid_after_utc == short.not_after.replace(microsecond=0)


def test_it_is_kept_until_half_its_life_and_issued_again_then() -> None:
    clock = Clock(T0)
    own = own_cert(Signing(issuer("a")), clock, lifetime=dt.timedelta(days=2))
    first = own.current()

    clock.now = T0 + dt.timedelta(days=1) - dt.timedelta(minutes=1, seconds=1)
    assert own.current() is first
    clock.now = T0 + dt.timedelta(days=1) - dt.timedelta(minutes=1)  # half of [T0 - 1m, +2d]
    assert own.current() not in (first, None)


def test_another_signing_ca_gets_a_certificate_of_its_own_at_once() -> None:
    signing = Signing(issuer("a"))
    own = own_cert(signing, Clock(T0), lifetime=dt.timedelta(days=7))
    first = own.current()

    signing.issuer = issuer("b")
    second = own.current()

    assert second is not None and second is not first
    assert served(second).issuer == signing.issuer.certificate.subject


def test_with_no_ca_loaded_there_is_nothing_to_serve_and_no_listener() -> None:
    own = own_cert(Signing(None), Clock(T0), lifetime=dt.timedelta(days=7))

    assert own.current() is None
    with pytest.raises(RuntimeError, match="the webhook has no certificate to serve with"):
        serving.listener_context(own.current, "the webhook")


@pytest.mark.parametrize("sni", [DNS_NAMES[0], None], ids=["with SNI", "without SNI"])
def test_a_listener_hands_each_handshake_the_certificate_current_then(sni: str | None) -> None:
    signing = Signing(issuer("a"))
    own = own_cert(signing, Clock(T0), lifetime=dt.timedelta(days=7))
    listener = serving.listener_context(own.current, "the webhook")
    before = served(listener, sni)

    signing.issuer = issuer("b")  # activated while listening: no restart
    after = served(listener, sni)

    assert before.issuer != after.issuer == signing.issuer.certificate.subject
    assert listener.minimum_version == ssl.TLSVersion.TLSv1_2


def test_the_key_is_on_disk_only_in_a_private_file_while_ssl_reads_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[Path, int]] = []
    load = ssl.SSLContext.load_cert_chain

    def spy(context: ssl.SSLContext, certfile: str, *args: object, **kwargs: object) -> None:
        seen.append((Path(certfile), stat.S_IMODE(Path(certfile).stat().st_mode)))
        load(context, certfile, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", spy)
    own = own_cert(Signing(issuer("a")), Clock(T0), lifetime=dt.timedelta(days=7))

    context = own.current()

    assert context is not None and context.minimum_version == ssl.TLSVersion.TLSv1_2
    ((path, mode),) = seen
    assert mode == 0o600
    assert not path.exists() and not path.parent.exists()


def test_while_the_cas_token_refuses_the_last_certificate_is_served_and_asked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    signing = Signing(issuer("a"))
    own = own_cert(signing, Clock(T0), lifetime=dt.timedelta(days=7))
    first = own.current()
    signing.issuer = issuer("b")
    sign_leaf = serving.certs.sign_leaf

    def refused(*args: object) -> str:
        raise model.KeyUnavailable("token 't' refused a signature")

    monkeypatch.setattr(serving.certs, "sign_leaf", refused)
    assert own.current() is first  # not an exception in a handshake: the old certificate
    monkeypatch.setattr(serving.certs, "sign_leaf", sign_leaf)
    back = own.current()
    assert back is not None and served(back).issuer == signing.issuer.certificate.subject
