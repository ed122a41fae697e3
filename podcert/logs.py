"""Structured JSON logs, one object per line, with the request's namespace/name on every line
about it (pass them as `extra={"namespace": ..., "name": ...}`)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import sys
from typing import Final

# Attributes every LogRecord has; anything else was passed through `extra` and is logged.
_STANDARD: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JSONFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, milliseconds), level, logger, msg, every `extra`,
    and `error` for an exception; ASCII only, as `json.dumps` writes it. Every issuance logs a
    line, so the encoder is made once and a second's time text is reused for its lines."""

    def __init__(self) -> None:
        super().__init__()
        self._second: tuple[int, str] = (-1, "")  # a whole second and its text, last used

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": self._time(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info and record.exc_info[0] is not None:
            line["error"] = f"{record.exc_info[0].__name__}: {record.exc_info[1]}"
        return _ENCODER.encode(line)

    def _time(self, created: float) -> str:
        """`datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")`: rounded
        to microseconds as that rounds (half to even), then cut to milliseconds."""
        fraction, whole = math.modf(created)
        second, micros = int(whole), round(fraction * 1e6)
        if micros >= 1_000_000:
            second, micros = second + 1, micros - 1_000_000
        elif micros < 0:
            second, micros = second - 1, micros + 1_000_000
        cached = self._second
        if cached[0] != second:
            text = dt.datetime.fromtimestamp(second, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
            cached = self._second = (second, text)
        return f"{cached[1]}.{micros // 1000:03d}+00:00"


_ENCODER: Final = json.JSONEncoder(default=str)  # json.dumps(line, default=str), made once


LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def level_name(text: str) -> str:
    """A `--log-level` value, any case, as `setup` takes it: an argparse type."""
    level = text.upper()
    if level not in LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(LEVELS)}")
    return level


def setup(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # What a line never shows is not gathered for every record either (the logging HOWTO's
    # "Optimization": the caller's frame, the thread's and the process's names).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    # The client libraries' own chatter (connection pool warnings) stays at warning.
    # urllib3 warns of each retry it makes inside one call; the caller's own retry line says
    # what failed and when it tries again, once.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
