"""The CA rotation loop: the leader applies whatever step the CA schedule says is due.

The schedule is pure (`rotation.ca_schedule`, asked through `CAStore.due`); this loop only asks
it on a timer, or at once when woken (the CA set changed, leadership was gained), and applies
the step to the CA Secret. Every replica follows the Secret, so a step taken here reaches all of
them. A step that fails is logged and asked for again at the next look: rotation is never urgent
to the minute, and the schedule leaves weeks of margin.

At each look every replica also asks whether an upstream-signed intermediate needs its successor
from the operator (`signer.authority.successor`): `SuccessorWarning` sets the gauge, logs one
warning line whenever the answer changes, and the leader records it as an Event on the CA Secret.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Protocol

from podcert.client.rest import ApiError
from signer.authority import successor
from signer.authority.ca import CAError
from signer.authority.castore import CAStore
from signer.authority.schedule import RotationError

log = logging.getLogger("podcert.signer")


class Rotator:
    def __init__(
        self,
        cas: CAStore,
        is_leader: Callable[[], bool],
        stop: threading.Event,
        *,
        interval: float = 30.0,
        every_look: Callable[[], object] | None = None,
    ) -> None:
        self.cas = cas
        # Run at each look by every replica, leader or not (the successor warning's check).
        self.every_look = every_look
        self.is_leader = is_leader
        self.interval = interval
        self._stop = stop
        self._wake = threading.Event()

    def wake(self) -> None:
        """Look at the schedule now rather than at the next tick."""
        self._wake.set()

    def run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self.every_look is not None and not self._stop.is_set():
                self.every_look()
            if self._stop.is_set() or not self.is_leader():
                continue
            self.step_if_due()

    def step_if_due(self) -> None:
        try:
            step = self.cas.due()
            if step is not None:
                log.info("CA rotation step due: %s", step)
                self.cas.step(step)
        except (ApiError, RotationError, CAError) as err:
            log.warning("CA rotation step not applied: %s", err)


class SuccessorEvents(Protocol):
    def record_secret_event(
        self, namespace: str, name: str, reason: str, message: str, now: dt.datetime
    ) -> None: ...


class SuccessorWarning:
    """Tells the operator that an upstream-signed intermediate needs its successor: the gauge
    (`set_gauge`, 1 or 0) at every look, a log line and (leader only) a Warning Event on the CA
    Secret each time the warning appears or changes (another generation, urgency, or a
    successor now awaiting its chain). Never raises: a look that fails is logged."""

    def __init__(
        self,
        cas: CAStore,
        set_gauge: Callable[[float], None],
        events: SuccessorEvents,
        is_leader: Callable[[], bool],
    ) -> None:
        self.cas = cas
        self.set_gauge = set_gauge
        self.events = events
        self.is_leader = is_leader
        self._logged: tuple[str, bool, str | None] | None = None
        self._recorded: tuple[str, bool, str | None] | None = None

    def check(self) -> successor.SuccessorDue | None:
        """Look once; the warning due now, or None."""
        try:
            now = self.cas.clock()
            due = successor.successor_due(
                self.cas.generations, self.cas.awaiting, now, self.cas.settings
            )
        except (ValueError, TypeError) as err:  # a CA set the store let through, unjudgeable
            log.warning("cannot judge the signing CA's successor: %s", err)
            return None
        self.set_gauge(1.0 if due is not None else 0.0)
        key = None if due is None else (due.id, due.urgent, due.awaiting)
        if due is not None and key != self._logged:
            log.warning("%s", due.message())
        self._logged = key
        if key is None:
            self._recorded = None
        elif key != self._recorded and due is not None and self.is_leader():
            self.events.record_secret_event(
                self.cas.namespace, self.cas.secret_name, successor.REASON, due.message(), now
            )
            self._recorded = key  # a replica that leads later records it once itself
        return due
