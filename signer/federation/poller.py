"""Polls the bundle endpoints of the trust domains we federate with, and publishes each one's
roots in a ClusterTrustBundle of its own. The edge around `signer.federation.domains` (pure).

Only the leader works: it fetches each endpoint (https_spiffe: authenticated with the roots it
holds for that trust domain, the endpoint's X509-SVID checked for the configured SPIFFE ID;
https_web: Web PKI with host name checks), hands the body to `federation.accept`, keeps what is
accepted and polls again at the bundle's refresh hint (backing off after failures). A rejected
or unreachable answer changes nothing: the last good roots stay published.

Guarantees:

- A fetch ends within FETCH_DEADLINE seconds, all of it: resolving the host, connecting, the
  TLS handshake, the request and the whole answer (at most MAX_BODY_BYTES of body). A peer
  trickling bytes is cut off at the deadline like a silent one, and counts as a failure.
- Each trust domain has a queue and a worker of its own (polls and publishes), so one domain's
  slow or failing endpoint never delays another's polls or publishing; it backs off alone.
- Roots are admitted under one lock (`federation.claim`): a root this signer holds, or one
  another domain holds, is refused for the domain listing it later, whichever finishes its
  fetch first; each refusal is logged once per change, naming the domain and the certificate.

Where it starts from: the roots it last published (the ClusterTrustBundle survives restarts and
leader changes), else the operator's bootstrap bundle. The bundle's sequence number is kept in
memory only: a new leader accepts the sequence it first sees.
"""

from __future__ import annotations

import datetime as dt
import http.client
import io
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bundles.spiffe import CertificateIdError, spiffe_id_of
from podcert.client.rest import JSON, ApiError
from podcert.reconcile.reflector import Reflector
from podcert.reconcile.runtime import Runtime, Synced, WorkerPool
from podcert.reconcile.workqueue import WorkQueue
from signer.authority import canarying, trustbundles
from signer.federation import domains
from signer.federation.domains import Bundle, FederatedDomain, Federation, Rejected, RootRefused
from signer.kube import SignerKube

log = logging.getLogger("podcert.signer.federation")

FETCH_DEADLINE: Final = 10.0  # seconds for a whole fetch
Fetch = Callable[[FederatedDomain, Sequence[x509.Certificate]], bytes]
Key = tuple[str, str]  # ("poll" | "publish", trust domain), or ("prune", "")
PRUNE: Final[Key] = ("prune", "")


class FetchError(Exception):
    """A bundle endpoint could not be read in time, or did not authenticate as configured."""


