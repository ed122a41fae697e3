"""Where the signer's CA lives: a Secret in its own namespace that every replica loads.

On first start with no Secret, one replica creates a root and an intermediate and stores them;
a replica that loses that race reads the winner's. An operator may instead point the signer at a
Secret holding their own CA (tls.crt, tls.key, ca.crt). The key material is held in memory only,
never logged.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable

from podcert.rest import ApiError
from signer import ca, model
from signer.kube import SignerKube

log = logging.getLogger("podcert.signer.ca")

MANAGED_LABEL = {"app.kubernetes.io/managed-by": "podcert-signer"}


class CAStore:
    def __init__(
        self,
        kube: SignerKube,
        namespace: str,
        secret_name: str,
        clock: Callable[[], dt.datetime],
        *,
        create: bool = True,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.secret_name = secret_name
        self.clock = clock
        self.create = create
        self._lock = threading.Lock()
        self._bundle: ca.CABundle | None = None
        self._version = ""
        self.error: str | None = None

    @property
    def bundle(self) -> ca.CABundle | None:
        with self._lock:
            return self._bundle

    def issuing(self) -> model.IssuingCA | None:
        bundle = self.bundle
        return ca.issuing_ca(bundle) if bundle is not None else None

    def load(self) -> ca.CABundle | None:
        """Read the Secret (creating it when allowed and absent). Transient errors raise
        ApiError; unusable material is recorded in `error` and yields None."""
        ref = f"{self.namespace}/{self.secret_name}"
        found = self.kube.read_secret(self.namespace, self.secret_name)
        if found is None:
            if not self.create:
                self.error = f"CA Secret {ref} does not exist"
                return None
            bundle = ca.new_ca("podcert", self.clock())
            if self.kube.create_secret(
                self.namespace, self.secret_name, ca.to_secret_data(bundle), MANAGED_LABEL
            ):
                log.info("created a new root and intermediate CA in Secret %s", ref)
            found = self.kube.read_secret(self.namespace, self.secret_name)
            if found is None:
                raise ApiError(404, "NotFound", f"CA Secret {ref} vanished after creation")
        data, version = found
        try:
            bundle = ca.from_secret_data(data)
        except ca.CAError as err:
            self.error = f"CA Secret {ref}: {err}"
            log.error("cannot use the CA: %s", self.error)
            return None
        with self._lock:
            self._bundle, self._version, self.error = bundle, version, None
        return bundle
