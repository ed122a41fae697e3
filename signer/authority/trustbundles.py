"""Publish the trusted roots as ClusterTrustBundles: per served signer name, a `live` one and a
`preview` one (`signer.authority.canarying`: the SPIFFE Filesystem Delivery labels).

`<signer>:roots` holds the live roots (every trusted root but a CA prepared in preview) and keeps
the label `podcert.dev/trust-domain` that selectors written before the standard use;
`<signer>:roots-preview` holds every trusted root, preview ones included, and carries only the
standard's labels, so a selector on `podcert.dev/trust-domain` still matches the live bundle
alone.

The desired bundle is a pure function of the signer name, trust domain and roots; the publisher
compares it with what a watch shows and writes only on a difference, so drift (an edit or a
deletion by someone else) is repaired within seconds and nothing is written when nothing changed.
"""

from __future__ import annotations

import logging
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
from signer.authority import canarying
from signer.authority.canarying import Channel
from signer.kube import SignerKube

log = logging.getLogger("podcert.signer.trust")

MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "podcert-signer"}
TRUST_DOMAIN_LABEL: Final = "podcert.dev/trust-domain"


def bundle_name(signer_name: str, channel: Channel = canarying.LIVE) -> str:
    """A signer-linked bundle's name must start with the signer name, '/' -> ':', then ':'."""
    suffix = "roots" if channel == canarying.LIVE else "roots-preview"
    return f"{signer_name.replace('/', ':')}:{suffix}"


def desired(
    signer_name: str,
    trust_domain: str,
    roots: Sequence[x509.Certificate],
    channel: Channel = canarying.LIVE,
) -> JSON:
    labels = dict(MANAGED_BY)
    if channel == canarying.LIVE and canarying.label_value_ok(trust_domain):
        labels[TRUST_DOMAIN_LABEL] = trust_domain
    labels |= canarying.labels(channel, trust_domain, trust_domain)
    return {
        "metadata": {"name": bundle_name(signer_name, channel), "labels": labels},
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
    """Keeps a live and a preview bundle per signer name equal to the live and the trusted
    roots (`preview_roots`, by default the same), while `active()` holds."""

    def __init__(
        self,
        kube: SignerKube,
        signers: Mapping[str, str],  # signer name -> trust domain
        roots: Callable[[], list[x509.Certificate]],
        active: Callable[[], bool],
        stop: threading.Event,
        preview_roots: Callable[[], list[x509.Certificate]] | None = None,
    ) -> None:
        self.kube = kube
        self.signers = dict(signers)
        self.roots = roots
        self.preview_roots = preview_roots or roots
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
        """Make the cluster hold exactly our live and preview bundles for `signer`. True when
        it wrote."""
        live, preview = self.roots(), self.preview_roots()
        if not live:
            return False
        td = self.signers[signer]
        wants = [
            desired(signer, td, live, canarying.LIVE),
            desired(signer, td, preview or live, canarying.PREVIEW),
        ]
        names = {want["metadata"]["name"] for want in wants}
        with self._lock:
            seen = dict(self._seen[signer])
        wrote = False
        for want in wants:
            name = want["metadata"]["name"]
            if not differs(want, seen.get(name)):
                continue
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
            roots = want["spec"]["trustBundle"].count("-----BEGIN CERTIFICATE-----")
            log.info("published %d root(s) in ClusterTrustBundle %s", roots, name)
            wrote = True
        for other, obj in seen.items():
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if (
                other not in names
                and labels.get("app.kubernetes.io/managed-by") == "podcert-signer"
            ):
                self.kube.delete_trust_bundle(other)
                log.info("removed stale ClusterTrustBundle %s", other)
                wrote = True
        return wrote
