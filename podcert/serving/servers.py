"""An aiohttp application served within `podcert.serving.connections.Limits` (the admission webhook,
the SPIFFE bundle endpoint): what aiohttp's own TCPSite does not bound.

- Connections are counted from the TCP accept, before the TLS handshake (asyncio gives each TLS
  connection a quarter-megabyte buffer as it is accepted): at most `max_connections` are held;
  a new one to a full port closes the one idle the longest, in its handshake or not, or is
  closed itself when every held connection is serving a request (`podcert.serving.connections`).
- A handshake not done within `handshake_timeout` is aborted (asyncio's default is a minute).
- A connection's request head must arrive within `idle_timeout` of the handshake or of the
  answer before it: aiohttp's keep-alive timer, which `runner` sets to that (its default is an
  hour), closes it otherwise; a request's body is the handler's to bound.

Import this only where a server starts: it loads aiohttp and asyncio.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiohttp import web

from podcert.serving.connections import Limits, Table

log = logging.getLogger("podcert.servers")

# Accept errors that mean "out of descriptors or memory right now": wait a little, go on.
_RESOURCES: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_RESOURCE_PAUSE: Final = 0.1

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _Connection:
    """One accepted socket: its handshake task until the handshake is done, its transport after."""

    __slots__ = ("handed", "sock", "task", "transport")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.task: asyncio.Task[None] | None = None
        self.handed = False  # to asyncio, which closes the socket from then on
        self.transport: asyncio.Transport | None = None

    def close_now(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        elif self.task is not None:
            self.task.cancel()  # the handshake's transport is closed on the way out
        else:
            self.sock.close()


class Held:
    """The connections one port holds, and the middleware that tells which are serving."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.table: Table[_Connection] = Table(limits)
        self._by_transport: dict[asyncio.BaseTransport, _Connection] = {}

    def __len__(self) -> int:
        return len(self.table)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        connection = self._by_transport.get(request.transport)  # type: ignore[arg-type]
        if connection is not None and not self.table.busy(connection):
            raise web.HTTPServiceUnavailable(headers={"Connection": "close"})  # closed meanwhile
        try:
            return await handler(request)
        finally:
            if connection is not None:
                self.table.idle(connection, asyncio.get_running_loop().time())

    def made(self, connection: _Connection, transport: asyncio.Transport) -> None:
        connection.transport = transport
        self._by_transport[transport] = connection

    def lost(self, connection: _Connection) -> None:
        self.table.remove(connection)
        if connection.transport is not None:
            self._by_transport.pop(connection.transport, None)


class _Tracked(asyncio.Protocol):
    """aiohttp's protocol for one connection, telling `Held` when it is made and lost."""

    def __init__(self, inner: asyncio.Protocol, held: Held, connection: _Connection) -> None:
        self.inner, self.held, self.connection = inner, held, connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.held.made(self.connection, transport)  # type: ignore[arg-type]
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.held.lost(self.connection)
        self.inner.connection_lost(exc)


class _Listener(asyncio.AbstractServer):
    """A listening socket with its own accept loop, admitting through `Held`."""

    def __init__(
        self,
        sock: socket.socket,
        factory: Callable[[], asyncio.Protocol],
        ssl_context: ssl.SSLContext | None,
        held: Held,
    ) -> None:
        self._sock, self._factory, self._ssl, self.held = sock, factory, ssl_context, held
        self._loop = asyncio.get_running_loop()
        self._accepting = self._loop.create_task(self._accept())
        self._handshakes: set[asyncio.Task[None]] = set()

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return () if self._sock.fileno() < 0 else (self._sock,)

    async def _accept(self) -> None:
        while True:
            try:
                sock, _ = await self._loop.sock_accept(self._sock)
            except OSError as err:
                if err.errno in _RESOURCES:
                    log.warning("cannot accept a connection now: %s", err.strerror)
                    await asyncio.sleep(_RESOURCE_PAUSE)
                continue  # a peer that gave up before the accept
            self._admit(_Connection(sock))
            await asyncio.sleep(0)  # let closes and handshakes run between accepts

    def _admit(self, connection: _Connection) -> None:
        admission = self.held.table.admit(connection, self._loop.time())
        if admission.evicted is not None:
            admission.evicted.close_now()
        if not admission.admitted:
            connection.sock.close()
            return
        task = self._loop.create_task(self._handshake(connection))
        connection.task = task
        self._handshakes.add(task)
        task.add_done_callback(lambda done: self._handshaken(connection, done))

    async def _handshake(self, connection: _Connection) -> None:
        held = self.held
        connection.handed = True
        try:
            await self._loop.connect_accepted_socket(
                lambda: _Tracked(self._factory(), held, connection),
                connection.sock,
                ssl=self._ssl,
                ssl_handshake_timeout=held.limits.handshake_timeout if self._ssl else None,
            )
        except (OSError, ssl.SSLError, asyncio.CancelledError):
            # Timed out, failed, or closed to make room: asyncio closed it, nothing was served.
            held.lost(connection)

    def _handshaken(self, connection: _Connection, task: asyncio.Task[None]) -> None:
        self._handshakes.discard(task)
        connection.task = None
        if not connection.handed:  # closed to make room before its handshake began
            self.held.lost(connection)
            connection.sock.close()

    def close(self) -> None:
        # The socket closes once the accept loop has let go of it (asyncio forgets its
        # descriptor first, so no later socket's descriptor is mistaken for it).
        self._accepting.add_done_callback(lambda _: self._sock.close())
        self._accepting.cancel()
        for task in list(self._handshakes):
            task.cancel()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return not self._accepting.done()

    async def start_serving(self) -> None:
        return None  # serving since it was made

    async def serve_forever(self) -> None:
        await self._accepting

    async def wait_closed(self) -> None:
        await asyncio.gather(self._accepting, *self._handshakes, return_exceptions=True)


class BoundedSite(web.BaseSite):
    """Like aiohttp's TCPSite, within `held.limits`; `port` is the bound one once started."""

    __slots__ = ("_held", "_host", "_port")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        held: Held,
        *,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 1024,
    ) -> None:
        super().__init__(runner, ssl_context=ssl_context, backlog=backlog)
        self._host, self._port, self._held = host, port, held

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        return f"{scheme}://{self._host}:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    async def start(self) -> None:
        await super().start()
        family, _, _, _, address = socket.getaddrinfo(
            self._host, self._port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.create_server(address, family=family, backlog=self._backlog)
        sock.setblocking(False)
        server = self._runner.server
        assert server is not None  # the BaseSite checked the runner was set up
        self._server = _Listener(sock, server, self._ssl_context, self._held)
        self._port = int(sock.getsockname()[1])


def runner(app: web.Application, held: Held, **kwargs: Any) -> web.AppRunner:
    """An AppRunner for `app` (not yet frozen) whose idle connections close on time."""
    app.middlewares.append(held.middleware)
    return web.AppRunner(app, access_log=None, keepalive_timeout=held.limits.idle_timeout, **kwargs)


async def start(
    app: web.Application,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None,
    limits: Limits,
) -> tuple[web.AppRunner, int]:
    """Serve `app` on (host, port) within `limits`: the runner (to clean up) and the bound port.
    When this returns the port accepts connections."""
    held = Held(limits)
    app_runner = runner(app, held, handle_signals=False)
    await app_runner.setup()
    site = BoundedSite(app_runner, host, port, held, ssl_context=ssl_context)
    await site.start()
    return app_runner, site.port
