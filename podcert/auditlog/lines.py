"""The audit log's lines: how an entry is framed, encoded, hashed and read back.

Shared by the writer (`signer.auditlog.writer.AuditLog`) and every reader; `checkpoints`
verifies what the lines claim. See the package's docstring for the format.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any, Final, Literal, get_args

from podcert.api.times import format_precise
from podcert.persisted import FormatUnreadable, format_number

Decision = Literal["issued", "denied", "failed"]

GENESIS: Final = "0" * 64  # the `prev` of line 1
# The log's format: what this release writes, and the newest it reads (`podcert.persisted`).
# Format 1 is 0.1.0's; its lines carry no `format` field (so 0.1.0 reads and continues a log this
# release wrote), its checkpoints carry the claim. From format 2 on every line carries `format`,
# which is how a reader that knows only format 1 tells a newer line from a damaged one.
FORMAT: Final = 1
CHECKPOINT_ALGORITHM: Final = "ES256"
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_HEX: Final = re.compile(r"[0-9a-fA-F]+")
_FRAME_KEYS: Final = ("seq", "prev", "kind")
_CHECKPOINT_KEYS: Final = frozenset({*_FRAME_KEYS, "format", "jwt"})


class NewerFormatLine(ValueError):
    """A line in a newer format than this release reads: not damage, and not readable here."""

    def __init__(self, found: int) -> None:
        super().__init__(
            f"in audit log format {found}, newer than format {FORMAT}, the newest read"
        )
        self.found = found


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
_ENTRY_KEYS: Final = frozenset({*_FRAME_KEYS, "format", *_ENTRY_FIELDS})
_TIME_FIELDS: Final = frozenset({"time", "not_before", "not_after"})
_OPTIONAL_FIELDS: Final = frozenset({"spiffe_id", "serial", "not_before", "not_after"})


# --- line encoding, shared with the writer (signer.auditlog.writer) -------------------------


def line_hash(line: bytes) -> str:
    """The hex SHA-256 the next line's `prev` commits to (of the line without its newline)."""
    return hashlib.sha256(line).hexdigest()


def encode_line(obj: dict[str, object]) -> bytes:
    """The exact bytes of a line (without its newline)."""
    # Compact and ASCII-only, so the bytes that get hashed do not depend on any locale or encoder.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def _parse_time(value: str, key: str) -> dt.datetime:
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{key} is not an ISO 8601 time: {value!r}") from None
    if parsed.utcoffset() is None:
        raise ValueError(f"{key} has no time zone: {value!r}")
    return parsed


def entry_fields(entry: Entry) -> dict[str, object]:
    """An entry's fields as they appear in its line, times as RFC 3339 UTC."""
    out: dict[str, object] = {}
    for name in _ENTRY_FIELDS:
        value = getattr(entry, name)
        out[name] = format_precise(value) if isinstance(value, dt.datetime) else value
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
class Line:
    """The frame of one parsed line: its number, the hash it chains to, and its JSON body."""

    seq: int
    prev: str
    kind: Literal["entry", "checkpoint"]
    body: dict[str, Any]


def _as_bytes(raw: bytes | str) -> bytes:
    # surrogatepass: text holding lone surrogates (bytes decoded with surrogateescape, say) still
    # becomes bytes, which then fail as JSON like any other damaged line.
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    # Accept lines with or without their newline (file iteration keeps it, splitlines drops it).
    return data.removesuffix(b"\n")


def parse_line(data: bytes) -> Line:
    """The frame of one line; raises ValueError naming what is wrong."""
    if not data:
        raise ValueError("empty line")
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("not valid JSON (torn or edited line)") from None
    except RecursionError:  # e.g. "[[[[..." : the decoder recurses once per level
        raise ValueError("nested too deeply to be an audit log line") from None
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    try:
        found = format_number(obj.get("format"), "line")
    except FormatUnreadable as err:
        raise ValueError(str(err)) from None
    if found > FORMAT:
        # Before any other check: a newer format may frame its lines differently.
        raise NewerFormatLine(found)
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
    return Line(seq=seq, prev=prev, kind=kind, body=obj)


# --- reading -----------------------------------------------------------------------------------


def iter_entries(lines: Iterable[bytes | str]) -> Iterator[Entry]:
    """The entries of a log, in order; checkpoints are skipped (and not verified: see `verify`)."""
    for line_no, raw in enumerate(lines, start=1):
        try:
            line = parse_line(_as_bytes(raw))
            entry = _entry_from_fields(line.body) if line.kind == "entry" else None
        except ValueError as err:
            raise AuditLogError(line_no, str(err)) from None
        if entry is not None:
            yield entry
