"""bundles.handshake: a refused peer never sees a byte of the request, whatever the client stack.

`TLSSource.client_context()` used to trust our roots and every federated
root and leave the SPIFFE ID to a check after the handshake, so urllib, httpx and aiohttp sent
the request, bearer token included, to both impostors tried. Here each stack `bundles` supports
talks, over loopback, to a real TLS server that records every application byte it reads: the
genuine server gets the request and answers; the impostors (a genuine leaf of our CA for another
workload, and a federated CA's leaf claiming our server's ID) read nothing at all. Then the
server side: a refused client's connection never reaches the application.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import ssl
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import requests
import requests.adapters

from bundles.authz import Authorizer, Verdict, allow_ids
from bundles.formats import Credential, TrustBundle, dump_credential
from bundles.handshake import PeerRefusedError, build_contexts
from bundles.source import TLSSource
from tests.unit.test_bundles_formats import Authority

LOCAL = "cluster.local"
API = f"spiffe://{LOCAL}/ns/shop/sa/api"
WEB = f"spiffe://{LOCAL}/ns/shop/sa/web"
OTHER = f"spiffe://{LOCAL}/ns/shop/sa/other"
PARTNER = "partner.test"
TOKEN = "Bearer s3cret-token"  # what must never reach an impostor
DEADLINE = 10.0

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def ours() -> Authority:
    return Authority("podcert root")


@pytest.fixture(scope="module")
def partner() -> Authority:
    return Authority("partner root")


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def web(tmp_path_factory: pytest.TempPathFactory, ours: Authority, partner: Authority) -> TLSSource:
    """The client workload: our root, and partner.test's root as partner.test's bundle."""
    folder = tmp_path_factory.mktemp("web")
    return TLSSource(
        write(folder / "credential.pem", dump_credential(ours.issue(WEB))),
        write(folder / "trust.pem", ours.pem),
        federated={PARTNER: write(folder / "partner.pem", partner.pem)},
    )


ALLOW_API = allow_ids([API])


# --- a TLS server that records what it reads ------------------------------------------------------


@dataclass
class Recorder:
    """A loopback TLS server presenting `credential`; records each connection's application
    bytes and answers a complete HTTP request with 200."""

    credential: Credential
    client_roots: bytes | None = None  # PEM; with it, the server asks for a client certificate
    received: list[bytes] = field(default_factory=list)
    connections: int = 0
    port: int = 0

    @contextlib.contextmanager
    def running(self) -> Iterator[Recorder]:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with _pem_file(dump_credential(self.credential)) as path:
            context.load_cert_chain(path)
        if self.client_roots is not None:
            context.verify_mode = ssl.CERT_OPTIONAL
            context.load_verify_locations(cadata=self.client_roots.decode())
        listener = socket.create_server(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        done = threading.Event()
        threads: list[threading.Thread] = []

        def accept() -> None:
            while not done.is_set():
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                thread = threading.Thread(target=self._serve, args=(context, conn), daemon=True)
                threads.append(thread)
                thread.start()

        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        try:
            yield self
        finally:
            done.set()
            listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (Linux)
            listener.close()
            acceptor.join(DEADLINE)
            for thread in threads:
                thread.join(DEADLINE)
                assert not thread.is_alive(), "a connection outlived its deadline"

    def _serve(self, context: ssl.SSLContext, conn: socket.socket) -> None:
        self.connections += 1
        got = b""
        conn.settimeout(DEADLINE)
        try:
            with context.wrap_socket(conn, server_side=True) as tls:
                while b"\r\n\r\n" not in got:
                    data = tls.recv(65536)
                    if not data:
                        break
                    got += data
                if b"\r\n\r\n" in got:
                    tls.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                    )
        except OSError:  # the client went away mid-handshake or after it: nothing more to read
            pass
        finally:
            self.received.append(got)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/"

    def wait_for(self, connections: int) -> None:
        deadline = time.monotonic() + DEADLINE
        while len(self.received) < connections:
            assert time.monotonic() < deadline, "the server never saw the connection end"
            time.sleep(0.01)


@contextlib.contextmanager
def _pem_file(data: bytes) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "credential.pem"
        path.write_bytes(data)
        yield str(path)


# --- the client stacks ----------------------------------------------------------------------------

Get = Callable[[str, ssl.SSLContext], str]


def with_urllib(url: str, context: ssl.SSLContext) -> str:
    request = urllib.request.Request(url, headers={"Authorization": TOKEN})  # noqa: S310
    with urllib.request.urlopen(request, context=context, timeout=DEADLINE) as answer:  # noqa: S310
        return str(answer.read().decode())


def with_http_client(url: str, context: ssl.SSLContext) -> str:
    port = int(url.rsplit(":", 1)[1].strip("/"))
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=DEADLINE)
    try:
        connection.request("GET", "/", headers={"Authorization": TOKEN})
        return connection.getresponse().read().decode()
    finally:
        connection.close()


class _ContextAdapter(requests.adapters.HTTPAdapter):
    """requests with a given SSLContext: the documented way, through urllib3's pool manager."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self._context = context
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        # Pod certificates name a workload, not a host: urllib3's own hostname match is off.
        kwargs.update(ssl_context=self._context, assert_hostname=False)
        super().init_poolmanager(*args, **kwargs)


