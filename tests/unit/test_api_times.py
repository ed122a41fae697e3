"""podcert.api.times: Kubernetes times read (`parse_time`, never raising; `require_time`, naming
the field; `parse_zoned_time`, for what a person types, refusing a time without a zone) and
written (metav1.Time in whole seconds, metav1.MicroTime, and podcert's own full-precision
stamps, which read back as what was written)."""

from __future__ import annotations

import datetime as dt

import pytest

from podcert.api.times import (
    TimeFieldError,
    format_micro_time,
    format_precise,
    format_time,
    parse_time,
    parse_zoned_time,
    require_time,
)

UTC = dt.UTC
T0 = dt.datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
PLUS_ONE = dt.timezone(dt.timedelta(hours=1))


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        pytest.param("2026-11-29T20:00:00Z", T0, id="Z"),
        pytest.param("2026-11-29T20:00:00z", T0, id="lower-case z"),
        pytest.param("2026-11-29T21:00:00+01:00", T0, id="an offset"),
        pytest.param("2026-11-29T20:00:00", T0, id="no zone: UTC, as the API server writes"),
        pytest.param(
            "2026-11-29T20:00:00.123456Z", T0 + dt.timedelta(microseconds=123456), id="micro"
        ),
    ],
)
def test_a_time_is_read_as_an_aware_datetime(text: str, moment: dt.datetime) -> None:
    parsed = parse_time(text)
    assert parsed == moment
    assert parsed is not None and parsed.tzinfo is not None


@pytest.mark.parametrize(
    "value",
    [None, "", "yesterday", "2026-13-01T00:00:00Z", 1764446400, ["2026-11-29T20:00:00Z"]],
)
def test_what_is_not_a_time_reads_as_none(value: object) -> None:
    assert parse_time(value) is None


def test_a_required_time_names_its_field_and_what_it_got() -> None:
    assert require_time("2026-11-29T20:00:00Z", "status.notBefore") == T0
    with pytest.raises(TimeFieldError) as raised:
        require_time("x" * 200, "status.notAfter")
    assert raised.value.field == "status.notAfter"
    assert str(raised.value) == f"status.notAfter: expected an RFC 3339 time, got {'x' * 64!r}"
    with pytest.raises(TimeFieldError, match=r"^spec\.at: expected an RFC 3339 time, got int$"):
        require_time(5, "spec.at")


def test_a_typed_time_must_carry_its_zone() -> None:
    assert parse_zoned_time("2026-11-29T21:00:00+01:00", "--now") == T0
    assert parse_zoned_time("2026-11-29T20:00:00Z", "--now") == T0
    with pytest.raises(TimeFieldError, match=r"^--now: '2026-11-29T20:00:00' has no time zone"):
        parse_zoned_time("2026-11-29T20:00:00", "--now")
    with pytest.raises(TimeFieldError, match=r"^--before: 'tuesday' is not an RFC 3339 time$"):
        parse_zoned_time("tuesday", "--before")


def test_metav1_time_is_whole_seconds_in_utc() -> None:
    moment = dt.datetime(2026, 11, 29, 21, 0, 0, 999999, tzinfo=PLUS_ONE)
    assert format_time(moment) == "2026-11-29T20:00:00Z"
    assert format_micro_time(moment) == "2026-11-29T20:00:00.999999Z"
    assert format_micro_time(T0) == "2026-11-29T20:00:00.000000Z"


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        pytest.param(T0, "2026-11-29T20:00:00Z", id="whole seconds: no fraction"),
        pytest.param(
            T0.astimezone(PLUS_ONE) + dt.timedelta(microseconds=5),
            "2026-11-29T20:00:00.000005Z",
            id="microseconds, from another zone",
        ),
    ],
)
def test_a_precise_stamp_reads_back_as_the_moment_written(moment: dt.datetime, text: str) -> None:
    assert format_precise(moment) == text
    assert parse_time(text) == moment
