"""bundles.pyspiffe: py-spiffe's own TLS library, spiffe-tls, works over podcert's files.

spiffe-tls is the client (and server) no one here wrote: its `dial` and `listen` take an
`X509FileSource` as their source and judge peers with spiffe-tls's own `authorize_id`. The peer
on the other end is built on `bundles`' authorizing contexts, and records every application byte
it reads. Credentials are signed by podcert's own signer code (root, intermediate, leaf), and
published as the kubelet's atomic writer does. Each side talks through a leaf rotation and a CA
rotation (new root added, leaves from the new CA, old root removed); a peer with the wrong SPIFFE
ID is refused inside the handshake, before a byte of the request reaches it.

Findings about spiffe-tls itself (docs/stacks/py-spiffe.md) are pinned here too, so a py-spiffe
release that changes them fails a test instead of leaving the page wrong.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import spiffe
import spiffetls
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from OpenSSL import SSL
from spiffe.workloadapi.errors import X509SourceError
from spiffetls.errors import TLSConnectionError
from spiffetls.tlsconfig.authorize import authorize_id

from bundles.authz import Authorizer, allow_ids
from bundles.formats import Credential, dump_credential
from bundles.handshake import PeerRefusedError
from bundles.pyspiffe import Authorize, SvidError, X509FileSource, X509Snapshot
from bundles.source import TLSSource
from signer import certs, model
from signer.authority import ca
from tests.unit.test_bundles_formats import Authority, key_secrets, new_key, pkcs8
from tests.unit.test_bundles_source import Volume

TD = "pods.test"
SERVER_ID = f"spiffe://{TD}/ns/shop/sa/api"
CLIENT_ID = f"spiffe://{TD}/ns/shop/sa/web"
OTHER_ID = f"spiffe://{TD}/ns/shop/sa/other"
REQUEST = b"GET /orders Authorization: Bearer s3cret-token\n"  # what no impostor may read
DEADLINE = 10.0
# OpenSSL judges validity by the real clock during the handshakes.
NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)

ALLOW_CLIENT = allow_ids([CLIENT_ID])  # one object per rule: bundles caches contexts by it
ALLOW_SERVER = allow_ids([SERVER_ID])

pytestmark = [
    pytest.mark.timeout(120),
    # spiffe-tls 0.4.0 hands pyOpenSSL its own X509 and PKey objects, which pyOpenSSL deprecates.
    pytest.mark.filterwarnings("ignore:Passing pyOpenSSL:DeprecationWarning"),
]


# --- podcert's material ---------------------------------------------------------------------------


def new_ca(name: str) -> ca.CABundle:
    return ca.new_ca(name, NOW)


def issue(authority: ca.CABundle, spiffe_id: str) -> bytes:
    """A credential bundle as a pod holds it: the signer's leaf and intermediate, key first."""
    key = ec.generate_private_key(ec.SECP256R1())
    plan = model.LeafPlan(
        public_key=key.public_key(),
        spiffe_id=spiffe_id,
        dns_names=(),
        not_before=NOW - dt.timedelta(minutes=1),
        not_after=NOW + dt.timedelta(hours=1),
        begin_refresh_at=NOW + dt.timedelta(minutes=30),
    )
    chain = certs.sign_leaf(plan, ca.issuing_ca(authority), certs.random_serial())
    return pkcs8(key) + chain.encode()


def roots(*authorities: ca.CABundle) -> bytes:
    return b"".join(a.root.public_bytes(serialization.Encoding.PEM) for a in authorities)


@dataclass
class Workload:
    """One pod's projected volume and the TLSSource reading it."""

    volume: Volume
    tls: TLSSource

    @classmethod
    def make(cls, folder: Path, credential: bytes, trust: bytes) -> Workload:
        volume = Volume(folder)
        volume.publish(**{"credential.pem": credential, "trust.pem": trust})
        return cls(volume, TLSSource(volume / "credential.pem", volume / "trust.pem"))

    def publish(self, *, credential: bytes | None = None, trust: bytes | None = None) -> None:
        files = {"credential.pem": credential, "trust.pem": trust}
        self.volume.publish(**{name: data for name, data in files.items() if data is not None})

    def rotate(self, *, credential: bytes | None = None, trust: bytes | None = None) -> None:
        self.publish(credential=credential, trust=trust)
        assert self.tls.refresh() is True, self.tls.last_error


