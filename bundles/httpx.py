"""httpx transports that authorize the server inside the TLS handshake and follow rotation.

`AuthorizingTransport` (sync) and `AsyncAuthorizingTransport` hand every request to an
`httpx.HTTPTransport` / `AsyncHTTPTransport` built with the source's current authorizing client
context (`TLSSource.client_context`): the handshake of each new connection ends only for a
server whose chain and SPIFFE ID the authorizer allows (`bundles.handshake`), so a refused
server never reads a byte of the request, headers and bearer tokens included.

Guarantees (tests/unit/test_bundles_httpx.py holds each, against real httpx):
- Rotation is followed per request: once the source has swapped material (`refresh()` or
  `watch()`), the next request goes through a new connection pool made with the new context.
  The previous pool finishes the responses it is streaming and is then closed, keep-alive
  connections included, so no request leaves on a connection made before the rotation was seen
  (after a CA rotation, none on a connection whose server a removed root vouched for).
- Only `https://` URLs are sent: a plain `http://` URL is refused before anything is written.
- The transport never takes `verify` or `cert`: trust and the client certificate come from the
  source alone. Each transport judges with a context of its own (httpcore sets ALPN on the
  context it is given), so other clients sharing the source cannot change it.
- Hostnames are not checked: a pod certificate names a workload, not a host. httpx checks them
  only through the context, which has them off.

`client()` and `async_client()` build an `httpx.Client` / `AsyncClient` around them with
`trust_env=False`: httpx would otherwise route URLs an environment proxy variable covers through
a transport of its own, with its default trust and no SPIFFE check.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import httpx

from bundles.authz import Authorizer, Verdict
from bundles.handshake import RefusalHook
from bundles.source import TLSSource

__all__ = ["AsyncAuthorizingTransport", "AuthorizingTransport", "async_client", "client"]

# What the transports and clients set themselves: a caller's value would bypass or change them.
_TRANSPORT_OWNS: Final = ("verify", "cert")
_CLIENT_OWNS: Final = ("verify", "cert", "transport", "mounts", "proxy", "trust_env")

T = TypeVar("T")  # httpx.HTTPTransport or httpx.AsyncHTTPTransport


def _own_kind(on_refusal: RefusalHook | None) -> RefusalHook:
    """A hook object of this transport's own: `TLSSource` caches one context per (authorizer,
    hook), so the transport's context is shared with no other client."""

    def hook(verdict: Verdict) -> None:
        if on_refusal is not None:
            on_refusal(verdict)

    return hook


def _refuse_options(options: dict[str, Any], owned: tuple[str, ...], what: str) -> None:
    for name in owned:
        if name in options:
            raise TypeError(
                f"{what} does not take {name!r}: trust, the client certificate and the "
                "connection path come from the TLSSource"
            )


def _require_https(request: httpx.Request) -> None:
    if request.url.scheme != "https":
        raise httpx.UnsupportedProtocol(
            f"refusing {request.url.scheme}://{request.url.host}: an authorizing transport "
            "sends requests over TLS only",
            request=request,
        )


@dataclass(eq=False)
class _Generation(Generic[T]):
    """One pool: the context it connects with, and the responses it is still streaming."""

    context: ssl.SSLContext
    transport: T
    in_flight: int = 0
    retired: bool = False


class _Generations(Generic[T]):
    """The pool for the source's current context, and the ones a rotation retired, each closed
    once the last response it streams is closed. Thread-safe."""

    def __init__(
        self,
        source: TLSSource,
        authorizer: Authorizer,
        on_refusal: RefusalHook | None,
        make: Callable[[ssl.SSLContext], T],
    ) -> None:
        self._source = source
        self._authorizer = authorizer
        self._hook = _own_kind(on_refusal)
        self._make: Callable[[ssl.SSLContext], T] = make
        self._lock = threading.Lock()
        self._current: _Generation[T] | None = None
        self._retired: list[_Generation[T]] = []

    def enter(self) -> tuple[_Generation[T], T | None]:
        """The generation to send on (counted in flight), and a retired pool to close now."""
        context = self._source.client_context(self._authorizer, on_refusal=self._hook)
        idle: T | None = None
        with self._lock:
            current = self._current
            if current is None or current.context is not context:
                if current is not None:
                    current.retired = True
                    if current.in_flight == 0:
                        idle = current.transport
                    else:
                        self._retired.append(current)
                current = self._current = _Generation(context, self._make(context))
            current.in_flight += 1
        return current, idle

    def leave(self, generation: _Generation[T]) -> T | None:
        """Count a response closed; the generation's pool if it is retired and now idle."""
        with self._lock:
            generation.in_flight -= 1
            if generation.retired and generation.in_flight == 0:
                if generation in self._retired:
                    self._retired.remove(generation)
                return generation.transport
        return None

    def drop_all(self) -> list[T]:
        with self._lock:
            everything = [*self._retired, *([self._current] if self._current else [])]
            self._retired, self._current = [], None
        return [generation.transport for generation in everything]


