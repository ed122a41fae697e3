"""py-spiffe's `X509Source` over podcert's files, for the `spiffe` and `spiffe-tls` packages.

py-spiffe offers one X.509 source, `spiffe.X509Source`, and it streams from the SPIFFE Workload
API; a pod with podcert holds files instead. `X509FileSource` is an `X509Source` (a subclass, so
spiffe-tls's `dial`, `listen` and `create_ssl_context`, typed against that class, take it) whose
material comes from a `bundles.TLSSource`: the same complete check before a swap, the same
re-read by content, the same inotify wake-up. Install it with the `spiffe` extra
(`pip install podcert[spiffe]`); `bundles` itself never imports py-spiffe.

spiffe-tls follows rotation by mutating the contexts it made, which pyOpenSSL (>= 26.2) refuses
once a context has made a connection: a listener would present its first leaf for ever. So the
rotation-proof way is a fresh context per swap: `snapshot()` is an `X509Source` frozen at one
swap (spiffe-tls subscribes to it for nothing), and `server_context(options)` is spiffe-tls's own
server context for the newest swap, for `conn.set_context(...)` between `accept()` and the
handshake. docs/stacks/py-spiffe.md shows both patterns and what spiffe-tls cannot do.

Guarantees (tests/unit/test_bundles_pyspiffe.py holds each, with spiffe-tls as the peer):
- `svid` and `bundles` always come from one swap of the TLSSource: never a new key beside an
  old chain, nor a new leaf beside a bundle that lacks its root.
- The SVID is parsed by py-spiffe itself (`X509Svid.parse_raw`), so material py-spiffe would
  refuse from a Workload API is refused here too: the first time with `SvidError` (what py-spiffe
  said, never key bytes), later by keeping the previous material, with the reason in
  `last_error`.
- After each swap py-spiffe took, every callback of `subscribe_for_updates` runs once (swaps
  close together may be told once, after the last), in the thread that refreshed (the
  watcher's, or the caller of `refresh()`); a failing one is logged and does not stop the
  others.
- Only the workload's own trust domain is served (its leaf's), as one `X509Bundle`: spiffe-tls
  loads every bundle into one OpenSSL store and its authorizers see the leaf alone, so a
  federated root would vouch for any ID, our own included. `bundles`' own contexts scope
  federated roots (`TLSSource(federated=...)`).
- `close()` stops the watcher; then every getter raises py-spiffe's `X509SourceError`, as a
  closed `X509Source` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Self

from cryptography.hazmat.primitives import serialization
from OpenSSL import SSL, crypto
from spiffe import SpiffeId, TrustDomain, X509Bundle, X509BundleSet, X509Source, X509Svid
from spiffe.errors import PySpiffeError
from spiffe.workloadapi.errors import X509SourceError
from spiffe.workloadapi.x509_context import X509Context
from spiffetls import ListenOptions, ServerTlsMode, create_ssl_context

from bundles.formats import Credential, TrustBundle
from bundles.source import DEFAULT_INTERVAL, SourceError, StrPath, TLSSource

log = logging.getLogger(__name__)

__all__ = ["SvidError", "X509FileSource", "X509Snapshot"]

_STOP_GRACE: Final = 5.0  # seconds close() waits for the watcher beyond one interval
_MAX_CONTEXTS: Final = 32  # server contexts kept per swap, by (mode, authorize_fn), oldest dropped

Authorize = Callable[[crypto.X509], bool]  # spiffe-tls's authorize_fn


class SvidError(SourceError):
    """py-spiffe does not take the credential as an X509-SVID; the message says why."""


@dataclass(frozen=True)
class _View:
    """What py-spiffe sees of one swap of the TLSSource; replaced as a whole."""

    credential: Credential  # the bundles material it was made from (identity marks the swap)
    svid: X509Svid
    bundle: X509Bundle
    # spiffe-tls server contexts made from this view, by (tls_mode, authorize_fn).
    contexts: dict[tuple[ServerTlsMode, Authorize | None], SSL.Context] = field(
        default_factory=dict, compare=False
    )


class _ViewSource(X509Source):
    """py-spiffe's X509Source answered from a `_View`. X509Source.__init__ is never called (it
    dials the Workload API): every public method of X509Source is overridden here or below, and
    a test pins the list."""

    def _current(self, what: str) -> _View:
        raise NotImplementedError

    @property
    def svid(self) -> X509Svid:
        return self._current("X.509 SVID").svid

    @property
    def bundles(self) -> frozenset[X509Bundle]:
        return frozenset({self._current("X.509 Bundles").bundle})

    def get_bundle_for_trust_domain(self, trust_domain: TrustDomain) -> X509Bundle | None:
        bundle = self._current("X.509 Bundle").bundle
        return bundle if bundle.trust_domain == trust_domain else None

    def get_x509_context(self) -> X509Context:
        view = self._current("X.509 context")
        return X509Context([view.svid], X509BundleSet.of([view.bundle]))

    @property
    def spiffe_id(self) -> SpiffeId:
        return self._current("SPIFFE ID").svid.spiffe_id

    def __enter__(self) -> Self:
        return self


class X509Snapshot(_ViewSource):
    """An X509Source frozen at one swap: what spiffe-tls should build a context from, since a
    context it made cannot be updated. Subscribing to it is a no-op (it never changes); it
    holds no resources, so closing it is one too."""

    def __init__(self, view: _View) -> None:
        self._view = view

    def _current(self, what: str) -> _View:
        return self._view

    def subscribe_for_updates(self, callback: Callable[[], None]) -> None:
        pass

    def unsubscribe_for_updates(self, callback: Callable[[], None]) -> None:
        pass

    def close(self) -> None:
        pass

    def is_closed(self) -> bool:
        return False


class X509FileSource(_ViewSource):
    """A py-spiffe X.509 source whose SVID and bundle are podcert's files, following rotation.

    `source` is the workload's `TLSSource` (share it with `bundles`' own contexts), or use
    `from_files`. With `watch=True` (py-spiffe's sources update themselves) a daemon thread runs
    `source.watch()` until `close()`; with `watch=False` the caller calls `refresh()`.
    Raises `SvidError` if py-spiffe does not take the current credential.
    """

    def __init__(
        self, source: TLSSource, *, watch: bool = True, interval: float = DEFAULT_INTERVAL
    ) -> None:
        if watch and interval <= 0:
            raise ValueError("interval must be positive")
        self._source = source
        self._state_lock = threading.Lock()  # the view and the closed flag
        self._swap_lock = threading.Lock()  # one view made at a time
        self._subscribers_lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self._is_closed = False
        self._refused: Exception | None = None
        self._view = _view_of(*_snapshot(source))
        self._unsubscribe = source.subscribe(self._on_swap)
        self._on_swap(source.credential)  # a swap between the first view and the subscription
        self._watcher = _Watcher(source, interval) if watch else None

    @classmethod
    def from_files(
        cls,
        credential: StrPath | tuple[StrPath, StrPath],
        trust_bundle: StrPath,
        *,
        watch: bool = True,
        interval: float = DEFAULT_INTERVAL,
    ) -> Self:
        """A source over a credential bundle (or a key and chain pair) and a trust bundle file;
        raises `bundles.SourceError` (`SvidError` included) when they hold no usable SVID."""
        return cls(TLSSource(credential, trust_bundle), watch=watch, interval=interval)

    # --- the rest of py-spiffe's X509Source ----------------------------------------------------

    def subscribe_for_updates(self, callback: Callable[[], None]) -> None:
        with self._subscribers_lock:
            self._callbacks.append(callback)

    def unsubscribe_for_updates(self, callback: Callable[[], None]) -> None:
        with self._subscribers_lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    def close(self) -> None:
        with self._state_lock:
            if self._is_closed:
                return
            self._is_closed = True
        self._unsubscribe()
        if self._watcher is not None:
            self._watcher.stop()

    def is_closed(self) -> bool:
        with self._state_lock:
            return self._is_closed

    # --- what spiffe-tls needs to follow rotation ----------------------------------------------

    def snapshot(self) -> X509Snapshot:
        """The current SVID and bundle as an X509Source that never changes: pass it to
        spiffe-tls's `dial` (a new context per dial, so nothing is lost) and `listen` (then
        `server_context` per accepted connection), which then subscribe to nothing."""
        return X509Snapshot(self._current("X.509 snapshot"))

    def server_context(self, options: ListenOptions | None = None) -> SSL.Context:
        """spiffe-tls's server context (`create_ssl_context`, as `listen` makes it) for the
        newest swap: `conn.set_context(source.server_context(options))` after `accept()` moves
        that connection onto the newest SVID and trusted roots. Made once per swap and
        `(tls_mode, authorize_fn)`: pass the same `options` each time.

        The connection keeps the listener's verify mode and `authorize_fn` (OpenSSL copies them
        when it accepts), so listen with the same `options`.
        """
        options = options or ListenOptions()
        view = self._current("server context")
        kind = (options.tls_mode, options.authorize_fn)
        context = view.contexts.get(kind)
        if context is None:
            mutual = options.tls_mode in (ServerTlsMode.MTLS, ServerTlsMode.MTLS_WEB)
            context = create_ssl_context(
                SSL.TLS_SERVER_METHOD,
                X509Snapshot(view),
                options.authorize_fn,
                SSL.VERIFY_PEER | (SSL.VERIFY_FAIL_IF_NO_PEER_CERT if mutual else 0),
                options.tls_mode == ServerTlsMode.MTLS_WEB,
            )
            if len(view.contexts) >= _MAX_CONTEXTS:
                view.contexts.pop(next(iter(view.contexts)))
            view.contexts[kind] = context
        return context

    # --- podcert's additions -------------------------------------------------------------------

    @property
    def source(self) -> TLSSource:
        return self._source

    def refresh(self) -> bool:
        """Re-read the files now (blocking); True when py-spiffe's view changed."""
        before = self._view
        self._source.refresh()
        return self._view is not before

    @property
    def last_error(self) -> Exception | None:
        """Why the newest material is not served: the TLSSource's reason, else py-spiffe's."""
        return self._source.last_error or self._refused

    @property
    def subscriber_count(self) -> int:
        """How many callbacks `subscribe_for_updates` holds (spiffe-tls adds one per context)."""
        with self._subscribers_lock:
            return len(self._callbacks)

    # --- inside --------------------------------------------------------------------------------

    def _current(self, what: str) -> _View:
        with self._state_lock:
            if self._is_closed:
                raise X509SourceError(f"Cannot get {what}: source is closed")
            return self._view

    def _on_swap(self, credential: Credential) -> None:
        """The TLSSource swapped in new material: make py-spiffe's view of it, then tell.

        Views are made one at a time from what is current then, so two refreshing threads
        cannot leave an older view in place; a view of material already served tells no one.
        """
        with self._swap_lock:
            try:
                view = _view_of(*_snapshot(self._source))
            except SvidError as exc:
                log.warning("keeping the previous X509-SVID: %s", exc)
                self._refused = exc
                return
            self._refused = None
            with self._state_lock:
                if self._is_closed or view.credential is self._view.credential:
                    return
                self._view = view
        with self._subscribers_lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("X509FileSource subscriber %r failed", callback)


