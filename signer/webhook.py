"""The validating admission webhook's server: refuse, at creation, PodCertificateRequests that
would only be denied later, and above all those not made by the node they name.

What it answers is decided in `signer.admission` (pure); this is the edge: it reads at most
`MAX_BODY_BYTES` of body within a deadline, hands parsing and the verdict (which reads live facts)
to a thread, and answers. Malformed input costs one warning line, never a traceback. Its serving
certificate is issued from our own CA and re-issued before half its life is gone (or when the CA
changes) without a restart.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import ssl
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from aiohttp import web
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from podcert.rest import ApiError
from signer import admission, certs, model
from signer.admission import MAX_BODY_BYTES, MalformedReview, Verdict
from signer.policy import Policy

log = logging.getLogger("podcert.signer.webhook")

PATH = "/validate-podcertificaterequests"


class ServingCert:
    """The webhook's TLS identity, issued by the active CA; swapped per handshake."""

    def __init__(
        self,
        issuing: Callable[[], model.IssuingCA | None],
        dns_names: Sequence[str],
        trust_domain: str,
        clock: Callable[[], dt.datetime],
        lifetime: dt.timedelta = dt.timedelta(days=7),
    ) -> None:
        self.issuing, self.dns_names = issuing, tuple(dns_names)
        self.trust_domain, self.clock, self.lifetime = trust_domain, clock, lifetime
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._renew_at: dt.datetime | None = None
        self._issuer: bytes = b""

    def _issue(self, issuer: model.IssuingCA) -> ssl.SSLContext:
        key = ec.generate_private_key(ec.SECP256R1())
        now = self.clock()
        not_before = certs.truncate_to_second(now - dt.timedelta(minutes=1))
        not_after = certs.truncate_to_second(min(issuer.not_after, not_before + self.lifetime))
        plan = model.LeafPlan(
            public_key=key.public_key(),
            spiffe_id=f"spiffe://{self.trust_domain}/podcert/webhook",
            dns_names=self.dns_names,
            not_before=not_before,
            not_after=not_after,
            begin_refresh_at=not_before + (not_after - not_before) / 2,
        )
        chain = certs.sign_leaf(plan, issuer, certs.random_serial())
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # load_cert_chain needs a path: a private temporary dir, gone after loading.
        with tempfile.TemporaryDirectory(prefix="podcert-webhook-") as tmp:
            path = Path(tmp) / "serving.pem"
            path.touch(mode=0o600)
            path.write_bytes(key_pem + chain.encode())
            context.load_cert_chain(str(path))
        self._renew_at = plan.begin_refresh_at
        return context

    def current(self) -> ssl.SSLContext | None:
        issuer = self.issuing()
        if issuer is None:
            return None
        fingerprint = issuer.certificate.fingerprint(hashes.SHA256())
        with self._lock:
            stale = self._renew_at is None or self.clock() >= self._renew_at
            if self._context is None or stale or fingerprint != self._issuer:
                self._context = self._issue(issuer)
                self._issuer = fingerprint
                log.info("issued the webhook serving certificate for %s", ", ".join(self.dns_names))
            return self._context

    def listener_context(self) -> ssl.SSLContext:
        """The context the socket listens with: each handshake that names a server (SNI, as the
        API server does for a Service or a host name) is handed the current certificate."""
        first = self.current()
        if first is None:
            raise RuntimeError("no CA loaded: cannot serve the webhook")

        def pick(sock: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: Any) -> None:
            ctx = self.current()
            if ctx is not None and ctx is not sock.context:
                sock.context = ctx

        first.sni_callback = pick
        return first


class WebhookServer:
    """aiohttp on its own thread and loop; blocking API reads go to the default executor."""

    def __init__(
        self,
        host: str,
        port: int,
        serving: ServingCert,
        served: Sequence[str],
        facts: Callable[[model.Request], model.Facts],
        policy: Policy,
        clock: Callable[[], dt.datetime],
    ) -> None:
        self.host, self.port = host, port
        self.serving, self.served, self.facts = serving, tuple(served), facts
        self.policy, self.clock = policy, clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self.started = threading.Event()
        self.error: BaseException | None = None

    async def handle(self, request: web.Request) -> web.Response:
        loop = asyncio.get_running_loop()
        try:
            body = await _read_body(request)
            review = await loop.run_in_executor(None, admission.parse_review, body)
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
                admission.admit,
                review.username,
                review.operation,
                review.object,
                self.served,
                self.facts,
                self.policy,
                self.clock(),
            )
        except ApiError as err:  # the API server must get an answer: fail closed
            log.warning("admission check could not read the cluster: %s", err)
            verdict = Verdict(False, "podcert could not check the request: ApiError")
        except Exception as err:
            log.exception("admission check failed")
            verdict = Verdict(False, f"podcert could not check the request: {type(err).__name__}")
        if not verdict.allowed:
            meta = review.object.get("metadata")
            namespace = meta.get("namespace") if isinstance(meta, dict) else None
            log.warning(
                "refused at admission: %s",
                verdict.detail or verdict.message,
                extra={"namespace": namespace, "user": review.username},
            )
        return web.json_response(admission.review_response(review.uid, verdict))

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    def run(self, stop: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._start())
            self.started.set()
            loop.run_until_complete(loop.run_in_executor(None, stop.wait))
            loop.run_until_complete(self._stop())
        except BaseException as err:  # surfaced to the caller through .error
            self.error = err
            self.started.set()
            log.exception("webhook server failed")
        finally:
            loop.close()

    async def _start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post(PATH, self.handle)
        app.router.add_get("/healthz", self._healthz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.host, self.port, ssl_context=self.serving.listener_context()
        )
        await site.start()
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
    too_large = MalformedReview(
        admission.TOO_LARGE, f"the body exceeds {MAX_BODY_BYTES} bytes", 413
    )
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
        raise MalformedReview(admission.TOO_SLOW, "the body did not arrive in time", 408) from None
    if len(body) > MAX_BODY_BYTES:
        raise too_large
    return bytes(body)
