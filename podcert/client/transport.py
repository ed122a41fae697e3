"""HTTP/1.1 to the API server over kept-alive connections: the few parts of the protocol a
Kubernetes client uses, written for the hot path.

The API server answers JSON to a client that asks no compression: a request is one write (head
and body together, one TLS record for a status PUT), an answer a status line, headers and a body
framed by Content-Length or by chunks (lists and watches). http.client parses each answer's
headers with the email package and urllib3 wraps that again, at several times this reader's CPU
for every request the signer makes (BENCHMARKS.md "Client CPU per request").

An answer is framed as h11 frames it (tests/unit/test_http_framing.py holds the two together on
generated answers): the same status line, header and chunk grammar, Content-Length and
Transfer-Encoding rules, so bytes h11 refuses are a `ProtocolError` here too. A head is bounded
(`MAX_LINE`, `MAX_HEADERS`) and so is a body (`MAX_BODY`); a body is read as it arrives, so a
Content-Length that lies costs no more memory than the bytes that came, and `Response.pieces`
hands it out a piece at a time to a reader that need not hold it whole (a list page).

A `Pool` keeps idle connections for any thread to take, one request at a time each; a watch holds
its connection until its stream ends. A connection the server closed while idle (it keeps them
for a while only) is noticed before use. A request that fails on a kept-alive connection anyway
is sent again, once and on a new connection, only when it cannot have been applied twice (Go's
net/http rules, which client-go follows): nothing of it was written, or its method is safe (GET,
HEAD, OPTIONS, TRACE) and no byte of an answer came back. A POST, PUT, PATCH or DELETE that was
written is never sent again: its caller learns the outcome is unknown. Every failure is an
`OSError` (`ProtocolError` for an answer that is not HTTP/1.1 as h11 reads it); the connection
it happened on is closed, never reused. A client certificate read from files that was replaced
(`podcert.client.clientcerts`) retires the connections made with the old one: each is closed instead
of reused once its request ends, so the next request presents the new pair.
"""

from __future__ import annotations

import io
import re
import select
import socket
import ssl
from collections import deque
from collections.abc import Iterator
from typing import Final, Protocol, cast

from podcert.client.endpoints import Endpoint

__all__ = ["Endpoint"]  # re-exported: its home is podcert.client.endpoints

MAX_LINE: Final = 64 * 1024  # a status line, header or chunk-size line longer is not HTTP we read
MAX_HEADERS: Final = 200
MAX_BODY: Final = 1 << 30  # an answer (or one chunk of a stream) larger is not one we read
PIECE: Final = 1 << 20  # a long body is read this much at a time, as it arrives
IDLE_KEPT: Final = 32  # idle connections kept per pool; as many workers as that share it
# Methods a server may be sent twice without a second effect (Go's Request.isReplayable).
SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})

# The grammar h11 reads answers with (h11/_abnf.py): RFC 9112 with its leniencies.
_VCHAR_OR_OBS: Final = rb"[^\x00\s]"
_STATUS: Final = re.compile(rb"HTTP/([0-9])\.([0-9]) ([0-9]{3})(?: (?:[ \t]|%s)*)?" % _VCHAR_OR_OBS)
_FIELD: Final = re.compile(
    rb"([-!#$%%&'*+.^_`|~0-9a-zA-Z]+):[ \t]*((?:%s+(?:[ \t]+%s+)*)?)[ \t]*"
    % (_VCHAR_OR_OBS, _VCHAR_OR_OBS)
)
_FOLD: Final = re.compile(rb"[ \t]+")
_CHUNK: Final = re.compile(rb"([0-9A-Fa-f]{1,20})(?:;.*)?[ \t]*\r\n")
_LENGTH: Final = re.compile(rb"[0-9]{1,20}")


class ProtocolError(OSError):
    """The server's answer is not HTTP/1.1 as this client reads it, or ended early."""


class ClosedUnread(ConnectionError):
    """A kept-alive connection was closed before any byte of an answer came back."""


class Unsent(ConnectionError):
    """A connection failed before any byte of the request was written on it."""


class Connection:
    """One TCP (and TLS) connection, used by one request at a time."""

    def __init__(self, endpoint: Endpoint, timeout: float) -> None:
        target = endpoint.proxy or (endpoint.host, endpoint.port)
        self.generation, context = endpoint.tls()  # the client certificate it presents
        sock = socket.create_connection(target, timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if endpoint.proxy is not None:
                _tunnel(sock, endpoint)
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=endpoint.server_hostname)
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


class _Reader(Protocol):
    def readline(self, size: int = -1, /) -> bytes: ...
    def read(self, size: int = -1, /) -> bytes: ...


