"""Token buckets per key (a node) that hold work back instead of refusing it.

A request over its node's rate is not denied: it is told how long to wait. To make that wait
mean something, the token it will use is reserved now (the bucket goes into debt), and the
request remembers its place by its own id: when it comes back at its time it is admitted
without taking a second token. Without reservations every held-back request would come back
at the next token and all but one would be sent away again, a herd that costs a reconcile
per request per token.

Bounded on purpose: a bucket never runs more than `horizon` seconds into debt (a request beyond
that is told to come back after `horizon`, without a reservation), reservations nobody came
back for are dropped once they are `horizon` stale, and buckets that are full again are
forgotten. Memory therefore follows the nodes that are over their rate right now.

Time is an argument (a monotonic `now` in seconds); the class sleeps never and reads no clock.
A lock makes it safe to share between worker threads.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Final

DEFAULT_HORIZON: Final = 60.0
# A request due within this much of now is admitted: the queue's timer fires a little early or
# late, and sending it away for a millisecond would only cost another round trip.
_SLACK: Final = 0.001


@dataclass(frozen=True)
class Rate:
    per_second: float  # sustained rate, > 0
    burst: int  # bucket size: how many may go at once after a quiet spell, >= 1


@dataclass
class _Bucket:
    tokens: float
    stamp: float
    reserved: dict[Hashable, float] = field(default_factory=dict)  # request -> its time


class TokenBuckets:
    def __init__(self, rate: Rate, *, horizon: float = DEFAULT_HORIZON) -> None:
        if rate.per_second <= 0 or rate.burst < 1:
            raise ValueError(f"a rate needs per_second > 0 and burst >= 1, got {rate}")
        self.rate = rate
        # Long enough that an empty bucket can always hand out one reservation.
        self.horizon = max(horizon, 2.0 / rate.per_second)
        self._buckets: dict[Hashable, _Bucket] = {}
        self._lock = threading.Lock()
        self._swept = float("-inf")

    def __len__(self) -> int:
        """Buckets held: the keys that used tokens lately."""
        with self._lock:
            return len(self._buckets)

    def admit(self, key: Hashable, request: Hashable, now: float) -> float:
        """0 when `request` may go now under `key`'s bucket; else the seconds it must wait.

        Ask again with the same `request` when the wait is over: its token is reserved.
        """
        with self._lock:
            if now - self._swept >= self.horizon:
                self._sweep(now)
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = _Bucket(float(self.rate.burst), now)
            self._refill(bucket, now)
            due = bucket.reserved.get(request)
            if due is not None:
                if due <= now + _SLACK:
                    del bucket.reserved[request]
                    return 0.0
                return due - now
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return 0.0
            wait = (1.0 - bucket.tokens) / self.rate.per_second
            if wait > self.horizon:
                return self.horizon  # too deep in debt: no place held, ask again later
            bucket.tokens -= 1.0
            bucket.reserved[request] = now + wait
            return wait

    def _refill(self, bucket: _Bucket, now: float) -> None:
        if now > bucket.stamp:
            bucket.tokens = min(
                float(self.rate.burst),
                bucket.tokens + (now - bucket.stamp) * self.rate.per_second,
            )
            bucket.stamp = now

    def _sweep(self, now: float) -> None:
        """Drop reservations nobody came back for and buckets that are as good as new."""
        self._swept = now
        for key in list(self._buckets):
            bucket = self._buckets[key]
            self._refill(bucket, now)
            stale = [r for r, due in bucket.reserved.items() if due < now - self.horizon]
            for request in stale:
                del bucket.reserved[request]
            if not bucket.reserved and bucket.tokens >= self.rate.burst:
                del self._buckets[key]
