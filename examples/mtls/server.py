"""The example server: HTTPS with client certificates, answering who the caller is.

    python -m examples.mtls.server --credential-bundle /var/run/identity/credentialbundle.pem \
        --trust-bundle /var/run/identity/trust-bundle.pem \
        --allow-workload 'shop/*' --port 8443

The TLS plumbing is `bundles.aiohttp.ServerTLS`'s. Rotation without a restart: asyncio fixes a
server's `ssl.SSLContext` when it starts listening, so the server listens with the TLSSource's
server context, whose `sni_callback` (called on every ClientHello, with or without SNI) moves the
handshake onto the source's current context — certificate, key and trusted roots alike.
Connections keep the context they were made with; new ones get the new.

Connections made before a rotation are drained, not cut: the next answer on such a connection
carries `Connection: close`, so the client's following request opens a new connection and sees
the new certificate, and no request fails.

Authorization happens inside the TLS handshake (`bundles.handshake`): a client whose chain does
not verify, whose chain ends at a federated trust domain's root while it claims an ID of another
trust domain, or whose SPIFFE ID the rules do not allow never completes it. Its connection is
closed before a byte of its request is read and no handler runs; the server logs one line
saying who was refused and why, and counts it in `refused`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import socket
import ssl
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from bundles.aiohttp import ServerTLS, peer_id
from bundles.authz import Authorizer, Verdict
from bundles.formats import BundleError, load_certificate
from bundles.source import SourceError, TLSSource
from examples.mtls import (
    add_credential_arguments,
    add_peer_arguments,
    authorizer_from,
    credential_paths,
    federated_paths,
    serial_of,
    setup_logging,
    stop_on_signals,
)

log = logging.getLogger("examples.mtls.server")


class IdentityServer:
    """Answers `GET /` with the caller's SPIFFE ID and the serial the server presented."""

    def __init__(self, source: TLSSource, authorizer: Authorizer) -> None:
        self.source = source
        self.authorizer = authorizer
        self.tls = ServerTLS(source, authorizer, on_refusal=self._refuse)
        self.served = 0
        self.refused = 0
        # Client leaf serials in the order first seen: shows clients rotating.
        self.client_serials: Counter[str] = Counter()
        self._runner: web.AppRunner | None = None

    # --- TLS ----------------------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        """The listening context: it refuses unauthorized clients inside the handshake, and
        moves each handshake onto the source's current material."""
        return self.tls.ssl_context()

    def _refuse(self, verdict: Verdict) -> None:
        self.refused += 1
        log.warning("refused client: %s", verdict.reason)

    # --- HTTP ---------------------------------------------------------------------------------

    def app(self) -> web.Application:
        """The handshake authorized the client; the middleware names it to the handlers and
        drains connections made with material since rotated."""
        app = web.Application(middlewares=[self.tls.middleware])
        app.cleanup_ctx.append(self.tls.draining)
        app.router.add_get("/", self._whoami)
        app.router.add_get("/stats", self._stats)
        return app

    async def _whoami(self, request: web.Request) -> web.Response:
        caller = str(peer_id(request))
        ssl_object = _ssl_object(request)
        der = ssl_object.getpeercert(binary_form=True) if ssl_object else None
        caller_serial = _serial_of_peer(der or b"")
        presented = self.source.credential_of(ssl_object.context) if ssl_object else None
        server_serial = serial_of(presented.leaf) if presented else None
        self.served += 1
        if caller_serial not in self.client_serials:
            log.info("first request from %s with certificate serial %s", caller, caller_serial)
        self.client_serials[caller_serial] += 1
        return web.json_response(
            {"caller": caller, "caller_serial": caller_serial, "server_serial": server_serial}
        )

    async def _stats(self, _: web.Request) -> web.Response:
        return web.json_response(self.stats())

    def stats(self) -> dict[str, Any]:
        return {
            "served": self.served,
            "refused": self.refused,
            "client_serials": list(self.client_serials),
            "serial": serial_of(self.source.credential.leaf),
        }

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen; returns the bound port (pick one with port=0). An idle connection, or one
        whose request head is slow to come, is closed after IDLE_TIMEOUT (aiohttp's default
        is an hour); the site bounds the rest."""
        self._runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, keepalive_timeout=IDLE_TIMEOUT
        )
        await self._runner.setup()
        site = _BoundedSite(self._runner, host, port, self.ssl_context())
        await site.start()
        return site.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


# Each connection costs the server memory from its accept (asyncio's TLS buffer, a quarter of a
# megabyte), and anyone who can reach the port can open one; only an authorized client gets
# through the handshake, so the handshakes in flight are what is capped.
MAX_HANDSHAKES = 64
HANDSHAKE_TIMEOUT = 5.0
IDLE_TIMEOUT = 10.0


class _BoundedSite(web.BaseSite):
    """aiohttp's TCPSite with a bound on what the unauthenticated can hold: at most
    MAX_HANDSHAKES connections in their TLS handshake, counted from the TCP accept, each for at
    most HANDSHAKE_TIMEOUT; a new connection beyond that closes the oldest of them."""

    __slots__ = ("_context", "_host", "_port")

    def __init__(self, runner: web.AppRunner, host: str, port: int, ctx: ssl.SSLContext) -> None:
        super().__init__(runner, backlog=1024)
        self._host, self._port, self._context = host, port, ctx

    @property
    def name(self) -> str:
        return f"https://{self._host}:{self._port}"

    @property
    def port(self) -> int:
        return self._port

    async def start(self) -> None:
        await super().start()
        listener = socket.create_server((self._host, self._port), backlog=self._backlog)
        listener.setblocking(False)
        self._port = listener.getsockname()[1]
        assert self._runner.server is not None
        self._server = _Handshakes(listener, self._runner.server, self._context)


class _Handshakes(asyncio.AbstractServer):
    """The accept loop of `_BoundedSite`: each connection's handshake is a task, oldest first."""

    def __init__(
        self, listener: socket.socket, factory: Callable[[], Any], ctx: ssl.SSLContext
    ) -> None:
        self._listener, self._factory, self._context = listener, factory, ctx
        self._loop = asyncio.get_running_loop()
        self._pending: dict[asyncio.Task[None], socket.socket] = {}
        self._handed: set[socket.socket] = set()  # to asyncio, which closes them from then on
        self._accepting = self._loop.create_task(self._accept())

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return (self._listener,)

    async def _accept(self) -> None:
        while True:
            try:
                sock, _ = await self._loop.sock_accept(self._listener)
            except OSError:  # out of descriptors, or a peer gone before the accept
                await asyncio.sleep(0.1)
                continue
            if len(self._pending) >= MAX_HANDSHAKES:
                next(iter(self._pending)).cancel()  # asyncio closes its connection
            task = self._loop.create_task(self._handshake(sock))
            self._pending[task] = sock
            task.add_done_callback(self._done)

    async def _handshake(self, sock: socket.socket) -> None:
        self._handed.add(sock)
        # Refused, timed out, gone or closed to make room: asyncio has closed it.
        with contextlib.suppress(OSError, ssl.SSLError, asyncio.CancelledError):
            await self._loop.connect_accepted_socket(
                self._factory, sock, ssl=self._context, ssl_handshake_timeout=HANDSHAKE_TIMEOUT
            )

    def _done(self, task: asyncio.Task[None]) -> None:
        sock = self._pending.pop(task)
        if sock not in self._handed:  # closed to make room before its handshake began
            sock.close()
        self._handed.discard(sock)

    def close(self) -> None:
        self._accepting.add_done_callback(lambda _: self._listener.close())
        self._accepting.cancel()
        for task in list(self._pending):
            task.cancel()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return not self._accepting.done()

    async def start_serving(self) -> None:
        return None

    async def serve_forever(self) -> None:
        await self._accepting

    async def wait_closed(self) -> None:
        await asyncio.gather(self._accepting, *self._pending, return_exceptions=True)


