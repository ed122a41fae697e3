"""Structured JSON logs, one object per line, with the request's namespace/name on every line
about it (pass them as `extra={"namespace": ..., "name": ...}`)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
from typing import Final

# Attributes every LogRecord has; anything else was passed through `extra` and is logged.
_STANDARD: Final = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info and record.exc_info[0] is not None:
            line["error"] = f"{record.exc_info[0].__name__}: {record.exc_info[1]}"
        return json.dumps(line, default=str)


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
    # The client libraries' own chatter (connection pool warnings) stays at warning.
    # urllib3 warns of each retry it makes inside one call; the caller's own retry line says
    # what failed and when it tries again, once.
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
