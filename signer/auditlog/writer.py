"""The signer's tamper-evident audit log: one JSON line per decision, hash-chained and checkpointed.

Why it exists: whoever can read a signer's audit trail must be able to tell whether it is the trail
the signer wrote. Each line carries the SHA-256 of the line before it, so removing or editing a line
breaks the chain at that point; signed checkpoints (JWTs whose x5c chains to the trust roots) show a
rewrite of the whole file.

This module is the writer (`AuditLog`), which does file I/O. The line format and the pure readers
(`verify`, `iter_entries`) live in `podcert.auditlog`, so auditors read the log without depending on
the signer; they are re-exported here for the signer's own code and tests.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import fcntl
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Literal

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from podcert.auditlog import (
    CHECKPOINT_ALGORITHM,
    FORMAT,
    GENESIS,
    AuditLogError,
    Decision,
    Entry,
    Line,
    NewerFormatLine,
    Verification,
    encode_line,
    entry_fields,
    iter_entries,
    line_hash,
    parse_line,
    verify,
)
from podcert.persisted import FormatTooNew, check_readable, format_number

__all__ = [
    "DEFAULT_CHECKPOINT_EVERY",
    "GENESIS",
    "AuditLog",
    "AuditLogError",
    "Decision",
    "Entry",
    "FsyncPolicy",
    "Verification",
    "iter_entries",
    "verify",
]

logger = logging.getLogger(__name__)

# When appended lines reach the disk: after every line, after every checkpoint (and at close), or
# whenever the kernel decides. Every line is handed to the kernel by its own os.write either way,
# and an `issued` entry is always on disk before `append` returns (see `append`), whatever the
# policy: the log must hold every certificate that exists.
FsyncPolicy = Literal["always", "checkpoint", "never"]

# A signed checkpoint after this many entries unless told otherwise (--audit-checkpoint-every).
DEFAULT_CHECKPOINT_EVERY: Final = 1000


# --- writing -----------------------------------------------------------------------------------


def _check_signer(key: ec.EllipticCurvePrivateKey, chain: Sequence[x509.Certificate]) -> None:
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ValueError("the audit key must be an ECDSA P-256 private key (ES256)")
    if not chain:
        raise ValueError("the audit certificate chain is empty")
    if chain[0].public_key() != key.public_key():
        raise ValueError("the first certificate of the chain is not the audit key's certificate")


class AuditLog:
    """An append-only audit log file, continued across restarts. Safe to share between threads.

    Opening takes an exclusive flock on the file, so two writers can never fork one chain.
    A file whose last line is in a newer format than this release writes (`FORMAT`) is refused
    with FormatTooNew before anything is written to it, a torn tail included.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
        fsync: FsyncPolicy = "checkpoint",
    ) -> None:
        if checkpoint_every < 1:
            raise ValueError("checkpoint_every must be at least 1")
        self.path = Path(path)
        self.checkpoint_every = checkpoint_every
        self.fsync: FsyncPolicy = fsync
        # Set when opening had to cut away a torn final line (a crash mid-write); also logged.
        self.recovery_warning: str | None = None
        self._lock = threading.Lock()
        # Group commit: one fsync covers every line written before it, so concurrent issuers
        # share fsyncs instead of queueing for one each. `_synced` is the size known durable.
        self._sync_lock = threading.Lock()
        self._synced = 0
        # Bumped whenever unsynced lines are cut away after a failed fsync: a caller whose line
        # was written before the cut must not take a later fsync as its own.
        self._epoch = 0
        self._signer: tuple[ec.EllipticCurvePrivateKey, tuple[x509.Certificate, ...]] | None = None
        self._fd = self._open()
        try:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise AuditLogError(
                    None, f"audit log {self.path} is open by another writer"
                ) from None
            self._size, self._seq, self._head, self._unsigned = self._recover()
            self._synced = self._size
            self._checkpoints = self._last_checkpoint_number()
        except BaseException:
            os.close(self._fd)
            raise

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_APPEND | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return os.open(self.path, flags)
        # Exactly 0600 whatever the umask, and make the new directory entry durable.
        os.fchmod(fd, 0o600)
        dir_fd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return fd

    def _recover(self) -> tuple[int, int, str, int]:
        """(size, lines, head hash, unsigned lines) from the file's last complete line."""
        size = os.fstat(self._fd).st_size
        if size == 0:
            return 0, 0, GENESIS, 0
        # Read backwards until the window holds the last line and the newline before it.
        window = 8192
        while True:
            start = max(0, size - window)
            data = os.pread(self._fd, size - start, start)
            if data.count(b"\n") >= 2 or start == 0:
                break
            window *= 2
        end = data.rfind(b"\n") + 1  # just past the last newline; 0 when there is none
        last = data[data.rfind(b"\n", 0, end - 1) + 1 : end - 1] if end else b""
        line = self._last_line(last) if last else None
        if end < len(data):
            # Lines are written whole with their newline, so bytes after the last newline are the
            # remains of a write a crash interrupted: the append() that made them never returned.
            torn = len(data) - end
            os.ftruncate(self._fd, start + end)
            os.fsync(self._fd)
            self.recovery_warning = (
                f"audit log {self.path}: cut {torn} byte(s) of a torn final line; "
                "the chain continues from the last complete line"
            )
            logger.warning("%s", self.recovery_warning)
            size = start + end
            if end == 0 and start == 0:
                return 0, 0, GENESIS, 0
        assert line is not None  # a complete last line exists when `end` > 0
        unsigned = 0 if line.kind == "checkpoint" else 1  # "some": the exact count is not needed
        return size, line.seq, line_hash(last), unsigned

    def _last_line(self, last: bytes) -> Line:
        """The file's last complete line, parsed; raises (touching nothing) when it is in a newer
        format or is no audit line at all."""
        what = f"audit log {self.path}"
        try:
            line = parse_line(last)
            if line.kind == "checkpoint":
                claims = jwt.decode(str(line.body.get("jwt")), options={"verify_signature": False})
                check_readable(format_number(claims.get("format"), what), FORMAT, what)
        except NewerFormatLine as err:
            raise FormatTooNew(what, err.found, FORMAT) from None
        except (ValueError, jwt.PyJWTError) as err:  # FormatUnreadable is a ValueError
            # A complete but unreadable last line is damage, not a torn write: refuse to chain a
            # new line onto it and leave the file as it is for a human to look at.
            raise AuditLogError(
                None, f"{what}: the last line is not an audit line: {err}"
            ) from None
        return line

    def _last_checkpoint_number(self) -> int:
        """The `n` of the file's last checkpoint (0 when it has none), read backwards from the
        end: checkpoints are numbered 1, 2, 3... in the file, across restarts."""
        end = self._size
        tail = b""
        while end > 0:
            start = max(0, end - 65536)
            tail = os.pread(self._fd, end - start, start) + tail
            lines = tail.split(b"\n")
            # The first piece may be the end of a line that starts in an earlier block.
            complete, tail = (lines, b"") if start == 0 else (lines[1:], lines[0])
            for raw in reversed(complete):
                if b'"kind":"checkpoint"' not in raw:
                    continue
                try:
                    line = parse_line(raw)
                    claims = jwt.decode(
                        str(line.body.get("jwt")), options={"verify_signature": False}
                    )
                except (ValueError, KeyError, jwt.PyJWTError):
                    continue
                number = claims.get("n")
                return number if isinstance(number, int) and number > 0 else 0
            end = start
        return 0

    @property
    def checkpoints(self) -> int:
        """The number of the last checkpoint written (0 before the first): monotonic, exported
        as a metric so that an auditor can tell a log cut back to an earlier checkpoint."""
        with self._lock:
            return self._checkpoints

    @property
    def head(self) -> str:
        """The hash of the last line written (GENESIS for an empty log)."""
        with self._lock:
            return self._head

    @property
    def lines(self) -> int:
        with self._lock:
            return self._seq

    def set_checkpoint_signer(
        self, key: ec.EllipticCurvePrivateKey, chain: Sequence[x509.Certificate]
    ) -> None:
        """Make `append` write a checkpoint after every `checkpoint_every` entries."""
        _check_signer(key, chain)
        with self._lock:
            self._signer = (key, tuple(chain))

    def append(self, entry: Entry) -> str:
        """Append one decision; returns the hash of its line (the new head).

        An `issued` entry is durable (written and fsynced) when this returns, so a caller that
        writes the certificate only afterwards never hands out one the log could lose. Raises
        OSError (e.g. ENOSPC) when it cannot be: the line is then not in the log either.
        """
        line = {"kind": "entry", **entry_fields(entry)}
        durable = self.fsync == "always" or entry.decision == "issued"
        with self._lock:
            digest = self._write(line, sync=False)
            self._unsigned += 1
            if self._signer is not None and self._unsigned >= self.checkpoint_every:
                # Stamped with the decision's time: the log itself never reads a clock.
                self._checkpoint(*self._signer, entry.time)
            written, epoch = self._size, self._epoch
        if durable:
            self._sync_to(written, epoch)
        return digest

    def _sync_to(self, size: int, epoch: int) -> None:
        """Make the file durable up to `size` bytes, sharing one fsync among concurrent callers."""
        with self._sync_lock:
            with self._lock:
                if self._epoch != epoch:
                    raise OSError(f"audit log {self.path}: an fsync failed; the line was cut")
                if self._synced >= size:
                    return  # another caller's fsync, begun after our write, covered it
                if self._fd < 0:
                    raise ValueError(f"audit log {self.path} is closed")
                fd, target = self._fd, self._size
            try:
                os.fsync(fd)
            except OSError:
                with self._lock:
                    self._rollback_unsynced()
                raise
            with self._lock:
                self._synced = max(self._synced, target)

    def _rollback_unsynced(self) -> None:
        """After a failed fsync nothing since the last good one can be trusted to be on disk:
        cut the file back to it, so the log never holds lines whose fate the kernel lost."""
        if self._size == self._synced:
            return
        self._epoch += 1
        os.ftruncate(self._fd, self._synced)
        self._size, self._seq, self._head, self._unsigned = self._recover()
        self._checkpoints = self._last_checkpoint_number()

    def checkpoint(
        self,
        signing_key: ec.EllipticCurvePrivateKey,
        chain: Sequence[x509.Certificate],
        now: dt.datetime,
        *,
        force: bool = False,
    ) -> str | None:
        """Sign the current head (at start, on a timer and at shutdown); returns the checkpoint
        line's hash.

        Does nothing and returns None when no line was appended since the last checkpoint, so an
        idle signer's timer does not grow the log; `force` writes one anyway (a signer opening
        its log checkpoints at once, so even a log with no entries is vouched for).
        """
        _check_signer(signing_key, chain)
        if now.utcoffset() is None:
            raise ValueError("now must be timezone-aware")
        with self._lock:
            if self._unsigned == 0 and not force:
                return None
            return self._checkpoint(signing_key, tuple(chain), now)

    def _checkpoint(
        self,
        key: ec.EllipticCurvePrivateKey,
        chain: tuple[x509.Certificate, ...],
        now: dt.datetime,
    ) -> str:
        claims = {
            "head": self._head,
            "lines": self._seq,
            "n": self._checkpoints + 1,
            "iat": int(now.timestamp()),
            "format": FORMAT,
        }
        # RFC 7515 x5c: standard (not URL-safe) base64 of each DER certificate, leaf first.
        x5c = [
            base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode("ascii")
            for cert in chain
        ]
        token = jwt.encode(claims, key, algorithm=CHECKPOINT_ALGORITHM, headers={"x5c": x5c})
        digest = self._write({"kind": "checkpoint", "jwt": token}, sync=self.fsync != "never")
        self._unsigned = 0
        self._checkpoints += 1
        return digest

    def _write(self, body: dict[str, object], *, sync: bool) -> str:
        if self._fd < 0:
            raise ValueError(f"audit log {self.path} is closed")
        line = encode_line({"seq": self._seq + 1, "prev": self._head, **body})
        data = line + b"\n"
        try:
            # One write on an O_APPEND fd: the line lands whole after the previous one.
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")
            if sync:
                os.fsync(self._fd)
                self._synced = max(self._synced, self._size + len(data))
        except OSError:
            # Never leave half a line for the next one to be chained onto.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)
        self._seq += 1
        self._head = line_hash(line)
        return self._head

    def close(self) -> None:
        """Flush to disk (unless fsync="never") and release the file. Idempotent."""
        with self._lock:
            if self._fd < 0:
                return
            try:
                if self.fsync != "never":
                    os.fsync(self._fd)
            finally:
                os.close(self._fd)  # also drops the flock
                self._fd = -1

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
