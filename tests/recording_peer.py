"""Peers for the stack integrations' tests: workloads whose files rotate, and a TLS server that
records every application byte it reads.

`Workload` is one pod's projected files, published the way the kubelet's atomic writer does
(`tests.unit.test_bundles_source.Volume`), with `rotate_leaf` and the three steps of a CA
rotation (`trust` old + new, a leaf of the new CA, `trust` new only). `RecordingServer` is a
loopback TLS server built with the `ssl` module alone, none of `bundles`: it presents what its
`material()` callable returns when each connection arrives (so it rotates too), asks for a
client certificate when given roots, records each connection's bytes and the leaf it presented,
and answers a complete HTTP request with 200. A test that a refused server "never receives a
byte of the request" asserts its `received()` holds only empty byte strings. The stack suites'
rotating pair of workloads is `tests.recording_stack_peer`.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from bundles.formats import Credential, dump_credential
from bundles.source import TLSSource
from tests.unit.test_bundles_formats import Authority
from tests.unit.test_bundles_source import Volume

DEADLINE = 10.0  # seconds any awaited condition may take; reached only when something is broken
TOKEN = "Bearer s3cret-token"  # what must never reach a refused peer

# What a RecordingServer presents, asked per connection: (credential, client roots as PEM or
# None for no client certificate).
Material = Callable[[], tuple[Credential, bytes | None]]


def eventually(condition: Callable[[], bool], what: str) -> None:
    """Poll `condition` until it holds, or fail after DEADLINE (a blocking wait)."""
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {DEADLINE}s waiting for {what}")
        time.sleep(0.01)


class Workload:
    """One workload's credential bundle and trust bundle, in an atomic-writer volume."""

    def __init__(self, folder: Path, spiffe_id: str, issuer: Authority) -> None:
        self.spiffe_id = spiffe_id
        self.volume = Volume(folder)
        self.credential = issuer.issue(spiffe_id)
        self.volume.publish(
            **{"credential.pem": dump_credential(self.credential), "trust.pem": issuer.pem}
        )

    @property
    def files(self) -> tuple[Path, Path]:
        return self.volume / "credential.pem", self.volume / "trust.pem"

    def source(self) -> TLSSource:
        return TLSSource(*self.files)

    def rotate_leaf(self, issuer: Authority) -> Credential:
        """A new key and leaf from `issuer` (the trust bundle unchanged)."""
        self.credential = issuer.issue(self.spiffe_id)
        self.volume.publish(**{"credential.pem": dump_credential(self.credential)})
        return self.credential

    def trust(self, *authorities: Authority) -> None:
        self.volume.publish(**{"trust.pem": b"".join(a.pem for a in authorities)})

    @property
    def serial(self) -> int:
        return self.credential.leaf.serial_number


def follows(source: TLSSource, workload: Workload, *roots: Authority) -> Callable[[], bool]:
    """A condition: `source` serves the workload's current leaf and trusts exactly `roots`."""

    def holds() -> bool:
        return source.credential.leaf == workload.credential.leaf and source.trust_bundle.roots == (
            tuple(a.cert for a in roots)
        )

    return holds


@dataclass
class Connection:
    """One connection a RecordingServer accepted: what it read and who was at the other end."""

    received: bytearray = field(default_factory=bytearray)  # every application byte read
    client_leaf: bytes | None = None  # DER, when the client presented one
    ended: threading.Event = field(default_factory=threading.Event)


