"""signer.authority.rotator: the CA rotation loop. The leader applies the step the schedule says
is due, a step that fails is logged and asked for again at the next look, and a replica that does
not lead never steps. The CA store is a stand-in that records the steps; the loop's waits are
woken, never slept."""

from __future__ import annotations

import logging
import threading

import pytest

from podcert.client.rest import ApiError
from signer.authority import schedule
from signer.authority.ca import CAError
from signer.authority.rotator import Rotator


class Store:
    """`due` answers from `steps`; `step` records, or raises `failure` once."""

    def __init__(self, *steps: schedule.Step | None) -> None:
        self.steps = list(steps)
        self.taken: list[schedule.Step] = []
        self.failure: Exception | None = None

    def due(self) -> schedule.Step | None:
        return self.steps.pop(0) if self.steps else None

    def step(self, step: schedule.Step) -> None:
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure
        self.taken.append(step)


def rotator(store: Store) -> Rotator:
    """A leader's loop over `store`."""
    return Rotator(store, lambda: True, threading.Event())  # type: ignore[arg-type]


def test_the_step_due_is_applied() -> None:
    store = Store(schedule.Activate("20260601t120000"))

    rotator(store).step_if_due()

    assert store.taken == [schedule.Activate("20260601t120000")]


def test_nothing_due_is_nothing_done() -> None:
    store = Store(None)

    rotator(store).step_if_due()

    assert store.taken == []


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(ApiError(409, "Conflict", "modified meanwhile"), id="the Secret changed"),
        pytest.param(schedule.RotationError("a prepared CA already exists"), id="not applicable"),
        pytest.param(CAError("ca.crt: not a certificate"), id="unusable material"),
    ],
)
def test_a_failed_step_is_logged_and_taken_at_the_next_look(
    failure: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(schedule.Prepare(), schedule.Prepare())
    store.failure = failure
    loop = rotator(store)

    with caplog.at_level(logging.INFO, logger="podcert.signer"):
        loop.step_if_due()
        loop.step_if_due()

    assert store.taken == [schedule.Prepare()]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [f"CA rotation step not applied: {failure}"]


@pytest.mark.parametrize(
    ("leading", "taken"),
    [
        pytest.param(True, [schedule.Prepare()], id="the leader steps"),
        pytest.param(False, [], id="a replica that does not lead never steps"),
    ],
)
def test_woken_the_loop_looks_at_once_and_steps_only_while_leading(
    leading: bool, taken: list[schedule.Step]
) -> None:
    store, stop = Store(schedule.Prepare()), threading.Event()

    def is_leader() -> bool:
        stop.set()  # one look, then the loop ends
        return leading

    loop = Rotator(store, is_leader, stop, interval=3600.0)  # type: ignore[arg-type]
    loop.wake()  # the CA set changed: look now, not in an hour
    runner = threading.Thread(target=loop.run)
    runner.start()
    runner.join(10)

    assert not runner.is_alive(), "the loop waited for its interval although woken"
    assert store.taken == taken


def test_a_stopped_loop_looks_no_more() -> None:
    stop = threading.Event()
    stop.set()
    store = Store(schedule.Prepare())
    asked: list[bool] = []
    loop = Rotator(store, lambda: asked.append(True) or True, stop)  # type: ignore[arg-type]

    loop.wake()
    loop.run()

    assert asked == [] and store.taken == []
