"""`podcert.client.rest.Rest` over its own HTTP/1.1 connections (`podcert.client.transport`),
against a small scripted server on loopback: kept-alive connections are reused, one the server
closed is replaced (a GET it dropped unread is sent again, once; a POST it may have applied never
is), a watch streams its events line by line across chunks, and every way the server can go away is
a retryable `ApiError` naming where it was.

Found earlier by tests/integration/test_faults.py: an API server going away mid-watch must be a
plain retry for the reflectors, not an unexpected error with a traceback.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import pytest
import trustme

from devcluster.testing import eventually
from podcert.client import pages, transport
from podcert.client.kubeconfig import ClientConfigError, ClientSettings
from podcert.client.rest import ApiError, Gone, Rest


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


def read_request(reader: BinaryIO) -> Request | None:
    line = reader.readline()
    if not line:
        return None
    method, target, _ = line.decode().split(" ", 2)
    headers = {}
    while (header := reader.readline()) not in (b"\r\n", b""):
        name, _, value = header.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    body = reader.read(int(headers.get("content-length", "0")))
    return Request(method, target, headers, body)


def answer(status: int, body: Any, close: bool = False) -> bytes:
    data = json.dumps(body).encode()
    head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(data)}\r\n" + ("Connection: close\r\n" if close else "")
    return head.encode() + b"\r\n" + data


def chunked(*chunks: bytes) -> bytes:
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    return head + b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)


def event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


# What the server does on one connection: (connection number, its reader, its socket).
Handler = Callable[[int, BinaryIO, socket.socket], None]


@dataclass
class Server:
    """A TCP server on loopback running `handler` for each connection it accepts."""

    handler: Handler
    context: ssl.SSLContext | None = None
    requests: list[Request] = field(default_factory=list)
    connections: int = 0

    def __post_init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.socks.append(sock)
            number = self.connections
            self.connections += 1
            threading.Thread(target=self._serve, args=(number, sock), daemon=True).start()

    def _serve(self, number: int, sock: socket.socket) -> None:
        try:
            if self.context is not None:
                sock = self.context.wrap_socket(sock, server_side=True)
            self.handler(number, sock.makefile("rb"), sock)
        except OSError:
            pass
        finally:
            sock.close()

    def read(self, reader: BinaryIO) -> Request | None:
        request = read_request(reader)
        if request is not None:
            self.requests.append(request)
        return request

    @property
    def url(self) -> str:
        return f"{'https' if self.context else 'http'}://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.listener.close()
        for sock in self.socks:
            sock.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def start(handler: Handler, context: ssl.SSLContext | None = None) -> Server:
        servers.append(Server(handler, context))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def rest_for(server: Server, **kwargs: Any) -> Rest:
    return Rest(ClientSettings(server.url, None, **kwargs), timeout=5.0)


# --- connections ----------------------------------------------------------------------------------


def test_requests_share_one_kept_alive_connection(serve: Callable[..., Server]) -> None:
    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while (request := server.read(reader)) is not None:
            sock.sendall(answer(200, {"path": request.target}))

    server = serve(handler)
    rest = rest_for(server, token=lambda: "t0ken")

    for i in range(3):
        assert rest.request("PUT", f"/api/v1/x{i}", body={"i": i}) == {"path": f"/api/v1/x{i}"}
    assert rest.write("PUT", "/api/v1/y", body={"i": 3}) is None  # its answer read, not decoded
    assert rest.request("GET", "/api/v1/z") == {"path": "/api/v1/z"}

    assert server.connections == 1
    first = server.requests[0]
    assert first.headers["authorization"] == "Bearer t0ken"
    assert first.headers["content-type"] == "application/json"
    assert first.headers["host"] == f"127.0.0.1:{server.port}"
    assert first.headers["user-agent"].startswith("podcert/")
    assert json.loads(first.body) == {"i": 0}


def test_a_connection_the_server_closed_while_idle_is_replaced(
    serve: Callable[..., Server],
) -> None:
    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        if server.read(reader) is not None:
            sock.sendall(answer(200, {}))  # then close, without saying so beforehand

    server = serve(handler)
    rest = rest_for(server)
    rest.request("GET", "/a")
    eventually(lambda: len(server.requests) == 1, timeout=5, what="the first request")
    rest.request("GET", "/b")

    assert server.connections == 2


def test_a_request_dropped_unread_on_a_kept_alive_connection_is_sent_again(
    serve: Callable[..., Server],
) -> None:
    """The race the idle check cannot see: the server closes a kept-alive connection just as a
    request goes out on it. Before any byte of an answer, it is sent once more, on a new one."""

    def handler(n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while (request := server.read(reader)) is not None:
            if n == 0 and request.target == "/second":
                sock.shutdown(socket.SHUT_RDWR)  # gone, no answer
                return
            sock.sendall(answer(200, {"n": n}))

    server = serve(handler)
    rest = rest_for(server)
    assert rest.request("GET", "/first") == {"n": 0}
    pool = rest._pool
    idle = pool._idle[-1]
    idle.idle_closed = lambda: False  # type: ignore[method-assign]  # as if it looked alive

    assert rest.request("GET", "/second") == {"n": 1}
    assert [r.target for r in server.requests] == ["/first", "/second", "/second"]


@pytest.mark.parametrize(
    "method",
    [
        pytest.param("POST", id="a create"),
        pytest.param("PUT", id="an update"),
        pytest.param("PATCH", id="a patch"),
        pytest.param("DELETE", id="a delete"),
    ],
)
def test_a_written_write_without_an_answer_is_never_sent_again(
    serve: Callable[..., Server], method: str
) -> None:
    """The server (or a proxy) may have applied it: a second copy could create a second object.
    The caller learns the outcome is unknown (a retryable ApiError), as from client-go."""

    def handler(n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while (request := server.read(reader)) is not None:
            if request.method == method:
                sock.shutdown(socket.SHUT_RDWR)  # read and gone, no answer
                return
            sock.sendall(answer(200, {"n": n}))

    server = serve(handler)
    rest = rest_for(server)
    rest.request("GET", "/first")  # the write goes on this kept-alive connection
    with pytest.raises(ApiError) as raised:
        rest.request(method, "/apis/x/v1/namespaces/a/things", body={"spec": {}})
    assert (raised.value.status, raised.value.reason) == (0, "Unavailable")
    assert [r.method for r in server.requests] == ["GET", method]
    assert server.connections == 1


def test_a_get_dropped_unread_is_sent_again_once_on_a_new_connection_only(
    serve: Callable[..., Server],
) -> None:
    """Every kept-alive connection dead but looking alive: the GET goes out on one of them, then
    once on a new connection, and not on each idle connection in turn."""

    def handler(n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while (request := server.read(reader)) is not None:
            if request.target == "/again":
                sock.shutdown(socket.SHUT_RDWR)
                return
            sock.sendall(answer(200, {"n": n}))

    server = serve(handler)
    rest = rest_for(server)
    # Three connections at once, all kept idle afterwards.
    held = [rest._send("GET", "/hold", None, None, "application/json", None) for _ in range(3)]
    for response in held:
        rest._body(response)
    for conn in rest._pool._idle:
        conn.idle_closed = lambda: False  # type: ignore[method-assign]
    assert server.connections == 3

    with pytest.raises(ApiError):
        rest.request("GET", "/again")
    assert [r.target for r in server.requests].count("/again") == 2
    assert server.connections == 4


class _DeadSocket:
    """A kept-alive connection whose first write fails: nothing of the request left."""

    def settimeout(self, _t: float) -> None:
        pass

    def send(self, _data: bytes) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    sendall = send


class _DeadConnection:
    sock = _DeadSocket()
    reader = None
    reused = True

    def idle_closed(self) -> bool:
        return False

    def close(self) -> None:
        pass


def test_a_write_of_which_nothing_was_written_is_sent_on_a_new_connection(
    serve: Callable[..., Server],
) -> None:
    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while server.read(reader) is not None:
            sock.sendall(answer(201, {"created": True}))

    server = serve(handler)
    rest = rest_for(server)
    rest._pool._idle.append(_DeadConnection())  # type: ignore[arg-type]

    assert rest.request("POST", "/things", body={}) == {"created": True}
    assert [r.method for r in server.requests] == ["POST"]


def test_a_new_connection_closed_unread_is_an_error_not_a_loop(
    serve: Callable[..., Server],
) -> None:
    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        server.read(reader)
        sock.shutdown(socket.SHUT_RDWR)

    server = serve(handler)
    with pytest.raises(ApiError) as raised:
        rest_for(server).request("GET", "/x")
    assert raised.value.status == 0 and raised.value.retryable
    assert f"cannot reach the API server at 127.0.0.1:{server.port}" in str(raised.value)
    assert server.connections == 1


def test_an_api_server_nobody_answers_for_says_where(serve: Callable[..., Server]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    rest = Rest(ClientSettings(f"http://127.0.0.1:{port}", None))
    with pytest.raises(ApiError) as raised:
        rest.get("/version")
    assert str(raised.value) == f"cannot reach the API server at 127.0.0.1:{port} " + (
        "(Connection refused)"
    )
    assert raised.value.retryable


def test_an_answer_that_does_not_come_times_out(serve: Callable[..., Server]) -> None:
    done = threading.Event()

    def handler(_n: int, reader: BinaryIO, _sock: socket.socket) -> None:
        server.read(reader)
        done.wait(10)

    server = serve(handler)
    rest = Rest(ClientSettings(server.url, None), timeout=0.2)
    with pytest.raises(ApiError, match=r"\(timed out\)"):
        rest.request("GET", "/slow")
    done.set()


def test_error_answers_keep_their_status_and_reason(serve: Callable[..., Server]) -> None:
    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while (request := server.read(reader)) is not None:
            if request.target.startswith("/missing"):
                status = {"kind": "Status", "code": 404, "reason": "NotFound", "message": "no"}
                sock.sendall(answer(404, status))
            elif request.target == "/text":
                sock.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 5\r\n\r\noops!")
            else:
                conflict = {"kind": "Status", "reason": "Conflict", "message": "changed"}
                sock.sendall(answer(409, conflict))

    server = serve(handler)
    rest = rest_for(server)
    assert rest.get("/missing") is None
    with pytest.raises(ApiError) as raised:
        rest.request("PUT", "/conflict", body={})
    assert (raised.value.status, raised.value.reason, raised.value.message) == (
        409,
        "Conflict",
        "changed",
    )
    with pytest.raises(ApiError, match="502 Error: oops!"):
        rest.request("GET", "/text")
    with pytest.raises(ApiError) as raised:
        rest.write("PUT", "/conflict", body={})  # an answer not decoded, its status still checked
    assert (raised.value.status, raised.value.message) == (409, "changed")
    assert server.connections == 1  # error answers leave the connection usable


def test_a_query_is_encoded_and_a_path_prefix_kept(serve: Callable[..., Server]) -> None:
    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while server.read(reader) is not None:
            sock.sendall(answer(200, {}))

    server = serve(handler)
    rest = Rest(ClientSettings(server.url + "/k8s", None))
    rest.request("GET", "/api/v1/pods", query={"labelSelector": "a=b,c", "watch": True})
    assert server.requests[0].target == "/k8s/api/v1/pods?labelSelector=a%3Db%2Cc&watch=true"


def test_a_client_certificate_over_tls(serve: Callable[..., Server], tmp_path: Path) -> None:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("kubernetes.default.svc").configure_cert(server_context)
    ca.configure_trust(server_context)
    server_context.verify_mode = ssl.CERT_REQUIRED
    seen: list[Any] = []

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        seen.append(sock.getpeercert())  # type: ignore[attr-defined]
        while server.read(reader) is not None:
            sock.sendall(answer(200, {"ok": True}))

    server = serve(handler, server_context)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(client)
    ca.issue_cert("node-a").configure_cert(client)

    named = Rest(ClientSettings(server.url, client, tls_server_name="kubernetes.default.svc"))
    assert named.get("/x") == {"ok": True}
    assert seen and seen[0]  # the server saw our certificate

    wrong = Rest(ClientSettings(server.url, client))  # 127.0.0.1 is not in its certificate
    with pytest.raises(ApiError, match="certificate verify failed"):
        wrong.get("/x")


def test_a_proxy_tunnels_with_connect(serve: Callable[..., Server]) -> None:
    def upstream(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while api.read(reader) is not None:
            sock.sendall(answer(200, {"via": "proxy"}))

    api = serve(upstream)
    connects: list[Request] = []

    def proxy_handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        request = read_request(reader)
        assert request is not None
        connects.append(request)
        with socket.create_connection(("127.0.0.1", api.port)) as up:
            sock.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            relay(sock, up)

    proxy = serve(proxy_handler)
    rest = Rest(ClientSettings(api.url, None, proxy=f"http://me:s3cret@127.0.0.1:{proxy.port}"))
    assert rest.get("/version") == {"via": "proxy"}
    assert connects[0].method == "CONNECT"
    assert connects[0].target == f"127.0.0.1:{api.port}"
    assert connects[0].headers["proxy-authorization"] == "Basic bWU6czNjcmV0"


def relay(a: socket.socket, b: socket.socket) -> None:
    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            dst.close()

    threading.Thread(target=pump, args=(b, a), daemon=True).start()
    pump(a, b)


# --- watches --------------------------------------------------------------------------------------


def test_a_watch_streams_events_split_across_chunks(serve: Callable[..., Server]) -> None:
    pods = [{"metadata": {"name": f"p{i}", "resourceVersion": str(i)}} for i in range(3)]
    stream = b"".join(event("ADDED", pod) for pod in pods)
    released = threading.Event()

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while (request := server.read(reader)) is not None:
            if "watch=true" in request.target:
                sock.sendall(chunked(stream[:10], stream[10:70], stream[70:]) + b"0\r\n\r\n")
            else:
                sock.sendall(answer(200, {}))
                released.set()

    server = serve(handler)
    rest = rest_for(server)
    events = list(rest.watch("/api/v1/pods", "1", timeout_seconds=5))

    assert [e["object"] for e in events] == pods
    assert "resourceVersion=1" in server.requests[0].target
    assert "allowWatchBookmarks=true" in server.requests[0].target
    rest.get("/after")  # the watch's connection, read to its end, is reused
    assert server.connections == 1


def test_a_watch_stream_cut_short_is_an_unavailable_api_error(
    serve: Callable[..., Server],
) -> None:
    pod = {"metadata": {"name": "p", "resourceVersion": "7"}}

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        server.read(reader)
        sock.sendall(chunked(event("ADDED", pod)) + b'40\r\n{"type":')  # then gone
        sock.shutdown(socket.SHUT_RDWR)

    server = serve(handler)
    events = rest_for(server).watch("/api/v1/pods", "1")
    assert next(events)["object"] == pod
    with pytest.raises(ApiError) as broke:
        next(events)
    assert (broke.value.status, broke.value.reason) == (0, "Unavailable")
    assert broke.value.retryable
    assert "watch stream broke" in str(broke.value)


def test_an_expired_watch_raises_gone(serve: Callable[..., Server]) -> None:
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while server.read(reader) is not None:
            sock.sendall(chunked(event("ERROR", status)) + b"0\r\n\r\n")

    server = serve(handler)
    with pytest.raises(Gone, match="410 Expired: too old"):
        list(rest_for(server).watch("/api/v1/pods", "1"))


def test_a_watch_left_half_way_does_not_leave_its_connection_for_others(
    serve: Callable[..., Server],
) -> None:
    pod = {"metadata": {"name": "p", "resourceVersion": "7"}}

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while (request := server.read(reader)) is not None:
            if "watch=true" in request.target:
                sock.sendall(chunked(event("ADDED", pod), event("ADDED", pod)))
            else:
                sock.sendall(answer(200, {"plain": True}))

    server = serve(handler)
    rest = rest_for(server)
    events = rest.watch("/api/v1/pods", "1")
    next(events)
    events.close()  # the caller stopped: the rest of the stream is unread

    assert rest.get("/x") == {"plain": True}
    assert server.connections == 2


def test_a_status_line_that_is_not_http_is_unavailable(serve: Callable[..., Server]) -> None:
    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        server.read(reader)
        sock.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

    server = serve(handler)
    with pytest.raises(ApiError, match=r"not an HTTP/1\.1 answer"):
        rest_for(server).get("/x")


def test_dropping_a_rest_closes_its_idle_connections(serve: Callable[..., Server]) -> None:
    closed = threading.Event()

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while server.read(reader) is not None:
            sock.sendall(answer(200, {}))
        closed.set()

    server = serve(handler)
    rest = rest_for(server)
    rest.get("/x")
    rest.close()
    assert closed.wait(5)


def test_idle_connections_kept_are_bounded() -> None:
    pool = transport.Pool(transport.Endpoint("127.0.0.1", 1, None, "127.0.0.1", ""), keep=1)

    class Conn:
        closed = False
        reused = False

        def close(self) -> None:
            self.closed = True

    class Done:
        def __init__(self) -> None:
            self.conn, self.done, self.keep = Conn(), True, True

    first, second = Done(), Done()
    pool.release(first)  # type: ignore[arg-type]
    pool.release(second)  # type: ignore[arg-type]
    assert list(pool._idle) == [first.conn] and second.conn.closed


# --- odd answers: each one a typed error ----------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", id="a 200 not JSON"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n[1,2]", id="a 200 JSON list"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n{}", id="Content-Length ²"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000000\r\n\r\n{}",
            id="Content-Length 10^15",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\n{}\r\n0\r\n\r\n",
            id="chunk size 0x2",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0_2\r\n{}\r\n0\r\n\r\n",
            id="chunk size 0_2",
        ),
    ],
)
def test_an_odd_answer_is_a_bad_response_api_error(
    serve: Callable[..., Server], raw: bytes
) -> None:
    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        server.read(reader)
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)

    server = serve(handler)
    with pytest.raises(ApiError) as raised:
        rest_for(server).request("GET", "/api/v1/x")
    assert (raised.value.status, raised.value.reason) == (0, "BadResponse")
    assert raised.value.retryable


def test_a_watch_error_event_with_an_odd_code_is_an_api_error(
    serve: Callable[..., Server],
) -> None:
    status = {"kind": "Status", "code": "gone", "reason": "Expired", "message": "?"}

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        server.read(reader)
        sock.sendall(chunked(event("ERROR", status)) + b"0\r\n\r\n")

    server = serve(handler)
    with pytest.raises(ApiError) as raised:
        list(rest_for(server).watch("/api/v1/pods", "1"))
    assert (raised.value.status, raised.value.reason) == (500, "Expired")


def test_a_token_that_is_no_header_value_is_refused_not_sent(
    serve: Callable[..., Server],
) -> None:
    server = serve(lambda _n, reader, _sock: server.read(reader))
    rest = Rest(ClientSettings(server.url, None, token=lambda: "t€ken", source="kubeconfig k"))
    with pytest.raises(ClientConfigError) as raised:
        rest.get("/x")
    assert str(raised.value) == "kubeconfig k: the bearer token is not one line of ASCII"
    assert "t€ken" not in str(raised.value)
    assert server.requests == []


# --- lists and shaped reads -----------------------------------------------------------------------


class PodName(msgspec.Struct, frozen=True):
    class Meta(msgspec.Struct, frozen=True):
        name: str = ""

    metadata: Meta = Meta()


def test_a_list_page_is_decoded_as_it_arrives(serve: Callable[..., Server]) -> None:
    """The first pod is handed out while the rest of its page is still to come: a page is never
    held whole (the server sends the rest only once the client has the first), only a buffer
    of about `pages.PIECE` bytes."""
    first_seen = threading.Event()
    rest_sent: list[bool] = []
    pods = [{"metadata": {"name": f"p{i}"}, "spec": {"x": "y" * 100_000}} for i in range(20)]
    body = json.dumps({"metadata": {"resourceVersion": "42"}, "items": pods}).encode()
    cut = body.index(b'{"metadata": {"name": "p15"}')
    assert cut > pages.PIECE

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        server.read(reader)
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        sock.sendall(head + b"%x\r\n%s\r\n" % (cut, body[:cut]))
        rest_sent.append(first_seen.wait(5))
        sock.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body) - cut, body[cut:]))

    server = serve(handler)
    items, version = rest_for(server).list("/api/v1/pods", PodName)
    assert version == "42"
    assert next(items).metadata.name == "p0"
    first_seen.set()
    assert [p.metadata.name for p in items] == [f"p{i}" for i in range(1, 20)]
    assert rest_sent == [True], "the client waited for the whole page before its first pod"


def test_a_list_reads_every_page_and_its_version_from_the_first(
    serve: Callable[..., Server],
) -> None:
    answers = {
        "": {"metadata": {"resourceVersion": "9", "continue": "c1"}, "items": [{"n": 0}]},
        # A later page's metadata after its items: its continue token is still read.
        "c1": {
            "items": [{"n": 1}, {"n": 2}],
            "metadata": {"resourceVersion": "9", "continue": "c2"},
        },
        "c2": {"items": [{"n": 3}], "metadata": {"resourceVersion": "9"}},
    }

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while (request := server.read(reader)) is not None:
            token = request.target.partition("continue=")[2]
            sock.sendall(chunked(json.dumps(answers[token]).encode()) + b"0\r\n\r\n")

    server = serve(handler)
    items, version = rest_for(server).list("/api/v1/pods", limit=1)
    assert version == "9"
    assert list(items) == [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}]
    assert all("limit=1" in r.target for r in server.requests)
    assert server.connections == 1, "each page read to its end leaves the connection reusable"


def test_a_first_page_with_its_metadata_after_the_items_still_gives_the_version(
    serve: Callable[..., Server],
) -> None:
    page = {"items": [{"n": 0}, {"n": 1}], "metadata": {"resourceVersion": "5"}}

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        server.read(reader)
        sock.sendall(answer(200, page))

    items, version = rest_for(server := serve(handler)).list("/api/v1/pods")
    assert version == "5"
    assert list(items) == page["items"]


def test_a_list_left_half_way_closes_its_connection(serve: Callable[..., Server]) -> None:
    body = {"metadata": {"resourceVersion": "1"}, "items": [{"n": "x" * pages.PIECE}] * 3}

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while (request := server.read(reader)) is not None:
            if "limit=" in request.target:
                sock.sendall(answer(200, body))
            else:
                sock.sendall(answer(200, {"plain": True}))

    server = serve(handler)
    rest = rest_for(server)
    items, _ = rest.list("/api/v1/pods")
    next(items)
    items.close()  # the caller stopped with the page unread

    assert rest.get("/x") == {"plain": True}
    assert server.connections == 2


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"metadata":{},"items":[{"n":1},', id="a page cut short"),
        pytest.param(b'{"metadata":{},"items":[{"n":1}}', id="a page not JSON"),
        pytest.param(b'{"metadata":{},"items":[1]}', id="an item not an object"),
        pytest.param(b'{"metadata":{},"items":[]} {}', id="more after the page"),
        pytest.param(b'{"items":[],"items":[]}', id="items twice"),
    ],
)
@pytest.mark.parametrize("framing", ["chunked", "to the end"])
def test_a_broken_list_page_is_a_bad_response(
    serve: Callable[..., Server], body: bytes, framing: str
) -> None:
    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        server.read(reader)
        if framing == "chunked":  # no last chunk: the server went away after the body
            sock.sendall(chunked(body))
        else:
            sock.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body)
        sock.shutdown(socket.SHUT_RDWR)

    server = serve(handler)
    with pytest.raises(ApiError) as failed:
        items, _ = rest_for(server).list("/api/v1/pods")
        list(items)
    assert (failed.value.status, failed.value.reason) == (0, "BadResponse"), failed.value
    assert failed.value.retryable


def test_a_shaped_get_decodes_only_the_shape(serve: Callable[..., Server]) -> None:
    pod = {"metadata": {"name": "p", "annotations": {"a": "b" * 1000}}, "spec": {}}

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while (request := server.read(reader)) is not None:
            if request.target.endswith("/gone"):
                sock.sendall(answer(404, {"kind": "Status", "reason": "NotFound"}))
            elif request.target.endswith("/odd"):
                sock.sendall(answer(200, [1, 2]))
            else:
                sock.sendall(answer(200, pod))

    rest = rest_for(server := serve(handler))
    assert rest.get_as("/api/v1/pods/p", PodName) == PodName(PodName.Meta("p"))
    assert rest.get_as("/api/v1/pods/gone", PodName) is None
    with pytest.raises(ApiError) as odd:
        rest.get_as("/api/v1/pods/odd", PodName)
    assert (odd.value.status, odd.value.reason) == (0, "BadResponse")
