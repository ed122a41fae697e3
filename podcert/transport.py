"""HTTP/1.1 to the API server over kept-alive connections: the few parts of the protocol a
Kubernetes client uses, written for the hot path.

The API server answers JSON to a client that asks no compression: a request is one write (head
and body together, one TLS record for a status PUT), an answer a status line, headers and a body
framed by Content-Length or by chunks (lists and watches). http.client parses each answer's
headers with the email package and urllib3 wraps that again; a status PUT of 4 KB cost the client
0.54 ms of CPU through urllib3, about 0.28 ms through http.client and 0.14 ms here
(bench/bench_rest.py, BENCHMARKS.md "Issuance throughput").

A `Pool` keeps idle connections for any thread to take, one request at a time each; a watch holds
its connection until its stream ends. A connection the server closed while idle (it keeps them
for a while only) is noticed before use, and a request that finds one closed anyway, before any
byte of an answer came back, is sent once more on a new connection: the server dropped it unread.
Every failure is an `OSError` (`ProtocolError` for an answer that is not HTTP/1.1); the
connection it happened on is closed, never reused.
"""

from __future__ import annotations

import base64
import io
import select
import socket
import ssl
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Protocol, cast
from urllib.parse import unquote, urlsplit

from podcert.kubeconfig import ClientSettings

MAX_LINE: Final = 64 * 1024  # a status line, header or chunk-size line longer is not HTTP we read
MAX_HEADERS: Final = 200
IDLE_KEPT: Final = 32  # idle connections kept per pool; as many workers as that share it


class ProtocolError(OSError):
    """The server's answer is not HTTP/1.1 as this client reads it, or ended early."""


class ClosedUnread(ConnectionError):
    """A kept-alive connection was closed before any byte of an answer: the server dropped the
    request without reading it, so it may be sent again."""


