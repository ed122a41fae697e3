"""One controller runtime: what every podcert process runs its reconcilers on.

controller-runtime's contract, in Python and with threads:

- A `WorkerPool` serves one `WorkQueue` of keys with N workers. `reconcile(key)` returns None
  (done: the key's backoff is forgotten), a number of seconds (look again then), or raises: a
  `Terminal` error drops the key until something adds it again; anything else retries it with
  the queue's capped exponential backoff and jitter. Errors of the pool's `expected` types are
  logged as one warning line, the rest with their traceback. No error is ever turned into an
  outcome for the key: that is the reconciler's decision, never the runtime's.
- Workers start once the caches they read have listed (`wait_for_sync`), as controllers wait for
  their informers; with a `sync_timeout` they start anyway when a list does not come.
- `Runtime` owns a process's threads: background loops (reflectors, timers), the pools, and a
  stop that shuts the queues, joins what must finish and then runs the clean-ups in order.
  SIGTERM and SIGINT stop it gracefully (`handle_signals`). `ready()` is every pool started plus
  the process's own checks; `healthy()` is every long-running thread still alive.
- `retry_until` is the start-up back-off: a process waits out transient trouble reaching the API
  server (doubling delays, capped) instead of crashing into a restart loop.

Time is injected (a monotonic clock, and the waits themselves where a test must not sleep).
Nothing here knows Kubernetes: the caller says which errors are transient.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, Final, Generic, TypeVar

from podcert.errors import CommandError, one_line
from podcert.reconcile.workqueue import ShutDown, WorkQueue

log = logging.getLogger("podcert.runtime")

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

SYNC_POLL: Final = 0.2  # seconds between looks at a cache that has not listed yet


class Terminal(Exception):
    """A reconcile that can never succeed for this key, whatever is retried: the key is dropped
    (and its backoff forgotten) until something adds it again. Raise it only for faults no
    retry can fix; transient trouble must raise anything else."""


# --- waiting for caches ------------------------------------------------------------------------


@dataclass(frozen=True)
class Synced:
    """A cache the workers read, by name, and the event its first full list sets."""

    name: str
    event: threading.Event


@dataclass(frozen=True)
class SyncResult:
    """How a wait for the caches ended: all listed, `timed_out` naming the first that did not
    list in time, or `stopped` when the process began to stop first."""

    timed_out: str | None = None
    stopped: bool = False

    @property
    def synced(self) -> bool:
        return self.timed_out is None and not self.stopped


def _wait_event(event: threading.Event, seconds: float) -> bool:
    return event.wait(seconds)


def wait_for_sync(
    caches: Sequence[Synced],
    stop: threading.Event,
    *,
    timeout: float | None = None,
    clock: Callable[[], float] = time.monotonic,
    wait: Callable[[threading.Event, float], bool] = _wait_event,
    poll: float = SYNC_POLL,
) -> SyncResult:
    """Wait until every cache has listed, the process stops, or `timeout` seconds pass (None:
    no limit). `wait(event, seconds)` is Event.wait; a test injects one that moves its clock."""
    deadline = None if timeout is None else clock() + timeout
    for cache in caches:
        while True:
            step = poll if deadline is None else max(0.0, min(poll, deadline - clock()))
            if wait(cache.event, step):
                break
            if stop.is_set():
                return SyncResult(stopped=True)
            if deadline is not None and clock() >= deadline:
                return SyncResult(timed_out=cache.name)
    return SyncResult()


# --- the worker pool ---------------------------------------------------------------------------


def _always() -> bool:
    return True


def _nothing() -> None:
    return None


class WorkerPool(Generic[K]):
    """Workers over one queue. `process` is one key's turn (tests call it directly); `run` is
    one worker's loop until the queue shuts down."""

    def __init__(
        self,
        name: str,
        queue: WorkQueue[K],
        reconcile: Callable[[K], float | None],
        *,
        workers: int = 1,
        active: Callable[[], bool] = _always,
        expected: tuple[type[Exception], ...] = (),
        on_retry: Callable[[K, Exception], None] | None = None,
        after_each: Callable[[], None] = _nothing,
        context: Callable[[K], Mapping[str, object]] | None = None,
        waits_for: Sequence[Synced] = (),
        sync_timeout: float | None = None,
        sync_timeout_note: str = "the workers start anyway",
        on_synced: Callable[[], None] = _nothing,
        logger: logging.Logger = log,
    ) -> None:
        """`active` false: keys are handed back untouched (a standby keeps them for later).
        `on_retry(key, error)` sees every error before its retry (metrics by reason);
        `after_each` runs after every key (a queue-depth gauge); `context(key)` is the log
        context of lines about the key. The pool's workers start once `waits_for` have
        listed, or after `sync_timeout` seconds with a warning ending in `sync_timeout_note`;
        `on_synced` runs once, just before they start."""
        if workers < 1:
            raise ValueError(f"a pool needs at least one worker, got {workers}")
        self.name = name
        self.queue = queue
        self.reconcile = reconcile
        self.workers = workers
        self.active = active
        self.expected = expected
        self.on_retry = on_retry
        self.after_each = after_each
        self.context = context
        self.waits_for = tuple(waits_for)
        self.sync_timeout = sync_timeout
        self.sync_timeout_note = sync_timeout_note
        self.on_synced = on_synced
        self.log = logger
        self.started = threading.Event()

    def _extra(self, key: K) -> Mapping[str, object] | None:
        return None if self.context is None else self.context(key)

    def process(self, key: K) -> None:
        """Reconcile one key the queue handed out, and tell the queue how it went."""
        try:
            if not self.active():
                return
            after = self.reconcile(key)
            if after is None:
                self.queue.forget(key)
            else:
                self.queue.add_after(key, after)
        except Terminal as err:
            self.queue.forget(key)
            self.log.error("%s: giving up: %s", self.name, err, extra=self._extra(key))
        except Exception as err:
            delay = self.queue.retry(key)
            if self.on_retry is not None:
                self.on_retry(key, err)
            if isinstance(err, self.expected):
                self.log.warning("will retry in %.2fs: %s", delay, err, extra=self._extra(key))
            else:
                self.log.exception(
                    "unexpected error; will retry in %.2fs", delay, extra=self._extra(key)
                )
        finally:
            self.queue.done(key)
            self.after_each()

    def run(self) -> None:
        while True:
            try:
                key = self.queue.get()
            except ShutDown:
                return
            if key is not None:
                self.process(key)


