"""The CA rotation loop: the leader applies whatever step the CA schedule says is due.

The schedule is pure (`rotation.ca_schedule`, asked through `CAStore.due`); this loop only asks
it on a timer, or at once when woken (the CA set changed, leadership was gained), and applies
the step to the CA Secret. Every replica follows the Secret, so a step taken here reaches all of
them. A step that fails is logged and asked for again at the next look: rotation is never urgent
to the minute, and the schedule leaves weeks of margin.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from podcert.client.rest import ApiError
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
    ) -> None:
        self.cas = cas
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
