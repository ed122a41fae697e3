"""Polls the bundle endpoints of the trust domains we federate with, and publishes each one's
roots in a ClusterTrustBundle of its own. The edge around `signer.federation` (pure).

Only the leader works: it fetches each endpoint (https_spiffe: authenticated with the roots it
holds for that trust domain, the endpoint's X509-SVID checked for the configured SPIFFE ID;
https_web: Web PKI with host name checks), hands the body to `federation.accept`, keeps what is
accepted and polls again at the bundle's refresh hint (backing off after failures). A rejected
or unreachable answer changes nothing: the last good roots stay published.

Where it starts from: the roots it last published (the ClusterTrustBundle survives restarts and
leader changes), else the operator's bootstrap bundle. The bundle's sequence number is kept in
memory only: a new leader accepts the sequence it first sees.
"""

from __future__ import annotations

import datetime as dt
import http.client
import logging
import ssl
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bundles.spiffe import CertificateIdError, spiffe_id_of
from podcert.reflector import Reflector
from podcert.rest import JSON, ApiError
from podcert.runtime import Runtime, Synced, WorkerPool
from podcert.workqueue import WorkQueue
from signer import federation, trustbundles
from signer.federation import Bundle, FederatedDomain, Federation, Rejected
from signer.kube import SignerKube

log = logging.getLogger("podcert.signer.federation")

FETCH_TIMEOUT: Final = 10.0
Fetch = Callable[[FederatedDomain, Sequence[x509.Certificate]], bytes]
Key = tuple[str, str]  # ("poll" | "publish", trust domain)


class FetchError(Exception):
    """A bundle endpoint could not be read, or did not authenticate as configured."""