@pytest.fixture(scope="module")
def ca1() -> ca.CABundle:
    return new_ca("podcert one")


@pytest.fixture
def folder(tmp_path: Path) -> Callable[[str], Path]:
    return lambda name: tmp_path / name


def leaf_der(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.DER)


# --- the peers ------------------------------------------------------------------------------------


@dataclass
class Served:
    """What one connection brought a server's application: the client's leaf and its bytes."""

    peer: bytes | None
    received: bytes


class Server:
    """A loopback server that records, per connection, what its application read (and the
    client's leaf); answers a complete request line with `ok <its own SPIFFE ID>`."""

    def __init__(self) -> None:
        self.served: list[Served] = []
        self.port = 0
        self._threads: list[threading.Thread] = []

    def wait_for(self, connections: int) -> list[Served]:
        """What the first `connections` connections brought, once each has ended."""
        for thread in list(self._threads):
            thread.join(DEADLINE)
            assert not thread.is_alive(), "a connection outlived its deadline"
        assert len(self.served) == connections
        return self.served

    def _accept_in_background(
        self, accept: Callable[[], tuple[Any, object]], serve: Callable[[Any], None]
    ) -> threading.Thread:
        """Serve each accepted connection in a thread of its own until `accept` fails."""

        def loop() -> None:
            while True:
                try:
                    conn, _ = accept()
                except OSError:
                    return  # the listener was shut down
                thread = threading.Thread(target=serve, args=(conn,), daemon=True)
                self._threads.append(thread)
                thread.start()

        acceptor = threading.Thread(target=loop, daemon=True)
        acceptor.start()
        return acceptor


class BundlesServer(Server):
    """Listens once with `bundles`' server context, which follows rotation per handshake and
    refuses a client `authorizer` does not allow inside the handshake."""

    def __init__(self, tls: TLSSource, authorizer: Authorizer = ALLOW_CLIENT) -> None:
        super().__init__()
        self.tls = tls
        self.context = tls.server_context(authorizer)

    @contextlib.contextmanager
    def running(self) -> Iterator[BundlesServer]:
        listener = socket.create_server(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        acceptor = self._accept_in_background(listener.accept, self._serve)
        try:
            yield self
        finally:
            listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (Linux)
            listener.close()
            acceptor.join(DEADLINE)

    def _serve(self, conn: socket.socket) -> None:
        got, peer = b"", None
        conn.settimeout(DEADLINE)
        try:
            with self.context.wrap_socket(conn, server_side=True) as tls:
                peer = tls.getpeercert(binary_form=True)
                while not got.endswith(b"\n"):
                    data = tls.recv(4096)
                    if not data:
                        break
                    got += data
                if got.endswith(b"\n"):
                    tls.sendall(f"ok {self.tls.credential.spiffe_id}\n".encode())
        except OSError:  # PeerRefusedError and every other handshake failure included
            pass
        finally:
            conn.close()
            self.served.append(Served(peer, got))


class SpiffeTlsServer(Server):
    """spiffe-tls's `listen` (mutual TLS unless `options` say otherwise), spiffe-tls's own
    `authorize_fn` judging clients.

    `follow=True` is the rotation-proof pattern of docs/stacks/py-spiffe.md: listen on a
    snapshot, and move each accepted connection onto `source.server_context(options)`.
    `follow=False` is spiffe-tls's own way: listen on the live source, whose subscription
    spiffe-tls uses to update the listener's one context.
    """

    def __init__(
        self,
        source: X509FileSource,
        authorize_fn: Authorize | None = None,
        *,
        follow: bool = True,
        tls_mode: spiffetls.ServerTlsMode = spiffetls.ServerTlsMode.MTLS,
    ) -> None:
        super().__init__()
        self.source = source
        self.options = spiffetls.ListenOptions(tls_mode=tls_mode, authorize_fn=authorize_fn)
        self.follow = follow

    @contextlib.contextmanager
    def running(self) -> Iterator[SpiffeTlsServer]:
        listening = self.source.snapshot() if self.follow else self.source
        listener = spiffetls.listen("127.0.0.1:0", listening, self.options)
        self.port = listener.getsockname()[1]
        acceptor = self._accept_in_background(listener.accept, self._serve)
        try:
            yield self
        finally:
            listener.sock_shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (Linux)
            listener.close()
            acceptor.join(DEADLINE)

    def _serve(self, conn: SSL.Connection) -> None:
        got, peer = b"", None
        try:
            if self.follow:
                conn.set_context(self.source.server_context(self.options))
            conn.do_handshake()
            certificate = conn.get_peer_certificate(as_cryptography=True)
            peer = leaf_der(certificate) if certificate is not None else None
            while not got.endswith(b"\n"):
                got += conn.recv(4096)
            conn.sendall(f"ok {self.source.spiffe_id}\n".encode())
            conn.shutdown()
        except (SSL.Error, OSError):  # a refused peer, or one that went away
            pass
        finally:
            conn.close()
            self.served.append(Served(peer, got))


def dial(server: Server, source: spiffe.X509Source, expected: str = SERVER_ID) -> tuple[str, bytes]:
    """spiffe-tls's client: the answer, and the leaf the server presented."""
    authorize = authorize_id(spiffe.SpiffeId(expected))
    conn = spiffetls.dial(f"127.0.0.1:{server.port}", source, authorize_fn=authorize)
    try:
        conn.sendall(REQUEST)
        answer = b""
        while not answer.endswith(b"\n"):
            data = conn.recv(4096)
            if not data:
                break
            answer += data
        certificate = conn.get_peer_certificate(as_cryptography=True)
        assert certificate is not None
        return answer.decode(), leaf_der(certificate)
    finally:
        conn.close()


def call(
    server: Server, tls: TLSSource, authorizer: Authorizer = ALLOW_SERVER
) -> tuple[str, bytes]:
    """bundles' client: the answer, and the leaf the server presented."""
    context = tls.client_context(authorizer)
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=DEADLINE) as raw,
        context.wrap_socket(raw) as conn,
    ):
        conn.sendall(REQUEST)
        answer = b""
        while not answer.endswith(b"\n"):
            data = conn.recv(4096)
            if not data:
                break
            answer += data
        peer = conn.getpeercert(binary_form=True)
        assert peer is not None
        return answer.decode(), peer


