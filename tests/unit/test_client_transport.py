"""`podcert.client.transport`, the API client's own HTTP/1.1 connections, driven through `Rest`
against a small scripted server on loopback (`tests.canned_rest.Server`): kept-alive connections
are reused, one the server closed is replaced (a GET it dropped unread is sent again, once; a POST
it may have applied never is), a client certificate is presented and the server's name checked, a
proxy is tunnelled through with CONNECT, the idle connections kept are bounded, and every way the
server can go away, or answer what is not HTTP/1.1, is a retryable `ApiError` naming where it was.
(What `Rest` makes of the answers, errors, watches and lists, is test_client_rest.py's; the
framing of an answer, pinned to h11, test_http_framing.py's.)
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import trustme

from devcluster.testing import eventually
from podcert.client import transport
from podcert.client.kubeconfig import ClientSettings
from podcert.client.rest import ApiError, Rest
from tests.canned_rest import Request, Server, answer, read_request, rest_for, scripted_servers


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    with scripted_servers() as start:
        yield start


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


def test_a_status_line_that_is_not_http_is_unavailable(serve: Callable[..., Server]) -> None:
    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        server.read(reader)
        sock.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")

    server = serve(handler)
    with pytest.raises(ApiError, match=r"not an HTTP/1\.1 answer"):
        rest_for(server).get("/x")


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
