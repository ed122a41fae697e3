"""Keep the caBundle of the signer's own ValidatingWebhookConfiguration equal to its CA's roots.

So `kubectl apply -k manifests/signer` needs no manual patch, and a CA rotation never leaves the API
server distrusting the webhook (cert-manager's cainjector does this for its own webhooks). What the
bundle must be is decided in `signer.admission.cabundle` (pure); this is the edge: a watch of that
one object (RBAC allows no other), and one write when it differs, made by the leader only. A
configuration that does not exist yet is waited for by the same watch, never created: its rules are
the operator's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from cryptography import x509

from podcert.client.rest import JSON, ApiError
from podcert.reconcile.reflector import Reflector
from podcert.reconcile.runtime import WorkerPool
from podcert.reconcile.workqueue import WorkQueue
from signer.admission import cabundle
from signer.kube import SignerKube

log = logging.getLogger("podcert.signer.webhook")


class CAInjector:
    """While `active()` holds, the configuration `name` carries `roots()` as every webhook's
    caBundle."""

    def __init__(
        self,
        kube: SignerKube,
        name: str,
        roots: Callable[[], list[x509.Certificate]],
        active: Callable[[], bool],
        stop: threading.Event,
    ) -> None:
        self.kube, self.name, self.roots, self.active = kube, name, roots, active
        self._lock = threading.Lock()
        self._seen: JSON | None = None
        self._missing_logged = False
        self.queue: WorkQueue[str] = WorkQueue(base_delay=0.2, max_delay=30.0)
        self.reflector = Reflector(
            f"webhookconfiguration[{name}]",
            lambda: kube.list_webhook_configuration(name),
            lambda rv: kube.watch_webhook_configuration(name, rv),
            self._on_list,
            self._on_event,
            stop,
        )

    def pool(self) -> WorkerPool[str]:
        """One worker; a failed write is retried with backoff."""
        return WorkerPool("ca-injector", self.queue, self._inject, expected=(ApiError,), logger=log)

    def resync(self) -> None:
        """Look again (the roots or the leadership changed)."""
        self.queue.add(self.name)

    def _on_list(self, items: list[JSON]) -> None:
        with self._lock:
            self._seen = items[0] if items else None
        self.resync()

    def _on_event(self, kind: str, obj: JSON) -> None:
        with self._lock:
            self._seen = None if kind == "DELETED" else obj
        self.resync()

    def _inject(self, _name: str) -> None:
        if self.active() and self.reflector.synced.is_set():
            self.reconcile()

    def reconcile(self) -> bool:
        """One look, and at most one write. True when it wrote."""
        with self._lock:
            seen = self._seen
        if seen is None:
            if not self._missing_logged:
                log.warning(
                    "ValidatingWebhookConfiguration %s does not exist (yet): its caBundle is set "
                    "when it appears",
                    self.name,
                )
                self._missing_logged = True
            return False
        self._missing_logged = False
        roots = self.roots()
        body = cabundle.updated(seen, roots)
        if body is None:
            return False
        try:
            written = self.kube.replace_webhook_configuration(body)
        except ApiError as err:
            if err.status not in (404, 409):
                raise
            # Changed or deleted meanwhile: the watch brings the new state; look again then.
            self.queue.add_after(self.name, 0.2)
            return False
        with self._lock:
            self._seen = written
        log.info(
            "set the caBundle of ValidatingWebhookConfiguration %s to %d root(s)",
            self.name,
            len(roots),
        )
        return True