def fetch(domain: FederatedDomain, trusted: Sequence[x509.Certificate]) -> bytes:
    """GET the bundle endpoint; at most MAX_BODY_BYTES + 1 bytes of its answer."""
    parts = urlsplit(domain.url)
    host, port = parts.hostname or "", parts.port or 443
    if domain.profile == "https_spiffe":
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False  # an X509-SVID names a workload, not a host
        context.load_verify_locations(
            cadata=b"".join(r.public_bytes(serialization.Encoding.DER) for r in trusted)
        )
    else:
        cafile = str(domain.web_roots) if domain.web_roots is not None else None
        context = ssl.create_default_context(cafile=cafile)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    connection = http.client.HTTPSConnection(host, port, context=context, timeout=FETCH_TIMEOUT)
    try:
        connection.connect()
        if domain.profile == "https_spiffe":
            _check_endpoint_id(connection, domain.endpoint_id)
        connection.request("GET", parts.path or "/", headers={"Accept": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise FetchError(f"{domain.url} answered HTTP {response.status}")
        return response.read(federation.MAX_BODY_BYTES + 1)
    except (OSError, http.client.HTTPException) as err:
        raise FetchError(f"{domain.url}: {type(err).__name__}: {err}") from None
    finally:
        connection.close()


def _check_endpoint_id(connection: http.client.HTTPSConnection, expected: str) -> None:
    sock = connection.sock
    der = sock.getpeercert(binary_form=True) if isinstance(sock, ssl.SSLSocket) else None
    if not der:
        raise FetchError("the bundle endpoint presented no certificate")
    try:
        found = str(spiffe_id_of(x509.load_der_x509_certificate(der)))
    except (ValueError, CertificateIdError) as err:
        raise FetchError(f"the bundle endpoint's certificate is no X509-SVID: {err}") from None
    if found != expected:
        raise FetchError(f"the bundle endpoint is {found}, not {expected}")


def load_bootstraps(config: Federation, now: dt.datetime) -> dict[str, Bundle] | str:
    """Each https_spiffe domain's bootstrap bundle, or what is wrong with one (named)."""
    out: dict[str, Bundle] = {}
    for domain in config.domains:
        if domain.bootstrap_bundle is None:
            continue
        where = f"federation: {domain.trust_domain}: bootstrapBundle {domain.bootstrap_bundle}"
        try:
            data = Path(domain.bootstrap_bundle).read_bytes()[: federation.MAX_BODY_BYTES + 1]
        except OSError as err:
            return f"{where}: {err.strerror or err}"
        found = federation.bootstrap_roots(data, domain.trust_domain, now)
        if isinstance(found, Rejected):
            return f"{where}: {found}"
        out[domain.trust_domain] = found
    return out


class Federator:
    """Polls every federated trust domain and keeps its ClusterTrustBundle, while `active()`."""

    def __init__(
        self,
        kube: SignerKube,
        config: Federation,
        bootstraps: Mapping[str, Bundle],
        active: Callable[[], bool],
        stop: threading.Event,
        clock: Callable[[], dt.datetime],
        fetch: Fetch = fetch,
    ) -> None:
        self.kube, self.config, self.active, self.clock = kube, config, active, clock
        self._fetch = fetch
        self.domains = {d.trust_domain: d for d in config.domains}
        self._bootstraps = dict(bootstraps)
        self._lock = threading.Lock()
        self.bundles: dict[str, Bundle] = {}  # accepted, by trust domain
        self._failures: dict[str, int] = {}
        self._seen: dict[str, JSON] = {}  # the signer name's ClusterTrustBundles, by name
        self.queue: WorkQueue[Key] = WorkQueue(base_delay=0.5, max_delay=60.0)
        self.reflector = Reflector(
            f"trustbundles[{config.signer_name}]",
            lambda: self.kube.list_trust_bundles(config.signer_name),
            lambda rv: self.kube.watch_trust_bundles(config.signer_name, rv),
            self._on_list,
            self._on_event,
            stop,
        )

    def start(self, runtime: Runtime) -> None:
        runtime.spawn(self.reflector.name, self.reflector.run)
        runtime.add_pool(
            WorkerPool(
                "federation",
                self.queue,
                self.reconcile,
                active=self.active,
                expected=(ApiError,),
                waits_for=[Synced(self.reflector.name, self.reflector.synced)],
                logger=log,
            )
        )

    def resync(self) -> None:
        """Poll every domain now and look at every bundle (leadership came, or the config)."""
        for td in self.domains:
            self.queue.add(("poll", td))

    # --- the watch ---------------------------------------------------------------------------

    def _on_list(self, items: list[JSON]) -> None:
        with self._lock:
            self._seen = {str(i["metadata"]["name"]): i for i in items}
        for td in self.domains:
            self.queue.add(("publish", td))

    def _on_event(self, kind: str, obj: JSON) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        with self._lock:
            if kind == "DELETED":
                self._seen.pop(name, None)
            else:
                self._seen[name] = obj
        labels = (obj.get("metadata") or {}).get("labels") or {}
        td = labels.get("podcert.dev/trust-domain")
        self.queue.add(("publish", td if td in self.domains else ""))

    # --- the work ----------------------------------------------------------------------------

    def reconcile(self, key: Key) -> float | None:
        action, td = key
        if action == "poll":
            return self.poll(td)
        self.publish(td)
        return None

    def _trusted(self, td: str) -> Bundle | None:
        """What authenticates the next fetch: the last accepted, else the last published,
        else the bootstrap bundle."""
        if td in self.bundles:
            return self.bundles[td]
        name = federation.bundle_name(self.config.signer_name, td)
        with self._lock:
            published = self._seen.get(name)
        pem = ((published or {}).get("spec") or {}).get("trustBundle")
        if isinstance(pem, str):
            try:
                return Bundle(td, tuple(x509.load_pem_x509_certificates(pem.encode())))
            except ValueError:
                pass
        return self._bootstraps.get(td)

    def poll(self, td: str) -> float | None:
        """Fetch one domain's bundle; seconds until the next poll."""
        domain = self.domains.get(td)
        if domain is None:
            return None
        trusted = self._trusted(td)
        previous = self.bundles.get(td)
        try:
            if domain.profile == "https_spiffe" and trusted is None:
                raise FetchError("no roots to authenticate the endpoint with")
            body = self._fetch(domain, trusted.roots if trusted is not None else ())
            result = federation.accept(body, td, previous, self.clock())
        except FetchError as err:
            result = Rejected("endpoint", str(err))
        if isinstance(result, Rejected):
            failures = self._failures[td] = self._failures.get(td, 0) + 1
            wait = federation.next_poll(previous.refresh_hint if previous else None, failures)
            log.warning(
                "federation with %s: bundle not taken (%s); again in %.0fs",
                td,
                result,
                wait.total_seconds(),
            )
            return wait.total_seconds()
        self._failures[td] = 0
        if previous is None or previous.ders() != result.ders():
            log.info(
                "federation with %s: %d root(s), sequence %s",
                td,
                len(result.roots),
                result.sequence,
            )
        self.bundles[td] = result
        self.queue.add(("publish", td))
        return federation.next_poll(result.refresh_hint, 0).total_seconds()

    def publish(self, td: str) -> None:
        """Make the cluster hold exactly the accepted roots of `td` (and remove the bundles of
        domains no longer configured); "" only removes."""
        with self._lock:
            seen = dict(self._seen)
        if td in self.bundles:
            want = federation.desired(self.config.signer_name, self.bundles[td], _managed())
            name = want["metadata"]["name"]
            if trustbundles.differs(want, seen.get(name)):
                try:
                    written = self.kube.put_trust_bundle(want, seen.get(name))
                except ApiError as err:
                    if err.status != 409:
                        raise
                    self.queue.add_after(("publish", td), 0.2)  # the watch will catch up
                    return
                with self._lock:
                    self._seen[name] = written
                log.info("published %s's roots in ClusterTrustBundle %s", td, name)
        wanted = {federation.bundle_name(self.config.signer_name, d) for d in self.domains}
        for other, obj in seen.items():
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if other not in wanted and labels.get(federation.FEDERATED_LABEL) == "true":
                self.kube.delete_trust_bundle(other)
                log.info("removed ClusterTrustBundle %s (no longer federated)", other)


def _managed() -> dict[str, Any]:
    return dict(trustbundles.MANAGED_BY)