# --- the process -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Thread:
    thread: threading.Thread
    join: bool  # joined (with the timeout) when the runtime stops
    lasting: bool  # runs for the process's life: its end makes the process unhealthy


class Runtime:
    """The threads of one process, started together and stopped together."""

    def __init__(
        self,
        name: str,
        *,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
    ) -> None:
        self.name = name
        self.stopping = stop if stop is not None else threading.Event()
        self.clock = clock
        self.log = logger
        self._lock = threading.Lock()
        self._threads: list[_Thread] = []
        self._pools: list[WorkerPool[Any]] = []
        self._checks: list[Callable[[], bool]] = []
        self._wakers: list[Callable[[], None]] = []
        self._cleanups: list[Callable[[], None]] = []
        self._started = False

    # --- assembly ------------------------------------------------------------------------------

    def add_pool(self, pool: WorkerPool[K]) -> WorkerPool[K]:
        self._pools.append(pool)
        if self._started:
            self._start_pool(pool)
        return pool

    def ready_when(self, check: Callable[[], bool]) -> None:
        """`ready()` also needs `check()` (a CA loaded, the audit log writable...)."""
        self._checks.append(check)

    def on_stopping(self, wake: Callable[[], None]) -> None:
        """Run as the stop begins, before any join: wake a loop that waits on its own event."""
        self._wakers.append(wake)

    def on_stopped(self, cleanup: Callable[[], None]) -> None:
        """Run once the threads are joined, in the order registered (a final checkpoint, then
        closing the servers and files)."""
        self._cleanups.append(cleanup)

    def spawn(
        self, name: str, target: Callable[[], None], *, join: bool = False, lasting: bool = True
    ) -> threading.Thread:
        """Start a daemon thread now. `join`: the stop waits for it (it must watch
        `stopping`); `lasting`: it is meant to run until the stop."""
        thread = threading.Thread(target=target, name=name, daemon=True)
        with self._lock:  # started and listed at once: a stop joins only started threads
            thread.start()
            self._threads.append(_Thread(thread, join, lasting))
        return thread

    # --- running -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start every pool: each waits for its caches on its own thread, then its workers."""
        self._started = True
        for pool in self._pools:
            self._start_pool(pool)

    def _start_pool(self, pool: WorkerPool[K]) -> None:
        self.spawn(f"{pool.name}-start", lambda: self._run_pool(pool), join=True, lasting=False)

    def _run_pool(self, pool: WorkerPool[K]) -> None:
        result = wait_for_sync(
            pool.waits_for, self.stopping, timeout=pool.sync_timeout, clock=self.clock
        )
        if result.stopped or self.stopping.is_set():
            return
        if result.timed_out is not None:
            pool.log.warning(
                "the %s cache has not synced in %.0fs: %s",
                result.timed_out,
                pool.sync_timeout,
                pool.sync_timeout_note,
            )
        pool.on_synced()
        for index in range(pool.workers):
            self.spawn(f"{pool.name}-{index}", pool.run, join=True)
        pool.started.set()

    def threads(self) -> list[threading.Thread]:
        """Every thread started so far, in order."""
        with self._lock:
            return [t.thread for t in self._threads]

    def ready(self) -> bool:
        return all(p.started.is_set() for p in self._pools) and all(c() for c in self._checks)

    def healthy(self) -> bool:
        """Not stopping, and every long-running thread started is still running (a dead
        worker calls for a restart, not a hang)."""
        with self._lock:
            threads = list(self._threads)
        return not self.stopping.is_set() and all(t.thread.is_alive() for t in threads if t.lasting)

    def handle_signals(self) -> None:
        """SIGTERM and SIGINT begin a graceful stop (call from the main thread)."""

        def handler(signum: int, frame: FrameType | None) -> None:
            self.stopping.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, handler)

    def wait(self) -> None:
        """Block until the stop begins (a signal, or a piece that gave up). In steps, so the main
        thread returns to the interpreter often and runs a signal's handler however it was
        blocked (a shim once sat out a SIGTERM in one unbounded wait)."""
        while not self.stopping.wait(1.0):
            pass

    def stop(self, timeout: float = 10.0) -> None:
        """Stop: shut the queues, wake the loops, join workers and joined threads (each for
        at most `timeout` seconds), then run the clean-ups."""
        self.stopping.set()
        for pool in self._pools:
            pool.queue.shut_down()
        for wake in self._wakers:
            wake()
        joined: set[threading.Thread] = {threading.current_thread()}
        while True:  # until no thread to join is left: a pool's starter may spawn workers
            with self._lock:
                pending = [t.thread for t in self._threads if t.join and t.thread not in joined]
            if not pending:
                break
            for thread in pending:
                thread.join(timeout)
                joined.add(thread)
        for cleanup in self._cleanups:
            try:
                cleanup()
            except Exception:
                self.log.exception("%s: a clean-up step failed while stopping", self.name)


