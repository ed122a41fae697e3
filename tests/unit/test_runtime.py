"""The controller runtime's contract: what a reconcile's result or error does to its key, how
workers wait for caches, how the process starts, is ready, stays healthy and stops.

Time is a fake clock (the queue's and the waits'); tests that need a thread wait for a condition
with a deadline, never for a fixed time."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator

import pytest

from podcert.reconcile.runtime import (
    GaveUp,
    Runtime,
    Synced,
    Terminal,
    WorkerPool,
    retry_until,
    wait_for_sync,
)
from podcert.reconcile.workqueue import WorkQueue

DEADLINE = 10.0


class Clock:
    """A monotonic clock that moves only when told to, or when a wait moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Event.wait on this clock: at once when set, else after `seconds`."""
        if event.is_set():
            return True
        self.now += seconds
        return event.is_set()


class Transient(Exception):
    pass


def pool_of(
    reconcile: Callable[[str], float | None], **options: object
) -> tuple[WorkerPool[str], WorkQueue[str], Clock]:
    clock = Clock()
    queue: WorkQueue[str] = WorkQueue(base_delay=1.0, max_delay=8.0, clock=clock)
    return WorkerPool("test", queue, reconcile, **options), queue, clock  # type: ignore[arg-type]


def turn(pool: WorkerPool[str], queue: WorkQueue[str], key: str = "k") -> None:
    """Add `key`, hand it out and give it its turn, as a worker would."""
    queue.add(key)
    assert queue.get(timeout=0) == key
    pool.process(key)


# --- one key's turn ----------------------------------------------------------------------------


def test_none_is_done_and_forgets_the_keys_backoff() -> None:
    pool, queue, _ = pool_of(lambda key: None)
    queue.backoff("k")  # an earlier failure
    turn(pool, queue)
    assert queue.failures("k") == 0
    assert queue.get(timeout=0) is None, "a settled key is not queued again"


def test_seconds_requeue_the_key_then_and_not_before() -> None:
    pool, queue, clock = pool_of(lambda key: 30.0)
    turn(pool, queue)
    assert queue.get(timeout=0) is None
    clock.now += 29.9
    assert queue.get(timeout=0) is None
    clock.now += 0.1
    assert queue.get(timeout=0) == "k"


def test_an_error_retries_with_growing_backoff_and_is_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[tuple[str, str]] = []

    def fail(key: str) -> float | None:
        raise Transient("the API server is restarting")

    pool, queue, clock = pool_of(
        fail, expected=(Transient,), on_retry=lambda key, err: seen.append((key, str(err)))
    )
    with caplog.at_level(logging.WARNING, logger="podcert.runtime"):
        turn(pool, queue)
    assert queue.failures("k") == 1
    assert seen == [("k", "the API server is restarting")]
    # An expected error is one warning line, without a traceback.
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.exc_info is None
    assert "will retry in" in record.getMessage()
    clock.now += 1.25  # base 1 s, at most +25 % jitter
    assert queue.get(timeout=0) == "k"
    pool.process("k")
    assert queue.failures("k") == 2


def test_an_unexpected_error_is_logged_with_its_traceback_and_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(key: str) -> float | None:
        raise KeyError("spec")

    pool, queue, _ = pool_of(broken, context=lambda key: {"request": key})
    with caplog.at_level(logging.WARNING, logger="podcert.runtime"):
        turn(pool, queue)
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
    assert record.__dict__["request"] == "k"
    assert queue.failures("k") == 1


def test_a_terminal_error_drops_the_key_until_it_is_added_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []

    def hopeless(key: str) -> float | None:
        calls.append(key)
        raise Terminal("the volume can never be written")

    pool, queue, clock = pool_of(hopeless)
    queue.backoff("k")
    with caplog.at_level(logging.ERROR, logger="podcert.runtime"):
        turn(pool, queue)
    assert "giving up: the volume can never be written" in caplog.text
    assert queue.failures("k") == 0
    clock.now += 3600
    assert queue.get(timeout=0) is None, "a terminal error is not retried"
    turn(pool, queue)  # ... but a new event for the key brings it back
    assert calls == ["k", "k"]


def test_an_inactive_pool_hands_keys_back_untouched() -> None:
    calls: list[str] = []
    active = threading.Event()
    pool, queue, _ = pool_of(lambda key: calls.append(key), active=active.is_set)
    turn(pool, queue)
    assert calls == []
    assert queue.get(timeout=0) is None
    active.set()
    turn(pool, queue)
    assert calls == ["k"]


def test_after_each_runs_after_every_key_whatever_happened() -> None:
    ran: list[int] = []

    def flaky(key: str) -> float | None:
        if key == "bad":
            raise Transient("no")
        return None

    pool, queue, _ = pool_of(flaky, after_each=lambda: ran.append(len(ran)))
    turn(pool, queue, "good")
    turn(pool, queue, "bad")
    assert ran == [0, 1]


# --- waiting for caches ------------------------------------------------------------------------


def caches(*names: str) -> list[Synced]:
    return [Synced(name, threading.Event()) for name in names]


def test_listed_caches_let_the_workers_start_at_once() -> None:
    listed = caches("pods", "nodes")
    for cache in listed:
        cache.event.set()
    clock = Clock()
    assert wait_for_sync(listed, threading.Event(), timeout=60, clock=clock, wait=clock.wait).synced
    assert clock.now == 1000.0


def test_the_wait_times_out_naming_the_first_cache_that_did_not_list() -> None:
    pods, nodes, accounts = caches("pods", "nodes", "serviceaccounts")
    pods.event.set()
    clock = Clock()
    result = wait_for_sync(
        [pods, nodes, accounts], threading.Event(), timeout=60, clock=clock, wait=clock.wait
    )
    assert result.timed_out == "nodes"
    assert not result.synced
    assert clock.now == pytest.approx(1060.0)


def test_without_a_timeout_the_wait_lasts_until_the_list_comes() -> None:
    [pods] = caches("pods")
    clock = Clock()

    def wait(event: threading.Event, seconds: float) -> bool:
        if clock.now >= 1000.0 + 3600:
            event.set()  # the list arrives after an hour
        return clock.wait(event, seconds)

    assert wait_for_sync([pods], threading.Event(), clock=clock, wait=wait).synced
    assert clock.now >= 1000.0 + 3600


def test_a_stop_ends_the_wait() -> None:
    stop = threading.Event()
    stop.set()
    clock = Clock()
    result = wait_for_sync(caches("pods"), stop, clock=clock, wait=clock.wait)
    assert result.stopped


# --- the process -------------------------------------------------------------------------------


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    rt = Runtime("test")
    yield rt
    rt.stop(timeout=DEADLINE)


def test_workers_start_after_the_sync_and_reconcile_what_is_queued(runtime: Runtime) -> None:
    order: list[str] = []
    handled = threading.Event()

    def reconcile(key: str) -> float | None:
        order.append(key)
        handled.set()
        return None

    [pods] = caches("pods")
    queue: WorkQueue[str] = WorkQueue()
    pool = runtime.add_pool(
        WorkerPool(
            "w", queue, reconcile, workers=2, waits_for=[pods], on_synced=lambda: order.append("+")
        )
    )
    queue.add("a")
    runtime.start()
    assert not runtime.ready()
    pods.event.set()
    assert handled.wait(DEADLINE)
    assert pool.started.wait(DEADLINE)
    assert order == ["+", "a"], "the sweep after the sync runs before any worker"
    assert runtime.ready()


def test_ready_needs_every_check(runtime: Runtime) -> None:
    writable = threading.Event()
    runtime.ready_when(writable.is_set)
    runtime.start()
    assert not runtime.ready()
    writable.set()
    assert runtime.ready()


def test_a_dead_lasting_thread_makes_the_process_unhealthy(runtime: Runtime) -> None:
    runtime.spawn("one-off", lambda: None, lasting=False).join(DEADLINE)
    assert runtime.healthy(), "a thread meant to end does not count"
    runtime.spawn("loop", lambda: None).join(DEADLINE)
    assert not runtime.healthy()


def test_stop_wakes_joins_then_cleans_up_in_order() -> None:
    runtime = Runtime("test")
    steps: list[str] = []
    wake = threading.Event()

    def loop() -> None:
        wake.wait(DEADLINE)
        steps.append("loop ended")

    queue: WorkQueue[str] = WorkQueue()
    runtime.add_pool(WorkerPool("w", queue, lambda key: None))
    runtime.spawn("loop", loop, join=True)
    runtime.on_stopping(wake.set)
    runtime.on_stopped(lambda: steps.append("checkpoint"))
    runtime.on_stopped(lambda: steps.append("close"))
    runtime.start()
    runtime.stop(timeout=DEADLINE)
    assert steps == ["loop ended", "checkpoint", "close"]
    assert runtime.stopping.is_set()
    assert not runtime.healthy()
    workers = [t for t in runtime.threads() if t.name.startswith("w-")]
    assert all(not t.is_alive() for t in workers)


def test_a_failing_clean_up_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    runtime = Runtime("test")
    steps: list[str] = []

    def broken() -> None:
        raise OSError("disk gone")

    runtime.on_stopped(broken)
    runtime.on_stopped(lambda: steps.append("close"))
    with caplog.at_level(logging.ERROR, logger="podcert.runtime"):
        runtime.stop()
    assert steps == ["close"]
    assert "clean-up step failed" in caplog.text


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_begin_a_graceful_stop(signum: int) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    runtime = Runtime("test")
    try:
        runtime.handle_signals()
        os.kill(os.getpid(), signum)
        assert runtime.stopping.wait(DEADLINE)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


# --- start-up back-off -------------------------------------------------------------------------


def test_start_up_retries_transient_trouble_with_doubling_capped_delays() -> None:
    delays: list[float] = []
    attempts = iter([Transient("refused")] * 6 + ["v1"])

    def attempt() -> str:
        outcome = next(attempts)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def wait(seconds: float) -> bool:
        delays.append(seconds)
        return False

    found = retry_until(attempt, threading.Event(), transient=(Transient,), wait=wait)
    assert found == "v1"
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]


def test_a_stop_during_start_up_gives_up_quietly() -> None:
    stop = threading.Event()

    def attempt() -> str:
        raise Transient("refused")

    def wait(seconds: float) -> bool:
        stop.set()  # SIGTERM while waiting
        return True

    assert retry_until(attempt, stop, transient=(Transient,), wait=wait) is None
    assert retry_until(lambda: "never tried", stop, transient=(Transient,)) is None


def test_an_error_no_wait_can_fix_is_raised_at_once() -> None:
    def attempt() -> str:
        raise PermissionError("no such CA Secret and may not create it")

    with pytest.raises(PermissionError):
        retry_until(attempt, threading.Event(), transient=(Transient,), wait=lambda s: False)


def test_a_retry_says_what_failed_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    # As podcert.client.rest words an API server it cannot reach, with a line break to flatten.
    nested = "cannot reach the API server at 127.0.0.1:6443\n  (Connection refused)"
    calls = iter([Transient(nested), "up"])

    def attempt() -> str:
        step = next(calls)
        if isinstance(step, Exception):
            raise step
        return step

    with caplog.at_level(logging.WARNING):
        assert retry_until(attempt, threading.Event(), transient=(Transient,), wait=lambda s: False)
    (record,) = caplog.records
    assert record.getMessage() == (
        "API server not usable yet (cannot reach the API server at 127.0.0.1:6443 "
        "(Connection refused)); retrying in 0.5s"
    )


def test_start_up_gives_up_when_the_trouble_outlasts_its_time() -> None:
    now = [0.0]
    attempts: list[float] = []

    def attempt() -> str:
        attempts.append(now[0])
        raise Transient("cannot reach the API server at 10.0.0.1:443 (timed out)")

    def wait(seconds: float) -> bool:
        now[0] += seconds
        return False

    with pytest.raises(GaveUp) as caught:
        retry_until(
            attempt,
            threading.Event(),
            transient=(Transient,),
            wait=wait,
            give_up_after=5.0,
            clock=lambda: now[0],
        )
    # 0, 0.5, 1.5, 3.5: the next wait would end past 5 s, so it stops there instead.
    assert attempts == [0.0, 0.5, 1.5, 3.5]
    assert str(caught.value) == (
        "API server not usable yet after 5s (cannot reach the API server at 10.0.0.1:443 "
        "(timed out)): giving up"
    )
