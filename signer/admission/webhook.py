"""The validating admission webhook's server: refuse, at creation, PodCertificateRequests that
would only be denied later, and above all those not made by the node they name.

What it answers is decided in `signer.admission.review` (pure); this is the edge: it reads at most
`MAX_BODY_BYTES` of body within a deadline, hands parsing and the verdict (which reads live facts)
to a thread, and answers. Malformed input costs one warning line, never a traceback. Its serving
certificate is issued from our own CA and re-issued before half its life is gone (or when the CA
changes) without a restart. The port holds at most `Limits.max_connections` connections, idle
ones for `idle_timeout` seconds (`podcert.serving.servers`): anyone who can connect, and so cost it
memory.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import ssl
import threading
from collections.abc import Callable, Sequence
from typing import Final

from aiohttp import web

from podcert.api.requests import PodCertificateRequest
from podcert.client.rest import ApiError
from podcert.serving import servers
from podcert.serving.connections import DEFAULT_LIMITS, Limits
from signer import model, serving
from signer.admission import review
from signer.admission.review import MAX_BODY_BYTES, MalformedReview, Verdict
from signer.policy import Policy

log = logging.getLogger("podcert.signer.webhook")

PATH = "/validate-podcertificaterequests"


class ServingCert(serving.OwnCert):
    """The webhook's TLS identity: DNS names for the API server to dial, from the active CA."""

    def __init__(
        self,
        issuing: Callable[[], model.IssuingCA | None],
        dns_names: Sequence[str],
        trust_domain: str,
        clock: Callable[[], dt.datetime],
        lifetime: dt.timedelta = dt.timedelta(days=7),
    ) -> None:
        super().__init__(
            issuing,
            f"spiffe://{trust_domain}/podcert/webhook",
            dns_names,
            clock,
            lifetime,
            what=f"the webhook serving certificate for {', '.join(dns_names)}",
        )

    def listener_context(self) -> ssl.SSLContext:
        return serving.listener_context(self.current, "the webhook")


class WebhookServer:
    """aiohttp on its own thread and loop; blocking API reads go to the default executor."""

    def __init__(
        self,
        host: str,
        port: int,
        serving: ServingCert,
        served: Sequence[str],
        facts: Callable[[PodCertificateRequest], model.Facts],
        policy: Policy,
        clock: Callable[[], dt.datetime],
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.host, self.port, self.limits = host, port, limits
        self.serving, self.served, self.facts = serving, tuple(served), facts
        self.policy, self.clock = policy, clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self.started = threading.Event()
        self.listening = threading.Event()  # set while the port accepts connections
        self.error: BaseException | None = None

    async def handle(self, request: web.Request) -> web.Response:
        loop = asyncio.get_running_loop()
        try:
            body = await _read_body(request)
            parsed = await loop.run_in_executor(None, review.parse_review, body)
        except MalformedReview as err:
            log.warning(
                "refused a malformed AdmissionReview: %s", err, extra={"peer": request.remote}
            )
            return web.json_response(
                {"reason": err.reason, "message": err.message}, status=err.status
            )
        try:
            verdict = await loop.run_in_executor(
                None,
                functools.partial(
                    review.admit,
                    parsed.username,
                    parsed.operation,
                    parsed.object,
                    self.served,
                    self.facts,
                    self.policy,
                    self.clock(),
                    converted_from=parsed.converted_from,
                ),
            )
        except ApiError as err:  # the API server must get an answer: fail closed
            log.warning("admission check could not read the cluster: %s", err)
            verdict = Verdict(False, "podcert could not check the request: ApiError")
        except Exception as err:
            log.exception("admission check failed")
            verdict = Verdict(False, f"podcert could not check the request: {type(err).__name__}")
        if not verdict.allowed:
            meta = parsed.object.get("metadata")
            namespace = meta.get("namespace") if isinstance(meta, dict) else None
            log.warning(
                "refused at admission: %s",
                verdict.detail or verdict.message,
                extra={"namespace": namespace, "user": parsed.username},
            )
        return web.json_response(review.review_response(parsed.uid, verdict))

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    def run(self, stop: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._start())
            self.listening.set()
            self.started.set()
            loop.run_until_complete(loop.run_in_executor(None, stop.wait))
            self.listening.clear()
            loop.run_until_complete(self._stop())
        except BaseException as err:  # surfaced to the caller through .error
            self.error = err
            self.listening.clear()
            self.started.set()
            log.exception("webhook server failed")
        finally:
            loop.close()

    async def _start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post(PATH, self.handle)
        app.router.add_get("/healthz", self._healthz)
        context = self.serving.listener_context()
        self._runner, self.port = await servers.start(
            app, self.host, self.port, context, self.limits
        )
        log.info("admission webhook on https://%s:%d%s", self.host, self.port, PATH)

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


# The API server waits 5 s (timeoutSeconds) for the whole call; a body still arriving after
# this is not from it.
_READ_TIMEOUT: Final = 10.0


async def _read_body(request: web.Request) -> bytes:
    """At most MAX_BODY_BYTES of body, refused early on Content-Length and whatever the
    framing; MalformedReview when larger or too slow."""
    too_large = MalformedReview(review.TOO_LARGE, f"the body exceeds {MAX_BODY_BYTES} bytes", 413)
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise too_large
    body = bytearray()
    try:
        async with asyncio.timeout(_READ_TIMEOUT):
            while len(body) <= MAX_BODY_BYTES:
                chunk = await request.content.read(MAX_BODY_BYTES + 1 - len(body))
                if not chunk:
                    break
                body += chunk
    except TimeoutError:
        raise MalformedReview(review.TOO_SLOW, "the body did not arrive in time", 408) from None
    if len(body) > MAX_BODY_BYTES:
        raise too_large
    return bytes(body)
