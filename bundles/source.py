"""Hot-reloading TLS material for a consuming application: always a current `ssl.SSLContext`.

The kubelet (or our shim) replaces the credential and trust bundle files in place through an
atomic `..data` symlink swap, and the separate key/chain files can even be read mid-rotation. This
source re-reads the files by content (sha256), validates new material completely (key matches
leaf, chain leads to a root of the trust bundle at `now`), and only then swaps in fresh server and
client contexts with one assignment. Anything half-written or inconsistent is never served: the
previous contexts stay, and the failure is kept in `last_error`.

Rotation semantics: open connections keep the context they were made with; new handshakes use the
new one. inotify (watchfiles) only wakes the watcher early; the content re-check every `interval`
seconds is what guarantees that the source converges.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import logging
import os
import secrets
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from cryptography.hazmat.primitives import serialization

from bundles.authz import Authorizer, Verdict, authorize_peer_certificate, authorize_peer_chain
from bundles.formats import (
    MAX_BUNDLE_BYTES,
    BundleError,
    Credential,
    TrustBundle,
    describe,
    dump_certificates,
    load_credential,
    load_credential_files,
    load_trust_bundle,
    verify_chain,
)

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

# Linux: the credential for load_cert_chain goes into an anonymous memory file (never on disk).
# Tests switch this off to exercise the temporary-directory fallback.
_USE_MEMFD: bool = hasattr(os, "memfd_create") and Path("/proc/self/fd").is_dir()


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
    server: ssl.SSLContext
    client: ssl.SSLContext
    federated: Mapping[bytes, str]  # a federated root (DER) -> its trust domain


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
        # IDs only, which `authorize` enforces after each handshake.
        self._federated = tuple(sorted((federated or {}).items()))
        federated_paths = tuple(path for _, path in self._federated)
        self._paths = tuple(Path(p) for p in (*credential_paths, trust_bundle, *federated_paths))
        self._anchors: Mapping[bytes, str] = {}
        self._clock = clock or _utc_now
        self._lock = threading.Lock()
        self._subscribers: list[Subscriber] = []
        self._last_error: Exception | None = None
        try:
            self._material = self._build(*self._read())
        except (OSError, ValueError) as exc:
            files = ", ".join(str(p) for p in self._paths)
            raise SourceError(f"no usable TLS material in {files}: {exc}") from exc

    # --- what consumers use -------------------------------------------------------------------

    def server_context(self) -> ssl.SSLContext:
        """For `ssl=` of a server: requires and verifies client certificates."""
        return self._material.server

    def client_context(self) -> ssl.SSLContext:
        """For `ssl=` of a client: verifies the server chain, not its hostname.

        Peer identity is the SPIFFE ID, checked with `bundles.authz` after the handshake.
        """
        return self._material.client

    @property
    def credential(self) -> Credential:
        return self._material.credential

    @property
    def trust_bundle(self) -> TrustBundle:
        return self._material.trust_bundle

    @property
    def last_error(self) -> Exception | None:
        """Why the latest refresh rejected what it read; None once the files are good again."""
        return self._last_error

    def authorize(
        self, ssl_object: ssl.SSLObject | ssl.SSLSocket | None, authorizer: Authorizer
    ) -> Verdict:
        """Who the peer of a finished handshake is, and whether `authorizer` lets it in; a
        peer vouched for by a federated trust domain's root must be of that trust domain."""
        anchors = self._anchors or self._material.federated
        if ssl_object is None:
            return Verdict(False, "The connection is not TLS.")
        if not self._federated:  # only our own roots: the leaf tells all
            return authorize_peer_certificate(ssl_object.getpeercert(binary_form=True), authorizer)
        return authorize_peer_chain(verified_chain(ssl_object), anchors, authorizer)

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
        verify_chain(credential, trust_bundle, self._clock())
        own = {r.public_bytes(serialization.Encoding.DER) for r in trust_bundle.roots}
        federated: dict[bytes, str] = {}
        everything = list(trust_bundle.roots)
        for (trust_domain, path), data in zip(
            self._federated, contents[first_federated:], strict=True
        ):
            try:
                roots = load_trust_bundle(data).roots
            except ValueError as exc:
                raise BundleError(f"federated trust bundle {path} ({trust_domain}): {exc}") from exc
            for root in roots:
                der = root.public_bytes(serialization.Encoding.DER)
                if der not in own and der not in federated:  # our own roots stay ours
                    federated[der] = trust_domain
                    everything.append(root)
        server, client = build_contexts(credential, TrustBundle(tuple(everything)))
        return _Material(digests, credential, trust_bundle, server, client, federated)

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
            # Connections made with the previous material are still authorized against it.
            self._anchors = {**self._material.federated, **material.federated}
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
    """The stop signal handed to watchfiles: set by the caller's event or by us.

    awatch sets the event it is given when it is cancelled; this keeps it from setting the
    caller's event, which may be shared with other tasks.
    """

    def __init__(self, outer: asyncio.Event) -> None:
        self._outer = outer
        self._own = False

    def is_set(self) -> bool:
        return self._own or self._outer.is_set()

    def set(self) -> None:
        self._own = True


