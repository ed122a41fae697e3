"""Every port a real signer serves
(metrics and probes, the admission webhook, the SPIFFE bundle endpoint) is bounded, and
readiness means every one of them accepts connections.

- Thousands of idle connections on each port, from one client without credentials, neither grow
  the signer's memory or threads past a bound nor stop /readyz and /healthz answering; the
  signer holds at most its cap of them and closes the rest within its idle timeout.
- Started again and again, the signer is never ready before every served port accepts a TLS
  handshake. (It was, for a moment: /readyz answered from the metrics port as soon as that
  listened, before the checks readiness needs were added, so a test that waited for it could
  reach the webhook or the bundle endpoint before either listened.)

Limits are made small (`--max-connections`, `--idle-timeout`) so this runs in seconds; the
figures at the default limits and 5,000 connections are bench/bench_idle_connections.py's.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator

import pytest

from bench.bench_idle_connections import (
    close_all,
    get,
    open_idle,
    raise_file_limit,
    still_open,
    threads,
)
from bench.bench_time_to_credential import pid_of, rss_mib
from devcluster import processes
from devcluster.supervise import free_port
from devcluster.testing import eventually
from tests.integration.conftest import StartSigner

SIGNER = "ports.podcert.dev/workload"
IDLE = 2000
CAP = 16  # the webhook's and the bundle endpoint's
METRICS_CAP = 32
IDLE_TIMEOUT = 2.0
# What the held connections may cost beyond the signer's own: the caps' worth of TLS buffers
# (a quarter of a megabyte each) and threads, with room for the allocator. Unbounded, 2,000 idle
# TLS connections cost over 500 MiB.
RSS_GROWTH_MIB = 40.0
THREAD_GROWTH = METRICS_CAP + 8


@pytest.fixture(scope="module")
def signer(start_signer: StartSigner) -> Iterator[tuple[processes.Signer, int, int]]:
    raise_file_limit()
    webhook, bundle = free_port(), free_port()
    proc = start_signer(
        SIGNER,
        namespace="podcert-ports",
        trust_domain="ports.test",
        webhook_port=webhook,
        webhook_host="127.0.0.1",
        bundle_endpoint_port=bundle,
        bundle_endpoint_host="127.0.0.1",
        max_connections=CAP,
        idle_timeout=IDLE_TIMEOUT,
    )
    yield proc, webhook, bundle


def probes_answer(proc: processes.Signer) -> bool:
    return all(
        get(f"http://127.0.0.1:{proc.metrics_port}{path}")[0] == 200
        for path in ("/readyz", "/healthz")
    )


@pytest.mark.parametrize("port_name", ["metrics", "webhook", "bundle endpoint"])
def test_thousands_of_idle_connections_cost_a_bounded_memory_and_the_probes_keep_answering(
    signer: tuple[processes.Signer, int, int], port_name: str
) -> None:
    proc, webhook, bundle = signer
    port = {"metrics": proc.metrics_port, "webhook": webhook, "bundle endpoint": bundle}[port_name]
    cap = METRICS_CAP if port_name == "metrics" else CAP
    pid = pid_of(proc)
    rss_before, threads_before = rss_mib(pid), threads(pid)
    started = time.monotonic()
    conns = open_idle(port, IDLE)
    try:
        # Each new connection to the full port closed the one idle the longest: the signer
        # holds no more than its cap while the probes, new connections, are still answered.
        eventually(lambda: still_open(conns) <= cap, timeout=10, what="at most the cap held")
        for _ in range(5):
            assert probes_answer(proc), "the probes answer while the port is full"
        assert rss_mib(pid) - rss_before < RSS_GROWTH_MIB
        assert threads(pid) - threads_before < THREAD_GROWTH
        # And the ones held are closed once idle for the idle timeout (plus the handshake's).
        eventually(lambda: still_open(conns) == 0, timeout=15, what="every idle one closed")
        assert time.monotonic() - started < 15 + IDLE_TIMEOUT + 5
    finally:
        close_all(conns)
    assert probes_answer(proc)


def handshake(port: int) -> None:
    """A TLS handshake with the port (who answers is not the question here)."""
    context = ssl._create_unverified_context()  # noqa: S323
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw),
    ):
        pass


@pytest.mark.parametrize("start", [pytest.param(n, id=f"start {n}") for n in range(1, 25)])
def test_every_served_port_accepts_connections_once_the_signer_is_ready(
    start_signer: StartSigner, start: int
) -> None:
    webhook, bundle = free_port(), free_port()
    proc = start_signer(
        SIGNER,
        namespace="podcert-ports-starts",
        trust_domain="ports.test",
        webhook_port=webhook,
        webhook_host="127.0.0.1",
        bundle_endpoint_port=bundle,
        bundle_endpoint_host="127.0.0.1",
        wait=False,
    )
    try:
        eventually(lambda: proc.ready() or not proc.running, timeout=60, what="ready")
        assert proc.running, proc.output()[-3000:]
        # The first look after /readyz said ready: no retry.
        for name, port in (("webhook", webhook), ("bundle endpoint", bundle)):
            try:
                handshake(port)
            except OSError as err:
                raise AssertionError(
                    f"ready, but the {name} on {port} refused: {err}\n{proc.output()[-3000:]}"
                ) from err
    finally:
        proc.stop()
