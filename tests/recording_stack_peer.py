"""What the stack integrations' suites (`test_bundles_httpx`, `_requests`, `_grpc`) share: two
workloads whose files rotate the way the kubelet's atomic writer rotates them, and a loopback
TLS server that records every application byte it reads, per connection.

`Workloads` holds a client and a server workload, each a projected volume (`Volume`) and a
`TLSSource` over it, issued by one test CA; its steps are the rotations the suites go through:
a leaf rotation, then a CA rotation (the new root added to both trust bundles, new leaves from
the new CA, the old root removed). Each step refreshes both sources, as `watch()` would.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from bundles.authz import Authorizer, allow_ids
from bundles.formats import Credential, dump_credential
from bundles.source import TLSSource
from tests.unit.test_bundles_formats import Authority
from tests.unit.test_bundles_source import Volume

LOCAL = "cluster.local"
SERVER_ID = f"spiffe://{LOCAL}/ns/shop/sa/api"
CLIENT_ID = f"spiffe://{LOCAL}/ns/shop/sa/web"
OTHER_ID = f"spiffe://{LOCAL}/ns/shop/sa/other"
TOKEN = "Bearer s3cret-token"  # what must never reach a refused peer
DEADLINE = 10.0  # seconds; reached only when something is broken


def der(credential: Credential) -> bytes:
    return credential.leaf.public_bytes(serialization.Encoding.DER)


class Workload:
    """One pod's projected volume and the TLSSource over it."""

    def __init__(self, folder: Path, ca: Authority, spiffe_id: str) -> None:
        self.spiffe_id = spiffe_id
        self.volume = Volume(folder)
        self.volume.publish(
            **{"credential.pem": dump_credential(ca.issue(spiffe_id)), "trust.pem": ca.pem}
        )
        self.source = TLSSource(self.volume / "credential.pem", self.volume / "trust.pem")

    def publish(self, **files: bytes) -> None:
        self.volume.publish(**files)
        assert self.source.refresh(), self.source.last_error


class Workloads:
    """A client and a server workload of one CA, and the rotations they go through."""

    def __init__(self, folder: Path, *, server_id: str = SERVER_ID) -> None:
        self.ca = Authority("podcert root 1")
        self.client = Workload(folder / "client", self.ca, CLIENT_ID)
        self.server = Workload(folder / "server", self.ca, server_id)

    @property
    def both(self) -> tuple[Workload, Workload]:
        return self.client, self.server

    def rotate_leaves(self) -> None:
        """Both get a new leaf from the current CA."""
        for workload in self.both:
            workload.publish(
                **{"credential.pem": dump_credential(self.ca.issue(workload.spiffe_id))}
            )

    def rotate_ca(self) -> Iterator[str]:
        """The CA rotation, one step per iteration (the step's name is yielded after it)."""
        new = Authority("podcert root 2")
        for workload in self.both:
            workload.publish(**{"trust.pem": self.ca.pem + new.pem})
        yield "new root added to both trust bundles"
        old, self.ca = self.ca, new
        self.rotate_leaves()
        yield "new leaves from the new CA"
        for workload in self.both:
            workload.publish(**{"trust.pem": new.pem})
        assert old.cert not in self.client.source.trust_bundle.roots
        yield "old root removed"


# --- a TLS server that records what it reads ------------------------------------------------------


@dataclass
class Connection:
    received: bytearray = field(default_factory=bytearray)
    client_leaf: bytes | None = None  # DER, when the client presented one
    ended: threading.Event = field(default_factory=threading.Event)


@dataclass
class RecordingServer:
    """A loopback TLS server; each connection's context comes from `context()` (a TLSSource's
    server context follows rotation). Answers every complete HTTP/1.1 request with 200 "ok" on
    the same connection (keep-alive) and records every application byte read."""

    context: Callable[[], ssl.SSLContext]
    connections: list[Connection] = field(default_factory=list)
    port: int = 0

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

    def _serve(self, conn: socket.socket, record: Connection) -> None:
        conn.settimeout(DEADLINE)
        try:
            with self.context().wrap_socket(conn, server_side=True) as tls:
                record.client_leaf = tls.getpeercert(binary_form=True)
                pending = b""
                while data := tls.recv(65536):
                    record.received += data
                    pending += data
                    while b"\r\n\r\n" in pending:
                        _, pending = pending.split(b"\r\n\r\n", 1)
                        tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        except OSError:  # refused, or the client went away: nothing more to read
            pass
        finally:
            conn.close()
            record.ended.set()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_ended(self, count: int | None = None) -> None:
        """Until `count` connections (default: every one made so far) have ended."""
        deadline = time.monotonic() + DEADLINE
        while True:
            made = list(self.connections)
            wanted = len(made) if count is None else count
            if len(made) >= wanted and all(c.ended.is_set() for c in made[:wanted]):
                return
            assert time.monotonic() < deadline, "the server never saw the connections end"
            time.sleep(0.01)

    def received(self) -> list[bytes]:
        return [bytes(c.received) for c in self.connections]


def serving(workload: Workload, allow_clients: Authorizer | None = None) -> RecordingServer:
    """A recording server presenting `workload`'s current material, authorizing its clients
    with `allow_clients` (default: the client workload) inside the handshake."""
    rule = allow_clients or allow_ids([CLIENT_ID])
    return RecordingServer(lambda: workload.source.server_context(rule))