def with_requests(url: str, context: ssl.SSLContext) -> str:
    with requests.Session() as session:
        session.mount("https://", _ContextAdapter(context))
        answer = session.get(url, headers={"Authorization": TOKEN}, timeout=DEADLINE)
        return answer.text


def with_httpx(url: str, context: ssl.SSLContext) -> str:
    with httpx.Client(verify=context, timeout=DEADLINE) as client:
        return client.get(url, headers={"Authorization": TOKEN}).text


def with_httpx_async(url: str, context: ssl.SSLContext) -> str:
    async def get() -> str:
        async with httpx.AsyncClient(verify=context, timeout=DEADLINE) as client:
            return (await client.get(url, headers={"Authorization": TOKEN})).text

    return asyncio.run(get())


def with_aiohttp(url: str, context: ssl.SSLContext) -> str:
    async def get() -> str:
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, ssl=context, headers={"Authorization": TOKEN}) as answer,
        ):
            return await answer.text()

    return asyncio.run(get())


def _raw_request(port: int) -> bytes:
    return f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: {TOKEN}\r\n\r\n".encode()


def with_asyncio_streams(url: str, context: ssl.SSLContext) -> str:
    port = int(url.rsplit(":", 1)[1].strip("/"))

    async def get() -> str:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
        try:
            writer.write(_raw_request(port))
            await writer.drain()
            return (await reader.read()).decode().rsplit("\r\n", 1)[-1]
        finally:
            writer.close()

    return asyncio.run(get())


def with_ssl_socket(url: str, context: ssl.SSLContext) -> str:
    port = int(url.rsplit(":", 1)[1].strip("/"))
    with context.wrap_socket(socket.create_connection(("127.0.0.1", port), DEADLINE)) as tls:
        tls.sendall(_raw_request(port))
        answer = b""
        while data := tls.recv(65536):
            answer += data
        return answer.decode().rsplit("\r\n", 1)[-1]


def with_ssl_socket_lazily(url: str, context: ssl.SSLContext) -> str:
    """No handshake on connect: the first sendall would let OpenSSL run it unjudged."""
    port = int(url.rsplit(":", 1)[1].strip("/"))
    plain = socket.create_connection(("127.0.0.1", port), DEADLINE)
    with context.wrap_socket(plain, do_handshake_on_connect=False) as tls:
        tls.sendall(_raw_request(port))
        return tls.recv(65536).decode().rsplit("\r\n", 1)[-1]


STACKS = [
    pytest.param(with_urllib, id="urllib"),
    pytest.param(with_http_client, id="http.client"),
    pytest.param(with_requests, id="requests"),
    pytest.param(with_httpx, id="httpx sync"),
    pytest.param(with_httpx_async, id="httpx async"),
    pytest.param(with_aiohttp, id="aiohttp ssl=context"),
    pytest.param(with_asyncio_streams, id="asyncio streams"),
    pytest.param(with_ssl_socket, id="ssl socket"),
    pytest.param(with_ssl_socket_lazily, id="ssl socket, handshake not on connect"),
]


