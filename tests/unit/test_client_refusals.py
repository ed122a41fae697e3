"""podcert.client.refusals: an identity the API server keeps refusing (a node certificate that
expired unrenewed) turns /healthz unhealthy, with one line naming the identity and never the secret,
and healthy again once a call succeeds. The rule is pure (`podcert.client.refusals`); `Rest` tells
it every answer; the shim's and the signer's /healthz ask it (the shim's, as
`kubelet_shim.build` wires it, is test_shim_build.py's)."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from podcert.client.kubeconfig import ClientSettings
from podcert.client.refusals import HEALTHY, WINDOW, Record, Refusals, observe, refuses, unhealthy
from podcert.client.rest import ApiError, Rest

TOKEN = "secret-token-that-must-never-show"


@pytest.mark.parametrize(
    ("method", "status", "verdict"),
    [
        pytest.param("GET", 401, True, id="401 to a read: refused"),
        pytest.param("POST", 401, True, id="401 to a write: refused"),
        pytest.param("GET", 403, True, id="403 to a read: the identity may not read, refused"),
        pytest.param("POST", 403, False, id="403 to a create: admission judged one object"),
        pytest.param("PUT", 403, False, id="403 to an update: admission judged one object"),
        pytest.param("GET", 200, False, id="200: accepted"),
        pytest.param("GET", 404, False, id="404: authenticated, accepted"),
        pytest.param("POST", 409, False, id="409: authenticated, accepted"),
        pytest.param("GET", 503, None, id="503: no evidence"),
        pytest.param("GET", 0, None, id="no answer: no evidence"),
    ],
)
def test_which_answers_refuse_the_identity(method: str, status: int, verdict: bool | None) -> None:
    assert refuses(method, status) is verdict


def fold(answers: list[tuple[float, str, int]]) -> Record:
    record = HEALTHY
    for now, method, status in answers:
        record = observe(record, method, status, now)
    return record


@pytest.mark.parametrize(
    ("answers", "sick"),
    [
        pytest.param([], False, id="no call at all: healthy"),
        pytest.param([(0, "GET", 401)], False, id="one refusal: healthy"),
        pytest.param(
            [(0, "GET", 401), (30, "GET", 401), (59, "GET", 401)], False, id="refused for 59s"
        ),
        pytest.param([(0, "GET", 401), (30, "GET", 401), (60, "GET", 401)], True, id="for 60s"),
        pytest.param(
            [(0, "GET", 401), (30, "GET", 200), (60, "GET", 401)],
            False,
            id="an answer accepted in between starts the count again",
        ),
        pytest.param(
            [(0, "GET", 401), (30, "GET", 503), (60, "GET", 401)],
            True,
            id="a 503 in between says nothing either way",
        ),
        pytest.param(
            [(0, "POST", 403), (30, "POST", 403), (90, "POST", 403)],
            False,
            id="creates denied by admission for 90s: healthy",
        ),
        pytest.param(
            [(0, "GET", 401), (60, "GET", 401), (61, "GET", 200)],
            False,
            id="refused for 60s, then accepted: healthy again",
        ),
        pytest.param(
            [(0, "GET", 403), (60, "GET", 403)], True, id="reads forbidden for 60s: unhealthy"
        ),
    ],
)
def test_unhealthy_once_every_answer_for_the_window_refused(
    answers: list[tuple[float, str, int]], sick: bool
) -> None:
    assert unhealthy(fold(answers), WINDOW) is sick


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_line_names_the_identity_when_it_turns_and_one_when_it_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    refusals = Refusals(lambda: "client certificate CN=system:node:a from /x.pem", clock=clock)
    with caplog.at_level(logging.INFO, "podcert.refusals"):
        for _ in range(7):
            refusals.answer("GET", 401)
            clock.now += 15
        assert not refusals.healthy()
        refusals.answer("GET", 200)
        assert refusals.healthy()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "refused client certificate CN=system:node:a from /x.pem for 60s" in lines[0]
    assert "401" in lines[0] and "accepts client certificate CN=system:node:a" in lines[1]


# --- through Rest: every answer told; the identity named without its secret ---------------------


def accept_in_threads(listener: socket.socket, serve: Callable[[socket.socket], None]) -> None:
    """Serve each connection `listener` accepts in a thread of its own, until it is closed."""

    def accept() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(sock,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


@pytest.fixture
def refusing() -> Iterator[tuple[str, list[int]]]:
    """A loopback server that answers each request with the next status of a script."""
    statuses: list[int] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve(sock: socket.socket) -> None:
        reader = sock.makefile("rb")
        try:
            while reader.readline():
                while reader.readline() not in (b"\r\n", b""):
                    pass
                status = statuses.pop(0) if statuses else 200
                body = b'{"kind":"Status","reason":"Unauthorized","message":"Unauthorized"}'
                head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n"
                sock.sendall(head.encode() + body)
        except OSError:
            pass
        finally:
            sock.close()

    accept_in_threads(listener, serve)
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", statuses
    listener.close()


def test_rest_tells_its_refusals_every_answer(
    refusing: tuple[str, list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    url, statuses = refusing
    settings = ClientSettings(url, None, lambda: TOKEN, identity="bearer token from /t")
    rest = Rest(settings, timeout=5.0)
    clock = Clock()
    rest.refusals.clock = clock
    statuses.extend([401] * 3)
    with caplog.at_level(logging.INFO, "podcert.refusals"):
        for _ in range(3):
            with pytest.raises(ApiError, match="401"):
                rest.get("/api/v1/nodes/a")
            clock.now += WINDOW / 2
        assert not rest.refusals.healthy()
        assert rest.get("/api/v1/nodes/a") == {
            "kind": "Status",
            "reason": "Unauthorized",
            "message": "Unauthorized",
        }
        assert rest.refusals.healthy()
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "bearer token from /t" in text and TOKEN not in text
    rest.close()