class Response:
    """An answer's status and headers, its body not read yet. `read()` the whole of it, or
    iterate `chunks()`; then `Pool.release` keeps the connection for the next request if the
    body was read to its end and the server keeps it open."""

    def __init__(self, conn: Connection, method: str, status_line: bytes) -> None:
        self.conn = conn
        version, status, (fields, length, chunked) = _head(conn.reader, status_line)
        while 100 <= status < 200:  # interim answers (100 Continue): the real one follows
            if status == 101:
                raise ProtocolError("101 Switching Protocols, to a request that asked none")
            version, status, (fields, length, chunked) = _head(conn.reader)
        self.status = status
        self.headers = fields
        self.keep = version >= (1, 1) and "close" not in _tokens(fields.get("connection"))
        self.chunked = False
        self.done = False
        self.length: int | None = None
        if method == "HEAD" or status in (204, 304):
            self.length = 0
        elif chunked:
            self.chunked = True
            if length is not None:
                # Framed by its chunks, as RFC 9112 says; a server that also sends a length
                # may not mean the same bytes, so the connection is not reused after it.
                self.keep = False
        elif length is not None:
            if length > MAX_BODY:
                raise ProtocolError(f"an answer of {length} bytes, over {MAX_BODY}")
            self.length = length
        else:
            self.keep = False  # the body runs to the end of the connection

    def read(self) -> bytes:
        if self.chunked:
            pieces, total = [], 0
            for chunk in self.chunks():
                total += len(chunk)
                if total > MAX_BODY:
                    raise ProtocolError(f"a chunked answer over {MAX_BODY} bytes")
                pieces.append(chunk)
            return b"".join(pieces)
        if self.length is None:
            data = _read_to_end(self.conn.reader)
        else:
            data = _read_exactly(self.conn.reader, self.length)
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
        while length := self._chunk_size():
            if length > MAX_BODY:
                raise ProtocolError(f"a chunk of {length} bytes, over {MAX_BODY}")
            data = _read_exactly(reader, length)
            if len(data) < length or reader.read(2) != b"\r\n":
                raise ProtocolError("the answer ended inside a chunk, or a chunk overran")
            yield data

    def pieces(self, size: int = PIECE) -> Iterator[bytes]:
        """The body in pieces of `size` bytes (the last one shorter), whatever its framing: a
        body read so costs `size` bytes at a time, however long it is and however the server
        cut it into chunks (small chunks are joined, a large one cut)."""
        reader = self.conn.reader
        if not self.chunked:
            left = self.length
            while left is None or left > 0:
                piece = reader.read(size if left is None else min(size, left))
                if not piece:
                    if left is not None:
                        raise ProtocolError("the answer ended before its Content-Length")
                    break
                if left is not None:
                    left -= len(piece)
                yield piece
            self.done = True
            return
        parts: list[bytes] = []
        have = 0
        while length := self._chunk_size():
            while length:
                piece = reader.read(min(length, size - have))
                if not piece:
                    raise ProtocolError("the answer ended inside a chunk")
                length -= len(piece)
                have += len(piece)
                parts.append(piece)
                if have >= size:
                    yield b"".join(parts)
                    parts, have = [], 0
            if reader.read(2) != b"\r\n":
                raise ProtocolError("the answer ended inside a chunk, or a chunk overran")
        if parts:
            yield b"".join(parts)

    def _chunk_size(self) -> int:
        """The next chunk's size; at the last chunk (0), its trailers read and the body done."""
        reader = self.conn.reader
        line = reader.readline(MAX_LINE)
        if not line.endswith(b"\n"):
            raise ProtocolError("the answer ended inside its chunked body")
        size = _CHUNK.fullmatch(line)
        if size is None:
            raise ProtocolError(f"not a chunk size line: {line[:40]!r}")
        length = int(size[1], 16)
        if length == 0:
            _headers(reader)  # trailers, then the blank line
            self.done = True
        return length


def _read_exactly(reader: _Reader, size: int) -> bytes:
    """`size` bytes, or fewer when the connection ends first; memory grows with what came."""
    if size <= PIECE:
        return reader.read(size)
    pieces: list[bytes] = []
    left = size
    while left:
        piece = reader.read(min(left, PIECE))
        if not piece:
            break
        pieces.append(piece)
        left -= len(piece)
    return b"".join(pieces)


def _read_to_end(reader: _Reader) -> bytes:
    pieces: list[bytes] = []
    total = 0
    while piece := reader.read(PIECE):
        total += len(piece)
        if total > MAX_BODY:
            raise ProtocolError(f"an answer over {MAX_BODY} bytes")
        pieces.append(piece)
    return b"".join(pieces)


def _tokens(value: str | None) -> set[str]:
    """A comma-separated header's values, lower case (Connection)."""
    return {t.strip() for t in value.lower().split(",")} if value else set()


# An answer's head: its fields (lower-case name: value, repeated names joined by ", "), its
# Content-Length (checked as h11 does), whether Transfer-Encoding is chunked (the only coding).
_Head = tuple[dict[str, str], int | None, bool]


def _line(raw: bytes, where: str) -> bytes:
    """A head line without its ending: CRLF, or LF alone (h11 takes both)."""
    if raw[-2:] == b"\r\n":
        return raw[:-2]
    if raw[-1:] == b"\n":
        return raw[:-1]
    raise ProtocolError(f"the answer ended inside its {where}")