def answered_by(spiffe_id: str) -> str:
    return f"ok {spiffe_id}\n"


def adapter(workload: Workload) -> X509FileSource:
    """The py-spiffe view of a workload; refreshed by the test (watching has its own test)."""
    return X509FileSource(workload.tls, watch=False)


# --- what py-spiffe sees --------------------------------------------------------------------------


def test_py_spiffe_reads_podcerts_svid_and_bundle(
    folder: Callable[[str], Path], ca1: ca.CABundle
) -> None:
    workload = Workload.make(folder("web"), issue(ca1, CLIENT_ID), roots(ca1))
    with adapter(workload) as source:
        assert isinstance(source, spiffe.X509Source)
        svid = source.svid
        assert svid.spiffe_id == spiffe.SpiffeId(CLIENT_ID)
        assert svid.cert_chain == list(workload.tls.credential.chain)  # leaf, intermediate
        assert leaf_der(svid.leaf) == leaf_der(workload.tls.credential.leaf)
        (bundle,) = source.bundles
        assert bundle.trust_domain == spiffe.TrustDomain(TD)
        assert bundle.x509_authorities == {ca1.root}
        assert source.get_bundle_for_trust_domain(spiffe.TrustDomain(TD)) == bundle
        assert source.get_bundle_for_trust_domain(spiffe.TrustDomain("partner.test")) is None
        context = source.get_x509_context()
        assert context.default_svid.spiffe_id == svid.spiffe_id
        assert context.x509_bundle_set.bundles == {bundle}


@pytest.mark.parametrize("ours", [X509FileSource, X509Snapshot], ids=lambda c: c.__name__)
def test_every_public_method_of_py_spiffes_source_is_ours(ours: type[spiffe.X509Source]) -> None:
    """Our sources skip X509Source.__init__ (it dials the Workload API): a public method they
    inherited would run on attributes that do not exist. A py-spiffe release that adds one
    fails here until the adapter implements it."""
    public = {name for name in vars(spiffe.X509Source) if not name.startswith("_")}
    assert public == {
        "svid",
        "bundles",
        "get_bundle_for_trust_domain",
        "get_x509_context",
        "close",
        "is_closed",
        "subscribe_for_updates",
        "unsubscribe_for_updates",
    }
    mro = ours.__mro__
    defined = {name for cls in mro[: mro.index(spiffe.X509Source)] for name in vars(cls)}
    assert public <= defined


