"""List, then watch from the last resourceVersion; relist only on 410 Gone. Never polls.

Shared by the signer (PodCertificateRequests, Services, ClusterTrustBundles, its CA Secret, and
its caches of the cluster's pods, nodes and ServiceAccounts) and the shim (its node's pods and
requests). Callbacks get objects as the list and watch functions decode them (dicts, or the
small shapes of `podcert.client.rest`); consumers key them by name.

A list may be lazy (`podcert.client.rest.Rest.list`: pages read as `on_list` iterates them), so
nothing here holds a list: the version is taken from the list function, and used for the watch only
once `on_list` has gone through every item; a list that fails half way is listed again.

`listed_at` is when (on a monotonic clock) the list the callbacks' store now rests on was asked
for: a list is a consistent read, so that store reflects every change the API server had made
before that moment (the signer relies on it, `signer.issue.fresh`). A reflector can be told to list
only `after` an event, to order its list after something another reflector saw.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from podcert.client.rest import ApiError, Gone, resource_version

log = logging.getLogger("podcert.reflector")


class Reflector:
    """List, then watch from the last resourceVersion; relist only on 410 Gone. Never polls."""

    def __init__(
        self,
        name: str,
        # The list: its objects (a list of dicts, or an iterator of shapes read as it goes) and
        # its resourceVersion; `on_list` gets the objects.
        list_fn: Callable[[], tuple[Any, str]],
        watch_fn: Callable[[str], Iterator[dict[str, Any]]],
        on_list: Callable[[Any], None],
        on_event: Callable[[str, Any], None],
        stop: threading.Event,
        *,
        after: threading.Event | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._list, self._watch = list_fn, watch_fn
        self._on_list, self._on_event = on_list, on_event
        self._stop = stop
        self._after = after
        self._monotonic = monotonic
        self.synced = threading.Event()
        self.relists = 0
        self.listed_at = -math.inf  # no list gone through yet

    def run(self) -> None:
        while self._after is not None and not self._after.wait(0.5):
            if self._stop.is_set():
                return
        version: str | None = None
        failures = 0
        while not self._stop.is_set():
            try:
                if version is None:
                    self.relists += 1
                    version = self._relist()
                    self.synced.set()
                    failures = 0  # the server answered whole: the next outage backs off anew
                for event in self._watch(version):
                    if self._stop.is_set():
                        return
                    obj = event.get("object")
                    version = resource_version(obj) or version
                    if event.get("type") != "BOOKMARK":
                        self._on_event(str(event.get("type")), obj)
                    failures = 0
                failures = 0  # a watch that ran to its timeout: the server is there
            except Gone:
                log.info("%s: watch expired (410 Gone); relisting", self.name)
                version = None
            except ApiError as err:
                failures += 1
                delay = min(30.0, 0.2 * 2 ** min(failures, 8))
                log.warning("%s: watch failed (%s); retrying in %.1fs", self.name, err, delay)
                self._stop.wait(delay)
            except Exception:
                failures += 1
                log.exception("%s: unexpected error in the watch loop", self.name)
                self._stop.wait(min(30.0, 0.2 * 2 ** min(failures, 8)))

    def _relist(self) -> str:
        """One whole list through `on_list`; its version. In a function of its own so that no
        frame of the watch loop keeps the list alive."""
        began = self._monotonic()
        items, version = self._list()
        self._on_list(items)
        self.listed_at = began
        return version
