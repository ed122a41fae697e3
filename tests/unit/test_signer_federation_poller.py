"""A federation fetch has one deadline for all of it: connecting, the TLS
handshake, the request and the whole answer. Against real local servers on loopback: a healthy
one, one trickling its answer a byte at a time (each read short, the whole long), one that never
starts the handshake, one that sends more than a bundle may hold."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trustme
from cryptography import x509

from signer.authority import spiffebundle
from signer.federation import domains
from signer.federation.domains import FederatedDomain
from signer.federation.poller import FetchError, fetch

DEADLINE = 0.5
SLACK = 1.5  # shared cores: the error must come well before the trickle would end
TRICKLE_FOR = 6.0  # seconds the slow server takes over its whole answer


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def roots_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("web") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


def bundle_body(ca: trustme.CA) -> bytes:
    root = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    doc = spiffebundle.bundle_document([root], 1, dt.timedelta(seconds=60))
    return json.dumps(doc).encode()


Answer = Callable[[ssl.SSLSocket, threading.Event], None]


@contextlib.contextmanager
def server(ca: trustme.CA, answer: Answer | None) -> Iterator[tuple[int, threading.Event]]:
    """A loopback server: TLS with a certificate for 127.0.0.1, then `answer(conn, stop)`
    once the request has been read; `answer` None: accept and never say a word. Yields the
    port and an event set when an answer was sent to its end."""
    listener = socket.create_server(("127.0.0.1", 0))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    stop, finished = threading.Event(), threading.Event()

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                if answer is None:
                    stop.wait()
                    return
                with context.wrap_socket(conn, server_side=True) as tls:
                    request = b""
                    while b"\r\n\r\n" not in request:
                        request += tls.recv(4096)
                    answer(tls, stop)
                    finished.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], finished
    finally:
        stop.set()
        listener.close()
        thread.join(10)


def domain(port: int, roots_file: Path) -> FederatedDomain:
    return FederatedDomain(
        "web.test", f"https://127.0.0.1:{port}/bundle", "https_web", web_roots=roots_file
    )


def whole(payload: bytes) -> Answer:
    def answer(tls: ssl.SSLSocket, stop: threading.Event) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
        tls.sendall(head.encode() + payload)

    return answer


def trickle(payload: bytes) -> Answer:
    """The status line, then a header one byte at a time (each read returns quickly), for
    TRICKLE_FOR seconds, then a good answer."""

    def answer(tls: ssl.SSLSocket, stop: threading.Event) -> None:
        tls.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        end = time.monotonic() + TRICKLE_FOR
        while time.monotonic() < end:
            if stop.wait(0.05):
                return
            tls.sendall(b"a")
        whole(payload)(tls, stop)

    return answer


def test_a_healthy_endpoint_is_read(ca: trustme.CA, roots_file: Path) -> None:
    payload = bundle_body(ca)
    with server(ca, whole(payload)) as (port, _):
        assert fetch(domain(port, roots_file), (), deadline=DEADLINE * 10) == payload


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(trickle, id="an answer trickled a byte at a time"),
        pytest.param(None, id="no TLS handshake at all"),
    ],
)
def test_a_slow_endpoint_is_cut_off_at_the_deadline(
    ca: trustme.CA, roots_file: Path, answer: Callable[[bytes], Answer] | None
) -> None:
    with server(ca, answer(bundle_body(ca)) if answer else None) as (port, finished):
        started = time.monotonic()
        with pytest.raises(FetchError, match=f"no whole answer within {DEADLINE:g}s"):
            fetch(domain(port, roots_file), (), deadline=DEADLINE)
        took = time.monotonic() - started
        assert not finished.is_set()
    assert DEADLINE <= took < DEADLINE + SLACK, took


def test_the_deadline_is_kept_on_the_injected_clock(ca: trustme.CA, roots_file: Path) -> None:
    """A clock that has already passed the deadline after the connect: nothing more is read."""
    ticks = iter([0.0, 0.0])  # the deadline is set, then the connect; after that, late

    def clock() -> float:
        return next(ticks, 100.0)

    with (
        server(ca, whole(bundle_body(ca))) as (port, _),
        pytest.raises(FetchError, match="no whole answer"),
    ):
        fetch(domain(port, roots_file), (), deadline=DEADLINE, clock=clock)


def test_a_body_over_the_limit_is_read_no_further(ca: trustme.CA, roots_file: Path) -> None:
    payload = b" " * (domains.MAX_BODY_BYTES * 2)
    with server(ca, whole(payload)) as (port, _):
        got = fetch(domain(port, roots_file), (), deadline=DEADLINE * 20)
    assert len(got) == domains.MAX_BODY_BYTES + 1
    assert isinstance(
        domains.parse_bundle(got, "web.test", dt.datetime.now(dt.UTC)), domains.Rejected
    )
