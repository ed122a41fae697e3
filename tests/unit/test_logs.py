"""podcert.logs: one JSON object per line, its time as datetime's isoformat writes it."""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podcert.logs import JSONFormatter


def record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.makeLogRecord({"name": "podcert.signer", "levelname": "INFO", "msg": msg})
    rec.args = args
    rec.__dict__.update(extra)
    return rec


def test_a_line_holds_time_level_logger_message_and_every_extra() -> None:
    rec = record("issued serial %s", "9f", namespace="web", request="api-0-x7k2p")
    rec.created = dt.datetime(2026, 11, 29, 12, 0, 1, 234_567, tzinfo=dt.UTC).timestamp()
    line = JSONFormatter().format(rec)
    assert json.loads(line) == {
        "time": "2026-11-29T12:00:01.234+00:00",
        "level": "info",
        "logger": "podcert.signer",
        "msg": "issued serial 9f",
        "namespace": "web",
        "request": "api-0-x7k2p",
    }
    assert "\n" not in line


def test_an_exception_is_named_with_its_message() -> None:
    rec = record("cannot write")
    try:
        raise OSError("disk full")
    except OSError:
        rec.exc_info = sys.exc_info()
    assert json.loads(JSONFormatter().format(rec))["error"] == "OSError: disk full"


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        pytest.param(Path("/var/log/audit.jsonl"), "/var/log/audit.jsonl", id="a path as text"),
        pytest.param(None, None, id="None as null"),
        pytest.param(3, 3, id="a number as a number"),
    ],
)
def test_extras_that_are_not_json_are_written_as_text(value: object, shown: object) -> None:
    assert json.loads(JSONFormatter().format(record("m", where=value)))["where"] == shown


def test_lines_are_ascii_as_json_dumps_writes_them() -> None:
    line = JSONFormatter().format(record("pod %s", "café", namespace="naïve"))
    assert line.isascii()
    assert json.loads(line)["msg"] == "pod café"


@settings(max_examples=500, deadline=None)
@given(
    moment=st.floats(min_value=0, max_value=4_102_444_800, allow_nan=False, allow_infinity=False)
)
def test_time_is_what_isoformat_writes_for_any_moment(moment: float) -> None:
    formatter = JSONFormatter()
    rec = record("m")
    rec.created = moment
    expected = dt.datetime.fromtimestamp(moment, dt.UTC).isoformat(timespec="milliseconds")
    assert json.loads(formatter.format(rec))["time"] == expected
    # Again, from the second's text the formatter kept.
    assert json.loads(formatter.format(rec))["time"] == expected


def test_the_next_second_is_not_written_with_the_last_ones_text() -> None:
    formatter = JSONFormatter()
    times = []
    for moment in (100.999, 101.0, 100.5, 101.9996):
        rec = record("m")
        rec.created = moment
        times.append(json.loads(formatter.format(rec))["time"])
    assert times == [
        "1970-01-01T00:01:40.999+00:00",
        "1970-01-01T00:01:41.000+00:00",
        "1970-01-01T00:01:40.500+00:00",
        "1970-01-01T00:01:41.999+00:00",
    ]
