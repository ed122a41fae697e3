"""podcert.auditlog.lines: an entry read back as it was appended, a malformed line named with its
number and what is wrong, an `Entry` that cannot hold what a line may not, and the bytes a line
is hashed as.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from podcert.auditlog import AuditLogError, encode_line, entry_fields, iter_entries, line_hash
from signer.auditlog.writer import GENESIS, AuditLog
from tests.auditlog_world import (
    Pki,
    entry,
    read_lines,
)


def test_iter_entries_gives_back_what_was_appended(tmp_path: Path, pki: Pki) -> None:
    path = tmp_path / "audit.log"
    appended = [entry(1), entry(2, "denied"), entry(3, "failed"), entry(4), entry(5)]
    with AuditLog(path, checkpoint_every=2) as log:
        log.set_checkpoint_signer(pki.key, pki.chain)
        for e in appended:
            log.append(e)
    assert list(iter_entries(path.read_text().splitlines())) == appended


@pytest.mark.parametrize(
    ("line", "message"),
    [
        pytest.param(b"{", "not valid JSON", id="bad JSON"),
        pytest.param(b"", "empty line", id="an empty line"),
        pytest.param(b"[]", "not a JSON object", id="a JSON array"),
        pytest.param({"seq": 0}, "seq must be a positive integer", id="seq zero"),
        pytest.param({"seq": 1, "prev": "abc", "kind": "entry"}, "prev must be", id="short prev"),
        pytest.param({"seq": 1, "prev": GENESIS, "kind": "note"}, "unknown kind", id="bad kind"),
        pytest.param({"decision": "approved"}, "decision must be one of", id="unknown decision"),
        pytest.param({"time": "yesterday"}, "time is not an ISO 8601 time", id="bad time"),
        pytest.param({"time": "2026-05-01T12:00:00"}, "time has no time zone", id="naive time"),
        pytest.param({"pod": None}, "entry field 'pod' must be a string", id="null pod"),
        pytest.param({"serial": "xyz"}, "serial must be hex", id="non-hex serial"),
    ],
)
def test_iter_entries_names_the_malformed_line(
    tmp_path: Path, line: bytes | dict[str, object], message: str
) -> None:
    path = tmp_path / "audit.log"
    with AuditLog(path) as log:
        log.append(entry(1))
    good = read_lines(path)[0]
    if isinstance(line, dict):
        line = json.dumps({**json.loads(good), "seq": 2, **line}).encode()

    with pytest.raises(AuditLogError, match=message) as caught:
        list(iter_entries([good, line]))
    assert caught.value.line_no == 2


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"time": dt.datetime(2026, 5, 1)}, id="a naive time"),
        pytest.param({"decision": "approved"}, id="an unknown decision"),
        pytest.param({"serial": "0x1f"}, id="a serial that is not bare hex"),
    ],
)
def test_entry_rejects(change: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        dataclasses.replace(entry(1), **change)


def test_a_line_is_compact_ascii_so_its_hash_depends_on_no_encoder() -> None:
    line = encode_line({"seq": 1, "pod": "wéb", "list": [1, 2]})

    assert line == b'{"seq":1,"pod":"w\\u00e9b","list":[1,2]}'
    assert line_hash(line) == hashlib.sha256(line).hexdigest()


def test_an_entrys_times_are_written_in_utc_to_the_microsecond() -> None:
    local = dt.timezone(dt.timedelta(hours=2))
    moment = dt.datetime(2026, 5, 1, 14, 0, 0, 123_456, tzinfo=local)

    fields = entry_fields(dataclasses.replace(entry(1), time=moment))

    assert fields["time"] == "2026-05-01T12:00:00.123456Z"
    assert fields["not_before"] == "2026-05-01T12:00:00Z"


def test_lines_are_read_as_bytes_with_or_without_their_newline_and_as_text() -> None:
    lines = [encode_line({"seq": 1, "prev": GENESIS, "kind": "entry", **entry_fields(entry(1))})]

    as_read = [
        list(iter_entries(lines)),
        list(iter_entries([line + b"\n" for line in lines])),
        list(iter_entries([line.decode() for line in lines])),
    ]

    assert as_read == [[entry(1)]] * 3


def test_a_line_nested_past_the_decoders_depth_is_a_malformed_line() -> None:
    with pytest.raises(AuditLogError, match="line 1: nested too deeply") as caught:
        list(iter_entries([b"[" * 100_000 + b"]" * 100_000]))
    assert caught.value.line_no == 1
