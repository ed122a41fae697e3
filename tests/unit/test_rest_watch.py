"""Rest.watch turns a stream cut short into a retryable ApiError, as the reflectors expect.

Found by tests/integration/test_faults.py: an API server going away mid-watch made urllib3 raise
ProtocolError ("Response ended prematurely"), which is not an OSError, so every reflector logged
an "unexpected error" with a traceback at error level instead of a plain retry warning.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from urllib3.exceptions import ProtocolError

from podcert.rest import ApiError, Gone, Rest


class _Raw:
    status = 200

    def __init__(self, chunks: list[bytes], error: Exception | None) -> None:
        self.chunks, self.error = chunks, error
        self.released = False

    def stream(self, amt: int, decode_content: bool) -> Iterator[bytes]:
        yield from self.chunks
        if self.error is not None:
            raise self.error

    def release_conn(self) -> None:
        self.released = True


class _Configuration:
    host = "https://127.0.0.1"

    def auth_settings(self) -> dict[str, Any]:
        return {}


class _Pool:
    def __init__(self, raw: _Raw) -> None:
        self.raw = raw

    def request(self, *_: Any, **__: Any) -> _Raw:
        return self.raw


class _RestClient:
    def __init__(self, raw: _Raw) -> None:
        self.pool_manager = _Pool(raw)


class _Api:
    """The seam Rest uses of the client: its configuration and its urllib3 pool."""

    user_agent = "test"
    default_headers: dict[str, str] = {}  # noqa: RUF012 (never mutated)

    def __init__(self, raw: _Raw) -> None:
        self.configuration = _Configuration()
        self.rest_client = _RestClient(raw)


def _event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


def test_a_watch_stream_cut_short_is_an_unavailable_api_error() -> None:
    pod = {"metadata": {"name": "p", "resourceVersion": "7"}}
    raw = _Raw([_event("ADDED", pod)], ProtocolError("Response ended prematurely"))
    events = Rest(_Api(raw)).watch("/api/v1/pods", "1")  # type: ignore[arg-type]
    assert next(events)["object"] == pod
    with pytest.raises(ApiError) as broke:
        next(events)
    assert (broke.value.status, broke.value.reason) == (0, "Unavailable")
    assert broke.value.retryable
    assert "Response ended prematurely" in str(broke.value)
    assert raw.released


def test_an_expired_watch_still_raises_gone() -> None:
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    raw = _Raw([_event("ERROR", status)], None)
    with pytest.raises(Gone):
        list(Rest(_Api(raw)).watch("/api/v1/pods", "1"))  # type: ignore[arg-type]
    assert raw.released