def _head(reader: _Reader, line: bytes | None = None) -> tuple[tuple[int, int], int, _Head]:
    """(HTTP version, status, head) of an answer whose status line is `line` (else read)."""
    if line is None:
        line = reader.readline(MAX_LINE)
    if not line:
        raise ProtocolError("the server closed the connection without an answer")
    status = _STATUS.fullmatch(_line(line, "status line"))
    if status is None or status[1] != b"1":
        raise ProtocolError(f"not an HTTP/1.1 answer: {line[:60]!r}")
    return (1, int(status[2])), int(status[3]), _headers(reader)


def _headers(reader: _Reader) -> _Head:
    lines: list[bytes] = []
    folded = False
    readline = reader.readline
    while line := _line(readline(MAX_LINE), "headers"):
        if len(lines) == MAX_HEADERS:
            raise ProtocolError(f"more than {MAX_HEADERS} header lines")
        folded = folded or line[0] in (0x20, 0x09)
        lines.append(line)
    if folded:
        lines = _unfold(lines)
    fields: dict[str, str] = {}
    length: bytes | None = None
    chunked = False
    for line in lines:
        field = _FIELD.fullmatch(line)
        if field is None:
            raise ProtocolError(f"not a header line: {line[:60]!r}")
        name, value = field[1].decode("ascii").lower(), field[2]
        if name == "content-length":
            lengths = {v.strip() for v in value.split(b",")}
            if len(lengths) != 1 or _LENGTH.fullmatch(one := lengths.pop()) is None:
                raise ProtocolError(f"Content-Length {value[:40]!r} is not a number")
            if length is not None and length != one:
                raise ProtocolError("two Content-Lengths")
            length = one
        elif name == "transfer-encoding":
            if chunked or value.lower() != b"chunked":
                raise ProtocolError(f"Transfer-Encoding {value[:40]!r}: only chunked is read")
            chunked = True
        text = value.decode("latin-1")
        fields[name] = f"{fields[name]}, {text}" if name in fields else text
    return fields, int(length) if length is not None else None, chunked


def _unfold(lines: list[bytes]) -> list[bytes]:
    """Obsolete line folding undone: a line that starts with blanks continues the one before."""
    out: list[bytes] = []
    for line in lines:
        if fold := _FOLD.match(line):
            if not out:
                raise ProtocolError("a continuation line before any header")
            out[-1] += b" " + line[fold.end() :]
        else:
            out.append(line)
    return out


def _tunnel(sock: socket.socket, endpoint: Endpoint) -> None:
    """CONNECT through an HTTP proxy to the API server."""
    head = f"CONNECT {endpoint.where} HTTP/1.1\r\nHost: {endpoint.where}\r\n"
    if endpoint.proxy_auth is not None:
        head += f"Proxy-Authorization: {endpoint.proxy_auth}\r\n"
    sock.sendall(f"{head}\r\n".encode("latin-1"))
    reader = sock.makefile("rb", buffering=0)  # no read past the proxy's answer
    try:
        _, status, _ = _head(reader)
    finally:
        reader.close()
    if status != 200:
        raise ProtocolError(f"the proxy refused to connect to {endpoint.where} ({status})")


# How a kept-alive connection the server closed shows when a request is sent on it.
_CLOSED: Final = (
    ClosedUnread,
    Unsent,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
)


def _write(sock: socket.socket, data: bytes) -> None:
    """`sock.sendall(data)`, telling apart a failure before any byte went out (`Unsent`)."""
    view = memoryview(data)
    sent = 0
    try:
        while sent < len(view):
            sent += sock.send(view[sent:])
    except _CLOSED as err:
        if sent == 0:
            raise Unsent(f"the connection failed before the request was written: {err}") from err
        raise


def may_resend(method: str, err: BaseException) -> bool:
    """Whether a request that failed with `err` on a kept-alive connection, before any byte of
    an answer, may be sent again: it cannot have reached the server, or sending it twice has
    no second effect."""
    return isinstance(err, Unsent) or (method in SAFE_METHODS and isinstance(err, _CLOSED))


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
        `connect` and `read` are timeouts in seconds (each wait on the socket, not the whole).
        Sent at most twice, the second time on a new connection (`may_resend`)."""
        data = head + body if body is not None else head
        conn = self._take()
        while True:
            fresh = conn is None
            if conn is None:
                conn = Connection(self.endpoint, connect)
            try:
                conn.sock.settimeout(read)
                _write(conn.sock, data)
                status_line = conn.reader.readline(MAX_LINE)
                if not status_line:
                    raise ClosedUnread("the server closed the connection without an answer")
            except _CLOSED as err:
                conn.close()
                if fresh or not may_resend(method, err):
                    raise
                conn = None  # a kept-alive connection the server had closed: once more, anew
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
        if (
            response.done
            and response.keep
            and not self._closed
            and len(self._idle) < self.keep
            and self._current(conn)
        ):
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
            if self._current(conn) and not conn.idle_closed():
                return conn
            conn.close()

    def _current(self, conn: Connection) -> bool:
        """Whether `conn` presents the client certificate in use: one made with a replaced pair
        is not used again, so a renewed certificate takes over as soon as connections are idle."""
        return self.endpoint.contexts is None or conn.generation == self.endpoint.tls()[0]
