"""A watched, keyed cache of one resource (an informer, in client-go's words).

A Reflector keeps it current; objects are converted on arrival into small immutable values, so
the cache holds what decisions need rather than whole API objects. Objects that cannot be
converted (broken or hostile) are left out and logged, never raised.

Built for the whole cluster's pods: the list is consumed one object at a time (pages, or shapes
decoded with only the fields a converter reads), and a relist updates the cache in place rather
than building a second one beside it, so memory stays at one cache plus one page, at start-up and
at every relist after a watch expired. An entry whose value did not change is left as it is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from podcert.reconcile.reflector import Reflector

log = logging.getLogger("podcert.cache")

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Cache(Generic[K, V]):
    def __init__(
        self,
        name: str,
        list_fn: Callable[[], tuple[Iterable[Any], str]],
        watch_fn: Callable[[str], Iterator[dict[str, Any]]],
        key: Callable[[Any], K | None],
        convert: Callable[[Any], V],
        stop: threading.Event,
        *,
        after: threading.Event | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._key, self._convert = key, convert
        self._lock = threading.Lock()
        self._items: dict[K, V] = {}
        self.reflector = Reflector(
            name,
            list_fn,
            watch_fn,
            self._on_list,
            self._on_event,
            stop,
            after=after,
            monotonic=monotonic,
        )

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    @property
    def synced(self) -> bool:
        """Whether a full list has gone through (entries are trustworthy before, just missing)."""
        return self.reflector.synced.is_set()

    @property
    def listed_at(self) -> float:
        """When the list the entries rest on was asked for (`Reflector.listed_at`): they reflect
        every change made before then; -inf before the first full list."""
        return self.reflector.listed_at

    def get(self, key: K) -> V | None:
        with self._lock:
            return self._items.get(key)

    def _entry(self, obj: Any) -> tuple[K, V] | None:
        key = self._key(obj)
        if key is None:
            return None
        try:
            return key, self._convert(obj)
        except ValueError as err:
            log.warning("%s: left out %s: %s", self.reflector.name, key, err)
            return None

    def _on_list(self, items: Iterable[Any]) -> None:
        # The keys the list has not named yet; what is left at the end is gone. A set of the
        # existing keys, not of the listed ones: no new key object is kept per item.
        with self._lock:
            stale = set(self._items)
        for obj in items:
            entry = self._entry(obj)
            if entry is None:
                continue
            key, value = entry
            stale.discard(key)
            self._put(key, value)
        with self._lock:
            for key in stale:
                self._items.pop(key, None)

    def _put(self, key: K, value: V) -> None:
        with self._lock:
            if self._items.get(key) != value:
                self._items[key] = value

    def _on_event(self, kind: str, obj: Any) -> None:
        key = self._key(obj)
        if key is None:
            return
        if kind == "DELETED":
            with self._lock:
                self._items.pop(key, None)
            return
        entry = self._entry(obj)
        if entry is None:
            with self._lock:
                self._items.pop(key, None)
        else:
            self._put(*entry)