@dataclass(frozen=True)
class Endpoint:
    """Where the bytes go: the API server (through a proxy's CONNECT tunnel, if any)."""

    host: str
    port: int
    context: ssl.SSLContext | None
    server_hostname: str  # what TLS checks the certificate against
    prefix: str  # a path the server URL carries, before every API path
    proxy: tuple[str, int] | None = None
    proxy_auth: str | None = None  # a Proxy-Authorization value (never in a message)

    @classmethod
    def of(cls, settings: ClientSettings) -> Endpoint:
        parts = urlsplit(settings.server)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        proxy, auth = None, None
        if settings.proxy:
            p = urlsplit(settings.proxy)
            proxy = (p.hostname or "", p.port or 80)
            if p.username is not None:
                creds = f"{unquote(p.username)}:{unquote(p.password or '')}".encode()
                auth = "Basic " + base64.b64encode(creds).decode()
        return cls(
            host,
            port,
            settings.ssl_context if parts.scheme == "https" else None,
            settings.tls_server_name or host,
            parts.path.rstrip("/"),
            proxy,
            auth,
        )

    @property
    def where(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def host_header(self) -> str:
        default = 443 if self.context is not None else 80
        return self.where if self.port != default else self.where.rsplit(":", 1)[0]


class Connection:
    """One TCP (and TLS) connection, used by one request at a time."""

    def __init__(self, endpoint: Endpoint, timeout: float) -> None:
        target = endpoint.proxy or (endpoint.host, endpoint.port)
        sock = socket.create_connection(target, timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if endpoint.proxy is not None:
                _tunnel(sock, endpoint)
            if endpoint.context is not None:
                sock = endpoint.context.wrap_socket(sock, server_hostname=endpoint.server_hostname)
        except BaseException:
            sock.close()
            raise
        self.sock: socket.socket = sock
        self.reader = cast(io.BufferedReader, sock.makefile("rb", buffering=64 * 1024))
        self.reused = False

    def idle_closed(self) -> bool:
        """Whether the server closed (or wrote to) this idle connection: either way it is not
        one to send a request on."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


class Response:
    """An answer's status and headers, its body not read yet. `read()` the whole of it, or
    iterate `chunks()`; then `Pool.release` keeps the connection for the next request if the
    body was read to its end and the server keeps it open."""

    def __init__(self, conn: Connection, method: str, status_line: bytes) -> None:
        self.conn = conn
        status, headers = _head(conn.reader, status_line)
        while 100 <= status < 200:  # interim answers (100 Continue): the real one follows
            status, headers = _head(conn.reader)
        self.status = status
        self.headers = headers
        self.keep = headers.get("connection", "").lower() != "close"
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self.done = False
        self.length: int | None = None
        if method == "HEAD" or status in (204, 304):
            self.length = 0
        elif not self.chunked:
            length = headers.get("content-length")
            if length is None:
                self.keep = False  # the body runs to the end of the connection
            elif length.isdigit():
                self.length = int(length)
            else:
                raise ProtocolError(f"Content-Length {length[:40]!r} is not a number")

    def read(self) -> bytes:
        if self.chunked:
            return b"".join(self.chunks())
        if self.length is None:
            data = self.conn.reader.read()
        else:
            data = self.conn.reader.read(self.length)
            if len(data) < self.length:
                raise ProtocolError("the answer ended before its Content-Length")
        self.done = True
        return data

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives: each chunk of a chunked answer (a watch sends one or more
        per event), else the body whole."""
        if not self.chunked:
            yield self.read()
            return
        reader = self.conn.reader
        while True:
            line = reader.readline(MAX_LINE)
            if not line.endswith(b"\n"):
                raise ProtocolError("the answer ended inside its chunked body")
            try:
                size = int(line.split(b";", 1)[0], 16)
            except ValueError:
                raise ProtocolError("a chunk size that is not a number") from None
            if size == 0:
                _headers(reader)  # trailers, then the blank line
                self.done = True
                return
            data = reader.read(size)
            if len(data) < size or reader.readline(MAX_LINE) not in (b"\r\n", b"\n"):
                raise ProtocolError("the answer ended inside a chunk")
            yield data


class _Lines(Protocol):
    def readline(self, size: int = -1, /) -> bytes: ...


def _head(reader: _Lines, line: bytes | None = None) -> tuple[int, dict[str, str]]:
    if line is None:
        line = reader.readline(MAX_LINE)
    if not line:
        raise ProtocolError("the server closed the connection without an answer")
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ProtocolError(f"not an HTTP/1.1 answer: {line[:60]!r}")
    return int(parts[1]), _headers(reader)


def _headers(reader: _Lines) -> dict[str, str]:
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS):
        line = reader.readline(MAX_LINE)
        if line in (b"\r\n", b"\n"):
            return headers
        if not line.endswith(b"\n"):
            raise ProtocolError("the answer ended inside its headers")
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise ProtocolError("a header line without a colon")
        name = name.strip().lower()
        value = value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    raise ProtocolError(f"more than {MAX_HEADERS} header lines")


def _tunnel(sock: socket.socket, endpoint: Endpoint) -> None:
    """CONNECT through an HTTP proxy to the API server."""
    head = f"CONNECT {endpoint.where} HTTP/1.1\r\nHost: {endpoint.where}\r\n"
    if endpoint.proxy_auth is not None:
        head += f"Proxy-Authorization: {endpoint.proxy_auth}\r\n"
    sock.sendall(f"{head}\r\n".encode("latin-1"))
    reader = sock.makefile("rb", buffering=0)  # no read past the proxy's answer
    try:
        status, _ = _head(reader)
    finally:
        reader.close()
    if status != 200:
        raise ProtocolError(f"the proxy refused to connect to {endpoint.where} ({status})")


# How a kept-alive connection the server closed shows when a request is sent on it.
_CLOSED: Final = (
    ClosedUnread,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
)


class Pool:
    """Idle connections to one endpoint, taken by one request at a time."""

    def __init__(self, endpoint: Endpoint, keep: int = IDLE_KEPT) -> None:
        self.endpoint = endpoint
        self.keep = keep
        self._idle: deque[Connection] = deque()
        self._closed = False

    def send(
        self, head: bytes, body: bytes | None, method: str, connect: float, read: float
    ) -> Response:
        """Write the request on an idle connection (or a new one) and read the answer's head.
        `connect` and `read` are timeouts in seconds (each wait on the socket, not the whole)."""
        data = head + body if body is not None else head
        while True:
            conn = self._take()
            fresh = conn is None
            if conn is None:
                conn = Connection(self.endpoint, connect)
            try:
                conn.sock.settimeout(read)
                conn.sock.sendall(data)
                status_line = conn.reader.readline(MAX_LINE)
                if not status_line:
                    raise ClosedUnread("the server closed the connection without an answer")
            except _CLOSED:
                conn.close()
                if fresh:
                    raise
                # A kept-alive connection the server had closed: nothing of an answer came
                # back, so it dropped the request unread. Send it again on a new connection.
                continue
            except BaseException:
                conn.close()
                raise
            try:
                return Response(conn, method, status_line)
            except BaseException:
                conn.close()
                raise

    def release(self, response: Response) -> None:
        """The response's connection back to the pool, or closed when it cannot be reused."""
        conn = response.conn
        if response.done and response.keep and not self._closed and len(self._idle) < self.keep:
            conn.reused = True
            self._idle.append(conn)
        else:
            conn.close()

    def discard(self, response: Response) -> None:
        response.conn.close()

    def close(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()

    def _take(self) -> Connection | None:
        while True:
            try:
                conn = self._idle.pop()  # the most recently used: least likely closed
            except IndexError:
                return None
            if not conn.idle_closed():
                return conn
            conn.close()
