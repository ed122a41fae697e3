"""Hot-reloading TLS material for a consuming application: always a current `ssl.SSLContext`.

The kubelet (or our shim) replaces the credential and trust bundle files in place through an
atomic `..data` symlink swap, and the separate key/chain files can even be read mid-rotation. This
source re-reads the files by content (sha256), validates new material completely (key matches
leaf, chain leads to a root of the trust bundle at `now`, usages and path lengths a peer checks:
`bundles.handshake.check_usable`), and only then swaps in fresh server and client contexts with
one assignment. Anything half-written or inconsistent is never served: the
previous contexts stay, and the failure is kept in `last_error`.

Peers are authorized inside the handshake (`bundles.handshake`): `server_context(authorizer)` and
`client_context(authorizer)` hand out contexts that refuse, before a byte of application data,
a peer whose chain or SPIFFE ID `authorizer` does not allow, and a federated trust domain's root
vouches only for that domain's IDs. Contexts are cached per authorizer and per material, so pass
the same authorizer object each time (aiohttp keys its connection pool by the context).

Rotation semantics: open connections keep the context they were made with; new handshakes use the
new one (a server listens once with `server_context(...)`, whose `sni_callback` moves every new
handshake onto the newest material). inotify (watchfiles) only wakes the watcher (`watch()`, or
`bundles.refresher.Refresher`'s thread) early; the content re-check every `interval` seconds is
what guarantees that the source converges.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import logging
import os
import ssl
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from bundles.authz import Authorizer, Verdict, authorize_peer_chain
from bundles.formats import (
    MAX_BUNDLE_BYTES,
    BundleError,
    Credential,
    PemMaterial,
    TrustBundle,
    describe,
    load_credential,
    load_credential_files,
    load_trust_bundle,
    pem_material,
)
from bundles.handshake import (
    SERVER_SIDES,
    PeerCheck,
    RefusalHook,
    Side,
    build_contexts,
    check_of,
    check_usable,
    load_contexts,
    verified_chain,
)
from bundles.spiffe import CertificateIdError

if TYPE_CHECKING:
    # Only the async watch uses asyncio, and its caller has it loaded: the shim and the audit
    # import bundles for its formats and skip it.
    import asyncio

log = logging.getLogger(__name__)

Clock = Callable[[], dt.datetime]  # returns an aware datetime
Subscriber = Callable[[Credential], None]
StrPath = str | os.PathLike[str]

DEFAULT_INTERVAL: Final = 2.0  # seconds between content re-checks when no inotify event comes
_DEBOUNCE_MS: Final = 300  # the atomic writer finishes in well under this
_MAX_CONTEXTS: Final = 32  # (side, authorizer, hook) kinds kept per material, oldest dropped

__all__ = ["SourceError", "StrPath", "TLSSource", "build_contexts", "verified_chain"]

_ContextKey = tuple[Side, Authorizer, RefusalHook | None]


class SourceError(Exception):
    """The first load found no usable TLS material; `__cause__` says why."""


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass(frozen=True)
class _Material:
    """Everything one successful load produced; swapped in as a whole, never field by field."""

    digests: tuple[bytes, ...]
    credential: Credential
    trust_bundle: TrustBundle
    everything: TrustBundle  # our roots, then the federated ones: what a context trusts
    trusted: Mapping[bytes, str | None]  # each of those (DER) -> its federated domain, or None
    # Contexts made from this material, by kind; filled as they are asked for.
    contexts: dict[_ContextKey, ssl.SSLContext] = field(default_factory=dict)


class TLSSource:
    """Server and client SSL contexts built from the last good credential and trust bundle.

    `credential` is the path of a credential bundle (key + chain in one file, one atomic read),
    or a `(key_path, chain_path)` pair. The first load happens here and raises SourceError if it
    fails: without material there is nothing to serve. Thread-safe: `refresh()` may run in a
    worker thread while the event loop calls `server_context()`.
    """

    def __init__(
        self,
        credential: StrPath | tuple[StrPath, StrPath],
        trust_bundle: StrPath,
        *,
        federated: Mapping[str, StrPath] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._split = isinstance(credential, tuple)
        credential_paths = credential if isinstance(credential, tuple) else (credential,)
        # Federated trust domains' bundles (trust domain -> file): trusted for that domain's
        # IDs only, which every handshake enforces.
        self._federated = tuple(sorted((federated or {}).items()))
        federated_paths = tuple(path for _, path in self._federated)
        self._paths = tuple(Path(p) for p in (*credential_paths, trust_bundle, *federated_paths))
        self._clock = clock or _utc_now
        self._lock = threading.Lock()
        self._contexts_lock = threading.Lock()
        self._wanted: dict[_ContextKey, None] = {}  # kinds asked for, oldest first
        # Every context made here -> the credential it presents, for as long as it lives.
        self._presents: weakref.WeakKeyDictionary[ssl.SSLContext, Credential] = (
            weakref.WeakKeyDictionary()
        )
        self._subscribers: list[Subscriber] = []
        self._last_error: Exception | None = None
        try:
            self._material = self._build(*self._read())
        except (OSError, ValueError) as exc:
            files = ", ".join(str(p) for p in self._paths)
            raise SourceError(f"no usable TLS material in {files}: {exc}") from exc
        self._trusted_ever: Mapping[bytes, str | None] = self._material.trusted

    # --- what consumers use -------------------------------------------------------------------

    def server_context(
        self,
        authorizer: Authorizer,
        *,
        on_refusal: RefusalHook | None = None,
        client_certificate: Literal["required", "optional"] = "required",
    ) -> ssl.SSLContext:
        """For `ssl=` of a server: requires a client certificate, and refuses inside the
        handshake a client `authorizer` does not allow (`on_refusal(verdict)` hears of it).

        Listen with it once: its `sni_callback` moves each new handshake onto the newest
        material (certificate, key and trusted roots), so a server follows rotation. Setting
        another `sni_callback` on it, or listening with a context of your own, forfeits that.

        `client_certificate="optional"` is for a probe port (kubelet HTTPS probes present no
        certificate): a client presenting one is judged as above, one presenting none gets
        through unauthenticated. Anyone who reaches that port may then send requests: serve
        there only what anyone may see (health answers). docs/stacks/README.md says more.
        """
        if client_certificate not in ("required", "optional"):
            raise ValueError("client_certificate must be 'required' or 'optional'")
        side: Side = "probe" if client_certificate == "optional" else "server"
        return self._context(side, authorizer, on_refusal)

    def client_context(
        self,
        authorizer: Authorizer,
        *,
        on_refusal: RefusalHook | None = None,
        check_hostname: bool = False,
    ) -> ssl.SSLContext:
        """For `ssl=` of a client: verifies the server's chain (not its hostname: a pod
        certificate names a workload) and refuses inside the handshake a server `authorizer`
        does not allow, before a byte of the request is sent.

        `check_hostname=True` also requires the server's certificate to name the host dialled
        (a DNS SAN: the signer's policy must turn DNS names on); the SPIFFE ID is still judged.

        Ask again for each new connection (or request): after a rotation it is a new context.
        """
        side: Side = "client+hostname" if check_hostname else "client"
        return self._context(side, authorizer, on_refusal)

    @property
    def credential(self) -> Credential:
        return self._material.credential

    @property
    def trust_domain(self) -> str | None:
        """The trust domain of our own SPIFFE ID (the local one), or None if the leaf has none."""
        try:
            return self._material.credential.spiffe_id.trust_domain
        except CertificateIdError:
            return None

    @property
    def trust_bundle(self) -> TrustBundle:
        return self._material.trust_bundle

    def pem(self) -> PemMaterial:
        """The current material as PEM, for stacks that take bytes, not contexts (grpcio); its
        repr never shows the key. A stack trusting `all_roots` lets a federated root vouch for
        any ID unless it judges the peer with `authorize` too."""
        material = self._material
        return pem_material(material.credential, material.trust_bundle, material.everything)

    @property
    def last_error(self) -> Exception | None:
        """Why the latest refresh rejected what it read; None once the files are good again."""
        return self._last_error

    def credential_of(self, context: ssl.SSLContext) -> Credential | None:
        """The credential a context from this source presents (e.g. `ssl_object.context` of a
        served connection, however many rotations ago it was made), else None."""
        return self._presents.get(context)

    def authorize(self, connection: object, authorizer: Authorizer) -> Verdict:
        """Judge the peer of a finished handshake again, e.g. with a stricter authorizer.

        `connection` is an `ssl.SSLSocket`, an `ssl.SSLObject`, or the `_ssl` object under
        either (httpx's sync `ssl_object`). A peer vouched for by a federated trust domain's
        root must be of that trust domain; a chain ending at a root this source never trusted
        is refused.
        """
        if connection is None:
            return Verdict(False, "The connection is not TLS.")
        check = check_of(getattr(connection, "context", None))
        trusted = check.trusted if check is not None else self._trusted_ever
        return authorize_peer_chain(verified_chain(connection), trusted, authorizer)

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call `callback(credential)` after each successful swap; returns an unsubscribe function.

        Callbacks run in the thread that swapped: the caller of `refresh()`, or the event loop
        for `watch()`. A failing callback is logged and does not stop the others.
        """
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._subscribers.remove(callback)

        return unsubscribe

    def refresh(self) -> bool:
        """Re-read the files; swap in new contexts if the content changed and is valid.

        Returns True when new material was swapped in. Blocking (file I/O): from async code use
        `watch()`, or `asyncio.to_thread(source.refresh)`.
        """
        material = self._reload()
        if material is None:
            return False
        self._notify(material.credential)
        return True

    async def watch(self, stop_event: asyncio.Event, *, interval: float = DEFAULT_INTERVAL) -> None:
        """Keep the contexts current until `stop_event` is set.

        Re-checks by content every `interval` seconds, and as soon as inotify reports a change in
        a parent directory (the atomic writer renames `..data` there; the files themselves are
        symlinks, so watching them would miss the swap). Without watchfiles, or if watching fails,
        it only polls.
        """
        if interval <= 0:
            raise ValueError("interval must be positive")
        await self._refresh_off_loop()
        if not await self._watch_inotify(stop_event, interval):
            await self._poll(stop_event, interval)

    # --- loading --------------------------------------------------------------------------------

    def _read(self) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
        contents = tuple(_read_capped(path) for path in self._paths)
        return contents, tuple(hashlib.sha256(content).digest() for content in contents)

    def _build(self, contents: tuple[bytes, ...], digests: tuple[bytes, ...]) -> _Material:
        if self._split:
            credential = load_credential_files(contents[0], contents[1])
        else:
            credential = load_credential(contents[0])
        first_federated = len(contents) - len(self._federated)
        trust_bundle = load_trust_bundle(contents[first_federated - 1])
        check_usable(credential, trust_bundle, self._clock())
        trusted: dict[bytes, str | None] = {
            r.public_bytes(serialization.Encoding.DER): None for r in trust_bundle.roots
        }
        listed: dict[bytes, tuple[x509.Certificate, list[str]]] = {}
        for (trust_domain, path), data in zip(
            self._federated, contents[first_federated:], strict=True
        ):
            try:
                roots = load_trust_bundle(data).roots
            except ValueError as exc:
                raise BundleError(f"federated trust bundle {path} ({trust_domain}): {exc}") from exc
            for root in roots:
                der = root.public_bytes(serialization.Encoding.DER)
                if der not in trusted:  # our own roots stay ours
                    listed.setdefault(der, (root, []))[1].append(trust_domain)
        everything = list(trust_bundle.roots)
        for der, (root, domains) in listed.items():
            if len(domains) > 1:
                # One owner per federated root: which of the domains listing it may vouch with
                # it is unknowable here, so it vouches for none (their other roots still do).
                log.warning(
                    "federated root %s (SHA-256 %s) is listed by %s: trusted for none of them",
                    root.subject.rfc4514_string(),
                    root.fingerprint(hashes.SHA256()).hex(),
                    " and ".join(domains),
                )
                continue
            trusted[der] = domains[0]
            everything.append(root)
        material = _Material(
            digests, credential, trust_bundle, TrustBundle(tuple(everything)), trusted
        )
        # Every kind of context asked for so far is made now, off the caller's thread; with
        # none yet, one plain context proves OpenSSL takes the material.
        with self._contexts_lock:
            kinds = list(self._wanted)
            if kinds:
                material.contexts.update(zip(kinds, self._load(material, kinds), strict=True))
            else:
                load_contexts(credential, material.everything, [("server", None)])
        return material

    def _load(self, material: _Material, kinds: list[_ContextKey]) -> list[ssl.SSLContext]:
        wanted = [
            (side, PeerCheck(material.trusted, authorizer, on_refusal, side == "probe"))
            for side, authorizer, on_refusal in kinds
        ]
        contexts = load_contexts(material.credential, material.everything, wanted)
        for kind, context in zip(kinds, contexts, strict=True):
            self._presents[context] = material.credential
            if kind[0] in SERVER_SIDES:
                context.sni_callback = _follow(self, kind)
        return contexts

    def _context(
        self, side: Side, authorizer: Authorizer, on_refusal: RefusalHook | None
    ) -> ssl.SSLContext:
        kind: _ContextKey = (side, authorizer, on_refusal)
        material = self._material
        context = material.contexts.get(kind)
        if context is not None:
            return context
        with self._contexts_lock:
            self._wanted.pop(kind, None)
            self._wanted[kind] = None
            while len(self._wanted) > _MAX_CONTEXTS:
                del self._wanted[next(iter(self._wanted))]
            context = material.contexts.get(kind)
            if context is None:
                (context,) = self._load(material, [kind])
                material.contexts[kind] = context
                while len(material.contexts) > _MAX_CONTEXTS:
                    del material.contexts[next(iter(material.contexts))]
        return context

    def _reload(self) -> _Material | None:
        """Swap in new material if the files changed and are valid; the new material or None."""
        with self._lock:
            try:
                contents, digests = self._read()
                if digests == self._material.digests:
                    # Back to (or still at) what is served, e.g. after a torn read was retried.
                    self._last_error = None
                    return None
                material = self._build(contents, digests)
            except (OSError, ValueError) as exc:  # BundleError and ssl.SSLError included
                # Content that failed is re-validated on every refresh, not remembered as bad:
                # a leaf rejected as "not yet valid" (clock skew) becomes good later.
                if str(exc) != str(self._last_error):
                    log.warning("keeping the previous TLS material: %s", exc)
                self._last_error = exc
                return None
            except Exception as exc:
                # A bug, not bad input; still, a long-running watcher must keep serving.
                log.exception("keeping the previous TLS material after an unexpected error")
                self._last_error = exc
                return None
            # Connections made with the previous material are still judged against its roots.
            self._trusted_ever = {**self._material.trusted, **material.trusted}
            self._material = material  # one assignment: readers see old or new, never a mix
            self._last_error = None
        log.info(
            "new TLS material: leaf %s, valid until %s",
            describe(material.credential.leaf),
            material.credential.not_after.isoformat(),
        )
        return material

    def _notify(self, credential: Credential) -> None:
        for callback in list(self._subscribers):
            try:
                callback(credential)
            except Exception:
                log.exception("TLS source subscriber %r failed", callback)

    # --- watching -------------------------------------------------------------------------------

    async def _refresh_off_loop(self) -> None:
        import asyncio

        # Reading files and building contexts block; the swap notification runs on the loop.
        material = await asyncio.to_thread(self._reload)
        if material is not None:
            self._notify(material.credential)

    async def _watch_inotify(self, stop_event: asyncio.Event, interval: float) -> bool:
        """Refresh on each change or quiet `interval`; False if watching is unavailable."""
        try:
            from watchfiles import awatch  # optional: polling alone also converges
        except ImportError:
            log.info("watchfiles is not installed; polling every %ss", interval)
            return False
        # Parents of the paths as given, not resolved: the resolved directory is the timestamped
        # one the atomic writer deletes on the next rotation.
        directories = list(dict.fromkeys(path.absolute().parent for path in self._paths))
        halt = _Halt(stop_event)
        try:
            changes = awatch(
                *directories,
                watch_filter=None,
                stop_event=halt,
                rust_timeout=max(1, round(interval * 1000)),
                yield_on_timeout=True,  # an empty set each quiet interval drives the re-check
                debounce=_DEBOUNCE_MS,
                recursive=False,
            )
            async with contextlib.aclosing(changes):
                async for _ in changes:
                    if stop_event.is_set():
                        break
                    await self._refresh_off_loop()
        except Exception as exc:  # inotify limits, a vanished directory, ...
            log.warning("watching %s failed (%s); polling every %ss", directories, exc, interval)
            return stop_event.is_set()
        finally:
            halt.set()  # lets the watcher thread end even if we leave by cancellation
        return True

    async def _poll(self, stop_event: asyncio.Event, interval: float) -> None:
        import asyncio

        while not stop_event.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await stop_event.wait()
            if not stop_event.is_set():
                await self._refresh_off_loop()


class _Halt:
    """The stop signal handed to watchfiles, set by the caller's event or by us: awatch sets
    the event it is given when cancelled, and the caller's may be shared with other tasks."""

    def __init__(self, outer: asyncio.Event) -> None:
        self._outer = outer
        self._own = False

    def is_set(self) -> bool:
        return self._own or self._outer.is_set()

    def set(self) -> None:
        self._own = True


def _read_capped(path: Path) -> bytes:
    # One read of at most the cap (+1 so the parser reports the size): a huge or endless file
    # (a FIFO, /dev/zero) cannot exhaust memory.
    with path.open("rb") as file:
        return file.read(MAX_BUNDLE_BYTES + 1)


def _follow(source: TLSSource, kind: _ContextKey) -> Callable[[Any, str | None, Any], None]:
    """A server context's sni_callback (OpenSSL calls it on every ClientHello, with or without
    SNI): moves the handshake onto the newest material's context of the same kind. Holds the
    source weakly, so a context kept by a listener does not keep a dropped source alive."""
    ref = weakref.ref(source)

    def select(connection: Any, server_name: str | None, context: Any) -> None:
        current = ref()
        if current is not None:
            newest = current._context(*kind)
            if connection.context is not newest:
                connection.context = newest

    return select
