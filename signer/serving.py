"""The TLS identities the signer serves with (the admission webhook, the SPIFFE bundle endpoint):
a certificate from its own active CA, issued when first asked for, again past half its life and
whenever the active CA changes, and handed to each handshake without a restart.

The key lives in memory; it touches the disk only in a private temporary folder, mode 0600, for
the moment `ssl` needs a path.
"""

from __future__ import annotations

import datetime as dt
import logging
import ssl
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from signer import certs, model

log = logging.getLogger("podcert.signer.serving")


def server_context(pem: bytes) -> ssl.SSLContext:
    """A TLS 1.2+ server context from a key and its chain in PEM."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="podcert-serving-") as tmp:
        path = Path(tmp) / "serving.pem"
        path.touch(mode=0o600)
        path.write_bytes(pem)
        context.load_cert_chain(str(path))
    return context


class OwnCert:
    """A serving certificate for `spiffe_id` (and `dns_names`) from the active CA."""

    def __init__(
        self,
        issuing: Callable[[], model.IssuingCA | None],
        spiffe_id: str,
        dns_names: Sequence[str],
        clock: Callable[[], dt.datetime],
        lifetime: dt.timedelta,
        what: str,
    ) -> None:
        self.issuing, self.spiffe_id, self.dns_names = issuing, spiffe_id, tuple(dns_names)
        self.clock, self.lifetime, self.what = clock, lifetime, what
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._renew_at: dt.datetime | None = None
        self._issuer = b""

    def _issue(self, issuer: model.IssuingCA) -> tuple[ssl.SSLContext, dt.datetime]:
        key = ec.generate_private_key(ec.SECP256R1())
        not_before = certs.truncate_to_second(self.clock() - dt.timedelta(minutes=1))
        not_after = certs.truncate_to_second(min(issuer.not_after, not_before + self.lifetime))
        plan = model.LeafPlan(
            public_key=key.public_key(),
            spiffe_id=self.spiffe_id,
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
        return server_context(key_pem + chain.encode()), plan.begin_refresh_at

    def current(self) -> ssl.SSLContext | None:
        """The context to serve with now; None while no CA is loaded."""
        issuer = self.issuing()
        if issuer is None:
            return None
        fingerprint = issuer.certificate.fingerprint(hashes.SHA256())
        with self._lock:
            due = self._renew_at is None or self.clock() >= self._renew_at
            if self._context is None or due or fingerprint != self._issuer:
                try:
                    self._context, self._renew_at = self._issue(issuer)
                except model.KeyUnavailable as err:
                    # The CA's token is away: serve the certificate we have (if any) meanwhile;
                    # the next handshake asks again.
                    log.warning("the CA key did not sign %s, retrying: %s", self.what, err)
                    return self._context
                self._issuer = fingerprint
                log.info("issued %s (%s)", self.what, self.spiffe_id)
            return self._context


def listener_context(current: Callable[[], ssl.SSLContext | None], what: str) -> ssl.SSLContext:
    """The context a socket listens with: it hands each handshake (with or without SNI) to the
    context `current()` gives then, so a renewed certificate is served at once."""
    if current() is None:
        raise RuntimeError(f"{what} has no certificate to serve with (no CA loaded yet)")
    dispatcher = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    dispatcher.minimum_version = ssl.TLSVersion.TLSv1_2

    def pick(sock: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: Any) -> None:
        context = current()
        if context is not None:
            sock.context = context

    dispatcher.sni_callback = pick
    return dispatcher
