"""The validating admission webhook: refuse, at creation, PodCertificateRequests that would only
be denied later, and above all those not made by the node they name.

NodeRestriction binds nodes only; any other user with RBAC `create` on podcertificaterequests could
ask for any pod's identity, and the signer cannot see who created a request. The API server can:
it tells the webhook the creator. Requests for other signer names are always allowed (and the
registration's matchConditions keep them from reaching us at all).

The verdict is `admit(...)`, pure; the aiohttp server at the edge reads the AdmissionReview, fetches
live facts off the event loop, and answers. Its serving certificate is issued from our own CA and
re-issued before half its life is gone (or when the CA changes) without a restart.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import ssl
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from signer import certs, model, objects
from signer.decide import decide
from signer.policy import Policy

log = logging.getLogger("podcert.signer.webhook")

PATH = "/validate-podcertificaterequests"


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""
    reason: str = ""


def admit(
    username: str,
    operation: str,
    pcr: Mapping[str, Any],
    served: Sequence[str],
    facts: Callable[[model.Request], model.Facts],
    policy: Policy,
    now: dt.datetime,
) -> Verdict:
    """The answer for one admission request. `facts` is only called for our own signer names."""
    spec = pcr.get("spec") if isinstance(pcr.get("spec"), Mapping) else None
    signer_name = spec.get("signerName") if spec else None
    if operation != "CREATE" or signer_name not in served:
        return Verdict(True)
    node_name = spec.get("nodeName") if spec else None
    if not isinstance(node_name, str) or username != f"system:node:{node_name}":
        return Verdict(
            False,
            f"only the node the pod runs on may request its certificate: "
            f"spec.nodeName is {node_name!r} but the request comes from {username!r}",
            "CreatorNotNode",
        )
    meta = dict(pcr.get("metadata") or {})
    meta.setdefault("name", meta.get("generateName", "") or "pending")
    meta.setdefault("uid", "pending")
    try:
        request = objects.request_from({**pcr, "metadata": meta})
    except objects.ObjectError as err:
        return Verdict(False, f"malformed request: {err}", model.INVALID_REQUEST)
    # The same checks the signer makes at issuance, minus the CA: fail fast instead of a
    # request that can only end Denied.
    decision = decide(request, facts(request), policy.for_signer(request.signer_name), now)
    if isinstance(decision, model.Deny):
        return Verdict(False, f"{decision.reason}: {decision.message}", decision.reason)
    return Verdict(True)


def review_response(review: Mapping[str, Any], verdict: Verdict) -> dict[str, Any]:
    uid = ((review.get("request") or {}).get("uid")) or ""
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": verdict.message}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


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
        try:
            review = json.loads(await request.read())
            if not isinstance(review, dict) or not isinstance(review.get("request"), dict):
                raise ValueError("not an AdmissionReview")
        except ValueError as err:
            return web.json_response({"error": f"bad AdmissionReview: {err}"}, status=400)
        req = review["request"]
        pcr = req.get("object") if isinstance(req.get("object"), dict) else {}
        username = str((req.get("userInfo") or {}).get("username", ""))
        loop = asyncio.get_running_loop()
        try:
            verdict = await loop.run_in_executor(
                None,
                admit,
                username,
                str(req.get("operation", "")),
                pcr,
                self.served,
                self.facts,
                self.policy,
                self.clock(),
            )
        except Exception as err:  # the API server must get an answer, whatever broke
            log.exception("admission check failed")
            verdict = Verdict(False, f"podcert could not check the request: {type(err).__name__}")
        if not verdict.allowed:
            meta = pcr.get("metadata") or {}
            log.warning(
                "refused at admission: %s",
                verdict.message,
                extra={"namespace": meta.get("namespace", req.get("namespace")), "user": username},
            )
        return web.json_response(review_response(review, verdict))

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
        app = web.Application(client_max_size=4 * 1024 * 1024)
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