class _ClosingStream(httpx.SyncByteStream):
    def __init__(self, stream: httpx.SyncByteStream, done: Callable[[], None]) -> None:
        self._stream = stream
        self._done: Callable[[], None] | None = done

    def __iter__(self) -> Iterator[bytes]:
        yield from self._stream

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            done, self._done = self._done, None
            if done is not None:
                done()


class _AsyncClosingStream(httpx.AsyncByteStream):
    def __init__(self, stream: httpx.AsyncByteStream, done: Callable[[], Awaitable[None]]) -> None:
        self._stream = stream
        self._done: Callable[[], Awaitable[None]] | None = done

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            done, self._done = self._done, None
            if done is not None:
                await done()


class AuthorizingTransport(httpx.BaseTransport):
    """A sync httpx transport whose connections end their handshake only for a server
    `authorizer` allows, made with `source`'s current material.

    `options` go to each `httpx.HTTPTransport` (`http2`, `limits`, `retries`, `proxy`, ...);
    `on_refusal(verdict)` hears of each refused server.
    """

    def __init__(
        self,
        source: TLSSource,
        authorizer: Authorizer,
        *,
        on_refusal: RefusalHook | None = None,
        **options: Any,
    ) -> None:
        _refuse_options(options, _TRANSPORT_OWNS, "AuthorizingTransport")
        self._generations: _Generations[httpx.HTTPTransport] = _Generations(
            source, authorizer, on_refusal, lambda context: httpx.HTTPTransport(context, **options)
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        _require_https(request)
        generation, idle = self._generations.enter()
        if idle is not None:
            idle.close()
        try:
            response = generation.transport.handle_request(request)
        except BaseException:
            self._leave(generation)
            raise
        assert isinstance(response.stream, httpx.SyncByteStream)
        response.stream = _ClosingStream(response.stream, lambda: self._leave(generation))
        return response

    def _leave(self, generation: _Generation[httpx.HTTPTransport]) -> None:
        idle = self._generations.leave(generation)
        if idle is not None:
            idle.close()

    def close(self) -> None:
        for transport in self._generations.drop_all():
            transport.close()


class AsyncAuthorizingTransport(httpx.AsyncBaseTransport):
    """`AuthorizingTransport` for `httpx.AsyncClient`: the same guarantees, per request."""

    def __init__(
        self,
        source: TLSSource,
        authorizer: Authorizer,
        *,
        on_refusal: RefusalHook | None = None,
        **options: Any,
    ) -> None:
        _refuse_options(options, _TRANSPORT_OWNS, "AsyncAuthorizingTransport")
        self._generations: _Generations[httpx.AsyncHTTPTransport] = _Generations(
            source,
            authorizer,
            on_refusal,
            lambda context: httpx.AsyncHTTPTransport(context, **options),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        _require_https(request)
        generation, idle = self._generations.enter()
        if idle is not None:
            await idle.aclose()
        try:
            response = await generation.transport.handle_async_request(request)
        except BaseException:
            await self._leave(generation)
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _AsyncClosingStream(response.stream, lambda: self._leave(generation))
        return response

    async def _leave(self, generation: _Generation[httpx.AsyncHTTPTransport]) -> None:
        idle = self._generations.leave(generation)
        if idle is not None:
            await idle.aclose()

    async def aclose(self) -> None:
        for transport in self._generations.drop_all():
            await transport.aclose()


def client(
    source: TLSSource,
    authorizer: Authorizer,
    *,
    on_refusal: RefusalHook | None = None,
    transport_options: dict[str, Any] | None = None,
    **client_options: Any,
) -> httpx.Client:
    """An `httpx.Client` that sends every request through an `AuthorizingTransport`.

    `client_options` go to `httpx.Client` (`timeout`, `headers`, `base_url`, ...); a proxy goes
    in `transport_options` (`{"proxy": ...}`), where the transport authorizes the server through
    the tunnel too.
    """
    _refuse_options(client_options, _CLIENT_OWNS, "bundles.httpx.client()")
    transport = AuthorizingTransport(
        source, authorizer, on_refusal=on_refusal, **(transport_options or {})
    )
    return httpx.Client(transport=transport, trust_env=False, **client_options)


def async_client(
    source: TLSSource,
    authorizer: Authorizer,
    *,
    on_refusal: RefusalHook | None = None,
    transport_options: dict[str, Any] | None = None,
    **client_options: Any,
) -> httpx.AsyncClient:
    """`client()` for asyncio: an `httpx.AsyncClient` over an `AsyncAuthorizingTransport`."""
    _refuse_options(client_options, _CLIENT_OWNS, "bundles.httpx.async_client()")
    transport = AsyncAuthorizingTransport(
        source, authorizer, on_refusal=on_refusal, **(transport_options or {})
    )
    return httpx.AsyncClient(transport=transport, trust_env=False, **client_options)
