"""The signer's side of its audit log: entries that fail closed, and the key that vouches for them.

- `record(entry)` appends one decision. When the log refuses (a full disk, a failed fsync), it
  says so, and the trail turns unwritable: issuance stops (the controller writes an Issued
  status only after its entry is durable) and /readyz fails, until a write succeeds again.
- An audit key per process and per CA: a fresh P-256 key whose certificate the issuing CA
  signs (the x5c chain of every checkpoint). When a new CA starts signing the trail re-keys
  under it and checkpoints, so the log stays verifiable once the old root is retired.
- Checkpoints: one at once on (re-)keying, so even an empty log is vouched for; then on a timer
  (`run`), probing every second while the log refuses writes so issuance resumes soon after
  space is back; and a last one when the process stops.

Without a log file every call is a no-op and the trail is always writable.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from signer import certs, model
from signer.auditlog import writer
from signer.metrics import Metrics

log = logging.getLogger("podcert.signer")

AUDIT_CERT_LIFETIME = dt.timedelta(days=30)
# Seconds between timed checkpoints unless told otherwise (--audit-checkpoint-interval).
DEFAULT_CHECKPOINT_INTERVAL: Final = 60.0
PROBE_INTERVAL = 1.0  # seconds between checkpoint probes while the log refuses writes


class AuditTrail:
    def __init__(
        self,
        audit: writer.AuditLog | None,
        metrics: Metrics,
        issuing: Callable[[], model.IssuingCA | None],
        trust_domain: str,
        *,
        clock: Callable[[], dt.datetime],
        backdate: dt.timedelta = certs.DEFAULT_LEAF_BACKDATE,
        checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL,
    ) -> None:
        self.audit = audit
        self.metrics = metrics
        self.issuing = issuing
        self.trust_domain = trust_domain
        self.clock = clock
        self.backdate = backdate
        self.checkpoint_interval = checkpoint_interval
        self._key: ec.EllipticCurvePrivateKey | None = None
        self._chain: list[x509.Certificate] = []
        self._issuer: x509.Certificate | None = None
        # A re-key the CA's key did not sign (its token away): retried every PROBE_INTERVAL.
        self._rekey_due = False
        self._writable = threading.Event()
        self._writable.set()
        metrics.audit_log_writable.set(1)

    @property
    def enabled(self) -> bool:
        return self.audit is not None

    def writable(self) -> bool:
        """False from a refused write until the next one that succeeds (a readiness check)."""
        return self._writable.is_set()

    def start(self) -> None:
        """Key the trail under the CA that signs now, and checkpoint."""
        if self.audit is not None:
            self.metrics.audit_checkpoint.set(self.audit.checkpoints)
            self.rekey()

    def on_ca_change(self) -> None:
        """A (new) CA signs now: re-key the audit certificate under it."""
        current = self.issuing()
        if self.audit is not None and current is not None and self._issuer != current.certificate:
            self.rekey()

    def record(self, entry: writer.Entry) -> bool:
        """Append one decision; False (logged, counted, readiness withdrawn) when the log
        cannot take it. An `issued` entry is on disk when this returns True."""
        if self.audit is None:
            return True
        try:
            self.audit.append(entry)
        except (OSError, ValueError, writer.AuditLogError) as err:
            self._failed("append to", err)
            return False
        self._succeeded()
        return True

    def rekey(self) -> None:
        """A fresh audit key, its certificate issued by the signing CA, then a checkpoint at
        once. The key lives in memory only."""
        issuer = self.issuing()
        if issuer is None or self.audit is None:
            return
        key = ec.generate_private_key(ec.SECP256R1())
        not_before = certs.truncate_to_second(self.clock() - self.backdate)
        try:
            pem = certs.sign_audit_certificate(
                key.public_key(),
                self.trust_domain,
                issuer,
                not_before,
                not_before + AUDIT_CERT_LIFETIME,
                certs.random_serial(),
            )
        except model.KeyUnavailable as err:
            self.metrics.token_errors.inc()
            log.warning("the CA key did not sign the audit certificate, retrying: %s", err)
            self._rekey_due = True
            return
        self._rekey_due = False
        self._chain = list(x509.load_pem_x509_certificates(pem.encode()))
        self._key = key
        self._issuer = issuer.certificate
        self.audit.set_checkpoint_signer(key, self._chain)
        self.checkpoint(force=True)

    def checkpoint(self, *, force: bool = False) -> None:
        if self.audit is None or self._key is None:
            return
        try:
            self.audit.checkpoint(self._key, self._chain, self.clock(), force=force)
        except (OSError, ValueError, writer.AuditLogError) as err:
            self._failed("write a checkpoint to", err)
            return
        self._succeeded()

    def run(self, stop: threading.Event) -> None:
        """Timed checkpoints until `stop`; while the log refuses writes, a forced checkpoint
        every second is the probe that finds it writable again."""
        while not stop.wait(
            self.checkpoint_interval
            if self._writable.is_set() and not self._rekey_due
            else PROBE_INTERVAL
        ):
            if self._rekey_due:
                self.rekey()
            self.checkpoint(force=not self._writable.is_set())

    def _failed(self, what: str, err: Exception) -> None:
        self.metrics.audit_log_errors.inc()
        self.metrics.audit_log_writable.set(0)
        if self._writable.is_set():
            self._writable.clear()
            log.error(
                "cannot %s the audit log (%s): issuance stops and /readyz fails until it can",
                what,
                err,
            )

    def _succeeded(self) -> None:
        if self.audit is not None:
            self.metrics.audit_checkpoint.set(self.audit.checkpoints)
        if not self._writable.is_set():
            self._writable.set()
            self.metrics.audit_log_writable.set(1)
            log.warning("the audit log takes writes again: issuance resumes")
