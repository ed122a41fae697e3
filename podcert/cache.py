"""A watched, keyed cache of one resource (an informer, in client-go's words).

A Reflector keeps it current; objects are converted on arrival into small immutable values, so
the cache holds what decisions need rather than whole API objects. Objects that cannot be
converted (broken or hostile) are left out and logged, never raised.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

from podcert.reflector import Reflector
from podcert.rest import JSON

log = logging.getLogger("podcert.cache")

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Cache(Generic[K, V]):
    def __init__(
        self,
        name: str,
        list_fn: Callable[[], tuple[list[JSON], str]],
        watch_fn: Callable[[str], Iterator[JSON]],
        key: Callable[[JSON], K | None],
        convert: Callable[[JSON], V],
        stop: threading.Event,
    ) -> None:
        self._key, self._convert = key, convert
        self._lock = threading.Lock()
        self._items: dict[K, V] = {}
        self.reflector = Reflector(name, list_fn, watch_fn, self._on_list, self._on_event, stop)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def get(self, key: K) -> V | None:
        with self._lock:
            return self._items.get(key)

    def _entry(self, obj: JSON) -> tuple[K, V] | None:
        key = self._key(obj)
        if key is None:
            return None
        try:
            return key, self._convert(obj)
        except ValueError as err:
            log.warning("%s: left out %s: %s", self.reflector.name, key, err)
            return None

    def _on_list(self, items: list[JSON]) -> None:
        fresh = dict(e for e in map(self._entry, items) if e is not None)
        with self._lock:
            self._items = fresh

    def _on_event(self, kind: str, obj: JSON) -> None:
        key = self._key(obj)
        if key is None:
            return
        entry = None if kind == "DELETED" else self._entry(obj)
        with self._lock:
            if entry is None:
                self._items.pop(key, None)
            else:
                self._items[key] = entry[1]