@pytest.mark.parametrize("get", STACKS)
def test_the_genuine_server_gets_the_request(get: Get, web: TLSSource, ours: Authority) -> None:
    with Recorder(ours.issue(API)).running() as server:
        assert get(server.url, web.client_context(ALLOW_API)) == "ok"
        server.wait_for(1)
    assert TOKEN.encode() in server.received[0]


IMPOSTORS = [
    pytest.param("ours", OTHER, f"{OTHER} is not the allowed ID", id="our CA, another workload"),
    pytest.param(
        "partner",
        API,
        f"{API} chains to a root of federated trust domain {PARTNER}",
        id="a federated CA's leaf claiming our server's ID",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("issuer", "claimed", "reason"), IMPOSTORS)
@pytest.mark.parametrize("get", STACKS)
def test_an_impostor_server_never_reads_a_byte_of_the_request(
    get: Get,
    issuer: str,
    claimed: str,
    reason: str,
    web: TLSSource,
    ours: Authority,
    partner: Authority,
) -> None:
    impostor = (ours if issuer == "ours" else partner).issue(claimed)
    with Recorder(impostor).running() as server:
        with pytest.raises(Exception) as failed:  # each stack wraps the refusal its own way
            get(server.url, web.client_context(ALLOW_API))
        server.wait_for(server.connections or 1)
    assert server.received and all(got == b"" for got in server.received), server.received
    assert _caused_by_refusal(failed.value, reason), repr(failed.value)


def _caused_by_refusal(error: BaseException, reason: str) -> bool:
    """Whether the stack's error is, or wraps, our refusal (its reason in the message)."""
    stack, seen = [error], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if reason in str(current):
            return True
        links = (current.__cause__, current.__context__, *current.args)
        stack += [link for link in links if isinstance(link, BaseException)]
    return False


def test_a_refused_connection_stays_refused(web: TLSSource, ours: Authority) -> None:
    with Recorder(ours.issue(OTHER)).running() as server:
        plain = socket.create_connection(("127.0.0.1", server.port), DEADLINE)
        tls = web.client_context(ALLOW_API).wrap_socket(plain, do_handshake_on_connect=False)
        with pytest.raises(PeerRefusedError):
            tls.do_handshake()
        for attempt in (lambda: tls.sendall(b"x"), lambda: tls.recv(1), tls.do_handshake):
            with pytest.raises(PeerRefusedError):
                attempt()
        server.wait_for(1)
    assert server.received == [b""]


def test_a_context_a_library_stopped_verifying_refuses_every_server(
    web: TLSSource, ours: Authority, tmp_path: Path
) -> None:
    """requests with verify=False sets CERT_NONE on the context it is given: then OpenSSL
    ignores what it found wrong with a chain, and no server is one of ours."""
    context = web.client_context(allow_ids([API, f"spiffe://{LOCAL}/ns/shop/sa/lax"]))
    context.verify_mode = ssl.CERT_NONE
    with Recorder(ours.issue(API)).running() as server:
        with pytest.raises(PeerRefusedError, match="no longer verifies peers"):
            with_ssl_socket(server.url, context)
        server.wait_for(1)
    assert server.received == [b""]


def test_httpx_syncs_raw_ssl_object_can_be_judged_again(web: TLSSource, ours: Authority) -> None:
    """httpx's sync client reports the `_ssl._SSLSocket` itself as `ssl_object`; authorize()
    used to call getpeercert(binary_form=True) on it and raise TypeError."""
    with (
        Recorder(ours.issue(API)).running() as server,
        httpx.Client(verify=web.client_context(ALLOW_API), timeout=DEADLINE) as client,
        client.stream("GET", server.url) as answer,
    ):
        raw = answer.extensions["network_stream"].get_extra_info("ssl_object")
        assert type(raw).__module__ == "_ssl"
        assert web.authorize(raw, ALLOW_API) == Verdict(True, f"{API} is the allowed ID.")
        assert not web.authorize(raw, allow_ids([OTHER]))
        answer.read()


# --- the server side ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, ours: Authority, partner: Authority) -> TLSSource:
    folder = tmp_path_factory.mktemp("api")
    return TLSSource(
        write(folder / "credential.pem", dump_credential(ours.issue(API))),
        write(folder / "trust.pem", ours.pem),
        federated={PARTNER: write(folder / "partner.pem", partner.pem)},
    )


CLIENTS = [
    pytest.param("ours", WEB, True, id="allowed: our shop/web"),
    pytest.param("ours", OTHER, False, id="refused: our CA, another workload"),
    pytest.param("partner", WEB, False, id="refused: a federated CA's leaf claiming our shop/web"),
    pytest.param(
        "partner",
        f"spiffe://{PARTNER}/ns/shop/sa/web",
        False,
        id="refused: the partner's own shop/web is not ours",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("issuer", "claimed", "allowed"), CLIENTS)
def test_an_asyncio_server_never_hands_a_refused_client_to_the_application(
    issuer: str,
    claimed: str,
    allowed: bool,
    api: TLSSource,
    ours: Authority,
    partner: Authority,
) -> None:
    rule: Authorizer = allow_ids([WEB])
    client_credential = (ours if issuer == "ours" else partner).issue(claimed)
    _, client_context = build_contexts(client_credential, _roots(ours))

    async def scenario() -> tuple[list[bytes], list[Verdict], bytes]:
        handled: list[bytes] = []
        refusals: list[Verdict] = []
        ended = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            handled.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            writer.close()

        def refused(verdict: Verdict) -> None:
            refusals.append(verdict)

        server = await asyncio.start_server(
            handle, "127.0.0.1", 0, ssl=api.server_context(rule, on_refusal=refused)
        )
        port = server.sockets[0].getsockname()[1]
        answer = b""
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context)
            writer.write(_raw_request(port))
            with contextlib.suppress(OSError):  # a refused client sees the connection end
                answer = await asyncio.wait_for(reader.read(), DEADLINE)
            writer.close()
            ended.set()
        finally:
            server.close()
            await server.wait_closed()
        return handled, refusals, answer

    handled, refusals, answer = asyncio.run(scenario())
    if allowed:
        assert len(handled) == 1 and TOKEN.encode() in handled[0]
        assert answer.endswith(b"ok") and refusals == []
    else:
        assert handled == [] and answer == b""
        (verdict,) = refusals
        assert claimed in verdict.reason


def _roots(*authorities: Authority) -> TrustBundle:
    return TrustBundle(tuple(a.cert for a in authorities))


def test_a_resumed_session_is_refused_and_servers_offer_none(
    api: TLSSource, web: TLSSource, ours: Authority
) -> None:
    """A resumed session has no verified chain to judge: servers issue no tickets, and a client
    told to resume is refused rather than let through unjudged."""
    assert api.server_context(allow_ids([WEB])).num_tickets == 0
    with Recorder(ours.issue(API)).running() as server:  # plain ssl: it issues tickets
        context = web.client_context(ALLOW_API)
        port = server.port
        with context.wrap_socket(socket.create_connection(("127.0.0.1", port), DEADLINE)) as tls:
            tls.sendall(_raw_request(port))
            while tls.recv(65536):
                pass
            session = tls.session
        plain = socket.create_connection(("127.0.0.1", port), DEADLINE)
        with pytest.raises(PeerRefusedError, match="verified no chain"):
            context.wrap_socket(plain, session=session)
        plain.close()
        server.wait_for(2)
    assert server.received[1] == b""


def test_a_root_two_federated_domains_list_vouches_for_neither(
    tmp_path: Path, ours: Authority, partner: Authority, caplog: pytest.LogCaptureFixture
) -> None:
    # The root was credited to the domain that sorts first, so genuine
    # peers of the other were refused and the first could speak for IDs it does not own.
    source = TLSSource(
        write(tmp_path / "credential.pem", dump_credential(ours.issue(WEB))),
        write(tmp_path / "trust.pem", ours.pem),
        federated={
            PARTNER: write(tmp_path / "partner.pem", partner.pem),
            "aaa.test": write(tmp_path / "aaa.pem", partner.pem),
        },
    )
    for trust_domain in ("aaa.test", PARTNER):
        claimed = f"spiffe://{trust_domain}/ns/shop/sa/api"
        with Recorder(partner.issue(claimed)).running() as server:
            with pytest.raises(ssl.SSLError):
                with_ssl_socket(server.url, source.client_context(allow_ids([claimed])))
            server.wait_for(server.connections or 1)
        assert all(got == b"" for got in server.received), server.received
    assert f"is listed by aaa.test and {PARTNER}: trusted for none of them" in caplog.text