def test_a_closed_source_answers_nothing_and_closing_twice_is_harmless(
    folder: Callable[[str], Path], ca1: ca.CABundle
) -> None:
    source = adapter(Workload.make(folder("web"), issue(ca1, CLIENT_ID), roots(ca1)))
    assert source.is_closed() is False
    source.close()
    source.close()
    assert source.is_closed() is True
    for get in (
        lambda: source.svid,
        lambda: source.bundles,
        source.get_x509_context,
        lambda: source.get_bundle_for_trust_domain(spiffe.TrustDomain(TD)),
    ):
        with pytest.raises(X509SourceError, match="closed"):
            get()


def test_the_source_made_from_files_reads_a_key_and_chain_pair_too(
    tmp_path: Path, ca1: ca.CABundle
) -> None:
    credential = issue(ca1, CLIENT_ID)
    key, chain = credential.split(b"-----END PRIVATE KEY-----\n")
    (tmp_path / "key.pem").write_bytes(key + b"-----END PRIVATE KEY-----\n")
    (tmp_path / "chain.pem").write_bytes(chain)
    (tmp_path / "trust.pem").write_bytes(roots(ca1))
    with X509FileSource.from_files(
        (tmp_path / "key.pem", tmp_path / "chain.pem"), tmp_path / "trust.pem", watch=False
    ) as source:
        assert str(source.spiffe_id) == CLIENT_ID


# --- what py-spiffe refuses -----------------------------------------------------------------------


def dns_only(authority: Authority) -> Credential:
    """A credential bundles serves (a DNS-SAN identity) and py-spiffe does not: an X509-SVID
    holds exactly one SPIFFE ID."""
    key = new_key()
    return Credential(key, (authority.leaf(key=key, dns_names=["api.shop.svc"]),))


def test_a_credential_py_spiffe_refuses_fails_the_first_load_with_its_reason(
    tmp_path: Path,
) -> None:
    authority = Authority("dns root")
    issued = dns_only(authority)
    workload = Workload.make(tmp_path / "web", dump_credential(issued), authority.pem)
    with pytest.raises(SvidError, match="py-spiffe refuses") as refused:
        X509FileSource(workload.tls, watch=False)
    message = str(refused.value)
    assert "URI SAN" in message
    assert not [secret for secret in key_secrets(issued.key) if secret in message]
    assert refused.value.__cause__ is None


def error_of(source: X509FileSource) -> Exception | None:
    return source.last_error  # a call, so mypy does not carry an earlier narrowing over


def test_a_rotation_py_spiffe_refuses_keeps_the_previous_svid_and_tells_no_one(
    tmp_path: Path,
) -> None:
    authority = Authority("one root")
    workload = Workload.make(
        tmp_path / "web", dump_credential(authority.issue(CLIENT_ID)), authority.pem
    )
    with adapter(workload) as source:
        told: list[None] = []
        source.subscribe_for_updates(lambda: told.append(None))
        before = source.svid
        workload.publish(credential=dump_credential(dns_only(authority)))
        assert source.refresh() is False
        assert isinstance(source.last_error, SvidError)
        assert source.svid is before
        assert told == []

        workload.publish(credential=dump_credential(authority.issue(CLIENT_ID)))
        assert source.refresh() is True
        assert error_of(source) is None
        assert source.svid is not before
        assert told == [None]


# --- subscribers and the watcher ------------------------------------------------------------------


def test_subscribers_hear_of_each_rotation_and_a_failing_one_stops_no_one(
    folder: Callable[[str], Path], ca1: ca.CABundle, caplog: pytest.LogCaptureFixture
) -> None:
    workload = Workload.make(folder("web"), issue(ca1, CLIENT_ID), roots(ca1))
    with adapter(workload) as source:
        heard: list[str] = []

        def broken() -> None:
            raise RuntimeError("subscriber bug")

        def hear() -> None:
            heard.append(str(source.svid.leaf.serial_number))

        source.subscribe_for_updates(broken)
        source.subscribe_for_updates(hear)
        workload.publish()  # the same bytes again: no rotation
        assert source.refresh() is False
        with caplog.at_level(logging.ERROR, logger="bundles.pyspiffe"):
            workload.publish(credential=issue(ca1, CLIENT_ID))
            assert source.refresh() is True
        assert heard == [str(workload.tls.credential.leaf.serial_number)]
        assert "subscriber" in caplog.text

        source.unsubscribe_for_updates(hear)
        source.unsubscribe_for_updates(hear)  # not there any more: harmless
        workload.publish(credential=issue(ca1, CLIENT_ID))
        assert source.refresh() is True
        assert len(heard) == 1