# --- start-up ----------------------------------------------------------------------------------


class GaveUp(CommandError):
    """Start-up's transient trouble outlasted the time it was given (exit 1)."""


def retry_until(
    attempt: Callable[[], T],
    stop: threading.Event,
    *,
    transient: tuple[type[Exception], ...],
    first: float = 0.5,
    cap: float = 10.0,
    wait: Callable[[float], bool] | None = None,
    logger: logging.Logger = log,
    what: str = "API server not usable yet",
    give_up_after: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
) -> T | None:
    """`attempt()`'s result, retrying transient errors with doubling delays (first, 2x first,
    ... capped at `cap`); None when the stop comes first. Other errors propagate: a process
    that cannot start for a reason no wait can fix should say so and exit. With
    `give_up_after` seconds (0: never), trouble that lasts longer raises GaveUp naming it.
    `wait(seconds)` returns True when stopped (Event.wait; a test injects its own)."""
    sleep = stop.wait if wait is None else wait
    delay = first
    deadline = clock() + give_up_after if give_up_after > 0 else None
    while not stop.is_set():
        try:
            return attempt()
        except transient as err:
            cause = one_line(str(err))
            if deadline is not None and clock() + delay > deadline:
                raise GaveUp(f"{what} after {give_up_after:g}s ({cause}): giving up") from None
            logger.warning("%s (%s); retrying in %.1fs", what, cause, delay)
            if sleep(delay):
                break
            delay = min(delay * 2, cap)
    return None
