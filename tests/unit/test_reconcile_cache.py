"""A cache of the whole cluster is filled one object at a time and relisted in place.

The signer's caches hold every pod of the cluster. The list used to be held whole (decoded at
once, kept alive by the watch loop's frame, and a relist built a second cache beside the first);
now the list function may give a lazy iterator (`podcert.client.rest.Rest.list`, page by page), the
cache updates itself as it goes, and a list that breaks half way leaves the cache as it was and is
listed again rather than watched from.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from podcert.client.rest import ApiError, Gone
from podcert.reconcile.cache import Cache


def obj(name: str, value: str, version: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}, "value": value}


class Script:
    """Lists and watches played from a script: each list is a list of objects (or an exception
    raised after the objects before it), each watch a list of events then an exception."""

    def __init__(self, lists: list[list[Any]], watches: list[list[Any]]) -> None:
        self.lists, self.watches = lists, watches
        self.listed = 0
        self.watched_from: list[str] = []
        self.stop = threading.Event()

    def list(self) -> tuple[Iterator[Any], str]:
        items = self.lists.pop(0)
        self.listed += 1

        def lazy() -> Iterator[Any]:
            for item in items:
                if isinstance(item, Exception):
                    raise item
                yield item

        return lazy(), f"list-{self.listed}"

    def watch(self, version: str) -> Iterator[dict[str, Any]]:
        self.watched_from.append(version)
        if not self.watches:
            self.stop.set()
            return
        for event in self.watches.pop(0):
            if isinstance(event, Exception):
                raise event
            yield event


def cache(script: Script) -> Cache[str, str]:
    return Cache(
        "things",
        script.list,
        script.watch,
        lambda o: o["metadata"]["name"],
        lambda o: str(o["value"]),
        script.stop,
    )


def test_a_relist_updates_in_place_and_drops_what_is_gone() -> None:
    script = Script(
        lists=[
            [obj("a", "A"), obj("b", "B"), obj("c", "C")],
            [obj("b", "B2"), obj("c", "C"), obj("d", "D")],
        ],
        watches=[[Gone(410, "Expired", "too old")]],
    )
    things = cache(script)
    seen: list[dict[str, str | None]] = []
    original = things._on_list

    def spy(items: Any) -> None:
        original(items)
        seen.append({k: things.get(k) for k in "abcd"})

    things.reflector._on_list = spy
    things.reflector.run()
    assert seen == [
        {"a": "A", "b": "B", "c": "C", "d": None},
        {"a": None, "b": "B2", "c": "C", "d": "D"},
    ]
    assert script.watched_from == ["list-1", "list-2"]


def test_an_unchanged_object_keeps_its_cached_value() -> None:
    script = Script(lists=[[obj("a", "A")], [obj("a", "A")]], watches=[[Gone(410, "", "")]])
    things: Cache[str, object] = Cache(
        "things", script.list, script.watch, lambda o: o["metadata"]["name"], dict, script.stop
    )
    first: list[object] = []
    original = things._on_list

    def spy(items: Any) -> None:
        original(items)
        first.append(things.get("a"))

    things.reflector._on_list = spy
    things.reflector.run()
    assert first[0] == first[1]
    assert first[0] is first[1], "an equal value replaced the cached one"


def test_a_list_that_breaks_half_way_keeps_the_cache_and_is_listed_again() -> None:
    broken = ApiError(0, "Unavailable", "page 2 failed")
    script = Script(
        lists=[
            [obj("a", "A"), obj("b", "B")],
            [obj("b", "B2"), broken],
            [obj("b", "B3")],
        ],
        watches=[[Gone(410, "Expired", "too old")]],
    )
    things = cache(script)
    things.reflector._stop.wait = lambda _t=None: False  # type: ignore[method-assign]
    things.reflector.run()
    # The broken list was never watched from; nothing it left out was dropped meanwhile.
    assert script.watched_from == ["list-1", "list-3"]
    assert script.listed == 3
    assert (things.get("a"), things.get("b")) == (None, "B3")


def test_watch_events_update_and_delete() -> None:
    script = Script(
        lists=[[obj("a", "A")]],
        watches=[
            [
                {"type": "ADDED", "object": obj("b", "B", "2")},
                {"type": "MODIFIED", "object": obj("a", "A2", "3")},
                {"type": "DELETED", "object": obj("b", "B", "4")},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}},
            ]
        ],
    )
    things = cache(script)
    things.reflector.run()
    assert (things.get("a"), things.get("b"), len(things)) == ("A2", None, 1)
    assert script.watched_from == ["list-1", "9"]
