"""The small HTTP face every podcert process has: /metrics, /healthz and /readyz, and the
registry behind /metrics.

A thread per connection (http.server), bounded by `podcert.serving.connections`: at most
`Limits.max_connections` handler threads; a new connection to a full port closes the one idle
the longest (or is closed itself when every thread is answering), so the kubelet's probes keep
being answered whatever an attacker holds; a request head must arrive within `idle_timeout` of
the accept (a janitor thread closes the late ones), and every socket read or write times out
after as long. Each connection carries one request (HTTP/1.0).
"""

from __future__ import annotations

import contextlib
import platform
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

from podcert import __version__
from podcert.serving.connections import Limits, Table

METRICS_LIMITS = Limits(max_connections=32)

Component = Literal["signer", "shim"]
"""Which process a registry belongs to: the `component` label of `podcert_build_info`."""

BUILD_INFO = "podcert_build_info"


def registry(component: Component) -> CollectorRegistry:
    """A new registry as every podcert process serves it. Guaranteed:

    - `podcert_build_info{component, version, python_version} 1`: podcert's version and the
      interpreter's, so a dashboard can join any series to the release that wrote it (no commit:
      the wheel carries none);
    - the process (`process_*`: memory, CPU, open files, from /proc), interpreter (`python_info`)
      and garbage collector (`python_gc_*`, CPython's) metrics of this process;
    - no `_created` series for any counter or histogram: OpenMetrics reserves the suffix and the
      series double what is stored for nothing a rate needs. prometheus_client's switch is
      process-wide, so every registry of the process (a test's too) exports none.
    """
    disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus_client
    out = CollectorRegistry()
    ProcessCollector(registry=out)
    PlatformCollector(registry=out)
    GCCollector(registry=out)
    Gauge(
        BUILD_INFO,
        "1, labelled with the podcert version and the Python version this process runs.",
        ["component", "version", "python_version"],
        registry=out,
    ).labels(
        component=component, version=__version__, python_version=platform.python_version()
    ).set(1)
    return out


class BoundedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer holding at most `limits.max_connections` connections (and threads)."""

    daemon_threads = True
    request_queue_size = 1024  # a burst of connections waits in the kernel, not in threads

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        limits: Limits,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(address, handler)
        self.limits, self.clock = limits, clock
        self.table: Table[socket.socket] = Table(limits)
        self._lock = threading.Condition()
        self._closed = False

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            admission = self.table.admit(request, self.clock())
            self._lock.notify()  # the janitor's next deadline may be sooner
        if admission.evicted is not None:
            _hang_up(admission.evicted)
        if not admission.admitted:
            self.shutdown_request(request)
            return
        request.settimeout(self.limits.idle_timeout)
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self.table.remove(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A peer that hung up or timed out (or was hung up on) is no news; a bug still is."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    def serving(self, request: socket.socket) -> bool:
        """The handler has the request head: its connection is no longer idle (False: it was
        closed meanwhile)."""
        with self._lock:
            return self.table.busy(request)

    def janitor(self) -> None:
        """Close connections idle past `idle_timeout`, until the server closes."""
        while True:
            with self._lock:
                if self._closed:
                    return
                late = self.table.overdue(self.clock())
                deadline = self.table.next_deadline()
                if not late:
                    wait = None if deadline is None else max(0.0, deadline - self.clock())
                    self._lock.wait(wait)
                    continue
            for sock in late:
                _hang_up(sock)

    def server_close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        super().server_close()


def _hang_up(sock: socket.socket) -> None:
    """End a connection another thread may be blocked reading: its read returns at once."""
    with contextlib.suppress(OSError):  # already gone
        sock.shutdown(socket.SHUT_RDWR)


def serve(
    render: Callable[[], bytes],
    port: int,
    ready: Callable[[], bool],
    healthy: Callable[[], bool] = lambda: True,
    host: str = "127.0.0.1",
    limits: Limits = METRICS_LIMITS,
) -> BoundedHTTPServer:
    """Serve in daemon threads; returns the server (its port is server.server_address[1])."""

    class Handler(BaseHTTPRequestHandler):
        server: BoundedHTTPServer

        def do_GET(self) -> None:
            if not self.server.serving(self.request):
                self.close_connection = True
                return
            if self.path == "/metrics":
                self._answer(200, render(), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                ok = healthy()
                self._answer(200 if ok else 503, b"ok\n" if ok else b"unhealthy\n")
            elif self.path == "/readyz":
                ok = ready()
                self._answer(200 if ok else 503, b"ok\n" if ok else b"not ready\n")
            else:
                self._answer(404, b"not found\n")

        def _answer(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # scrapes are not news

    server = BoundedHTTPServer((host, port), Handler, limits)
    threading.Thread(target=server.janitor, name="metrics-janitor", daemon=True).start()
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
