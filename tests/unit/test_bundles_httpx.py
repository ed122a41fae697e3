"""bundles.httpx: real httpx clients, sync and async, against a loopback server that records
every byte it reads. A server with the wrong SPIFFE ID reads nothing at all; the right one
serves the client through a leaf rotation and a CA rotation, each request on a connection made
with the client's current material (the server sees the client's current leaf)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from bundles.authz import Verdict, allow_ids
from bundles.httpx import AsyncAuthorizingTransport, AuthorizingTransport, async_client, client
from tests.recording_stack_peer import (
    DEADLINE,
    OTHER_ID,
    SERVER_ID,
    TOKEN,
    RecordingServer,
    Workloads,
    der,
    serving,
)

pytestmark = pytest.mark.timeout(60)

ALLOW_SERVER = allow_ids([SERVER_ID])
HEADERS = {"Authorization": TOKEN}

Get = Callable[[str], str]


class SyncClient:
    def __init__(self, workloads: Workloads, refusals: list[Verdict]) -> None:
        self.http = client(
            workloads.client.source, ALLOW_SERVER, on_refusal=refusals.append, timeout=DEADLINE
        )

    def get(self, url: str) -> str:
        return self.http.get(url, headers=HEADERS).text

    def close(self) -> None:
        self.http.close()


class AsyncClient:
    """An AsyncClient driven from sync test code, on a loop of its own."""

    def __init__(self, workloads: Workloads, refusals: list[Verdict]) -> None:
        self.loop = asyncio.new_event_loop()
        self.http = async_client(
            workloads.client.source, ALLOW_SERVER, on_refusal=refusals.append, timeout=DEADLINE
        )

    def get(self, url: str) -> str:
        async def get() -> str:
            return (await self.http.get(url, headers=HEADERS)).text

        return self.loop.run_until_complete(get())

    def close(self) -> None:
        self.loop.run_until_complete(self.http.aclose())
        self.loop.close()


CLIENTS = [pytest.param(SyncClient, id="sync"), pytest.param(AsyncClient, id="async")]


@pytest.mark.parametrize("make", CLIENTS)
def test_a_server_with_the_wrong_spiffe_id_never_reads_a_byte(
    make: type[SyncClient | AsyncClient], tmp_path: Path
) -> None:
    workloads = Workloads(tmp_path, server_id=OTHER_ID)
    refusals: list[Verdict] = []
    http = make(workloads, refusals)
    with serving(workloads.server).running() as server:
        try:
            with pytest.raises(httpx.ConnectError, match=f"{OTHER_ID} is not the allowed ID"):
                http.get(server.url)
        finally:
            http.close()
        server.wait_ended()
    assert server.received() == [b""]
    assert [v.reason for v in refusals] == [f"{OTHER_ID} is not the allowed ID {SERVER_ID}."]


@pytest.mark.parametrize("make", CLIENTS)
def test_the_right_server_serves_through_a_leaf_and_a_ca_rotation(
    make: type[SyncClient | AsyncClient], tmp_path: Path
) -> None:
    workloads = Workloads(tmp_path)
    http = make(workloads, [])
    with serving(workloads.server).running() as server:
        try:
            steps = ["first request", "again, keep-alive"]
            assert http.get(server.url) == http.get(server.url) == "ok"
            assert len(server.connections) == 1  # the second request reused the connection
            workloads.rotate_leaves()
            steps.append("leaf rotation")
            assert http.get(server.url) == "ok", steps[-1]
            _assert_current(server, workloads, steps)
            for step in workloads.rotate_ca():
                steps.append(step)
                assert http.get(server.url) == "ok", step
                _assert_current(server, workloads, steps)
        finally:
            http.close()
        server.wait_ended()
    assert all(TOKEN.encode() in got for got in server.received())


def _assert_current(server: RecordingServer, workloads: Workloads, steps: list[str]) -> None:
    """Each rotation's request went on a new connection carrying the client's current leaf,
    and every connection made before it was closed (the retired pool's keep-alive included)."""
    made = list(server.connections)
    assert len(made) == len(steps) - 1, steps
    assert made[-1].client_leaf == der(workloads.client.source.credential), steps[-1]
    server.wait_ended(len(made) - 1)


def test_a_response_still_streaming_keeps_its_pool_until_it_is_closed(tmp_path: Path) -> None:
    workloads = Workloads(tmp_path)
    transport = AuthorizingTransport(workloads.client.source, ALLOW_SERVER)
    with (
        serving(workloads.server).running() as server,
        httpx.Client(transport=transport, trust_env=False, timeout=DEADLINE) as http,
    ):
        with http.stream("GET", server.url, headers=HEADERS) as streaming:
            workloads.rotate_leaves()
            assert http.get(server.url, headers=HEADERS).text == "ok"  # the new pool
            assert not server.connections[0].ended.is_set()
            assert streaming.read() == b"ok"
        server.wait_ended(1)  # the retired pool closed with its last response
        assert len(server.connections) == 2
        assert not server.connections[1].ended.is_set()


def test_plain_http_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    workloads = Workloads(tmp_path)
    with (
        client(workloads.client.source, ALLOW_SERVER) as http,
        pytest.raises(httpx.UnsupportedProtocol, match="over TLS only"),
    ):
        http.get("http://127.0.0.1:9/", headers=HEADERS)


@pytest.mark.parametrize("option", ["verify", "cert"])
def test_the_transports_take_no_trust_or_certificate_of_the_caller(
    option: str, tmp_path: Path
) -> None:
    source = Workloads(tmp_path).client.source
    for kind in (AuthorizingTransport, AsyncAuthorizingTransport):
        with pytest.raises(TypeError, match=f"does not take '{option}'"):
            kind(source, ALLOW_SERVER, **{option: False})


@pytest.mark.parametrize("option", ["verify", "trust_env", "transport", "mounts", "proxy"])
def test_the_clients_take_nothing_that_would_bypass_the_transport(
    option: str, tmp_path: Path
) -> None:
    source = Workloads(tmp_path).client.source
    with pytest.raises(TypeError, match=f"does not take '{option}'"):
        client(source, ALLOW_SERVER, **{option: True})


def test_each_transport_judges_with_a_context_of_its_own(tmp_path: Path) -> None:
    """httpcore sets ALPN on the context it connects with: a shared one would change under
    another client."""
    source = Workloads(tmp_path).client.source
    first, second = (AuthorizingTransport(source, ALLOW_SERVER) for _ in range(2))
    contexts = [t._generations.enter()[0].context for t in (first, second)]
    assert contexts[0] is not contexts[1]
    assert source.client_context(ALLOW_SERVER) not in contexts
