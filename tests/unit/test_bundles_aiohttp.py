"""bundles.aiohttp against the real aiohttp: the server judges clients inside the handshake,
names them to handlers, answers probes, drains pre-rotation connections; the client judges
servers before a byte of the request; both follow leaf and CA rotations with no failed request.

The server side records every request aiohttp parsed (an outermost middleware) and every one a
handler ran for; the client side talks to `tests.recording_peer.RecordingServer`, which records
every byte it read. Waits are conditions with deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from bundles.aiohttp import SPIFFE_ID, AuthorizingSession, ServerTLS, peer_id
from bundles.authz import Verdict, allow_ids
from bundles.source import TLSSource
from tests.recording_peer import (
    DEADLINE,
    TOKEN,
    RecordingServer,
    Workload,
    answered,
    call,
    client_context_of,
    der,
    follows,
)
from tests.unit.test_bundles_formats import Authority

LOCAL = "cluster.local"
API = f"spiffe://{LOCAL}/ns/shop/sa/api"
WEB = f"spiffe://{LOCAL}/ns/shop/sa/web"
OTHER = f"spiffe://{LOCAL}/ns/shop/sa/other"
ALLOW_API = allow_ids([API])
ALLOW_WEB = allow_ids([WEB])

GRACE = 2.0  # long enough for the steps a drain test takes before it expires

pytestmark = pytest.mark.timeout(90)


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {DEADLINE}s waiting for {what}")
        await asyncio.sleep(0.02)


@pytest.fixture(scope="module")
def ca1() -> Authority:
    return Authority("aiohttp root 1")


@pytest.fixture(scope="module")
def ca2() -> Authority:
    return Authority("aiohttp root 2")


@pytest.fixture
def api(tmp_path: Path, ca1: Authority) -> Workload:
    return Workload(tmp_path / "api", API, ca1)


@pytest.fixture
def web_pod(tmp_path: Path, ca1: Authority) -> Workload:
    return Workload(tmp_path / "web", WEB, ca1)


# --- a server on ServerTLS that records what reached it ----------------------------------------


@dataclass
class Served:
    tls: ServerTLS
    port: int = 0
    probe_port: int = 0
    parsed: list[str] = field(default_factory=list)  # every request aiohttp read (paths)
    handled: list[tuple[str, str | None, str | None]] = field(default_factory=list)
    refusals: list[Verdict] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)  # lets /slow answer

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/"

    async def slow(self, request: web.Request) -> web.Response:
        await self.release.wait()
        return await self.handle(request)

    async def handle(self, request: web.Request) -> web.Response:
        ssl_object = request.transport.get_extra_info("ssl_object") if request.transport else None
        presented = self.tls.source.credential_of(ssl_object.context) if ssl_object else None
        peer = peer_id(request)
        assert request[SPIFFE_ID] == peer
        self.handled.append((request.path, request.headers.get("Authorization"), str(peer)))
        return web.json_response(
            {
                "caller": str(peer) if peer else None,
                "client_leaf": (ssl_object.getpeercert(binary_form=True) or b"").hex()
                if ssl_object
                else None,
                "server_serial": presented.leaf.serial_number if presented else None,
            }
        )


def bound() -> socket.socket:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    return listener


@contextlib.asynccontextmanager
async def serving(
    tls: ServerTLS, *, own_context: ssl.SSLContext | None = None
) -> AsyncIterator[Served]:
    """The app behind a strict site and a probe site (or one site with `own_context`)."""
    served = Served(tls)

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        served.parsed.append(request.path)
        response: web.StreamResponse = await handler(request)
        return response

    app = web.Application(middlewares=[record, tls.middleware])
    app.cleanup_ctx.append(tls.draining)
    app.router.add_get("/", served.handle)
    app.router.add_get("/healthz", served.handle)
    app.router.add_get("/slow", served.slow)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    strict, probe = bound(), bound()
    served.port, served.probe_port = strict.getsockname()[1], probe.getsockname()[1]
    await web.SockSite(runner, strict, ssl_context=own_context or tls.ssl_context()).start()
    await web.SockSite(runner, probe, ssl_context=tls.probe_ssl_context()).start()
    try:
        yield served
    finally:
        await runner.cleanup()


def server_tls(source: TLSSource, refusals: list[Verdict], **options: Any) -> ServerTLS:
    return ServerTLS(source, ALLOW_WEB, on_refusal=refusals.append, **options)


async def get_json(session: AuthorizingSession, url: str) -> dict[str, Any]:
    async with session.get(url, headers={"Authorization": TOKEN}) as response:
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = json.loads(await response.text())
        return answer


async def in_thread(call_: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(call_, *args, **kwargs)


# --- the server ------------------------------------------------------------------------------


def test_the_server_names_an_allowed_client_and_never_reads_a_request_from_another(
    api: Workload, web_pod: Workload, ca1: Authority
) -> None:
    async def scenario() -> None:
        refusals: list[Verdict] = []
        async with (
            serving(server_tls(api.source(), refusals)) as served,
            AuthorizingSession(web_pod.source(), ALLOW_API) as session,
        ):
            answer = await get_json(session, served.url)
            assert answer["caller"] == WEB
            assert answer["client_leaf"] == der(web_pod.credential).hex()
            assert served.handled == [("/", TOKEN, WEB)]

            impostor = client_context_of(ca1.issue(OTHER), ca1.pem)
            assert not await in_thread(answered, served.port, impostor)
            await until(lambda: bool(refusals), "the refusal")
            assert served.parsed == ["/"]  # aiohttp read nothing from the impostor
            assert f"{OTHER} is not the allowed ID" in refusals[0].reason

    run(scenario)


def test_a_probe_port_answers_anonymous_callers_on_probe_paths_only(
    api: Workload, web_pod: Workload, ca1: Authority
) -> None:
    async def scenario() -> None:
        refusals: list[Verdict] = []
        tls = server_tls(api.source(), refusals, probe_paths=["/healthz"])
        async with serving(tls) as served:
            anonymous = client_context_of(None, ca1.pem)
            probe = await in_thread(call, served.probe_port, anonymous, "/healthz")
            assert probe.startswith(b"HTTP/1.1 200")
            assert b'"caller": null' in probe
            other_path = await in_thread(call, served.probe_port, anonymous, "/")
            assert other_path.startswith(b"HTTP/1.1 403")
            assert served.handled == [("/healthz", TOKEN, "None")]  # no handler for "/"

            # A certificate on the probe port is judged in the handshake all the same.
            impostor = client_context_of(ca1.issue(OTHER), ca1.pem)
            assert not await in_thread(answered, served.probe_port, impostor)
            allowed = client_context_of(web_pod.credential, ca1.pem)
            answer = await in_thread(call, served.probe_port, allowed, "/")
            assert f'"caller": "{WEB}"'.encode() in answer
            # The strict port lets no anonymous caller through, probe path or not.
            assert not await in_thread(answered, served.port, anonymous, server_hostname="x")
            assert served.parsed == ["/healthz", "/", "/"]

    run(scenario)


def test_a_site_listening_with_its_own_context_still_answers_no_refused_client(
    api: Workload, web_pod: Workload, ca1: Authority
) -> None:
    """The middleware judges again: a plain context that verifies chains only lets an
    impostor's request be read, but no handler runs for it."""

    async def scenario() -> None:
        plain = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        credential, trust = api.files
        plain.load_cert_chain(credential)
        plain.verify_mode = ssl.CERT_REQUIRED
        plain.load_verify_locations(trust)
        refusals: list[Verdict] = []
        async with serving(server_tls(api.source(), refusals), own_context=plain) as served:
            impostor = client_context_of(ca1.issue(OTHER), ca1.pem)
            answer = await in_thread(call, served.port, impostor)
            assert answer.startswith(b"HTTP/1.1 403")
            allowed = client_context_of(web_pod.credential, ca1.pem)
            assert (await in_thread(call, served.port, allowed)).startswith(b"HTTP/1.1 200")
            assert [caller for _, _, caller in served.handled] == [WEB]
            assert len(refusals) == 1

    run(scenario)


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str = "/"
) -> bytes:
    """One keep-alive request; the answer's head and body."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: api\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE)
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head + await asyncio.wait_for(reader.readexactly(length), DEADLINE)


def test_connections_made_before_a_rotation_are_told_to_close_then_closed_after_the_grace(
    api: Workload, web_pod: Workload, ca1: Authority
) -> None:
    async def scenario() -> None:
        server_source, client_source = api.source(), web_pod.source()
        context = client_source.client_context(ALLOW_API)
        async with serving(server_tls(server_source, [], grace=GRACE)) as served:
            busy = await asyncio.open_connection("127.0.0.1", served.port, ssl=context)
            idle = await asyncio.open_connection("127.0.0.1", served.port, ssl=context)
            for reader, writer in (busy, idle):
                assert b"connection: close" not in (await exchange(reader, writer)).lower()
            old_serial = api.serial
            api.rotate_leaf(ca1)
            # The busy connection asks again before the grace ends: answered, then told to close.
            assert await asyncio.to_thread(server_source.refresh)
            answer = await exchange(*busy)
            assert b"connection: close" in answer.lower()
            assert f'"server_serial": {old_serial}'.encode() in answer
            # A connection made after the rotation gets the new leaf and is left alone.
            fresh = await asyncio.open_connection("127.0.0.1", served.port, ssl=context)
            assert f'"server_serial": {api.serial}'.encode() in await exchange(*fresh)
            # The idle one is closed once the grace has passed.
            assert await asyncio.wait_for(idle[0].read(), DEADLINE) == b""
            assert b"connection: close" not in (await exchange(*fresh)).lower()
            for _, writer in (busy, idle, fresh):
                writer.close()

    run(scenario)


def test_the_drain_never_cuts_a_request_in_flight(
    api: Workload, web_pod: Workload, ca1: Authority
) -> None:
    async def scenario() -> None:
        server_source, client_source = api.source(), web_pod.source()
        context = client_source.client_context(ALLOW_API)
        async with serving(server_tls(server_source, [], grace=0.1)) as served:
            slow = await asyncio.open_connection("127.0.0.1", served.port, ssl=context)
            idle = await asyncio.open_connection("127.0.0.1", served.port, ssl=context)
            for reader, writer in (slow, idle):
                await exchange(reader, writer)
            waiting = asyncio.create_task(exchange(*slow, "/slow"))
            await until(lambda: served.parsed.count("/slow") == 1, "the slow request read")
            api.rotate_leaf(ca1)
            assert await asyncio.to_thread(server_source.refresh)
            # The grace has passed once the idle connection is closed; the slow one is not.
            assert await asyncio.wait_for(idle[0].read(), DEADLINE) == b""
            assert not waiting.done()
            served.release.set()
            answer = await waiting
            assert answer.startswith(b"HTTP/1.1 200") and b"connection: close" in answer.lower()
            assert await asyncio.wait_for(slow[0].read(), DEADLINE) == b""
            for _, writer in (slow, idle):
                writer.close()

    run(scenario)


# --- the client ------------------------------------------------------------------------------


def test_the_client_never_sends_a_byte_to_a_server_with_another_id(
    web_pod: Workload, ca1: Authority
) -> None:
    async def scenario() -> None:
        async with AuthorizingSession(web_pod.source(), ALLOW_API) as session:
            with RecordingServer.presenting(ca1.issue(API)).running() as genuine:
                async with session.get(genuine.url, headers={"Authorization": TOKEN}) as answer:
                    assert await answer.text() == "ok"
                await asyncio.to_thread(genuine.wait_ended, 1)
            assert TOKEN.encode() in genuine.received()[0]
            with RecordingServer.presenting(ca1.issue(OTHER)).running() as impostor:
                with pytest.raises(aiohttp.ClientConnectorCertificateError, match=OTHER):
                    await session.get(impostor.url, headers={"Authorization": TOKEN})
                await asyncio.to_thread(impostor.wait_ended, 1)
            assert impostor.received() == [b""]

    run(scenario)


def test_the_client_refuses_a_tls_context_of_the_callers(web_pod: Workload) -> None:
    async def scenario() -> None:
        async with AuthorizingSession(web_pod.source(), ALLOW_API) as session:
            for option in ("ssl", "ssl_context", "verify_ssl"):
                with pytest.raises(TypeError, match="chooses the TLS context"):
                    session.get("https://127.0.0.1:1/", **{option: False})
        with pytest.raises(RuntimeError, match="async with"):
            AuthorizingSession(web_pod.source(), ALLOW_API).get("https://127.0.0.1:1/")

    run(scenario)


# --- both through rotations --------------------------------------------------------------------


def test_server_and_client_follow_leaf_and_ca_rotations_under_load_with_no_failure(
    api: Workload, web_pod: Workload, ca1: Authority, ca2: Authority
) -> None:
    async def scenario() -> None:
        server_source, client_source = api.source(), web_pod.source()
        stop, failures, answers = asyncio.Event(), [], []
        watchers = [
            asyncio.create_task(s.watch(stop, interval=0.1)) for s in (server_source, client_source)
        ]
        refusals: list[Verdict] = []
        async with (
            serving(server_tls(server_source, refusals)) as served,
            AuthorizingSession(
                client_source, ALLOW_API, connector=aiohttp.TCPConnector(keepalive_timeout=2)
            ) as session,
        ):

            async def load() -> None:
                while not stop.is_set():
                    try:
                        answers.append(await get_json(session, served.url))
                    except (aiohttp.ClientError, AssertionError) as exc:
                        failures.append(exc)
                    await asyncio.sleep(0.01)

            loader = asyncio.create_task(load())

            async def step(change: Callable[[], object], *roots: Authority) -> None:
                change()
                await until(follows(server_source, api, *roots), "the server's new material")
                await until(follows(client_source, web_pod, *roots), "the client's new material")
                seen = len(answers)
                await until(lambda: len(answers) >= seen + 5, "answers after the step")
                last = answers[-1]
                assert (last["server_serial"], last["client_leaf"]) == (
                    api.serial,
                    der(web_pod.credential).hex(),
                )

            await step(lambda: None, ca1)
            await step(lambda: (api.rotate_leaf(ca1), web_pod.rotate_leaf(ca1)), ca1)
            await step(lambda: (api.trust(ca1, ca2), web_pod.trust(ca1, ca2)), ca1, ca2)
            await step(lambda: (api.rotate_leaf(ca2), web_pod.rotate_leaf(ca2)), ca1, ca2)
            await step(lambda: (api.trust(ca2), web_pod.trust(ca2)), ca2)
            stop.set()
            await loader
        await asyncio.gather(*watchers)
        assert failures == []
        assert refusals == []
        assert len({a["server_serial"] for a in answers}) == 3
        assert len({a["client_leaf"] for a in answers}) == 3

    run(scenario)
