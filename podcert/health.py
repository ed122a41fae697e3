"""The small HTTP face every podcert process has: /metrics, /healthz and /readyz."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST


def serve(
    render: Callable[[], bytes],
    port: int,
    ready: Callable[[], bool],
    healthy: Callable[[], bool] = lambda: True,
    host: str = "127.0.0.1",
) -> ThreadingHTTPServer:
    """Serve in a daemon thread; returns the server (its port is server.server_address[1])."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
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

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
