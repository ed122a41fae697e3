"""The signer's tamper-evident audit log: one JSON line per decision, hash-chained and checkpointed.

Why it exists: whoever can read a signer's audit trail must be able to tell whether it is the trail
the signer wrote. Each line carries the SHA-256 of the line before it, so removing or editing a line
breaks the chain at that point. A chain alone can be recomputed by someone who rewrites the whole
file, so the log also appends checkpoints: JWTs (ES256) signed by a dedicated audit key, attesting
the chain head and line count, with the audit key's certificate chain in the `x5c` header. A rewrite
then has to forge a signature that chains to the trust roots.

Writing (`AuditLog`) does file I/O; reading (`verify`, `iter_entries`) is pure and takes `now`, so
the audit CLI and tests run it over any sequence of lines. An `Entry` has no field that could hold
key material, and a verifier rejects lines with fields it does not know.

Line format (one JSON object per line, compact, ASCII, keys in this order):

    {"seq":1,"prev":"<64 hex>","kind":"entry","time":"2026-05-01T12:00:00Z",...}
    {"seq":2,"prev":"<64 hex>","kind":"checkpoint","jwt":"<header>.<claims>.<signature>"}

`seq` is the 1-based line number, `prev` the hex SHA-256 of the previous line's exact bytes without
its newline (64 zeros on line 1). Checkpoint claims: `head` (hash of the line before it), `lines`
(how many lines precede it) and `iat` (seconds since the epoch).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import logging
import os
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, get_args

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import verification

__all__ = [
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

Decision = Literal["issued", "denied", "failed"]
# When appended lines reach the disk: after every line, after every checkpoint (and at close), or
# whenever the kernel decides. Every line is handed to the kernel by its own os.write either way.
FsyncPolicy = Literal["always", "checkpoint", "never"]

GENESIS: Final = "0" * 64  # the `prev` of line 1
_ALGORITHM: Final = "ES256"
# How far past the verifier's `now` a checkpoint may be dated (signer and auditor clocks differ).
_MAX_CLOCK_SKEW: Final = dt.timedelta(minutes=5)
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_HEX: Final = re.compile(r"[0-9a-fA-F]+")
_FRAME_KEYS: Final = ("seq", "prev", "kind")
_CHECKPOINT_KEYS: Final = frozenset({*_FRAME_KEYS, "jwt"})


class AuditLogError(Exception):
    """A line (or the log file) is not a well-formed audit log line; `line_no` is 1-based."""

    def __init__(self, line_no: int | None, message: str) -> None:
        super().__init__(f"line {line_no}: {message}" if line_no is not None else message)
        self.line_no = line_no
        self.message = message


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One signer decision. Deliberately has no field for keys, CSRs or certificates."""

    time: dt.datetime
    namespace: str
    name: str  # the PodCertificateRequest
    uid: str
    pod: str
    node: str
    service_account: str
    decision: Decision
    reason: str
    signer_name: str
    spiffe_id: str | None = None
    serial: str | None = None  # hex, of the issued leaf
    not_before: dt.datetime | None = None
    not_after: dt.datetime | None = None

    def __post_init__(self) -> None:
        if self.decision not in get_args(Decision):
            raise ValueError(f"decision must be one of {get_args(Decision)}, not {self.decision!r}")
        if self.serial is not None and not _HEX.fullmatch(self.serial):
            raise ValueError(f"serial must be hex, not {self.serial!r}")
        for name in ("time", "not_before", "not_after"):
            value = getattr(self, name)
            if value is not None and value.utcoffset() is None:
                raise ValueError(f"{name} must be timezone-aware")


_ENTRY_FIELDS: Final = tuple(f.name for f in fields(Entry))
_ENTRY_KEYS: Final = frozenset({*_FRAME_KEYS, *_ENTRY_FIELDS})
_TIME_FIELDS: Final = frozenset({"time", "not_before", "not_after"})
_OPTIONAL_FIELDS: Final = frozenset({"spiffe_id", "serial", "not_before", "not_after"})


@dataclass(frozen=True)
class Verification:
    """What `verify` found. `ok` is false as soon as there is one problem."""

    entries: int = 0
    checkpoints: int = 0
    # Entry lines after the last valid checkpoint: chained, but not yet vouched for by a signature.
    unsigned_tail: int = 0
    # True when trust roots were given and every checkpoint (at least one) verified against them.
    anchored: bool = False
    first_broken_line: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