def _snapshot(source: TLSSource) -> tuple[Credential, TrustBundle]:
    """The credential and trust bundle of one swap: each swap makes a new Credential object, so
    a credential still current after the trust bundle was read is that bundle's."""
    while True:
        credential = source.credential
        trust_bundle = source.trust_bundle
        if source.credential is credential:
            return credential, trust_bundle


def _view_of(credential: Credential, trust_bundle: TrustBundle) -> _View:
    chain = b"".join(c.public_bytes(serialization.Encoding.DER) for c in credential.chain)
    key = credential.key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    try:
        svid = X509Svid.parse_raw(chain, key)
    except PySpiffeError as exc:
        # py-spiffe's messages name certificates and IDs; a key error is named by type alone,
        # and nothing is chained, so no library frame holding the key bytes travels on.
        reason = "the private key was refused" if "PrivateKey" in type(exc).__name__ else exc
        raise SvidError(f"py-spiffe refuses the credential as an X509-SVID: {reason}") from None
    bundle = X509Bundle(svid.spiffe_id.trust_domain, set(trust_bundle.roots))
    return _View(credential, svid, bundle)


class _Watcher:
    """`TLSSource.watch()` on an event loop of its own, in a daemon thread, until `stop()`."""

    def __init__(self, source: TLSSource, interval: float) -> None:
        self._source = source
        self._interval = interval
        self._started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="X509FileSource", daemon=True)
        self._thread.start()
        self._started.wait()

    def _run(self) -> None:
        try:
            asyncio.run(self._watch())
        except Exception:
            log.exception("the X509FileSource watcher stopped; the files are no longer followed")
        finally:
            self._started.set()

    async def _watch(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._started.set()
        await self._source.watch(self._stop, interval=self._interval)

    def stop(self) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            # RuntimeError: the loop closed between the check and the call.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(self._interval + _STOP_GRACE)
