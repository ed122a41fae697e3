"""Lease decisions use our own observation time, never the holder's clock, and the holder's
lease duration, not our own (a rolling update that changes --lease-duration)."""

from __future__ import annotations

import pytest

from signer.leader import MAX_HONOURED, LeaseSettings, decide_lease, honoured_duration

S = LeaseSettings(duration=15, renew_deadline=10, retry_period=2)


@pytest.mark.parametrize(
    ("holder", "seen", "now", "action"),
    [
        pytest.param(None, None, 100.0, "acquire", id="no lease: take it"),
        pytest.param("", 90.0, 100.0, "acquire", id="released lease: take it"),
        pytest.param("me", 90.0, 100.0, "renew", id="ours: renew"),
        pytest.param("other", 90.0, 100.0, "wait", id="held and renewed 10s ago: wait"),
        pytest.param("other", 85.0, 100.0, "acquire", id="not renewed for 15s: take over"),
        pytest.param("other", None, 100.0, "acquire", id="never seen changing: take over"),
    ],
)
def test_decide_lease(holder: str | None, seen: float | None, now: float, action: str) -> None:
    assert decide_lease(holder, "me", seen, now, S) == action


SHORT = LeaseSettings(duration=5, renew_deadline=3, retry_period=1)


@pytest.mark.parametrize(
    ("written", "seen", "now", "action"),
    [
        pytest.param(30, 90.0, 100.0, "wait", id="holder wrote 30s, silent 10s: wait (ours is 5)"),
        pytest.param(30, 70.0, 100.0, "acquire", id="holder wrote 30s, silent 30s: take over"),
        pytest.param(2, 97.0, 100.0, "acquire", id="holder wrote 2s, silent 3s: take over"),
        pytest.param(None, 96.0, 100.0, "wait", id="no duration written: ours (5s), wait"),
        pytest.param(None, 95.0, 100.0, "acquire", id="no duration written: ours, take over"),
        pytest.param(0, 96.0, 100.0, "wait", id="zero: ours, not at once"),
        pytest.param(-30, 96.0, 100.0, "wait", id="negative: ours"),
        pytest.param("30", 90.0, 100.0, "acquire", id="not a number: ours (5s)"),
        pytest.param(True, 96.0, 100.0, "wait", id="a boolean is no number: ours"),
        pytest.param(10**9, 100.0 - MAX_HONOURED, 100.0, "acquire", id="a year: capped at an hour"),
    ],
)
def test_a_holders_lease_is_judged_by_the_duration_it_wrote(
    written: object, seen: float, now: float, action: str
) -> None:
    assert decide_lease("other", "me", seen, now, SHORT, written) == action


def test_a_released_lease_is_taken_whatever_its_duration() -> None:
    assert decide_lease("", "me", 99.0, 100.0, SHORT, 3600) == "acquire"


@pytest.mark.parametrize(
    ("written", "honoured"),
    [
        pytest.param(15, 15.0, id="as written"),
        pytest.param(None, 5.0, id="missing: ours"),
        pytest.param(1.5, 5.0, id="not whole seconds (the API takes int32 only): ours"),
        pytest.param(int(MAX_HONOURED) + 1, MAX_HONOURED, id="over an hour: an hour"),
    ],
)
def test_honoured_duration(written: object, honoured: float) -> None:
    assert honoured_duration(written, 5.0) == honoured
