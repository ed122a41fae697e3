"""A TLSSource kept current without asyncio, and a TLSSource waited for until its files exist.

`TLSSource.watch()` serves asyncio applications. Everything else (Flask, Django, gunicorn
workers, scripts, a uvicorn server whose loop is not ours to add tasks to) starts a `Refresher`:
one daemon thread that calls `source.refresh()` as soon as inotify (watchfiles) reports a change
in the files' folders, and every `interval` seconds regardless, which is what guarantees that
the source converges. Subscribers of the source are called in that thread.

`wait()` is for start-up, when a container may start before the files are written (by the shim,
a sidecar or an init step): it retries until the deadline, then raises `MissingFilesError`
naming the files still missing, or the last `SourceError` if they are there but unusable.

Waits are injected (`Refresher(wake=...)`, `wait(monotonic=..., sleep=...)`), so tests decide
when a re-check happens and need no sleeps.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final

from bundles.source import DEFAULT_INTERVAL, Clock, SourceError, StrPath, TLSSource

log = logging.getLogger(__name__)

__all__ = ["MissingFilesError", "Refresher", "Wake", "wait"]

# Yields once per reason to re-check the files (a change, or a quiet `interval`), until the
# event is set.
Wake = Callable[[threading.Event, float], Iterable[object]]

_DEBOUNCE_MS: Final = 300  # the atomic writer finishes in well under this
_STEP_MS: Final = 50  # how often watchfiles looks at the stop event


class MissingFilesError(SourceError):
    """`wait()` reached its deadline while some files did not exist; `missing` names them."""

    def __init__(self, missing: Sequence[Path], timeout: float) -> None:
        self.missing = tuple(missing)
        listed = ", ".join(str(path) for path in self.missing)
        super().__init__(f"after {timeout:g}s, still missing: {listed}")


class Refresher:
    """Keeps `source` current from a daemon thread until `stop()` (or the end of a `with`).

    `checks` counts the re-checks done, the first one at start included.
    """

    def __init__(
        self, source: TLSSource, *, interval: float = DEFAULT_INTERVAL, wake: Wake | None = None
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self._source = source
        self._interval = interval
        # Parents of the paths as given, not resolved: the resolved directory is the timestamped
        # one the atomic writer deletes on the next rotation.
        directories = tuple(dict.fromkeys(p.absolute().parent for p in source._paths))
        self._wake = wake or _inotify_or_ticks(directories)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.checks = 0

    def start(self) -> Refresher:
        if self._thread is not None:
            raise RuntimeError("a Refresher starts once")
        self._thread = threading.Thread(target=self._run, name="podcert-refresher", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop the thread and wait up to `timeout` seconds (None: as long as it takes)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Refresher:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        self._check()
        for _ in self._wake(self._stop, self._interval):
            if self._stop.is_set():
                break
            self._check()

    def _check(self) -> None:
        try:
            self._source.refresh()  # keeps bad material out itself; raises only from a bug
        except Exception:
            log.exception("refreshing the TLS source failed; trying again later")
        self.checks += 1


def _inotify_or_ticks(directories: Sequence[Path]) -> Wake:
    def wake(stop: threading.Event, interval: float) -> Iterator[object]:
        try:
            from watchfiles import watch  # a base dependency; polling alone also converges
        except ImportError:
            log.info("watchfiles is not installed; polling every %ss", interval)
            yield from _ticks(stop, interval)
            return
        try:
            yield from watch(
                *directories,
                watch_filter=None,
                stop_event=stop,
                rust_timeout=max(1, round(interval * 1000)),
                yield_on_timeout=True,  # an empty set each quiet interval drives the re-check
                debounce=_DEBOUNCE_MS,
                step=_STEP_MS,
                recursive=False,
                raise_interrupt=False,
            )
        except Exception as exc:  # inotify limits, a vanished directory, ...
            log.warning("watching %s failed (%s); polling every %ss", directories, exc, interval)
            yield from _ticks(stop, interval)

    return wake


def _ticks(stop: threading.Event, interval: float) -> Iterator[object]:
    while not stop.wait(interval):
        yield None


def wait(
    credential: StrPath | tuple[StrPath, StrPath],
    trust_bundle: StrPath,
    *,
    timeout: float,
    federated: Mapping[str, StrPath] | None = None,
    clock: Clock | None = None,
    poll: float = 0.2,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> TLSSource:
    """`TLSSource(credential, trust_bundle, federated=..., clock=...)` once it loads, trying
    every `poll` seconds for up to `timeout` seconds.

    Raises MissingFilesError (a SourceError) naming the files that still do not exist at the
    deadline (a dangling symlink counts as missing), or else the last attempt's SourceError.
    """
    if timeout < 0 or poll <= 0:
        raise ValueError("timeout must not be negative and poll must be positive")
    credential_paths = credential if isinstance(credential, tuple) else (credential,)
    paths = [Path(p) for p in (*credential_paths, trust_bundle, *(federated or {}).values())]
    deadline = monotonic() + timeout
    while True:
        try:
            return TLSSource(credential, trust_bundle, federated=federated, clock=clock)
        except SourceError as exc:
            remaining = deadline - monotonic()
            if remaining <= 0:
                missing = [path for path in paths if not path.exists()]
                if missing:
                    raise MissingFilesError(missing, timeout) from exc
                raise
        sleep(min(poll, remaining))
