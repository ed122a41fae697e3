"""aiohttp with pod certificates (`pip install podcert[aiohttp]`; import it explicitly).

Server, `ServerTLS(source, authorizer)`:
- `ssl_context()`: listen with it once (`web.TCPSite(..., ssl_context=)`, `web.run_app(...,
  ssl_context=)`). Its `sni_callback` moves every handshake onto the source's newest material
  (certificate, key, trusted roots), and it refuses a client `authorizer` does not allow inside
  the handshake: aiohttp reads no byte of its request, no middleware or handler runs.
- `probe_ssl_context()`: for a second port that kubelet HTTPS probes reach. A client presenting
  a certificate is judged as above; one presenting none gets through, and the middleware answers
  it only on `probe_paths` (403 elsewhere, before the handler runs).
- `middleware`: puts the client's SPIFFE ID where handlers read it (`peer_id(request)`, or
  `request[SPIFFE_ID]`; None for an anonymous probe caller) and judges it again, so that a site
  listening with a context of its own still answers no client `authorizer` refuses (403, no
  handler runs; but that request was read). It drains: an answer on a connection made with
  material since rotated carries `Connection: close`, so the client's next request opens a
  connection with the new material.
- `draining` (for `app.cleanup_ctx`): `grace` seconds after a rotation, connections the
  middleware saw that still hold older material and are idle are closed (aiohttp's public
  `RequestHandler.force_close()`); one answering a request then closes after its answer, which
  carries `Connection: close`. Connections that never sent a request end at aiohttp's
  keep-alive timeout instead.

Client, `AuthorizingSession(source, authorizer)`: an `aiohttp.ClientSession` whose every
request passes the source's current client context as `ssl=`, aiohttp's public per-request
option, so each new connection judges the server inside the handshake, before a byte of the
request is written, and uses the newest material (aiohttp keys its pool by the context).
aiohttp offers no public way to give a session or connector a context that changes, which is
why requests go through this wrapper; an `ssl=` of the caller's is refused.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import aiohttp
from aiohttp import web

from bundles.authz import Authorizer, Verdict
from bundles.formats import BundleError, load_certificate
from bundles.handshake import RefusalHook, verified_chain
from bundles.source import TLSSource
from bundles.spiffe import CertificateIdError, SpiffeId, spiffe_id_of

if TYPE_CHECKING:
    from aiohttp.client import _RequestContextManager
    from aiohttp.web import RequestHandler

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_GRACE", "SPIFFE_ID", "AuthorizingSession", "ServerTLS", "peer_id"]

DEFAULT_GRACE: Final = 30.0  # seconds a pre-rotation connection may live on after a rotation

# Where the middleware leaves the client's SpiffeId (None: no certificate, a probe caller).
# aiohttp 3.14 warns on string keys and offers typed ones.
SPIFFE_ID: Any = (
    web.RequestKey("spiffe_id", SpiffeId) if hasattr(web, "RequestKey") else "spiffe_id"
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def peer_id(request: web.Request) -> SpiffeId | None:
    """The client's SPIFFE ID as `ServerTLS.middleware` found it; None for an anonymous probe
    caller. KeyError when the middleware did not run for this request."""
    peer: SpiffeId | None = request[SPIFFE_ID]
    return peer


class ServerTLS:
    """The TLS half of an aiohttp server on a TLSSource; see the module docstring."""

    def __init__(
        self,
        source: TLSSource,
        authorizer: Authorizer,
        *,
        on_refusal: RefusalHook | None = None,
        probe_paths: Iterable[str] = (),
        grace: float = DEFAULT_GRACE,
    ) -> None:
        if grace < 0:
            raise ValueError("grace must not be negative")
        self.source = source
        self.authorizer = authorizer
        self.probe_paths = frozenset(probe_paths)
        self.grace = grace
        self._on_refusal = on_refusal
        # Connections the middleware saw -> their requests in flight, for the drain.
        # RequestHandler takes no weak references: closed ones are dropped whenever the table
        # has doubled.
        self._seen: dict[RequestHandler, int] = {}
        self._pruned_at = 0

    def ssl_context(self) -> ssl.SSLContext:
        return self.source.server_context(self.authorizer, on_refusal=self._on_refusal)

    def probe_ssl_context(self) -> ssl.SSLContext:
        return self.source.server_context(
            self.authorizer, on_refusal=self._on_refusal, client_certificate="optional"
        )

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        ssl_object = _ssl_object(request)
        if ssl_object is None or not verified_chain(ssl_object):
            # No certificate: a probe port's anonymous caller, or a server without TLS.
            if request.path not in self.probe_paths:
                log.warning("refused a request without a client certificate: %s", request.path)
                raise web.HTTPForbidden(text="a client certificate is required\n")
            request[SPIFFE_ID] = None
            return await handler(request)
        verdict = self.source.authorize(ssl_object, self.authorizer)
        if not verdict:
            self._refused(verdict)
            raise web.HTTPForbidden(text="this client is not allowed\n")
        request[SPIFFE_ID] = _leaf_id(ssl_object)
        connection = request.protocol
        self._enter(connection)
        try:
            response = await handler(request)
        finally:
            self._leave(connection)
        if self._stale(ssl_object):
            response.force_close()  # the client reconnects, and meets the new material
        return response

    async def draining(self, app: web.Application) -> AsyncIterator[None]:
        """For `app.cleanup_ctx`: closes pre-rotation connections `grace` seconds after each
        rotation, for as long as the app runs."""
        loop = asyncio.get_running_loop()
        timers: list[asyncio.TimerHandle] = []

        def close(stale: list[RequestHandler]) -> None:
            for handler in stale:
                # One answering a request now closes after it: the middleware marks the answer.
                if handler.transport is not None and not self._seen.get(handler):
                    handler.force_close()

        def schedule() -> None:
            # The connections older than this rotation; those made after it are not touched.
            self._prune()
            stale = [h for h in self._seen if self._stale(_ssl_object_of(h.transport))]
            timers[:] = [t for t in timers if not t.cancelled() and t.when() > loop.time()]
            timers.append(loop.call_later(self.grace, close, stale))

        def rotated(_: object) -> None:
            # Subscribers run in the thread that swapped (a Refresher's, or the loop's).
            loop.call_soon_threadsafe(schedule)

        unsubscribe = self.source.subscribe(rotated)
        try:
            yield
        finally:
            unsubscribe()
            for timer in timers:
                timer.cancel()

    def _enter(self, handler: RequestHandler) -> None:
        if len(self._seen) > 2 * self._pruned_at + 64:
            self._prune()
        self._seen[handler] = self._seen.get(handler, 0) + 1

    def _leave(self, handler: RequestHandler) -> None:
        if self._seen.get(handler):
            self._seen[handler] -= 1

    def _prune(self) -> None:
        self._seen = {h: n for h, n in self._seen.items() if h.transport is not None}
        self._pruned_at = len(self._seen)

    def _stale(self, ssl_object: ssl.SSLObject | None) -> bool:
        """Made with material the source has since replaced (a context not from the source
        never rotates, so closing its connections would gain nothing)."""
        presented = self.source.credential_of(ssl_object.context) if ssl_object else None
        return presented is not None and presented is not self.source.credential

    def _refused(self, verdict: Verdict) -> None:
        log.warning("refused client: %s", verdict.reason)
        if self._on_refusal is not None:
            try:
                self._on_refusal(verdict)
            except Exception:
                log.exception("refusal hook %r failed", self._on_refusal)


class AuthorizingSession:
    """An `aiohttp.ClientSession` (made on `async with`, with `session_options`) whose requests
    judge the server inside each new connection's handshake; see the module docstring.

    `check_hostname=True` also requires the server's certificate to name the host in the URL.
    """

    def __init__(
        self,
        source: TLSSource,
        authorizer: Authorizer,
        *,
        on_refusal: RefusalHook | None = None,
        check_hostname: bool = False,
        **session_options: Any,
    ) -> None:
        self.source = source
        self.authorizer = authorizer
        self._on_refusal = on_refusal
        self._check_hostname = check_hostname
        self._options = session_options
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The session underneath, for what does not make a request (cookies, closing)."""
        if self._session is None:
            raise RuntimeError("use `async with AuthorizingSession(...)`")
        return self._session

    async def __aenter__(self) -> AuthorizingSession:
        self._session = aiohttp.ClientSession(**self._options)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def ssl_context(self) -> ssl.SSLContext:
        return self.source.client_context(
            self.authorizer, on_refusal=self._on_refusal, check_hostname=self._check_hostname
        )

    def request(self, method: str, url: str, **options: Any) -> _RequestContextManager:
        """`ClientSession.request`, on a connection that judged the server in its handshake."""
        if "ssl" in options or "verify_ssl" in options or "ssl_context" in options:
            raise TypeError("AuthorizingSession chooses the TLS context; do not pass ssl=")
        return self.session.request(method, url, ssl=self.ssl_context(), **options)

    def get(self, url: str, **options: Any) -> _RequestContextManager:
        return self.request("GET", url, **options)

    def post(self, url: str, **options: Any) -> _RequestContextManager:
        return self.request("POST", url, **options)

    def put(self, url: str, **options: Any) -> _RequestContextManager:
        return self.request("PUT", url, **options)

    def delete(self, url: str, **options: Any) -> _RequestContextManager:
        return self.request("DELETE", url, **options)


def _ssl_object(request: web.Request) -> ssl.SSLObject | None:
    return _ssl_object_of(request.transport)


def _ssl_object_of(transport: asyncio.BaseTransport | None) -> ssl.SSLObject | None:
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    return ssl_object if isinstance(ssl_object, ssl.SSLObject) else None


def _leaf_id(ssl_object: ssl.SSLObject) -> SpiffeId | None:
    der = ssl_object.getpeercert(binary_form=True)
    try:
        return spiffe_id_of(load_certificate(der or b""))
    except (BundleError, CertificateIdError):  # authorized, so it has one; never crash on it
        return None
