"""The example server's port bounded: a peer with no credential holds at
most MAX_HANDSHAKES connections, each for at most HANDSHAKE_TIMEOUT, however many it opens, and
an authorized client is answered meanwhile. Real TLS on loopback, limits made small for speed."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from examples.mtls import server as example
from kubelet_shim.atomic import AtomicDirStorage
from tests.unit.test_mtls_example import CLIENT_ID, DEADLINE, SERVER_ID, Pod, new_ca, pair, run

IDLE = 1_000
SMALL_CAP = 16
SHORT_HANDSHAKE = 1.0


def still_open(conns: list[socket.socket]) -> int:
    """How many of these client sockets the server has not closed (no EOF, no reset)."""
    count = 0
    for conn in conns:
        try:
            count += conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            count += 1
        except OSError:
            pass
    return count


async def open_idle(port: int, count: int) -> list[socket.socket]:
    """`count` TCP connections that never send a ClientHello."""
    loop = asyncio.get_running_loop()
    conns = []
    for _ in range(count):
        conn = socket.socket()
        conn.setblocking(False)
        await loop.sock_connect(conn, ("127.0.0.1", port))
        conns.append(conn)
    return conns


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {DEADLINE}s waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.fixture
def pods(tmp_path: Path) -> tuple[Pod, Pod]:
    """The example pair's volumes, issued as in the example's own tests."""
    storage, issuer = AtomicDirStorage(tmp_path / "node"), new_ca("mtls limits")
    server_pod, client_pod = Pod(storage, "uid-api", SERVER_ID), Pod(storage, "uid-web", CLIENT_ID)
    server_pod.issue(issuer, [issuer.root])
    client_pod.issue(issuer, [issuer.root])
    return server_pod, client_pod


def test_idle_connections_without_a_handshake_are_capped_closed_on_time_and_do_not_lock_out(
    pods: tuple[Pod, Pod], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(example, "MAX_HANDSHAKES", SMALL_CAP)
    monkeypatch.setattr(example, "HANDSHAKE_TIMEOUT", SHORT_HANDSHAKE)
    server_pod, client_pod = pods

    async def scenario() -> None:
        async with pair(server_pod, client_pod) as (server, client):
            port = int(client.url.rsplit(":", 1)[1].rstrip("/"))
            started = time.monotonic()
            conns = await open_idle(port, IDLE)
            try:
                # Every connection beyond the cap closed the oldest handshake: the server holds
                # at most the cap, and an authorized client is still answered.
                await until(lambda: still_open(conns) <= SMALL_CAP, f"<= {SMALL_CAP} held")
                assert (await client.request() or {}).get("caller") == client_pod.spiffe_id
                # The ones still held are closed by the handshake deadline.
                await until(lambda: still_open(conns) == 0, "every idle connection closed")
                assert time.monotonic() - started < SHORT_HANDSHAKE + DEADLINE
            finally:
                for conn in conns:
                    conn.close()
            assert server.served >= 1

    run(scenario)