@dataclass
class RecordingServer:
    """A loopback TLS server that records what it reads; see the module docstring. With
    `context` instead of `material`, it listens with that context (e.g. a TLSSource's server
    context, to record what reaches the application behind it). It answers one request and
    closes, unless `keep_alive`: then it answers every request on the connection, for the
    suites that check their stack reuses connections."""

    material: Material | None = None
    context: Callable[[], ssl.SSLContext] | None = None
    keep_alive: bool = False
    connections: list[Connection] = field(default_factory=list)
    port: int = 0

    @classmethod
    def presenting(
        cls, credential: Credential, client_roots: bytes | None = None
    ) -> RecordingServer:
        return cls(material=lambda: (credential, client_roots))

    @contextlib.contextmanager
    def running(self) -> Iterator[RecordingServer]:
        listener = socket.create_server(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        threads: list[threading.Thread] = []

        def accept() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                record = Connection()
                self.connections.append(record)
                thread = threading.Thread(target=self._serve, args=(conn, record), daemon=True)
                threads.append(thread)
                thread.start()

        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        try:
            yield self
        finally:
            listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (Linux)
            listener.close()
            acceptor.join(DEADLINE)
            for thread in threads:
                thread.join(DEADLINE)
                assert not thread.is_alive(), "a connection outlived its deadline"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def received(self) -> list[bytes]:
        """What each connection made so far read, in the order they arrived."""
        return [bytes(c.received) for c in self.connections]

    def client_ids(self) -> list[bytes | None]:
        """The leaf (DER) each connection's client presented, None where it presented none."""
        return [c.client_leaf for c in self.connections]

    def wait_ended(self, count: int | None = None) -> None:
        """Until `count` connections (default: every one made so far) have ended."""

        def ended() -> bool:
            made = list(self.connections)
            wanted = len(made) if count is None else count
            return len(made) >= wanted and all(c.ended.is_set() for c in made[:wanted])

        eventually(ended, f"{count or 'every'} connection(s) to end")

    def _context(self) -> ssl.SSLContext:
        if self.context is not None:
            return self.context()
        assert self.material is not None
        credential, client_roots = self.material()
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with _pem_file(dump_credential(credential)) as path:
            context.load_cert_chain(path)
        if client_roots is not None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cadata=client_roots.decode())
        return context

    def _serve(self, conn: socket.socket, record: Connection) -> None:
        conn.settimeout(DEADLINE)
        close = b"" if self.keep_alive else b"Connection: close\r\n"
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + close + b"\r\nok"
        try:
            with self._context().wrap_socket(conn, server_side=True) as tls:
                record.client_leaf = tls.getpeercert(binary_form=True)
                pending = b""
                while data := tls.recv(65536):
                    record.received += data
                    pending += data
                    while b"\r\n\r\n" in pending:
                        _, pending = pending.split(b"\r\n\r\n", 1)
                        tls.sendall(answer)
                        if not self.keep_alive:
                            return
        except OSError:  # refused, or the client went away: nothing more to read
            pass
        finally:
            conn.close()
            record.ended.set()


def raw_request(port: int, path: str = "/") -> bytes:
    """An HTTP/1.1 request carrying TOKEN, asking the server to close after answering."""
    return (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: {TOKEN}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()


def call(
    port: int, context: ssl.SSLContext, path: str = "/", *, server_hostname: str = "localhost"
) -> bytes:
    """One request over `context` from a plain `ssl` socket; the whole answer as bytes."""
    with context.wrap_socket(
        socket.create_connection(("127.0.0.1", port), DEADLINE), server_hostname=server_hostname
    ) as tls:
        tls.sendall(raw_request(port, path))
        answer = b""
        while data := tls.recv(65536):
            answer += data
        return answer


def answered(port: int, context: ssl.SSLContext, *, server_hostname: str = "localhost") -> bool:
    """Whether a request over `context` got any answer: a refused client's connection is
    closed, which shows as an error or as an end of stream with nothing in it."""
    try:
        return call(port, context, server_hostname=server_hostname) != b""
    except (ssl.SSLError, ConnectionError):
        return False


def client_context_of(credential: Credential | None, roots: bytes) -> ssl.SSLContext:
    """A plain `ssl` client context (none of `bundles`' judgement): trusts `roots`, presents
    `credential` if given; for impostors and anonymous callers."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(cadata=roots.decode())
    if credential is not None:
        with _pem_file(dump_credential(credential)) as path:
            context.load_cert_chain(path)
    return context


def der(credential: Credential) -> bytes:
    return credential.leaf.public_bytes(serialization.Encoding.DER)


@contextlib.contextmanager
def _pem_file(data: bytes) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "credential.pem"
        path.write_bytes(data)
        yield str(path)