def test_the_watcher_follows_the_files_until_closed(
    folder: Callable[[str], Path], ca1: ca.CABundle
) -> None:
    workload = Workload.make(folder("web"), issue(ca1, CLIENT_ID), roots(ca1))
    rotated = threading.Event()
    source = X509FileSource(workload.tls, interval=0.05)
    try:
        watcher = next(t for t in threading.enumerate() if t.name == "X509FileSource")
        source.subscribe_for_updates(rotated.set)
        workload.publish(credential=issue(ca1, CLIENT_ID))
        assert rotated.wait(DEADLINE), "the watcher never picked up the rotation"
        assert leaf_der(source.svid.leaf) == leaf_der(workload.tls.credential.leaf)
    finally:
        source.close()
    assert not watcher.is_alive()


def test_a_watcher_needs_a_positive_interval(
    folder: Callable[[str], Path], ca1: ca.CABundle
) -> None:
    workload = Workload.make(folder("web"), issue(ca1, CLIENT_ID), roots(ca1))
    with pytest.raises(ValueError, match="interval"):
        X509FileSource(workload.tls, interval=0)


# --- spiffe-tls dialing a bundles server ----------------------------------------------------------


def test_spiffe_tls_dials_a_bundles_server_through_a_leaf_and_a_ca_rotation(
    folder: Callable[[str], Path], ca1: ca.CABundle
) -> None:
    server = Workload.make(folder("api"), issue(ca1, SERVER_ID), roots(ca1))
    client = Workload.make(folder("web"), issue(ca1, CLIENT_ID), roots(ca1))
    ca2 = new_ca("podcert two")
    with adapter(client) as source, BundlesServer(server.tls).running() as api:
        calls = 0

        def works() -> None:
            nonlocal calls
            answer, presented = dial(api, source.snapshot())
            calls += 1
            assert answer == answered_by(SERVER_ID)
            assert presented == leaf_der(server.tls.credential.leaf)
            assert api.wait_for(calls)[-1] == Served(leaf_der(source.svid.leaf), REQUEST)

        works()
        # Leaf rotation, both sides.
        server.rotate(credential=issue(ca1, SERVER_ID))
        client.publish(credential=issue(ca1, CLIENT_ID))
        assert source.refresh() is True
        works()
        # CA rotation: the new root first, then leaves of the new CA, then the old root goes.
        for workload in (server, client):
            workload.publish(trust=roots(ca1, ca2))
        server.tls.refresh()
        assert source.refresh() is True
        assert source.svid.leaf.issuer == ca1.intermediate.subject
        works()
        server.rotate(credential=issue(ca2, SERVER_ID))
        client.publish(credential=issue(ca2, CLIENT_ID))
        assert source.refresh() is True
        works()
        for workload in (server, client):
            workload.publish(trust=roots(ca2))
        server.tls.refresh()
        assert source.refresh() is True
        (bundle,) = source.bundles
        assert bundle.x509_authorities == {ca2.root}
        works()
        assert calls == 5

        # A server still on the old CA is refused now, before a byte of the request reaches it.
        stale = Workload.make(folder("stale"), issue(ca1, SERVER_ID), roots(ca1, ca2))
        with BundlesServer(stale.tls).running() as old, pytest.raises(TLSConnectionError):
            dial(old, source.snapshot())
    assert [s.received for s in old.wait_for(1)] == [b""]


def test_spiffe_tls_refuses_a_server_with_the_wrong_spiffe_id_before_any_request_byte(
    folder: Callable[[str], Path], ca1: ca.CABundle
) -> None:
    # A genuine leaf of our own CA, for another workload.
    impostor = Workload.make(folder("other"), issue(ca1, OTHER_ID), roots(ca1))
    client = Workload.make(folder("web"), issue(ca1, CLIENT_ID), roots(ca1))
    with adapter(client) as source, BundlesServer(impostor.tls).running() as other:
        with pytest.raises(TLSConnectionError):
            dial(other, source)
        assert dial(other, source, expected=OTHER_ID)[0] == answered_by(OTHER_ID)
    assert [s.received for s in other.wait_for(2)] == [b"", REQUEST]


