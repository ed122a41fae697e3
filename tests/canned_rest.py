"""Canned API answers for the unit tests. `CannedRest`, a Rest over canned JSON for the tests of
the API adapters (`signer.kube`, `kubelet_shim.kube`): lists and watches decode each object into
the shape asked for, as `podcert.client.rest.Rest` does, and what was asked and written is
recorded. `Server`, a small scripted HTTP/1.1 server on loopback that a real `Rest` talks to, for
the tests of `podcert.client.rest` and `podcert.client.transport`: each connection runs a handler
that reads the requests and writes whatever bytes the test scripts."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO, cast

import msgspec

from podcert.client import pages
from podcert.client.kubeconfig import ClientSettings
from podcert.client.rest import Rest


class CannedRest:
    """list, watch, get and write over `items`; a watch ends with a BOOKMARK at `bookmark`
    when one is given."""

    def __init__(self, items: list[dict[str, Any]], bookmark: str | None = None) -> None:
        self.raw = [json.dumps(item).encode() for item in items]
        self.bookmark = bookmark
        self.queries: list[Mapping[str, str]] = []
        self.sent: list[tuple[str, str, Any]] = []

    def list(
        self, path: str, shape: type[Any] | pages.Shape[Any], *, query: Mapping[str, str]
    ) -> tuple[Iterator[Any], str]:
        self.queries.append(query)
        return iter([_decode(raw, shape) for raw in self.raw]), "41"

    def watch(
        self, path: str, resource_version: str, shape: type[Any] | pages.Shape[Any], **query: str
    ) -> Iterator[dict[str, Any]]:
        self.queries.append(query)
        for raw in self.raw:
            yield {"type": "MODIFIED", "object": _decode(raw, shape)}
        if self.bookmark is not None:
            meta = {"resourceVersion": self.bookmark}
            mark = msgspec.json.encode({"kind": "Bookmark", "metadata": meta})
            yield {"type": "BOOKMARK", "object": _decode(mark, shape)}

    def get(self, path: str) -> dict[str, Any] | None:
        return cast(dict[str, Any], json.loads(self.raw[0]))

    def get_as(self, path: str, shape: type[Any] | pages.Shape[Any]) -> Any:
        self.sent.append(("GET", path, None))
        return _decode(self.raw[0], shape)

    def write(self, method: str, path: str, *, body: Any) -> None:
        self.sent.append((method, path, json.loads(msgspec.json.encode(body))))  # as Rest sends it


def _decode(raw: bytes, shape: type[Any] | pages.Shape[Any]) -> Any:
    """As `Rest` decodes: into a type, or through a shape's own decoders (`pages.Lenient`)."""
    if isinstance(shape, pages.Shape):
        return shape.element(raw, "object")
    return msgspec.json.decode(raw, type=shape)


# --- a scripted server for a real Rest ------------------------------------------------------------


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


@contextlib.contextmanager
def scripted_servers() -> Iterator[Callable[..., Server]]:
    """`start(handler, context=None)` starts a `Server`; every one is closed when the block ends
    (the `serve` fixture of the tests that use them)."""
    servers: list[Server] = []

    def start(handler: Handler, context: ssl.SSLContext | None = None) -> Server:
        servers.append(Server(handler, context))
        return servers[-1]

    try:
        yield start
    finally:
        for server in servers:
            server.close()


def rest_for(server: Server, **kwargs: Any) -> Rest:
    return Rest(ClientSettings(server.url, None, **kwargs), timeout=5.0)
