"""The uvicorn pattern of docs/stacks/uvicorn.md, run as written against the real uvicorn.

The page's first Python block is executed here, so the page cannot drift from what works. A
recording ASGI app shows what reached the application: an allowed client is answered through a
leaf rotation and a CA rotation (each side kept current by a Refresher); a client with another
SPIFFE ID, or a leaf of a removed root, is refused in the handshake and the app never hears of
it; the probe server answers a caller without a certificate and still refuses a wrong one.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from bundles import Refresher, TLSSource, allow_ids
from tests.recording_peer import (
    DEADLINE,
    TOKEN,
    Workload,
    answered,
    call,
    client_context_of,
    der,
    eventually,
    follows,
    raw_request,
)
from tests.unit.test_bundles_formats import Authority

DOC = Path(__file__).resolve().parents[2] / "docs" / "stacks" / "uvicorn.md"
LOCAL = "cluster.local"
API = f"spiffe://{LOCAL}/ns/shop/sa/api"
WEB = f"spiffe://{LOCAL}/ns/shop/sa/web"
OTHER = f"spiffe://{LOCAL}/ns/shop/sa/other"
ALLOW_API = allow_ids([API])
ALLOW_WEB = allow_ids([WEB])

pytestmark = pytest.mark.timeout(90)


def the_pages_pattern() -> dict[str, Any]:
    """The first ```python block of the page, executed."""
    block = DOC.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(block, str(DOC), "exec"), namespace)  # noqa: S102 - our own documentation
    return namespace


class RecordingApp:
    """An ASGI app that records each request it receives and answers "hello"."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, bytes | None]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.requests.append((scope["path"], dict(scope["headers"]).get(b"authorization")))
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]}
        )
        await send({"type": "http.response.body", "body": b"hello"})


@contextlib.contextmanager
def running(server: uvicorn.Server) -> Iterator[int]:
    """The server in a thread of its own (uvicorn leaves signals alone there); yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        eventually(lambda: server.started, "uvicorn to start")
        yield listener.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(DEADLINE)
        listener.close()
        assert not thread.is_alive()


def call_seeing(port: int, context: ssl.SSLContext) -> tuple[bytes, bytes | None]:
    """One request; the answer and the leaf the server presented."""
    with context.wrap_socket(socket.create_connection(("127.0.0.1", port), DEADLINE)) as tls:
        leaf = tls.getpeercert(binary_form=True)
        tls.sendall(raw_request(port))
        answer = b""
        while data := tls.recv(65536):
            answer += data
        return answer, leaf


@pytest.fixture(scope="module")
def ca1() -> Authority:
    return Authority("uvicorn root 1")


@pytest.fixture(scope="module")
def ca2() -> Authority:
    return Authority("uvicorn root 2")


# uvicorn's own logging configuration is left out: it would replace the test run's.
OPTIONS: dict[str, Any] = {"lifespan": "off", "log_config": None, "log_level": "warning"}


def test_uvicorn_with_the_pages_pattern_follows_rotations_and_refuses_before_the_app(
    tmp_path: Path, ca1: Authority, ca2: Authority
) -> None:
    api, web = Workload(tmp_path / "api", API, ca1), Workload(tmp_path / "web", WEB, ca1)
    server_source, client_source = api.source(), web.source()
    app = RecordingApp()
    server = the_pages_pattern()["uvicorn_server"](app, server_source, ALLOW_WEB, **OPTIONS)
    with (
        Refresher(server_source, interval=0.2),
        Refresher(client_source, interval=0.2),
        running(server) as port,
    ):

        def works(*roots: Authority) -> None:
            eventually(follows(server_source, api, *roots), "the server's new material")
            eventually(follows(client_source, web, *roots), "the client's new material")
            answer, leaf = call_seeing(port, client_source.client_context(ALLOW_API))
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello"), answer
            assert leaf == der(api.credential)
            assert app.requests[-1] == ("/", TOKEN.encode())

        works(ca1)
        api.rotate_leaf(ca1), web.rotate_leaf(ca1)
        works(ca1)
        api.trust(ca1, ca2), web.trust(ca1, ca2)
        works(ca1, ca2)
        api.rotate_leaf(ca2), web.rotate_leaf(ca2)
        works(ca1, ca2)
        api.trust(ca2), web.trust(ca2)
        works(ca2)
        heard = len(app.requests)
        assert not answered(port, client_context_of(ca2.issue(OTHER), ca2.pem))
        assert not answered(port, client_context_of(ca1.issue(WEB), ca2.pem))  # removed root
        assert not answered(port, client_context_of(None, ca2.pem))  # no certificate
        assert len(app.requests) == heard


def test_the_pages_probe_server_answers_callers_without_a_certificate_only_there(
    tmp_path: Path, ca1: Authority
) -> None:
    source: TLSSource = Workload(tmp_path / "api", API, ca1).source()
    health = RecordingApp()
    server = the_pages_pattern()["probe_server"](health, source, ALLOW_WEB, **OPTIONS)
    with running(server) as port:
        anonymous = client_context_of(None, ca1.pem)
        assert call(port, anonymous, "/healthz").endswith(b"hello")
        assert not answered(port, client_context_of(ca1.issue(OTHER), ca1.pem))
        assert call(port, client_context_of(ca1.issue(WEB), ca1.pem)).endswith(b"hello")
    assert [path for path, _ in health.requests] == ["/healthz", "/"]
