"""podcert.serving.servers: an aiohttp application served within `Limits`, on loopback. The port
holds at most its cap of connections, counted from the TCP accept, so one still in its TLS
handshake counts, and is the first closed to make room; a new connection to a port whose every
connection is answering is closed at once; a handshake that does not finish in time is aborted;
and what was held is let go as each connection closes. (Which connection goes is the pure rule of
test_connections.py; the bound under a real signer, tests/integration/test_served_ports.py.)"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import trustme
from aiohttp import web

from podcert.serving import servers
from podcert.serving.connections import Limits

DEADLINE = 5.0
T = TypeVar("T")


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(scenario(), DEADLINE * 2)

    return asyncio.run(bounded())


@asynccontextmanager
async def serving(
    app: web.Application, limits: Limits, context: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[servers.Held, int]]:
    """`app` served as `servers.start` serves it, with the connections it holds to look at."""
    held = servers.Held(limits)
    runner = servers.runner(app, held, handle_signals=False)
    await runner.setup()
    site = servers.BoundedSite(runner, "127.0.0.1", 0, held, ssl_context=context)
    await site.start()
    try:
        yield held, site.port
    finally:
        await runner.cleanup()


async def holding(held: servers.Held, count: int) -> None:
    """Until the port holds `count` connections. `Held` signals nothing to wait on, so this looks
    again at each turn of the loop (an accept, a handshake, a close is one)."""
    while len(held) != count:  # noqa: ASYNC110
        await asyncio.sleep(0)


async def connect(
    port: int, held: servers.Held, count: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A plain TCP connection, once the port holds `count` connections with it."""
    streams = await asyncio.open_connection("127.0.0.1", port)
    await asyncio.wait_for(holding(held, count), DEADLINE)
    return streams


async def closed(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed the connection: a read ends with nothing."""
    try:
        return await asyncio.wait_for(reader.read(1), DEADLINE) == b""
    except ConnectionResetError:
        return True


async def ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str = "/") -> bytes:
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    return await asyncio.wait_for(reader.read(), DEADLINE)


def hello() -> web.Application:
    app = web.Application()

    async def handle(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    app.router.add_get("/", handle)
    return app


def test_the_app_is_served_and_a_closed_connection_is_let_go() -> None:
    async def scenario() -> tuple[bytes, int]:
        async with serving(hello(), Limits(max_connections=4)) as (held, port):
            reader, writer = await connect(port, held, 1)
            answer = await ask(reader, writer)
            writer.close()
            await asyncio.wait_for(holding(held, 0), DEADLINE)
            return answer, len(held)

    answer, left = run(scenario)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello")
    assert left == 0


def test_a_new_connection_to_a_full_port_closes_the_one_idle_the_longest() -> None:
    async def scenario() -> tuple[bool, bytes]:
        async with serving(hello(), Limits(max_connections=2)) as (held, port):
            oldest, _ = await connect(port, held, 1)
            _, older = await connect(port, held, 2)
            newest = await connect(port, held, 2)
            gone = await closed(oldest)
            answer = await ask(*newest)
            older.close()
            return gone, answer

    gone, answer = run(scenario)
    assert gone
    assert answer.startswith(b"HTTP/1.1 200"), "the newcomer is answered"


def test_a_new_connection_is_closed_when_every_held_one_is_answering() -> None:
    async def scenario() -> tuple[bool, list[bytes]]:
        entered = asyncio.Semaphore(0)
        release = asyncio.Event()
        app = web.Application()

        async def slow(request: web.Request) -> web.Response:
            entered.release()
            await release.wait()
            return web.Response(text="slow")

        app.router.add_get("/", slow)
        async with serving(app, Limits(max_connections=2)) as (held, port):
            first = await connect(port, held, 1)
            second = await connect(port, held, 2)
            answers = [asyncio.create_task(ask(*streams)) for streams in (first, second)]
            for _ in answers:
                await asyncio.wait_for(entered.acquire(), DEADLINE)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            refused = await closed(reader)
            writer.close()
            release.set()
            return refused, list(await asyncio.gather(*answers))

    refused, answers = run(scenario)
    assert refused, "nothing answering may be closed to make room"
    assert all(a.startswith(b"HTTP/1.1 200") and a.endswith(b"slow") for a in answers)


def tls() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context and a client context that trusts it."""
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client


def test_a_connection_in_its_handshake_counts_and_is_closed_to_make_room() -> None:
    server_context, client_context = tls()

    async def scenario() -> tuple[bool, bytes]:
        async with serving(hello(), Limits(max_connections=1), server_context) as (held, port):
            silent, _ = await connect(port, held, 1)  # never says hello
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_context, server_hostname="127.0.0.1"
            )
            gone = await closed(silent)
            return gone, await ask(reader, writer)

    gone, answer = run(scenario)
    assert gone
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello")


def test_a_handshake_not_done_in_time_is_aborted() -> None:
    server_context, _ = tls()
    limits = Limits(max_connections=4, handshake_timeout=0.2)

    async def scenario() -> tuple[bool, int]:
        async with serving(hello(), limits, server_context) as (held, port):
            silent, _ = await connect(port, held, 1)
            gone = await closed(silent)
            await asyncio.wait_for(holding(held, 0), DEADLINE)
            return gone, len(held)

    gone, left = run(scenario)
    assert gone and left == 0
