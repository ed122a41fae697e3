"""A client certificate and key named as files, followed as they are replaced.

The kubelet renews its own client certificate (`kubelet-client-current.pem`, one file holding
certificate and key, or two) well before it expires, and client-go follows: when a kubeconfig
names both as files, it reads them again at most once a second as connections are made
(k8s.io/client-go/transport/cert_rotation.go, `dynamicClientCert`, and transport.go's caching
loader). A client that kept the first pair would be refused (401) by every call once it expires.

What `CertFiles` guarantees:
- The files are read again at most once every `REREAD_PERIOD` seconds, and only when a
  connection is about to be made or reused: an idle client reads nothing.
- A pair whose bytes changed is loaded into a new `ssl.SSLContext` with a new generation; new
  connections present it, and a kept-alive connection made with an older pair is closed instead
  of reused once its request ends (`podcert.client.transport.Pool`). Requests and watches already on
  such a connection finish on it (client-go closes them all at once; a watch ends within its
  timeout anyway, and its answer already came).
- A pair that does not load (a half-written file, a key that does not match the certificate,
  a file gone for a moment) keeps the previous pair and logs one line naming the files and why,
  never their bytes. The same bytes are not tried again; the next change is.

The decision is pure (`due`, `judge`); `CertFiles` applies it to the files.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final, Literal

from podcert.errors import ConfigError

log = logging.getLogger("podcert.kubeconfig")

REREAD_PERIOD: Final = 1.0  # client-go's caching loader: at most once a second


@dataclass(frozen=True)
class Seen:
    """What is known of the files: when they were last read (monotonic seconds), the digest of
    the pair in use, and that of the last pair that would not load."""

    checked_at: float
    loaded: bytes
    refused: bytes | None = None


def due(seen: Seen, now: float, period: float = REREAD_PERIOD) -> bool:
    """Whether the files may be read again."""
    return now - seen.checked_at >= period


Verdict = Literal["same", "load", "refused before"]


def judge(seen: Seen, digest: bytes) -> Verdict:
    """What to do with the pair just read, by its digest: nothing when it is the pair in use or
    one that already failed to load; else try it."""
    if digest == seen.loaded:
        return "same"
    if digest == seen.refused:
        return "refused before"
    return "load"


def digest_of(cert: bytes, key: bytes) -> bytes:
    return hashlib.sha256(b"%d:" % len(cert) + cert + key).digest()


def subject_of(cert_pem: bytes) -> str:
    """The first certificate's subject (RFC 4514), for messages; "" when it does not parse."""
    from cryptography import x509  # a few hundredths of a second, for clients that use it only

    start = cert_pem.find(b"-----BEGIN CERTIFICATE-----")  # a key may come first in the file
    try:
        return x509.load_pem_x509_certificate(cert_pem[max(start, 0) :]).subject.rfc4514_string()
    except ValueError:
        return ""


class CertFiles:
    """The current TLS context for a client certificate and key read from files.

    `read(path, what)` returns a file's bytes or raises `ConfigError`; `build(cert, key)` returns
    a client context holding them or raises `ConfigError` saying why (no bytes in it). The
    first pair must load: a kubeconfig whose files are unusable is refused at start."""

    def __init__(
        self,
        cert: Path,
        key: Path,
        read: Callable[[Path, str], bytes],
        build: Callable[[bytes, bytes], ssl.SSLContext],
        *,
        period: float = REREAD_PERIOD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cert, self.key = cert, key
        self._read, self._build, self.period, self.clock = read, build, period, clock
        cert_pem, key_pem = self._pair()
        self._current = (0, build(cert_pem, key_pem))  # (generation, context): one read
        self._subject = subject_of(cert_pem)
        self._seen = Seen(clock(), digest_of(cert_pem, key_pem))
        self._lock = threading.Lock()

    @property
    def files(self) -> str:
        same = self.cert == self.key
        return str(self.cert) if same else f"{self.cert} and {self.key}"

    @property
    def identity(self) -> str:
        """The certificate in use, for messages: its subject and where it is read from."""
        return f"client certificate {self._subject or '(no subject)'} from {self.files}"

    def current(self) -> tuple[int, ssl.SSLContext]:
        """(generation, context) for a new connection; the files read again when due."""
        if not due(self._seen, self.clock(), self.period):
            return self._current
        with self._lock:
            now = self.clock()
            if due(self._seen, now, self.period):
                self._look(now)
            return self._current

    def _pair(self) -> tuple[bytes, bytes]:
        cert = self._read(self.cert, "client-certificate")
        key = cert if self.key == self.cert else self._read(self.key, "client-key")
        if not cert.endswith(b"\n"):
            cert += b"\n"  # two files joined into one PEM: no block may run into the next
        return cert, key

    def _look(self, now: float) -> None:
        seen = replace(self._seen, checked_at=now)
        try:
            cert, key = self._pair()
        except ConfigError as err:
            self._seen = self._refuse(seen, hashlib.sha256(str(err).encode()).digest(), err)
            return
        digest = digest_of(cert, key)
        if judge(seen, digest) != "load":
            self._seen = seen
            return
        try:
            context = self._build(cert, key)
        except ConfigError as err:
            self._seen = self._refuse(seen, digest, err)
            return
        self._current, self._subject = (self._current[0] + 1, context), subject_of(cert)
        self._seen = replace(seen, loaded=digest, refused=None)
        log.info(
            "client certificate from %s replaced: now %s; new connections present it",
            self.files,
            self._subject or "(no subject)",
        )

    def _refuse(self, seen: Seen, digest: bytes, err: ConfigError) -> Seen:
        if digest != seen.refused:
            log.warning(
                "keeping the client certificate in use (%s): the one in %s does not load: %s",
                self._subject or "(no subject)",
                self.files,
                err,
            )
        return replace(seen, refused=digest)


@contextlib.contextmanager
def memory_file(data: bytes) -> Iterator[str]:
    """A file name from which `data` can be read until the block ends, then gone."""
    memfd = getattr(os, "memfd_create", None)
    path = ""
    if memfd is not None and Path("/proc/self/fd").is_dir():
        fd = memfd("podcert-client", os.MFD_CLOEXEC)
        name = f"/proc/self/fd/{fd}"
    else:
        fd, path = tempfile.mkstemp(prefix="podcert-client-")  # mode 0600
        name = path
    try:
        os.write(fd, data)
        yield name
    finally:
        os.close(fd)
        if path:
            Path(path).unlink(missing_ok=True)
