"""bundles.refresher: a sync application's source stays current from a thread, and start-up
waits for files that are not there yet.

The end-to-end test is a sync stack with no asyncio anywhere: the standard library's
`http.server` listening with the source's server context, `http.client` calling with the
source's client context, each side kept current by a Refresher, through a leaf rotation and the
three steps of a CA rotation; a wrong-ID peer on either side never receives a byte of a request.
Waits poll conditions with deadlines; the Refresher's own waits are injected where the test must
decide when a re-check happens.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import logging
import queue
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bundles import MissingFilesError, Refresher, SourceError, TLSSource, allow_ids, wait
from bundles.formats import dump_credential
from bundles.handshake import PeerRefusedError
from tests.recording_peer import (
    DEADLINE,
    TOKEN,
    RecordingServer,
    Workload,
    answered,
    client_context_of,
    der,
    eventually,
    follows,
)
from tests.unit.test_bundles_formats import Authority

LOCAL = "cluster.local"
API = f"spiffe://{LOCAL}/ns/shop/sa/api"
WEB = f"spiffe://{LOCAL}/ns/shop/sa/web"
OTHER = f"spiffe://{LOCAL}/ns/shop/sa/other"
ALLOW_API = allow_ids([API])
ALLOW_WEB = allow_ids([WEB])

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def ca1() -> Authority:
    return Authority("refresher root 1")


@pytest.fixture(scope="module")
def ca2() -> Authority:
    return Authority("refresher root 2")


@pytest.fixture
def api(tmp_path: Path, ca1: Authority) -> Workload:
    return Workload(tmp_path / "api", API, ca1)


@pytest.fixture
def web(tmp_path: Path, ca1: Authority) -> Workload:
    return Workload(tmp_path / "web", WEB, ca1)


# --- the refresher's loop --------------------------------------------------------------------


class Wakes:
    """An injected wake: the test says when the refresher re-checks (`tick()`)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[bool] = queue.Queue()
        self.intervals: list[float] = []

    def __call__(self, stop: threading.Event, interval: float) -> Iterator[object]:
        self.intervals.append(interval)
        while self._queue.get():
            yield None

    def tick(self) -> None:
        self._queue.put(True)

    def end(self) -> None:
        self._queue.put(False)


def test_each_wake_is_one_recheck_and_a_rotation_reaches_subscribers_in_its_thread(
    api: Workload, ca1: Authority
) -> None:
    source, wakes = api.source(), Wakes()
    heard: list[tuple[int, str]] = []
    source.subscribe(
        lambda c: heard.append((c.leaf.serial_number, threading.current_thread().name))
    )
    refresher = Refresher(source, interval=7.5, wake=wakes)
    with refresher:
        eventually(lambda: wakes.intervals == [7.5], "the check at start, then the wait")
        assert refresher.checks == 1
        new = api.rotate_leaf(ca1)
        assert source.credential.leaf != new.leaf  # nothing re-reads without a wake
        wakes.tick()
        eventually(lambda: refresher.checks == 2, "the re-check")
        assert source.credential.leaf == new.leaf
        assert heard == [(new.leaf.serial_number, "podcert-refresher")]
        wakes.tick()
        eventually(lambda: refresher.checks == 3, "an idle re-check")
        assert len(heard) == 1
        wakes.end()
    assert not refresher.running


