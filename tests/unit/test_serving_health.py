"""podcert.serving.health: the small HTTP face of every podcert process, on loopback. /metrics,
/healthz and /readyz answer what they are given, anything else 404; the port holds at most its
cap of connections, a new one closing the one idle the longest, or itself closed when every held
one is answering; and a connection that sends no request within the idle timeout is hung up on,
by a janitor reading the server's clock (a fake one here). (Which connection goes is the pure
rule of test_connections.py; the bound under a real signer,
tests/integration/test_served_ports.py.) The registry every process serves carries the build,
process and GC metrics and no `_created` series."""

from __future__ import annotations

import http.client
import platform
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from devcluster.testing import eventually
from podcert import __version__
from podcert.serving import health
from podcert.serving.connections import Limits

DEADLINE = 5.0


@pytest.fixture
def started() -> Iterator[Callable[..., health.BoundedHTTPServer]]:
    """Start `health.serve` with the arguments given; every server shut down afterwards."""
    servers: list[health.BoundedHTTPServer] = []

    def start(*args: object, **kwargs: object) -> health.BoundedHTTPServer:
        servers.append(health.serve(*args, **kwargs))  # type: ignore[arg-type]
        return servers[-1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def get(server: health.BoundedHTTPServer, path: str) -> tuple[int, str, bytes]:
    host, port = server.server_address[:2]
    connection = http.client.HTTPConnection(str(host), port, timeout=DEADLINE)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, answer.getheader("Content-Type") or "", answer.read()
    finally:
        connection.close()


def counted(server: health.BoundedHTTPServer) -> threading.Semaphore:
    """Released each time `server` has taken a connection in (held or refused)."""
    taken = threading.Semaphore(0)
    take = server.process_request

    def process_request(request: socket.socket, client_address: object) -> None:
        take(request, client_address)
        taken.release()

    server.process_request = process_request  # type: ignore[method-assign]
    return taken


def connect(server: health.BoundedHTTPServer, taken: threading.Semaphore) -> socket.socket:
    """A connection the server has taken in, that has sent nothing yet."""
    sock = socket.create_connection(server.server_address[:2], timeout=DEADLINE)
    assert taken.acquire(timeout=DEADLINE), "the server took the connection in"
    return sock


def hung_up(sock: socket.socket) -> bool:
    """Whether the server closed `sock` (a read returns at once, with nothing)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def ask(sock: socket.socket, path: str) -> bytes:
    sock.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


# --- the registry behind /metrics ----------------------------------------------------------------


def scraped(text: bytes) -> dict[str, list[dict[str, str]]]:
    """Series name -> the label sets of its samples, as a scraper reads the text."""
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(dict(sample.labels))
    return out


def test_a_registry_carries_the_build_the_process_and_the_garbage_collector() -> None:
    registry = health.registry("shim")
    series = scraped(generate_latest(registry))
    assert series[health.BUILD_INFO] == [
        {"component": "shim", "version": __version__, "python_version": platform.python_version()}
    ]
    assert registry.get_sample_value(health.BUILD_INFO, series[health.BUILD_INFO][0]) == 1
    for name in (
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "python_info",
        "python_gc_collections_total",
    ):
        assert name in series, name


def test_no_counter_or_histogram_exports_a_created_series() -> None:
    registry = health.registry("signer")
    Counter("x_things", "", ["kind"], registry=registry).labels(kind="a").inc()
    Histogram("x_seconds", "", registry=registry).observe(0.2)
    series = scraped(generate_latest(registry))
    assert {"x_things_total", "x_seconds_count", "x_seconds_bucket"} <= set(series)
    assert [name for name in series if name.endswith("_created")] == []


# --- what each path answers -----------------------------------------------------------------------


def test_each_path_answers_what_it_is_given(
    started: Callable[..., health.BoundedHTTPServer],
) -> None:
    switches = {"ready": False, "healthy": True}
    server = started(
        lambda: b"podcert_up 1\n", 0, lambda: switches["ready"], lambda: switches["healthy"]
    )
    assert get(server, "/metrics") == (200, CONTENT_TYPE_LATEST, b"podcert_up 1\n")
    assert get(server, "/readyz") == (503, "text/plain", b"not ready\n")
    assert get(server, "/healthz") == (200, "text/plain", b"ok\n")
    switches.update(ready=True, healthy=False)
    assert get(server, "/readyz") == (200, "text/plain", b"ok\n")
    assert get(server, "/healthz") == (503, "text/plain", b"unhealthy\n")
    assert get(server, "/metrics/extra")[0] == 404
    assert get(server, "/")[0] == 404


# --- a full port ----------------------------------------------------------------------------------


def test_a_new_connection_to_a_full_port_closes_the_one_idle_the_longest(
    started: Callable[..., health.BoundedHTTPServer],
) -> None:
    server = started(lambda: b"", 0, lambda: True, limits=Limits(max_connections=2))
    taken = counted(server)
    oldest, older = connect(server, taken), connect(server, taken)
    newest = connect(server, taken)
    with oldest, older, newest:
        assert hung_up(oldest)
        assert len(server.table) == 2
        assert ask(newest, "/healthz").startswith(b"HTTP/1.0 200"), "the newest is answered"


def test_a_new_connection_is_closed_when_every_held_one_is_answering(
    started: Callable[..., health.BoundedHTTPServer],
) -> None:
    release = threading.Event()
    rendering = threading.Semaphore(0)

    def render() -> bytes:
        rendering.release()
        release.wait(DEADLINE)
        return b"slow\n"

    server = started(render, 0, lambda: True, limits=Limits(max_connections=2))
    taken = counted(server)
    first, second = connect(server, taken), connect(server, taken)
    with first, second:
        for sock in (first, second):
            sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        assert rendering.acquire(timeout=DEADLINE) and rendering.acquire(timeout=DEADLINE)
        with socket.create_connection(server.server_address[:2], timeout=DEADLINE) as third:
            assert hung_up(third), "refused: nothing answering may be closed to make room"
        release.set()
        for sock in (first, second):
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"slow\n")


# --- idle connections -----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


def test_a_connection_idle_past_the_timeout_is_hung_up_on() -> None:
    clock = Clock()
    limits = Limits(max_connections=8, idle_timeout=10.0)
    server = health.BoundedHTTPServer(("127.0.0.1", 0), Ok, limits, clock=clock)
    threading.Thread(target=server.janitor, daemon=True).start()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    taken = counted(server)
    try:
        silent = connect(server, taken)
        clock.now = 9.9
        early = connect(server, taken)  # the janitor looks again at each accept
        clock.now = 10.0
        late = connect(server, taken)
        with silent, early, late:
            assert hung_up(silent)
            eventually(lambda: len(server.table) == 2, timeout=DEADLINE, what="silent dropped")
            assert ask(early, "/").startswith(b"HTTP/1.0 200"), "idle for 0.1 s: still held"
            assert ask(late, "/").startswith(b"HTTP/1.0 200")
    finally:
        server.shutdown()
        server.server_close()
