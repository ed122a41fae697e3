"""List, then watch from the last resourceVersion; relist only on 410 Gone. Never polls.

Shared by the signer (PodCertificateRequests, Services, ClusterTrustBundles, its CA Secret) and the
shim (its node's pods and requests). Callbacks get whole objects; consumers key them by name.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

from podcert.rest import JSON, ApiError, Gone

log = logging.getLogger("podcert.reflector")


class Reflector:
    """List, then watch from the last resourceVersion; relist only on 410 Gone. Never polls."""

    def __init__(
        self,
        name: str,
        list_fn: Callable[[], tuple[list[JSON], str]],
        watch_fn: Callable[[str], Iterator[JSON]],
        on_list: Callable[[list[JSON]], None],
        on_event: Callable[[str, JSON], None],
        stop: threading.Event,
    ) -> None:
        self.name = name
        self._list, self._watch = list_fn, watch_fn
        self._on_list, self._on_event = on_list, on_event
        self._stop = stop
        self.synced = threading.Event()
        self.relists = 0

    def run(self) -> None:
        version: str | None = None
        failures = 0
        while not self._stop.is_set():
            try:
                if version is None:
                    items, version = self._list()
                    self.relists += 1
                    self._on_list(items)
                    self.synced.set()
                for event in self._watch(version):
                    if self._stop.is_set():
                        return
                    obj = event.get("object") or {}
                    version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                    if event.get("type") != "BOOKMARK":
                        self._on_event(str(event.get("type")), obj)
                    failures = 0
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