# --- line encoding, shared by the writer and the verifier -------------------------------------


def _hash(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


def _encode(obj: dict[str, object]) -> bytes:
    # Compact and ASCII-only, so the bytes that get hashed do not depend on any locale or encoder.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _format_time(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _parse_time(value: str, key: str) -> dt.datetime:
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{key} is not an ISO 8601 time: {value!r}") from None
    if parsed.utcoffset() is None:
        raise ValueError(f"{key} has no time zone: {value!r}")
    return parsed


def _entry_fields(entry: Entry) -> dict[str, object]:
    out: dict[str, object] = {}
    for name in _ENTRY_FIELDS:
        value = getattr(entry, name)
        out[name] = _format_time(value) if isinstance(value, dt.datetime) else value
    return out


def _entry_from_fields(obj: dict[str, Any]) -> Entry:
    values: dict[str, Any] = {}
    for name in _ENTRY_FIELDS:
        if name not in obj:
            raise ValueError(f"entry has no {name!r}")
        value = obj[name]
        if value is None and name in _OPTIONAL_FIELDS:
            values[name] = None
        elif not isinstance(value, str):
            raise ValueError(f"entry field {name!r} must be a string, not {value!r}")
        else:
            values[name] = _parse_time(value, name) if name in _TIME_FIELDS else value
    return Entry(**values)


@dataclass(frozen=True)
class _Line:
    seq: int
    prev: str
    kind: Literal["entry", "checkpoint"]
    body: dict[str, Any]


def _as_bytes(raw: bytes | str) -> bytes:
    data = raw.encode("utf-8") if isinstance(raw, str) else raw
    # Accept lines with or without their newline (file iteration keeps it, splitlines drops it).
    return data.removesuffix(b"\n")


def _parse_line(data: bytes) -> _Line:
    """The frame of one line; raises ValueError naming what is wrong."""
    if not data:
        raise ValueError("empty line")
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("not valid JSON (torn or edited line)") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    seq, prev, kind = obj.get("seq"), obj.get("prev"), obj.get("kind")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise ValueError(f"seq must be a positive integer, not {seq!r}")
    if not isinstance(prev, str) or not _HEX64.fullmatch(prev):
        raise ValueError(f"prev must be 64 lowercase hex digits, not {prev!r}")
    if kind == "entry":
        allowed = _ENTRY_KEYS
    elif kind == "checkpoint":
        allowed = _CHECKPOINT_KEYS
    else:
        raise ValueError(f"unknown kind {kind!r}")
    unknown = sorted(set(obj) - allowed)
    if unknown:
        # Also how a verifier notices anything smuggled into the log, key material included.
        raise ValueError(f"unexpected field(s) in {kind} line: {', '.join(unknown)}")
    return _Line(seq=seq, prev=prev, kind=kind, body=obj)


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
    """

    def __init__(
        self,
        path: Path | str,
        *,
        checkpoint_every: int = 1000,
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
        last = data[data.rfind(b"\n", 0, end - 1) + 1 : end - 1]
        try:
            line = _parse_line(last)
        except ValueError as err:
            # A complete but unreadable last line is damage, not a torn write: refuse to chain a
            # new line onto it and leave the file as it is for a human to look at.
            raise AuditLogError(
                None, f"audit log {self.path}: the last line is not an audit line: {err}"
            ) from None
        unsigned = 0 if line.kind == "checkpoint" else 1  # "some": the exact count is not needed
        return size, line.seq, _hash(last), unsigned

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
        """Append one decision; returns the hash of its line (the new head)."""
        line = {"kind": "entry", **_entry_fields(entry)}
        with self._lock:
            digest = self._write(line, sync=self.fsync == "always")
            self._unsigned += 1
            if self._signer is not None and self._unsigned >= self.checkpoint_every:
                # Stamped with the decision's time: the log itself never reads a clock.
                self._checkpoint(*self._signer, entry.time)
            return digest

    def checkpoint(
        self,
        signing_key: ec.EllipticCurvePrivateKey,
        chain: Sequence[x509.Certificate],
        now: dt.datetime,
    ) -> str | None:
        """Sign the current head (on a timer and at shutdown); returns the checkpoint line's hash.

        Does nothing and returns None when no line was appended since the last checkpoint, so an
        idle signer's timer does not grow the log.
        """
        _check_signer(signing_key, chain)
        if now.utcoffset() is None:
            raise ValueError("now must be timezone-aware")
        with self._lock:
            if self._unsigned == 0:
                return None
            return self._checkpoint(signing_key, tuple(chain), now)

    def _checkpoint(
        self,
        key: ec.EllipticCurvePrivateKey,
        chain: tuple[x509.Certificate, ...],
        now: dt.datetime,
    ) -> str:
        claims = {"head": self._head, "lines": self._seq, "iat": int(now.timestamp())}
        # RFC 7515 x5c: standard (not URL-safe) base64 of each DER certificate, leaf first.
        x5c = [
            base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode("ascii")
            for cert in chain
        ]
        token = jwt.encode(claims, key, algorithm=_ALGORITHM, headers={"x5c": x5c})
        digest = self._write({"kind": "checkpoint", "jwt": token}, sync=self.fsync != "never")
        self._unsigned = 0
        return digest

    def _write(self, body: dict[str, object], *, sync: bool) -> str:
        if self._fd < 0:
            raise ValueError(f"audit log {self.path} is closed")
        line = _encode({"seq": self._seq + 1, "prev": self._head, **body})
        data = line + b"\n"
        try:
            # One write on an O_APPEND fd: the line lands whole after the previous one.
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")
            if sync:
                os.fsync(self._fd)
        except OSError:
            # Never leave half a line for the next one to be chained onto.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)
        self._seq += 1
        self._head = _hash(line)
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


# --- reading -----------------------------------------------------------------------------------


def iter_entries(lines: Iterable[bytes | str]) -> Iterator[Entry]:
    """The entries of a log, in order; checkpoints are skipped (and not verified: see `verify`)."""
    for line_no, raw in enumerate(lines, start=1):
        try:
            line = _parse_line(_as_bytes(raw))
            entry = _entry_from_fields(line.body) if line.kind == "entry" else None
        except ValueError as err:
            raise AuditLogError(line_no, str(err)) from None
        if entry is not None:
            yield entry


def _checkpoint_problems(
    line_no: int,
    token: object,
    head: str,
    trust_roots: Sequence[x509.Certificate] | None,
    now: dt.datetime,
    since: str,
) -> list[str]:
    """What is wrong with the checkpoint on `line_no`, whose preceding line hashes to `head`."""
    where = f"line {line_no}: checkpoint"
    if not isinstance(token, str):
        return [f"{where} has no JWT"]
    try:
        x5c = jwt.get_unverified_header(token).get("x5c")
        if not isinstance(x5c, list) or not x5c or not all(isinstance(c, str) for c in x5c):
            return [f"{where} has no x5c certificate chain in its header"]
        chain = [x509.load_der_x509_certificate(base64.b64decode(c, validate=True)) for c in x5c]
    except (jwt.PyJWTError, binascii.Error, ValueError) as err:
        return [f"{where} has an unreadable header or x5c chain: {err}"]
    leaf_key = chain[0].public_key()
    if not isinstance(leaf_key, ec.EllipticCurvePublicKey) or not isinstance(
        leaf_key.curve, ec.SECP256R1
    ):
        return [f"{where} x5c leaf does not hold an ECDSA P-256 key"]
    try:
        claims = jwt.decode(
            token,
            leaf_key,
            algorithms=[_ALGORITHM],
            # Times are judged against the injected `now` below, never the wall clock.
            options={"verify_exp": False, "verify_nbf": False, "verify_iat": False},
        )
    except jwt.PyJWTError as err:
        return [f"{where} signature invalid: {err}"]
    claimed_head, claimed_lines, iat = claims.get("head"), claims.get("lines"), claims.get("iat")
    if (
        not isinstance(claimed_head, str)
        or not isinstance(claimed_lines, int)
        or not isinstance(iat, int)
    ):
        return [f"{where} claims are missing head, lines or iat"]

    problems = []
    # A good signature over another log: what precedes the checkpoint is not what it signed.
    if claimed_head != head:
        problems.append(
            f"{where} attests {claimed_lines} line(s) ending in {claimed_head[:12]}…, but the "
            f"log holds {line_no - 1} ending in {head[:12]}…: lines {since} were rewritten"
        )
    elif claimed_lines != line_no - 1:
        problems.append(
            f"{where} attests {claimed_lines} line(s), but {line_no - 1} precede it: "
            f"lines were removed from or added to lines {since}"
        )
    signed_at = dt.datetime.fromtimestamp(iat, dt.UTC)
    if signed_at > now + _MAX_CLOCK_SKEW:
        problems.append(f"{where} is dated {_format_time(signed_at)}, in the future")
    if trust_roots is not None:
        # Web PKI rules for the CAs; the audit leaf may carry any EKU (clientAuth or a private
        # one), but if it has a KeyUsage it must allow signing. Validity is judged at signing time.
        ee_policy = verification.ExtensionPolicy.permit_all().may_be_present(
            x509.KeyUsage, verification.Criticality.AGNOSTIC, _allows_signing
        )
        verifier = (
            verification.PolicyBuilder()
            .store(verification.Store(list(trust_roots)))
            .time(signed_at)
            .extension_policies(
                ca_policy=verification.ExtensionPolicy.webpki_defaults_ca(), ee_policy=ee_policy
            )
            .build_client_verifier()
        )
        try:
            verifier.verify(chain[0], chain[1:])
        except verification.VerificationError as err:
            problems.append(f"{where} x5c chain does not verify to the trust roots: {err}")
    return problems


def _allows_signing(
    _policy: verification.Policy, _cert: x509.Certificate, usage: x509.KeyUsage | None
) -> None:
    if usage is not None and not usage.digital_signature:
        raise ValueError("the audit certificate's KeyUsage does not allow digitalSignature")


def verify(
    lines: Iterable[bytes | str],
    trust_roots: Sequence[x509.Certificate] | None,
    now: dt.datetime,
) -> Verification:
    """Check the chain and every checkpoint of a log. Pure: reads nothing but its arguments.

    Each problem names its line. `first_broken_line` is the first line the log cannot vouch for:
    an edited line, the line after a gap, a malformed line, or a checkpoint that fails.
    With `trust_roots=None` the checkpoint signatures are checked against their x5c leaf only.
    """
    if trust_roots is not None and not trust_roots:
        raise ValueError("trust_roots is empty; pass None to skip anchoring")
    problems: list[str] = []
    broken: list[int] = []
    entries = checkpoints = good_checkpoints = unsigned = 0
    prev_hash, prev_seq, after_bad = GENESIS, 0, False
    last_good = 0  # line number of the last checkpoint that verified

    for line_no, raw in enumerate(lines, start=1):
        data = _as_bytes(raw)
        digest = _hash(data)
        try:
            line = _parse_line(data)
            entry = _entry_from_fields(line.body) if line.kind == "entry" else None
        except ValueError as err:
            problems.append(f"line {line_no}: {err}")
            broken.append(line_no)
            # Report one bad line once: the next line's prev cannot be judged against it.
            prev_hash, prev_seq, after_bad = digest, prev_seq + 1, True
            continue

        if line.seq > prev_seq + 1:
            gap = line.seq - prev_seq - 1
            problems.append(
                f"line {line_no}: sequence jumps from {prev_seq} to {line.seq}: "
                f"{gap} line(s) removed before it"
            )
            broken.append(line_no)
        elif line.seq <= prev_seq:
            problems.append(
                f"line {line_no}: sequence number {line.seq} follows {prev_seq}: "
                "line(s) duplicated or reordered"
            )
            broken.append(line_no)
        elif line.prev != prev_hash and not after_bad:
            if line_no == 1:
                problems.append(f"line 1: prev is not {GENESIS[:12]}…: the log's start is missing")
                broken.append(1)
            else:
                # The link is cut: the line before is not what this line committed to.
                problems.append(
                    f"line {line_no}: prev does not match the hash of line {line_no - 1}: "
                    f"line {line_no - 1} was edited (or this line's prev was)"
                )
                broken.append(line_no - 1)

        if entry is not None:
            entries += 1
            unsigned += 1
        else:
            checkpoints += 1
            since = f"{last_good + 1}..{line_no - 1}"
            found = _checkpoint_problems(
                line_no, line.body.get("jwt"), prev_hash, trust_roots, now, since
            )
            if found:
                problems.extend(found)
                broken.append(line_no)
            else:
                good_checkpoints += 1
                last_good = line_no
                unsigned = 0
        prev_hash, prev_seq, after_bad = digest, line.seq, False

    return Verification(
        entries=entries,
        checkpoints=checkpoints,
        unsigned_tail=unsigned,
        anchored=trust_roots is not None and 0 < good_checkpoints == checkpoints,
        first_broken_line=min(broken) if broken else None,
        problems=problems,
    )