def test_a_failing_refresh_does_not_end_the_thread(
    api: Workload, ca1: Authority, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, wakes = api.source(), Wakes()
    real, failures = source.refresh, [1]

    def refresh() -> bool:
        if failures:
            failures.pop()
            raise RuntimeError("a bug in a subscriber")
        return real()

    monkeypatch.setattr(source, "refresh", refresh)
    with Refresher(source, wake=wakes) as refresher:
        eventually(lambda: refresher.checks == 1, "the failed check")
        new = api.rotate_leaf(ca1)
        wakes.tick()
        eventually(lambda: source.credential.leaf == new.leaf, "the rotation after the failure")
        assert refresher.running
        wakes.end()


def test_a_refresher_starts_once_and_refuses_a_non_positive_interval(api: Workload) -> None:
    source = api.source()
    with pytest.raises(ValueError, match="positive"):
        Refresher(source, interval=0)
    wakes = Wakes()
    refresher = Refresher(source, wake=wakes).start()
    try:
        with pytest.raises(RuntimeError, match="once"):
            refresher.start()
    finally:
        wakes.end()
        refresher.stop(10)


def rotate_until_heard(source: TLSSource, workload: Workload, ca: Authority) -> None:
    """Rotate, and rotate again while waiting: covers the moment before inotify watches."""
    rotated = threading.Event()
    source.subscribe(lambda _: rotated.set())
    deadline = time.monotonic() + DEADLINE
    workload.rotate_leaf(ca)
    while not rotated.wait(0.1):
        assert time.monotonic() < deadline, "the refresher never heard of the rotation"
        workload.rotate_leaf(ca)


def test_inotify_wakes_the_thread_long_before_its_interval(
    api: Workload, ca1: Authority, caplog: pytest.LogCaptureFixture
) -> None:
    source = api.source()
    # With a 60 s interval, only an inotify wake-up can notice the rotation within the deadline.
    with caplog.at_level(logging.INFO, logger="bundles.refresher"):
        with Refresher(source, interval=60) as refresher:
            eventually(lambda: refresher.checks >= 1, "the check at start")
            rotate_until_heard(source, api, ca1)
        assert not refresher.running  # stop() ended the watch promptly, interval or not
    assert "polling" not in caplog.text


def test_without_watchfiles_it_polls_by_content(
    api: Workload, ca1: Authority, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "watchfiles", None)  # makes the import fail
    source = api.source()
    with Refresher(source, interval=0.05):
        rotate_until_heard(source, api, ca1)


def test_when_inotify_fails_it_polls_by_content(
    api: Workload, ca1: Authority, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_watch(*paths: object, **options: object) -> object:
        raise OSError(28, "inotify watch limit reached")

    monkeypatch.setattr("watchfiles.watch", broken_watch)
    source = api.source()
    with Refresher(source, interval=0.05):
        rotate_until_heard(source, api, ca1)


# --- waiting for files -------------------------------------------------------------------------


class FakeTime:
    """An injected clock for wait(): each sleep advances it, and may run a step first."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.on_sleep: list[object] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        if self.on_sleep:
            step = self.on_sleep.pop(0)
            if callable(step):
                step()


def test_wait_returns_the_source_once_the_files_appear(tmp_path: Path, ca1: Authority) -> None:
    clock = FakeTime()
    credential, trust = tmp_path / "credential.pem", tmp_path / "trust.pem"
    issued = ca1.issue(API)
    clock.on_sleep = [
        None,
        lambda: credential.write_bytes(dump_credential(issued)),
        lambda: trust.write_bytes(ca1.pem),
    ]
    source = wait(
        credential, trust, timeout=5, poll=0.5, monotonic=clock.monotonic, sleep=clock.sleep
    )
    assert source.credential.leaf == issued.leaf
    assert clock.sleeps == [0.5, 0.5, 0.5]


def test_wait_names_exactly_the_files_still_missing_at_the_deadline(
    tmp_path: Path, ca1: Authority
) -> None:
    clock = FakeTime()
    trust = tmp_path / "trust.pem"
    trust.write_bytes(ca1.pem)
    dangling = tmp_path / "credential.pem"
    dangling.symlink_to("..data/credential.pem")  # the atomic writer's link, before its data
    partner = tmp_path / "partner.pem"
    with pytest.raises(MissingFilesError) as caught:
        wait(
            dangling,
            trust,
            federated={"partner.test": partner},
            timeout=2,
            poll=0.3,
            monotonic=clock.monotonic,
            sleep=clock.sleep,
        )
    assert caught.value.missing == (dangling, partner)
    assert str(caught.value) == f"after 2s, still missing: {dangling}, {partner}"
    assert isinstance(caught.value, SourceError)
    assert clock.now == pytest.approx(2.0)  # polled up to the deadline, not past it
    assert max(clock.sleeps) <= 0.3


def test_wait_raises_the_last_error_when_the_files_are_there_but_unusable(
    tmp_path: Path, ca1: Authority
) -> None:
    clock = FakeTime()
    credential, trust = tmp_path / "credential.pem", tmp_path / "trust.pem"
    credential.write_bytes(dump_credential(Authority("another root").issue(API)))
    trust.write_bytes(ca1.pem)
    with pytest.raises(SourceError, match="signed by no root") as caught:
        wait(credential, trust, timeout=1, monotonic=clock.monotonic, sleep=clock.sleep)
    assert not isinstance(caught.value, MissingFilesError)


@pytest.mark.parametrize(
    ("timeout", "poll"),
    [pytest.param(-1, 0.2, id="negative timeout"), pytest.param(1, 0, id="zero poll")],
)
def test_wait_refuses_bad_arguments(tmp_path: Path, timeout: float, poll: float) -> None:
    with pytest.raises(ValueError, match="timeout must not be negative"):
        wait(tmp_path / "c.pem", tmp_path / "t.pem", timeout=timeout, poll=poll)


# --- a sync stack end to end ---------------------------------------------------------------------


class Recorded(http.server.BaseHTTPRequestHandler):
    """Records each request that reaches the application, with the client's leaf."""

    seen: list[tuple[str, str | None, bytes | None]]

    def do_GET(self) -> None:
        assert isinstance(self.connection, ssl.SSLSocket)
        client = self.connection.getpeercert(binary_form=True)
        self.seen.append((self.path, self.headers.get("Authorization"), client))
        body = b"hello"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def sync_server(
    source: TLSSource,
) -> Iterator[tuple[int, list[tuple[str, str | None, bytes | None]]]]:
    """http.server listening with the source's server context (the handshake runs in accept)."""
    seen: list[tuple[str, str | None, bytes | None]] = []
    handler = type("Handler", (Recorded,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.socket = source.server_context(ALLOW_WEB).wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def sync_get(port: int, source: TLSSource) -> tuple[bytes, bytes | None]:
    """One request with http.client over the source's current client context; the body and
    the server's leaf."""
    connection = http.client.HTTPSConnection(
        "127.0.0.1", port, context=source.client_context(ALLOW_API), timeout=10
    )
    try:
        connection.request("GET", "/", headers={"Authorization": TOKEN})
        assert connection.sock is not None
        leaf = connection.sock.getpeercert(binary_form=True)
        return connection.getresponse().read(), leaf
    finally:
        connection.close()


def test_a_sync_stack_follows_leaf_and_ca_rotations_and_refuses_wrong_ids_before_a_byte(
    api: Workload, web: Workload, ca1: Authority, ca2: Authority
) -> None:
    server_source, client_source = api.source(), web.source()
    with (
        Refresher(server_source, interval=0.2),
        Refresher(client_source, interval=0.2),
        sync_server(server_source) as (port, seen),
    ):

        def works(*roots: Authority) -> None:
            eventually(follows(server_source, api, *roots), "the server's new material")
            eventually(follows(client_source, web, *roots), "the client's new material")
            body, server_leaf = sync_get(port, client_source)
            assert (body, server_leaf) == (b"hello", der(api.credential))
            assert seen[-1] == ("/", TOKEN, der(web.credential))

        works(ca1)
        api.rotate_leaf(ca1), web.rotate_leaf(ca1)  # a leaf rotation
        works(ca1)
        api.trust(ca1, ca2), web.trust(ca1, ca2)  # CA rotation: the new root is trusted,
        works(ca1, ca2)
        api.rotate_leaf(ca2), web.rotate_leaf(ca2)  # then signs,
        works(ca1, ca2)
        api.trust(ca2), web.trust(ca2)  # then the old root goes
        works(ca2)
        requests = len(seen)

        # A client of the right CA with another ID: refused in accept's handshake, no request.
        assert not answered(port, client_context_of(ca2.issue(OTHER), ca2.pem))
        # A client still holding a leaf of the removed root: its chain no longer verifies.
        assert not answered(port, client_context_of(ca1.issue(WEB), ca2.pem))
        works(ca2)  # the server kept serving
        assert len(seen) == requests + 1

    # The client side: a server with another ID never reads a byte of the request.
    with RecordingServer.presenting(ca2.issue(OTHER)).running() as recorder:
        with pytest.raises(PeerRefusedError, match=f"{OTHER} is not the allowed ID"):
            sync_get(recorder.port, client_source)
        recorder.wait_ended(1)
    assert recorder.received() == [b""]
