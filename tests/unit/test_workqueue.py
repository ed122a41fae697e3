"""The work queue's contract: dedupe, one worker per key, latest state wins, delays by clock."""

from __future__ import annotations

import random
import threading

import pytest

from podcert.workqueue import ShutDown, WorkQueue


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_key_added_twice_is_handed_out_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add("a")
    assert q.get(timeout=0) == "a"
    assert q.get(timeout=0) is None


def test_a_key_being_processed_is_not_handed_to_a_second_worker() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.add("a")  # changed while a worker holds it
    assert q.get(timeout=0) is None
    q.done("a")  # ... so it comes back once the worker is done
    assert q.get(timeout=0) == "a"


def test_delayed_keys_wait_for_the_clock() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add_after("a", 5.0)
    assert q.get(timeout=0) is None
    clock.now += 5.0
    assert q.get(timeout=0) == "a"


def test_backoff_doubles_to_the_cap_and_forget_resets_it() -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=1.0, max_delay=8.0, rng=random.Random(1))
    delays = [q.backoff("a") for _ in range(6)]
    for delay, nominal in zip(delays, [1, 2, 4, 8, 8, 8], strict=True):
        assert 0.75 * nominal <= delay <= 1.25 * nominal
    q.forget("a")
    assert q.failures("a") == 0
    assert q.backoff("a") <= 1.25


def test_shut_down_wakes_blocked_workers() -> None:
    q: WorkQueue[str] = WorkQueue()
    raised = threading.Event()

    def worker() -> None:
        try:
            q.get()
        except ShutDown:
            raised.set()

    thread = threading.Thread(target=worker)
    thread.start()
    q.shut_down()
    thread.join(timeout=5)
    assert raised.is_set()
    with pytest.raises(ShutDown):
        q.get(timeout=0)