def test_a_bundles_server_refuses_a_spiffe_tls_client_it_does_not_allow(
    folder: Callable[[str], Path], ca1: ca.CABundle
) -> None:
    server = Workload.make(folder("api"), issue(ca1, SERVER_ID), roots(ca1))
    stranger = Workload.make(folder("other"), issue(ca1, OTHER_ID), roots(ca1))
    with adapter(stranger) as source, BundlesServer(server.tls).running() as api:
        answer = None
        # TLS 1.3: the client finishes first, so spiffe-tls may send before hearing the refusal.
        with contextlib.suppress(SSL.Error, OSError):
            answer, _ = dial(api, source)
        assert not answer
    assert [s.received for s in api.wait_for(1)] == [b""]


def test_dialing_the_live_source_leaves_a_subscription_per_dial_that_fails_each_rotation(
    folder: Callable[[str], Path], ca1: ca.CABundle, caplog: pytest.LogCaptureFixture
) -> None:
    """A finding about spiffe-tls: every `dial` (every `create_ssl_context`) subscribes a
    callback holding its context, and nothing unsubscribes it. Each rotation then calls every
    one, and each fails: pyOpenSSL refuses to change a context that made a connection. Dialing
    a snapshot subscribes nothing."""
    server = Workload.make(folder("api"), issue(ca1, SERVER_ID), roots(ca1))
    client = Workload.make(folder("web"), issue(ca1, CLIENT_ID), roots(ca1))
    with adapter(client) as source, BundlesServer(server.tls).running() as api:
        for made in range(1, 4):
            assert dial(api, source)[0] == answered_by(SERVER_ID)
            assert source.subscriber_count == made
        client.publish(credential=issue(ca1, CLIENT_ID))
        with caplog.at_level(logging.ERROR, logger="bundles.pyspiffe"):
            assert source.refresh() is True
        reasons = [str(r.exc_info[1]) for r in caplog.records if r.exc_info]
        assert len(reasons) == 3
        assert all("cannot be mutated" in reason for reason in reasons)

        dial(api, source.snapshot())
        assert source.subscriber_count == 3
    api.wait_for(4)


# --- a bundles client calling a spiffe-tls listener -----------------------------------------------


def test_a_bundles_client_calls_a_spiffe_tls_listener_through_a_leaf_and_a_ca_rotation(
    folder: Callable[[str], Path], ca1: ca.CABundle
) -> None:
    server = Workload.make(folder("api"), issue(ca1, SERVER_ID), roots(ca1))
    client = Workload.make(folder("web"), issue(ca1, CLIENT_ID), roots(ca1))
    ca2 = new_ca("podcert two")
    authorize = authorize_id(spiffe.SpiffeId(CLIENT_ID))
    with adapter(server) as source, SpiffeTlsServer(source, authorize).running() as api:
        calls = 0

        def works() -> None:
            nonlocal calls
            answer, presented = call(api, client.tls)
            calls += 1
            assert answer == answered_by(SERVER_ID)
            assert presented == leaf_der(source.svid.leaf)
            assert api.wait_for(calls)[-1] == Served(leaf_der(client.tls.credential.leaf), REQUEST)

        works()
        # Leaf rotation, both sides: each accepted connection moves onto the newest context.
        server.publish(credential=issue(ca1, SERVER_ID))
        assert source.refresh() is True
        client.rotate(credential=issue(ca1, CLIENT_ID))
        works()
        # CA rotation: the new root first, then leaves of the new CA, then the old root goes.
        for workload in (server, client):
            workload.publish(trust=roots(ca1, ca2))
        assert source.refresh() is True
        client.tls.refresh()
        works()
        server.publish(credential=issue(ca2, SERVER_ID))
        assert source.refresh() is True
        client.rotate(credential=issue(ca2, CLIENT_ID))
        works()
        for workload in (server, client):
            workload.publish(trust=roots(ca2))
        assert source.refresh() is True
        client.tls.refresh()
        works()
        assert calls == 5

        # A client still on the old CA is refused now, before its request is read.
        stale = Workload.make(folder("stale"), issue(ca1, CLIENT_ID), roots(ca1, ca2))
        with pytest.raises(OSError):  # the listener's alert, or its reset
            call(api, stale.tls)
        assert api.wait_for(calls + 1)[-1].received == b""


