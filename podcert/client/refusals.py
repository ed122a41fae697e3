"""When the API server has refused a process's identity for long enough to call it unhealthy.

A node certificate that expired unrenewed, a revoked token, a service account deleted: every call
is then answered 401 (or 403), and the process retries forever while it looks alive. No retry
can fix that; a restart (which reads every credential again) or an operator can, so `/healthz`
says so. The rule (`unhealthy`, pure, over `Record`s that `observe` folds answers into):

- An answer refuses the identity when it is 401 to any call, or 403 to a read (GET: gets, lists,
  watches). A 403 to a write may be admission judging that one object (a webhook, a policy,
  NodeRestriction): it says nothing of the identity, so it counts as accepted, as does every
  other answer below 500. 5xx and no answer at all are no evidence either way.
- Unhealthy once every answer for at least `window` seconds refused the identity: the refusals
  since the last accepted answer span `window` or more. One refusal followed by silence is not
  enough; a process that made no call is not judged.
- Healthy again at the first accepted answer.

`Refusals` applies the rule to a process's answers (`podcert.client.rest.Rest` tells it each one)
and logs one line when it turns unhealthy, naming the identity (a certificate's subject and file, a
token's source: never the secret), and one when it is healthy again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

log = logging.getLogger("podcert.refusals")

WINDOW: Final = 60.0  # seconds of nothing but refusals before /healthz says unhealthy
READS: Final = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class Record:
    """The refusals since the last accepted answer: when the first and the latest came
    (monotonic seconds), and the latest's status. `since` None: the last answer was accepted."""

    since: float | None = None
    latest: float | None = None
    status: int = 0


HEALTHY: Final = Record()


def refuses(method: str, status: int) -> bool | None:
    """Whether an answer refuses the identity (True), accepts it (False) or says nothing (None)."""
    if status == 401 or (status == 403 and method in READS):
        return True
    if status == 0 or status >= 500:
        return None
    return False


def observe(record: Record, method: str, status: int, now: float) -> Record:
    """`record` after one more answer."""
    verdict = refuses(method, status)
    if verdict is None:
        return record
    if not verdict:
        return HEALTHY
    return Record(record.since if record.since is not None else now, now, status)


def unhealthy(record: Record, window: float = WINDOW) -> bool:
    return (
        record.since is not None
        and record.latest is not None
        and record.latest - record.since >= window
    )


class Refusals:
    """A process's answers, judged by the rule above; safe to share between threads."""

    def __init__(
        self,
        identity: Callable[[], str],
        *,
        window: float = WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.identity, self.window, self.clock = identity, window, clock
        self._record = HEALTHY
        self._lock = threading.Lock()

    def answer(self, method: str, status: int) -> None:
        """One answer of the API server to a call of `method`."""
        if self._record is HEALTHY and refuses(method, status) is not True:
            return  # the common case: nothing to change, no lock taken
        with self._lock:
            before = self._record
            self._record = after = observe(before, method, status, self.clock())
            was, now = unhealthy(before, self.window), unhealthy(after, self.window)
        if now and not was:
            log.error(
                "the API server has refused %s for %.0fs (every answer %d): unhealthy until "
                "a call succeeds",
                self.identity(),
                (after.latest or 0.0) - (after.since or 0.0),
                after.status,
            )
        elif was and not now:
            log.info("the API server accepts %s again: healthy", self.identity())

    def healthy(self) -> bool:
        return not unhealthy(self._record, self.window)
