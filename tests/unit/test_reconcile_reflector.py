"""The reflector's retry back-off belongs to one outage: once the server answers a whole list or
a watch runs to its end, the next outage starts again from the shortest delay (it used to keep
doubling across outages, up to 30 s on a quiet node)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from podcert.client.rest import ApiError, Gone
from podcert.reconcile.reflector import Reflector


class RecordingStop(threading.Event):
    """A stop event whose waits return at once and are recorded; set after `waits` of them."""

    def __init__(self, waits: int) -> None:
        super().__init__()
        self.delays: list[float] = []
        self.waits = waits

    def wait(self, timeout: float | None = None) -> bool:
        self.delays.append(timeout or 0.0)
        if len(self.delays) >= self.waits:
            self.set()
        return self.is_set()


def run(script: list[str], waits: int) -> list[float]:
    """Drive a reflector through watch outcomes: "down" (unreachable), "gone" (410), "ends" (a
    watch that runs to its timeout with no event)."""
    steps = iter(script)
    stop = RecordingStop(waits)

    def watch(version: str) -> Iterator[dict[str, Any]]:
        step = next(steps, "ends")
        if step == "down":
            raise ApiError(0, "Unavailable", "connection refused")
        if step == "gone":
            raise Gone(410, "Expired", "too old")
        return iter(())

    def no_objects(items: Any) -> None:
        return None

    reflector = Reflector(
        "pods", lambda: ([], "1"), watch, no_objects, lambda kind, obj: None, stop
    )
    reflector.run()
    return stop.delays


def test_a_relist_ends_the_outage_so_the_next_one_backs_off_from_the_start() -> None:
    delays = run(["down", "down", "gone", "down", "down"], waits=4)

    assert delays == [0.4, 0.8, 0.4, 0.8]


def test_a_watch_that_ran_to_its_end_resets_the_back_off() -> None:
    delays = run(["down", "down", "down", "ends", "down"], waits=4)

    assert delays == [0.4, 0.8, 1.6, 0.4]


def test_one_long_outage_still_doubles_to_the_cap() -> None:
    delays = run(["down"] * 12, waits=12)

    assert delays[:4] == [0.4, 0.8, 1.6, 3.2]
    assert max(delays) == 30.0
