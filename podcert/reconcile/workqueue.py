"""A work queue of keys, as client-go has it: level-based, deduplicated, one worker per key,
with ready keys shared fairly between flows.

- A key added while queued is not queued twice; a key added while being processed is queued
  again when its worker calls `done`, so the latest state is always handled and no key is ever
  handled by two workers at once.
- `add_all` adds many keys as one step: none is handed out before all are queued.
- `add_after` delays a key (retry with backoff, requeue at a time); `backoff` gives the capped
  exponential delay with jitter for a key's consecutive failures; `forget` resets it.
- Fair queuing: with a `flow` function, each key belongs to a flow path such as
  (node, namespace). `get` takes turns between the flows that have keys ready, level by level
  (round-robin over nodes, then within a node over its namespaces), FIFO inside one flow. So a
  flood in one flow delays a newly ready key of another flow by at most one turn of each other
  flow with keys ready (plus the keys workers already hold), however long the flood is. Without
  a `flow` every key is in one flow: plain FIFO.
- Time comes from an injected monotonic clock; waiting uses a Condition, never a fixed sleep.
"""

from __future__ import annotations

import heapq
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable
from typing import Final, Generic, TypeVar

K = TypeVar("K", bound=Hashable)

FlowPath = tuple[Hashable, ...]
"""Where a key queues: outermost flow first, e.g. (node, namespace); () is the one shared flow."""

_HERE: Final = object()  # a turn for the keys whose path ends at this level


class ShutDown(Exception):
    """The queue was shut down; the worker should exit."""


class _Flows(Generic[K]):
    """Ready keys, served round-robin over sub-flows at every level, FIFO within one flow.

    A level keeps a ring of turns: one per sub-flow with keys ready (and one for keys whose path
    ends here). `pop` serves the turn at the head and puts it back at the tail while it still
    has keys; a flow that runs dry is dropped, so memory follows the ready keys only.
    """

    __slots__ = ("_here", "_size", "_subflows", "_turns")

    def __init__(self) -> None:
        self._here: deque[K] = deque()
        self._subflows: dict[Hashable, _Flows[K]] = {}
        self._turns: deque[Hashable] = deque()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, key: K, path: FlowPath) -> None:
        level = self
        for name in path:
            level._size += 1
            sub = level._subflows.get(name)
            if sub is None:
                sub = level._subflows[name] = _Flows()
                level._turns.append(name)
            level = sub
        level._size += 1
        if not level._here:
            level._turns.append(_HERE)
        level._here.append(key)

    def pop(self) -> K:
        """The next key in turn (the caller checks that there is one)."""
        level = self
        while True:
            level._size -= 1
            turn = level._turns.popleft()
            if turn is _HERE:
                key = level._here.popleft()
                if level._here:
                    level._turns.append(_HERE)
                return key
            sub = level._subflows[turn]
            if len(sub) > 1:
                level._turns.append(turn)  # more after this one: back of the line
            else:
                del level._subflows[turn]
            level = sub


class WorkQueue(Generic[K]):
    def __init__(
        self,
        *,
        base_delay: float = 0.05,
        max_delay: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        flow: Callable[[K], FlowPath] | None = None,
    ) -> None:
        """`flow` gives a key's flow path; it runs outside the queue's lock (so it may take
        the caller's own locks) when the key is added, must be cheap and must not raise."""
        self._clock = clock
        self._rng = rng or random.Random()  # noqa: S311 (jitter, not secrets)
        self._base, self._max = base_delay, max_delay
        self._flow = flow
        self._cond = threading.Condition()
        self._ready: _Flows[K] = _Flows()
        self._dirty: dict[K, FlowPath] = {}  # queued or to be queued again, with its flow
        self._processing: set[K] = set()
        self._delayed: list[tuple[float, int, K, FlowPath]] = []
        self._seq = 0
        self._failures: dict[K, int] = {}
        self._shutdown = False

    def __len__(self) -> int:
        with self._cond:
            return len(self._ready) + len(self._delayed)

    def _path(self, key: K) -> FlowPath:
        return () if self._flow is None else self._flow(key)

    def add(self, key: K) -> None:
        path = self._path(key)
        with self._cond:
            if self._shutdown or key in self._dirty:
                return
            self._dirty[key] = path
            if key not in self._processing:
                self._ready.push(key, path)
                self._cond.notify()

    def add_all(self, keys: Iterable[K]) -> None:
        """`add` for many keys at once: none of them is ready before all of them are, so a
        worker that wakes meanwhile cannot take the first flow's keys while the others are
        still being added (a listed flood ahead of another node's request stays fair)."""
        paths = [(key, self._path(key)) for key in keys]
        with self._cond:
            if self._shutdown:
                return
            for key, path in paths:
                if key in self._dirty:
                    continue
                self._dirty[key] = path
                if key not in self._processing:
                    self._ready.push(key, path)
            self._cond.notify_all()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        path = self._path(key)
        with self._cond:
            if self._shutdown:
                return
            self._seq += 1
            heapq.heappush(self._delayed, (self._clock() + delay, self._seq, key, path))
            self._cond.notify()

    def backoff(self, key: K) -> float:
        """Delay for this key's next retry: base * 2^failures, capped, with +-25% jitter."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        delay = min(self._max, self._base * (2**failures))
        jittered: float = delay * self._rng.uniform(0.75, 1.25)
        return jittered

    def retry(self, key: K) -> float:
        delay = self.backoff(key)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    def _promote_due(self) -> float | None:
        """Move due delayed keys to their flows; return seconds until the next one is due."""
        now = self._clock()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, key, path = heapq.heappop(self._delayed)
            if key not in self._dirty:
                self._dirty[key] = path
                if key not in self._processing:
                    self._ready.push(key, path)
        return self._delayed[0][0] - now if self._delayed else None

    def get(self, timeout: float | None = None) -> K | None:
        """The next key to work on (now owned by the caller until `done`), or None on timeout."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while True:
                if self._shutdown:
                    raise ShutDown
                wait = self._promote_due()
                if self._ready:
                    key = self._ready.pop()
                    del self._dirty[key]
                    self._processing.add(key)
                    return key
                if deadline is not None:
                    left = deadline - self._clock()
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)

    def done(self, key: K) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._ready.push(key, self._dirty[key])
                self._cond.notify()

    def shut_down(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()