def _ssl_object(request: web.Request) -> ssl.SSLObject | None:
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport else None
    return ssl_object if isinstance(ssl_object, ssl.SSLObject) else None


def _serial_of_peer(der: bytes) -> str:
    try:
        return serial_of(load_certificate(der))
    except BundleError:  # authorized already, so this is not expected
        return "?"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.mtls.server", description=__doc__)
    add_credential_arguments(parser)
    add_peer_arguments(parser, "allow", "clients")
    parser.add_argument("--host", default="0.0.0.0")  # noqa: S104 - a pod listens on its IP
    parser.add_argument("--port", type=int, default=8443)
    args = parser.parse_args(argv)
    credential = credential_paths(parser, args)
    rules = authorizer_from(parser, args)
    setup_logging(args.log_level)
    try:
        source = TLSSource(credential, args.trust_bundle, federated=federated_paths(parser, args))
        authorizer = rules(source.trust_domain)
    except (SourceError, ValueError) as exc:
        log.error("%s", exc)
        return 1
    return asyncio.run(_serve(IdentityServer(source, authorizer), args))


async def _serve(server: IdentityServer, args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    stop_on_signals(stop)
    watcher = asyncio.create_task(server.source.watch(stop, interval=args.reload_interval))
    port = await server.start(args.host, args.port)
    log.info("serving on %s:%d as %s", args.host, port, server.source.credential.spiffe_id)
    try:
        await stop.wait()
    finally:
        await server.stop()
        await watcher
    json.dump(server.stats(), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