def verified_chain(ssl_object: ssl.SSLObject | ssl.SSLSocket) -> list[bytes] | None:
    """The chain TLS verified for the peer (DER, leaf first, trust anchor last), or None.
    Public from Python 3.13; before it, the same method of the `_ssl` object underneath."""
    getter = getattr(ssl_object, "get_verified_chain", None)
    if getter is None:
        getter = getattr(getattr(ssl_object, "_sslobj", None), "get_verified_chain", None)
    if getter is None:
        return None
    chain = getter()
    # 3.13 gives DER bytes; 3.10-3.12 `_ssl.Certificate`s (2 is `_ssl.ENCODING_DER`).
    return [c if isinstance(c, bytes) else bytes(c.public_bytes(2)) for c in chain or ()]


def _read_capped(path: Path) -> bytes:
    # One read of at most the cap (+1 so the parser reports the size): a huge or endless file
    # (a FIFO, /dev/zero) cannot exhaust memory.
    with path.open("rb") as file:
        return file.read(MAX_BUNDLE_BYTES + 1)


def build_contexts(
    credential: Credential, trust_bundle: TrustBundle
) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts: TLS 1.2+ (1.3 preferred), mutual, trusting only the bundle."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    # Identity is the SPIFFE ID in a URI SAN, checked by bundles.authz; there is no hostname.
    client.check_hostname = False
    cadata = trust_bundle.der()
    # load_cert_chain reads only from a path. The key goes there encrypted under a one-time
    # password, inside a memfd (never on disk) where available, else in a 0600 file inside a
    # private 0700 temporary directory; either is gone when this block ends.
    password = secrets.token_urlsafe(32)
    key_pem = credential.key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(password.encode("ascii")),
    )
    with _transient_file(key_pem + dump_certificates(credential.chain)) as path:
        for context in (server, client):
            context.minimum_version = ssl.TLSVersion.TLSv1_2  # OpenSSL negotiates 1.3 first
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cadata=cadata)
            context.load_cert_chain(path, password=password)
    return server, client


@contextlib.contextmanager
def _transient_file(data: bytes) -> Iterator[str]:
    """A path OpenSSL can open, holding `data` only for the duration of the block."""
    if _USE_MEMFD:
        try:
            fd = os.memfd_create("podcert-credential", os.MFD_CLOEXEC)
        except OSError:  # seccomp or an old kernel: fall through to the temporary directory
            pass
        else:
            try:
                with os.fdopen(os.dup(fd), "wb") as file:
                    file.write(data)
                yield f"/proc/self/fd/{fd}"
            finally:
                os.close(fd)
            return
    with tempfile.TemporaryDirectory(prefix="podcert-") as directory:
        path = Path(directory) / "credential.pem"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        yield str(path)