def fetch(
    domain: FederatedDomain,
    trusted: Sequence[x509.Certificate],
    *,
    deadline: float = FETCH_DEADLINE,
    clock: Callable[[], float] = time.monotonic,
) -> bytes:
    """GET the bundle endpoint, the whole exchange within `deadline` seconds; at most
    MAX_BODY_BYTES + 1 bytes of its answer's body."""
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
    left = _Left(clock() + deadline, clock)
    sock: ssl.SSLSocket | None = None
    try:
        raw = _connect(host, port, left)
        raw.settimeout(left())  # the handshake is one call, bounded as a whole by its timeout
        sock = context.wrap_socket(raw, server_hostname=host)
        if domain.profile == "https_spiffe":
            _check_endpoint_id(sock, domain.endpoint_id)
        connection = http.client.HTTPSConnection(host, port)
        connection.sock = _WithinDeadline(sock, left)
        connection.request("GET", parts.path or "/", headers={"Accept": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise FetchError(f"{domain.url} answered HTTP {response.status}")
        return response.read(domains.MAX_BODY_BYTES + 1)
    except TimeoutError:
        raise FetchError(f"{domain.url}: no whole answer within {deadline:g}s") from None
    except (OSError, http.client.HTTPException) as err:
        raise FetchError(f"{domain.url}: {type(err).__name__}: {err}") from None
    finally:
        if sock is not None:
            sock.close()


class _Left:
    """Seconds left before the deadline; TimeoutError once it has passed."""

    def __init__(self, end: float, clock: Callable[[], float]) -> None:
        self.end, self.clock = end, clock

    def __call__(self) -> float:
        left = self.end - self.clock()
        if left <= 0:
            raise TimeoutError("the fetch's deadline passed")
        return left


def _connect(host: str, port: int, left: _Left) -> socket.socket:
    error: OSError = OSError(f"{host} has no address")
    for family, kind, proto, _, address in _resolve(host, port, left):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(left())
            sock.connect(address)
            return sock
        except TimeoutError:
            sock.close()
            raise
        except OSError as err:
            sock.close()
            error = err
    raise error


def _resolve(host: str, port: int, left: _Left) -> list[Any]:
    """getaddrinfo within the deadline: a name is resolved on a thread of its own (the call
    itself cannot be interrupted; a late answer is dropped)."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        pass  # a name, not an address
    found: list[Any] = []
    failed: list[OSError] = []
    done = threading.Event()

    def resolve() -> None:
        try:
            found.extend(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as err:
            failed.append(err)
        finally:
            done.set()

    threading.Thread(target=resolve, name=f"resolve {host}", daemon=True).start()
    if not done.wait(left()):
        raise TimeoutError(f"resolving {host}")
    if failed:
        raise failed[0]
    return found


class _WithinDeadline:
    """The TLS socket as http.client uses it, every send and read given only the time left
    (a read is one call, bounded as a whole by the socket's timeout). The fetch closes it."""

    def __init__(self, sock: ssl.SSLSocket, left: _Left) -> None:
        self.sock, self.left = sock, left

    def sendall(self, data: bytes) -> None:
        self.sock.settimeout(self.left())
        self.sock.sendall(data)

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_Reads(self))

    def close(self) -> None:
        pass  # http.client closes it while the body is still to be read


class _Reads(io.RawIOBase):
    def __init__(self, within: _WithinDeadline) -> None:
        self.within = within

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self.within.sock.settimeout(self.within.left())
        return self.within.sock.recv_into(buffer)


def _check_endpoint_id(sock: ssl.SSLSocket, expected: str) -> None:
    der = sock.getpeercert(binary_form=True)
    if not der:
        raise FetchError("the bundle endpoint presented no certificate")
    try:
        found = str(spiffe_id_of(x509.load_der_x509_certificate(der)))
    except (ValueError, CertificateIdError) as err:
        raise FetchError(f"the bundle endpoint's certificate is no X509-SVID: {err}") from None
    if found != expected:
        raise FetchError(f"the bundle endpoint is {found}, not {expected}")


def load_bootstraps(config: Federation, now: dt.datetime) -> dict[str, Bundle] | str:
    """Each https_spiffe domain's bootstrap bundle, or what is wrong with one (named): a root
    in two domains' bootstrap bundles is one (a root has one owner)."""
    out: dict[str, Bundle] = {}
    holders: dict[bytes, str] = {}
    for domain in config.domains:
        if domain.bootstrap_bundle is None:
            continue
        where = f"federation: {domain.trust_domain}: bootstrapBundle {domain.bootstrap_bundle}"
        try:
            data = Path(domain.bootstrap_bundle).read_bytes()[: domains.MAX_BODY_BYTES + 1]
        except OSError as err:
            return f"{where}: {err.strerror or err}"
        found = domains.bootstrap_roots(data, domain.trust_domain, now)
        if isinstance(found, Rejected):
            return f"{where}: {found}"
        for root in found.roots:
            der = root.public_bytes(serialization.Encoding.DER)
            if der in holders:
                return (
                    f"{where}: root {domains.describe(root)} is also in "
                    f"{holders[der]}'s bootstrapBundle; a root belongs to one trust domain"
                )
            holders[der] = domain.trust_domain
        out[domain.trust_domain] = found
    return out


class Federator:
    """Polls every federated trust domain and keeps its ClusterTrustBundle, while `active()`:
    one queue and one worker per domain, and one more for removing the bundles of domains no
    longer configured."""

    def __init__(
        self,
        kube: SignerKube,
        config: Federation,
        bootstraps: Mapping[str, Bundle],
        active: Callable[[], bool],
        stop: threading.Event,
        clock: Callable[[], dt.datetime],
        fetch: Fetch = fetch,
        local_roots: Callable[[], Sequence[x509.Certificate]] = tuple,
        workloads: Sequence[str] = ("cluster.local",),
    ) -> None:
        """`local_roots()`: this signer's own roots, never published as a federated one;
        `workloads`: the trust domains it serves, the default first (each federates)."""
        self.kube, self.config, self.active, self.clock = kube, config, active, clock
        self.workloads = tuple(workloads)
        self._fetch = fetch
        self._local_roots = local_roots
        self.domains = {d.trust_domain: d for d in config.domains}
        self._bootstraps = dict(bootstraps)
        self._lock = threading.Lock()  # _seen
        self._claiming = threading.Lock()  # admitting roots: one domain at a time
        self.bundles: dict[str, Bundle] = {}  # accepted, by trust domain
        self._failures: dict[str, int] = {}
        self._seen: dict[str, JSON] = {}  # the signer name's ClusterTrustBundles, by name
        self.queues: dict[str, WorkQueue[Key]] = {
            td: WorkQueue(base_delay=0.5, max_delay=60.0) for td in ("", *self.domains)
        }  # "": pruning
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
        for td, queue in self.queues.items():
            runtime.add_pool(
                WorkerPool(
                    f"federation[{td}]" if td else "federation-prune",
                    queue,
                    self.reconcile,
                    active=self.active,
                    expected=(ApiError,),
                    waits_for=[Synced(self.reflector.name, self.reflector.synced)],
                    logger=log,
                )
            )

    def add(self, key: Key) -> None:
        """Queue `key` on its domain's queue (pruning on its own)."""
        action, td = key
        if action == "prune" or td not in self.domains:
            self.queues[""].add(PRUNE)
        else:
            self.queues[td].add(key)

    def resync(self) -> None:
        """Poll every domain now and look at every bundle (leadership came, or the config)."""
        for td in self.domains:
            self.add(("poll", td))
        self.add(PRUNE)

    # --- the watch ---------------------------------------------------------------------------

    def _on_list(self, items: list[JSON]) -> None:
        with self._lock:
            self._seen = {str(i["metadata"]["name"]): i for i in items}
        for td in self.domains:
            self.add(("publish", td))
        self.add(PRUNE)

    def _on_event(self, kind: str, obj: JSON) -> None:
        name = str((obj.get("metadata") or {}).get("name", ""))
        with self._lock:
            if kind == "DELETED":
                self._seen.pop(name, None)
            else:
                self._seen[name] = obj
        labels = (obj.get("metadata") or {}).get("labels") or {}
        td = labels.get(canarying.PEER_TRUST_DOMAIN) or labels.get("podcert.dev/trust-domain")
        self.add(("publish", td) if td in self.domains else PRUNE)

    # --- the work ----------------------------------------------------------------------------

    def reconcile(self, key: Key) -> float | None:
        action, td = key
        if action == "poll":
            return self.poll(td)
        if action == "publish":
            self.publish(td)
        else:
            self.prune()
        return None

    def _trusted(self, td: str) -> Bundle | None:
        """What authenticates the next fetch, and what `td` holds now: the last accepted,
        else the last published, else the bootstrap bundle."""
        if td in self.bundles:
            return self.bundles[td]
        name = domains.bundle_name(self.config.signer_name, td)
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
            result = domains.accept(body, td, previous, self.clock())
        except FetchError as err:
            result = Rejected("endpoint", str(err))
        with self._claiming:
            if isinstance(result, Bundle):
                result = self._claim(result)
            if isinstance(result, Bundle):
                self.bundles[td] = result
        self._log_refused(td, previous, result.refused)
        if isinstance(result, Rejected):
            failures = self._failures[td] = self._failures.get(td, 0) + 1
            wait = domains.next_poll(previous.refresh_hint if previous else None, failures)
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
        self.add(("publish", td))
        return domains.next_poll(result.refresh_hint, 0).total_seconds()

    def _claim(self, bundle: Bundle) -> Bundle | Rejected:
        others: dict[str, frozenset[bytes]] = {}
        for other in self.domains:
            if other != bundle.trust_domain and (held := self._trusted(other)) is not None:
                others[other] = held.ders()
        local = {r.public_bytes(serialization.Encoding.DER) for r in self._local_roots()}
        return domains.claim(bundle, others, local)

    def _log_refused(
        self, td: str, previous: Bundle | None, refused: Sequence[RootRefused]
    ) -> None:
        """Each refused certificate once, while the refusals stay the same."""
        if previous is not None and set(previous.refused) == set(refused):
            return
        for refusal in refused:
            log.warning("federation: %s", refusal)

    def publish(self, td: str) -> None:
        """Make the cluster hold exactly the accepted roots of `td`."""
        if td not in self.bundles:
            return
        with self._lock:
            seen = dict(self._seen)
        wants = domains.desired(
            self.config.signer_name, self.bundles[td], _managed(), self.workloads
        )
        for want in wants:
            name = want["metadata"]["name"]
            if not trustbundles.differs(want, seen.get(name)):
                continue
            try:
                written = self.kube.put_trust_bundle(want, seen.get(name))
            except ApiError as err:
                if err.status != 409:
                    raise
                self.queues[td].add_after(("publish", td), 0.2)  # the watch will catch up
                return
            with self._lock:
                self._seen[name] = written
            log.info("published %s's roots in ClusterTrustBundle %s", td, name)

    def prune(self) -> None:
        """Remove the bundles of domains no longer configured."""
        with self._lock:
            seen = dict(self._seen)
        # A configured domain's bundles: its name, and its twins (`domains.desired`) after it.
        bases = [domains.bundle_name(self.config.signer_name, d) for d in self.domains]
        for other, obj in seen.items():
            labels = (obj.get("metadata") or {}).get("labels") or {}
            wanted = any(other == base or other.startswith(f"{base}:") for base in bases)
            if not wanted and labels.get(domains.FEDERATED_LABEL) == "true":
                self.kube.delete_trust_bundle(other)
                log.info("removed ClusterTrustBundle %s (no longer federated)", other)


def _managed() -> dict[str, Any]:
    return dict(trustbundles.MANAGED_BY)
