"""The SPIFFE bundle endpoint: the trust domain's bundle, served at `/` over HTTPS on a port of
its own, for other SPIFFE control planes (SPIRE, go-spiffe's federation package) to poll.

What is served is decided in `signer.authority.spiffebundle` (pure): every root the CA Secret
trusts and the sequence number it records, so every replica serves the same bundle, leader or not.
This is the edge, with the two authentication profiles of the SPIFFE Trust Domain and Bundle spec
(5.2):

- `https_spiffe` (the default): the endpoint presents an X509-SVID of the signer's own,
  `spiffe://<trust domain>/podcert/bundle-endpoint` (no pod can hold an ID under /podcert),
  issued by the active CA, re-issued before half its life is gone and whenever the active CA
  changes; consumers authenticate it with the bundle they fetched last.
- `https_web`: the operator's Web PKI certificate and key files; read again (by content, at
  most every `WEB_RELOAD_INTERVAL` seconds) so a renewed certificate is served without a restart.

Every handshake picks the current certificate (`signer.serving`, which also issues the SVID and
keeps its key in memory). Anyone may connect without credentials, so the port holds at most
`Settings.limits` connections, idle ones for seconds (`podcert.serving.servers`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal

from cryptography import x509

from podcert.reconcile.runtime import Runtime
from podcert.serving.connections import DEFAULT_LIMITS, Limits
from signer import model, serving
from signer.authority import spiffebundle

if TYPE_CHECKING:
    # Imported where the server starts: a signer without the endpoint never loads aiohttp and
    # asyncio (a tenth of a second of its start-up).
    from aiohttp import web

log = logging.getLogger("podcert.signer.bundle")

Profile = Literal["https_spiffe", "https_web"]
ENDPOINT_PATH: Final = "/podcert/bundle-endpoint"
SVID_LIFETIME: Final = dt.timedelta(days=1)
WEB_RELOAD_INTERVAL: Final = 10.0
START_TIMEOUT: Final = 30.0


@dataclass(frozen=True)
class Settings:
    """`--bundle-endpoint-*`: where to listen and how to authenticate. The defaults here are
    the flags' defaults too (the CLI reads them from the class)."""

    port: int
    host: str = "0.0.0.0"  # noqa: S104 (other trust domains reach it from outside the pod)
    web_cert: Path | None = None  # both given: https_web; neither: https_spiffe
    web_key: Path | None = None
    refresh_hint: dt.timedelta = spiffebundle.DEFAULT_REFRESH_HINT
    limits: Limits = DEFAULT_LIMITS

    @property
    def profile(self) -> Profile:
        return "https_web" if self.web_cert is not None else "https_spiffe"


def endpoint_id(trust_domain: str) -> str:
    """The SPIFFE ID the endpoint presents with https_spiffe (what consumers configure)."""
    return f"spiffe://{trust_domain}{ENDPOINT_PATH}"


class SpiffeIdentity(serving.OwnCert):
    """https_spiffe: the endpoint's X509-SVID from the active CA (consumers check the SPIFFE ID,
    not a host name)."""

    def __init__(
        self,
        issuing: Callable[[], model.IssuingCA | None],
        trust_domain: str,
        clock: Callable[[], dt.datetime],
        lifetime: dt.timedelta = SVID_LIFETIME,
    ) -> None:
        spiffe_id = endpoint_id(trust_domain)
        super().__init__(issuing, spiffe_id, (), clock, lifetime, what="the bundle endpoint's SVID")


