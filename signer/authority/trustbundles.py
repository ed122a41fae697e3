"""Publish every currently trusted root as a ClusterTrustBundle per served signer name.

The desired bundle is a pure function of the signer name, trust domain and roots; the publisher
compares it with what a watch shows and writes only on a difference, so drift (an edit or a
deletion by someone else) is repaired within seconds and nothing is written when nothing changed.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bundles.formats import dump_roots
from podcert.client.rest import JSON, ApiError
from podcert.reconcile.reflector import Reflector
from podcert.reconcile.runtime import WorkerPool
from podcert.reconcile.workqueue import WorkQueue
from signer.kube import SignerKube

log = logging.getLogger("podcert.signer.trust")

MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "podcert-signer"}
TRUST_DOMAIN_LABEL: Final = "podcert.dev/trust-domain"
_LABEL_VALUE: Final = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


def bundle_name(signer_name: str) -> str:
    """A signer-linked bundle's name must start with the signer name, '/' -> ':', then ':'."""
    return f"{signer_name.replace('/', ':')}:roots"


def desired(signer_name: str, trust_domain: str, roots: Sequence[x509.Certificate]) -> JSON:
    labels = dict(MANAGED_BY)
    if _LABEL_VALUE.match(trust_domain):
        labels[TRUST_DOMAIN_LABEL] = trust_domain
    return {
        "metadata": {"name": bundle_name(signer_name), "labels": labels},
        "spec": {"signerName": signer_name, "trustBundle": dump_roots(roots).decode()},
    }


def _roots_of(pem: object) -> frozenset[bytes]:
    if not isinstance(pem, str):
        return frozenset()
    try:
        return frozenset(
            c.public_bytes(serialization.Encoding.DER)
            for c in x509.load_pem_x509_certificates(pem.encode())
        )
    except ValueError:
        return frozenset()


def differs(want: Mapping[str, Any], have: Mapping[str, Any] | None) -> bool:
    """True when `have` does not already hold exactly the roots and labels we want."""
    if have is None:
        return True
    want_labels = want["metadata"]["labels"]
    have_labels = (have.get("metadata") or {}).get("labels") or {}
    if any(have_labels.get(k) != v for k, v in want_labels.items()):
        return True
    spec = have.get("spec") or {}
    return spec.get("signerName") != want["spec"]["signerName"] or _roots_of(
        spec.get("trustBundle")
    ) != _roots_of(want["spec"]["trustBundle"])


class Publisher:
    """Keeps one bundle per signer name equal to the trusted roots, while `active()` holds."""

    def __init__(
        self,
        kube: SignerKube,
        signers: Mapping[str, str],  # signer name -> trust domain
        roots: Callable[[], list[x509.Certificate]],
        active: Callable[[], bool],
        stop: threading.Event,
    ) -> None:
        self.kube = kube
        self.signers = dict(signers)
        self.roots = roots
        self.active = active
        self._stop = stop
        self._lock = threading.Lock()
        self._seen: dict[str, dict[str, JSON]] = {s: {} for s in signers}  # signer -> name -> obj
        self.queue: WorkQueue[str] = WorkQueue(base_delay=0.2, max_delay=30.0)
        self.reflectors = [
            Reflector(
                f"trustbundles[{signer}]",
                lambda s=signer: self.kube.list_trust_bundles(s),  # type: ignore[misc]
                lambda rv, s=signer: self.kube.watch_trust_bundles(s, rv),  # type: ignore[misc]
                lambda items, s=signer: self._on_list(s, items),  # type: ignore[misc]
                lambda kind, obj, s=signer: self._on_event(s, kind, obj),  # type: ignore[misc]
                stop,
            )
            for signer in signers
        ]

    def pool(self) -> WorkerPool[str]:
        """One worker, keyed by signer name; failed writes retry with backoff."""
        return WorkerPool(
            "trust-publisher", self.queue, self._publish, expected=(ApiError,), logger=log
        )

    def resync(self) -> None:
        """Look at every signer again (the roots or the leadership changed)."""
        for signer in self.signers:
            self.queue.add(signer)

    def _on_list(self, signer: str, items: list[JSON]) -> None:
        with self._lock:
            self._seen[signer] = {str(i["metadata"]["name"]): i for i in items}
        self.queue.add(signer)

    def _on_event(self, signer: str, kind: str, obj: JSON) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        with self._lock:
            if kind == "DELETED":
                self._seen[signer].pop(name, None)
            else:
                self._seen[signer][name] = obj
        self.queue.add(signer)

    # How soon a leader's publish that found a bundle list not yet in looks again. A list's
    # arrival cannot be the only trigger: its reflector says synced only after `_on_list`
    # returns, so the worker may look in between and see it unsynced.
    UNSYNCED_RETRY: Final = 0.2

    def _publish(self, signer: str) -> None:
        """Only the leader writes, and only once every bundle list is in; a leader that looked
        too early looks again until they are (a follower waits for `resync`)."""
        if not self.active():
            return
        if all(r.synced.is_set() for r in self.reflectors):
            self.reconcile(signer)
        else:
            self.queue.add_after(signer, self.UNSYNCED_RETRY)

    def reconcile(self, signer: str) -> bool:
        """Make the cluster hold exactly our one bundle for `signer`. True when it wrote."""
        roots = self.roots()
        if not roots:
            return False
        want = desired(signer, self.signers[signer], roots)
        name = want["metadata"]["name"]
        with self._lock:
            seen = dict(self._seen[signer])
        wrote = False
        if differs(want, seen.get(name)):
            try:
                written = self.kube.put_trust_bundle(want, seen.get(name))
            except ApiError as err:
                if err.status != 409:
                    raise
                # Our cache is behind (created or changed meanwhile): the watch will catch up.
                self.queue.add_after(signer, 0.2)
                return False
            with self._lock:
                self._seen[signer][name] = written
            log.info("published %d root(s) in ClusterTrustBundle %s", len(roots), name)
            wrote = True
        for other, obj in seen.items():
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if other != name and labels.get("app.kubernetes.io/managed-by") == "podcert-signer":
                self.kube.delete_trust_bundle(other)
                log.info("removed stale ClusterTrustBundle %s", other)
                wrote = True
        return wrote