def test_a_listener_on_the_live_source_keeps_its_first_leaf(
    folder: Callable[[str], Path], ca1: ca.CABundle, caplog: pytest.LogCaptureFixture
) -> None:
    """A finding about spiffe-tls: `listen` updates its one context in place when the source
    tells it of a rotation, and pyOpenSSL refuses (the context has made connections): the roots
    are added to its store, the new leaf never served. Such a listener presents its first leaf
    until the process restarts, and fails every handshake once that leaf expires."""
    server = Workload.make(folder("api"), issue(ca1, SERVER_ID), roots(ca1))
    client = Workload.make(folder("web"), issue(ca1, CLIENT_ID), roots(ca1))
    authorize = authorize_id(spiffe.SpiffeId(CLIENT_ID))
    with (
        adapter(server) as source,
        SpiffeTlsServer(source, authorize, follow=False).running() as api,
    ):
        first = leaf_der(source.svid.leaf)
        assert call(api, client.tls)[1] == first
        server.publish(credential=issue(ca1, SERVER_ID))
        with caplog.at_level(logging.ERROR, logger="bundles.pyspiffe"):
            assert source.refresh() is True
        assert leaf_der(source.svid.leaf) != first
        assert call(api, client.tls)[1] == first
        reasons = [str(r.exc_info[1]) for r in caplog.records if r.exc_info]
        assert len(reasons) == 1
        assert "cannot be mutated" in reasons[0]
    api.wait_for(2)


def test_a_bundles_client_refuses_a_spiffe_tls_listener_with_the_wrong_spiffe_id(
    folder: Callable[[str], Path], ca1: ca.CABundle
) -> None:
    impostor = Workload.make(folder("other"), issue(ca1, OTHER_ID), roots(ca1))
    client = Workload.make(folder("web"), issue(ca1, CLIENT_ID), roots(ca1))
    with (
        adapter(impostor) as source,
        SpiffeTlsServer(source).running() as other,
        pytest.raises(PeerRefusedError),
    ):
        call(other, client.tls)
    assert [s.received for s in other.wait_for(1)] == [b""]


def test_a_spiffe_tls_listener_refuses_a_client_it_does_not_allow_before_any_byte(
    folder: Callable[[str], Path], ca1: ca.CABundle
) -> None:
    server = Workload.make(folder("api"), issue(ca1, SERVER_ID), roots(ca1))
    stranger = Workload.make(folder("other"), issue(ca1, OTHER_ID), roots(ca1))
    authorize = authorize_id(spiffe.SpiffeId(CLIENT_ID))
    with adapter(server) as source, SpiffeTlsServer(source, authorize).running() as api:
        answer = None
        # TLS 1.3: the client finishes first and may send before hearing the refusal.
        with contextlib.suppress(ssl.SSLError, OSError):
            answer, _ = call(api, stranger.tls)
        assert not answer
    assert [s.received for s in api.wait_for(1)] == [b""]


def test_a_listener_with_optional_client_certificates_lets_in_a_client_without_one(
    folder: Callable[[str], Path], ca1: ca.CABundle
) -> None:
    """A finding about spiffe-tls, for probe ports: with `ServerTlsMode.TLS` the client
    certificate is optional, and OpenSSL runs the verify callback, so `authorize_fn`, only on a
    certificate it received: a client that presents none is let in."""
    server = Workload.make(folder("api"), issue(ca1, SERVER_ID), roots(ca1))
    authorize = authorize_id(spiffe.SpiffeId(CLIENT_ID))
    anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    anonymous.check_hostname = False  # a pod certificate names a workload, not a host
    anonymous.load_verify_locations(cadata=roots(ca1).decode())
    with (
        adapter(server) as source,
        SpiffeTlsServer(source, authorize, tls_mode=spiffetls.ServerTlsMode.TLS).running() as api,
        socket.create_connection(("127.0.0.1", api.port), timeout=DEADLINE) as raw,
        anonymous.wrap_socket(raw) as conn,
    ):
        conn.sendall(REQUEST)
        assert conn.recv(4096) == answered_by(SERVER_ID).encode()
    assert api.wait_for(1) == [Served(None, REQUEST)]