class WebIdentity:
    """https_web: the operator's certificate and key files, re-read when their content changes
    (looked at no more often than every `interval` seconds); a bad pair keeps the last good one."""

    def __init__(
        self,
        cert: Path,
        key: Path,
        clock: Callable[[], float],
        interval: float = WEB_RELOAD_INTERVAL,
    ) -> None:
        self.cert, self.key, self.clock, self.interval = cert, key, clock, interval
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._digest = b""
        self._checked: float | None = None

    def current(self) -> ssl.SSLContext | None:
        with self._lock:
            now = self.clock()
            if self._checked is not None and now - self._checked < self.interval:
                return self._context
            self._checked = now
            try:
                key, chain = self.key.read_bytes(), self.cert.read_bytes()
                digest = hashlib.sha256(key + b"\0" + chain).digest()
                if digest != self._digest:
                    self._context = serving.server_context(key.rstrip() + b"\n" + chain)
                    self._digest = digest
                    log.info("loaded the bundle endpoint's Web PKI certificate %s", self.cert)
            except (OSError, ssl.SSLError) as err:
                # Names the files only: the error of a key load may quote nothing secret, but
                # the key's bytes never reach a log line.
                log.warning(
                    "cannot load the bundle endpoint's certificate %s / key %s: %s",
                    self.cert,
                    self.key,
                    type(err).__name__,
                )
            return self._context


Identity = SpiffeIdentity | WebIdentity


def listener_context(identity: Identity) -> ssl.SSLContext:
    return serving.listener_context(identity.current, "the bundle endpoint")


class BundleServer:
    """aiohttp on its own thread and loop. `bundle()` gives the roots and the sequence."""

    def __init__(
        self,
        settings: Settings,
        identity: Identity,
        bundle: Callable[[], tuple[list[x509.Certificate], int]],
    ) -> None:
        self.settings, self.identity, self.bundle = settings, identity, bundle
        self._runner: web.AppRunner | None = None
        self.started = threading.Event()
        self.listening = threading.Event()  # set while the port accepts connections
        self.error: BaseException | None = None
        self.port = settings.port

    async def handle(self, _request: web.Request) -> web.Response:
        from aiohttp import web

        roots, sequence = self.bundle()
        if not roots:  # an empty bundle would tell consumers to trust nothing of ours
            return web.Response(status=503, text="no CA loaded yet\n")
        body = spiffebundle.bundle_body(roots, sequence, self.settings.refresh_hint)
        return web.Response(body=body, content_type="application/json")

    def run(self, stop: threading.Event) -> None:
        import asyncio

        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._start())
            self.listening.set()
            self.started.set()
            loop.run_until_complete(loop.run_in_executor(None, stop.wait))
            self.listening.clear()
            if self._runner is not None:
                loop.run_until_complete(self._runner.cleanup())
        except BaseException as err:  # surfaced to the caller through .error
            self.error = err
            self.listening.clear()
            self.started.set()
            log.exception("the bundle endpoint failed")
        finally:
            loop.close()

    async def _start(self) -> None:
        from aiohttp import web

        from podcert.serving import servers

        app = web.Application()
        app.router.add_get("/", self.handle)
        context = listener_context(self.identity)
        self._runner, self.port = await servers.start(
            app, self.settings.host, self.settings.port, context, self.settings.limits
        )
        log.info(
            "SPIFFE bundle endpoint (%s) on https://%s:%d/",
            self.settings.profile,
            self.settings.host,
            self.port,
        )


def start(
    settings: Settings,
    issuing: Callable[[], model.IssuingCA | None],
    bundle: Callable[[], tuple[list[x509.Certificate], int]],
    trust_domain: str,
    runtime: Runtime,
    clock: Callable[[], dt.datetime],
) -> BundleServer:
    """Serve on `runtime` until it stops; a server that cannot start stops the runtime."""
    identity: Identity
    if settings.web_cert is not None and settings.web_key is not None:
        identity = WebIdentity(settings.web_cert, settings.web_key, runtime.clock)
    else:
        identity = SpiffeIdentity(issuing, trust_domain, clock)
    server = BundleServer(settings, identity, bundle)
    runtime.spawn("bundle-endpoint", lambda: server.run(runtime.stopping), join=True)
    server.started.wait(START_TIMEOUT)
    if server.error is not None:
        log.error("the SPIFFE bundle endpoint could not start: %s", server.error)
        runtime.stopping.set()
    return server
