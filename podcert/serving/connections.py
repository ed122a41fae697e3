"""How many connections a served port holds, and which one goes when it is full: the rules every
podcert server (metrics and probes, the admission webhook, the SPIFFE bundle endpoint) applies,
as pure bookkeeping with the time passed in. The servers (`podcert.serving.health`,
`podcert.serving.servers`) do the I/O: they ask, then close what they are told to.

Without a cap, each idle connection costs memory (asyncio's TLS buffer, a thread and its stack)
for as long as the peer likes, and nothing needs credentials to open one. With it:

- At most `Limits.max_connections` connections are held per port, counted from the TCP accept
  (before any TLS handshake), so an attacker's share of memory is bounded whatever it opens.
- A connection that is not serving a request is idle: in its TLS handshake, waiting for a
  request head, reading one, or kept alive after an answer. When a new connection comes to a
  full port, the one idle the longest is closed to make room; only when every held connection
  is serving a request is the new one refused (closed at once, never queued).
- So a probe, which connects and sends its request at once, is the newest idle connection and
  the last to go: it keeps being answered while an attacker holds every slot with idle
  connections, however many it opens. (A cap per peer would not do that: an attacker has many
  addresses, and the kubelet's probes come from the node's address, which host-network pods
  share. A reserve would need to tell a probe apart before it has said anything.)
- An idle connection is closed `idle_timeout` seconds after it became idle (`overdue`), a TLS
  handshake after `handshake_timeout`: a silent or slow peer cannot hold a slot past those.
"""

from __future__ import annotations

import argparse
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

K = TypeVar("K", bound=Hashable)

DEFAULT_MAX_CONNECTIONS: Final = 64
DEFAULT_HANDSHAKE_TIMEOUT: Final = 5.0
DEFAULT_IDLE_TIMEOUT: Final = 10.0


@dataclass(frozen=True)
class Limits:
    """What one served port holds. `idle_timeout` bounds a request head's arrival too (the
    head of a first request counts from the accept, a later one from the answer before it)."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT

    def problem(self) -> str | None:
        """What is wrong with these limits, or None."""
        if self.max_connections < 1:
            return f"max_connections must be at least 1, got {self.max_connections}"
        if not self.handshake_timeout > 0:
            return f"handshake_timeout must be above 0, got {self.handshake_timeout}"
        if not self.idle_timeout > 0:
            return f"idle_timeout must be above 0, got {self.idle_timeout}"
        return None


DEFAULT_LIMITS: Final = Limits()


def add_flags(parser: argparse.ArgumentParser, ports: str) -> None:
    """`--max-connections` and `--idle-timeout`, for the `ports` a command serves."""
    parser.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        help=f"connections {ports} each hold; a new one to a full port closes the one idle "
        "the longest, or is refused when every one is serving a request",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT,
        help=f"seconds {ports} keep a connection that serves no request (a request head must "
        "arrive within it)",
    )


def from_flags(args: argparse.Namespace) -> Limits:
    return Limits(max_connections=args.max_connections, idle_timeout=args.idle_timeout)


def flags_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with `add_flags`' flags, or None."""
    if args.max_connections < 1:
        return f"--max-connections must be at least 1, got {args.max_connections}"
    if not args.idle_timeout > 0:
        return f"--idle-timeout must be above 0, got {args.idle_timeout}"
    return None


@dataclass(frozen=True)
class Admission(Generic[K]):
    """The answer for a new connection: held or not, and the idle one closed to make room."""

    admitted: bool
    evicted: K | None = None


class Table(Generic[K]):
    """The connections one port holds, each idle since a time or serving a request. Not
    thread-safe: a threaded server holds its own lock around every call."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._idle_since: dict[K, float] = {}  # insertion order is idle-since order
        self._busy: set[K] = set()

    def __len__(self) -> int:
        return len(self._idle_since) + len(self._busy)

    def __contains__(self, key: object) -> bool:
        return key in self._idle_since or key in self._busy

    def admit(self, key: K, now: float) -> Admission[K]:
        """Hold `key` (just accepted) as idle, closing the longest-idle one if the port is full;
        refuse it when every held connection is serving a request."""
        evicted: K | None = None
        if len(self) >= self.limits.max_connections:
            evicted = next(iter(self._idle_since), None)
            if evicted is None:
                return Admission(admitted=False)
            del self._idle_since[evicted]
        self._idle_since[key] = now
        return Admission(admitted=True, evicted=evicted)

    def busy(self, key: K) -> bool:
        """`key` began serving a request (its head has arrived); False if it is not held (it was
        closed meanwhile: the request is not to be served)."""
        if self._idle_since.pop(key, None) is None:
            return key in self._busy
        self._busy.add(key)
        return True

    def idle(self, key: K, now: float) -> None:
        """`key` answered and is kept alive, idle from `now`."""
        if key in self._busy:
            self._busy.discard(key)
            self._idle_since[key] = now

    def remove(self, key: K) -> None:
        """`key` is closed."""
        self._idle_since.pop(key, None)
        self._busy.discard(key)

    def overdue(self, now: float) -> list[K]:
        """The idle connections that have been idle `idle_timeout` or longer at `now`; they
        are no longer held once returned."""
        out: list[K] = []
        for key, since in self._idle_since.items():
            if now - since < self.limits.idle_timeout:
                break  # the rest became idle later
            out.append(key)
        for key in out:
            del self._idle_since[key]
        return out

    def next_deadline(self) -> float | None:
        """When the longest-idle connection becomes overdue (None: none is idle)."""
        first = next(iter(self._idle_since.values()), None)
        return None if first is None else first + self.limits.idle_timeout
