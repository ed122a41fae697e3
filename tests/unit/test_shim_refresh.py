"""Refresh timing, staleness and retry backoff: fixed datetimes and seeded RNGs only."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from kubelet_shim.projection import label
from kubelet_shim.refresh import backoff, next_refresh
from podcert.api.credentials import REFRESH_JITTER, credential_state, fallback_refresh

NB = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
DAY = timedelta(hours=24)
NA = NB + DAY
HINT = NB + timedelta(hours=16)
MIN = timedelta(minutes=1)


def refresh_at(
    hint: datetime | None,
    *,
    seed: int = 1,
    now: datetime = NB,
    jitter: timedelta = REFRESH_JITTER,
    not_after: datetime = NA,
) -> datetime:
    return next_refresh(NB, not_after, hint, rng=random.Random(seed), now=now, jitter=jitter)


def test_refresh_lands_within_five_minutes_after_the_hint() -> None:
    for seed in range(50):
        assert HINT <= refresh_at(HINT, seed=seed) <= HINT + 5 * MIN


def test_jitter_spreads_pods_across_the_whole_window() -> None:
    points = [refresh_at(HINT, seed=seed) - HINT for seed in range(200)]
    assert min(points) < timedelta(seconds=30)
    assert max(points) > timedelta(minutes=4, seconds=30)


def test_same_seed_same_point() -> None:
    assert refresh_at(HINT, seed=7) == refresh_at(HINT, seed=7)


def test_zero_jitter_is_exactly_the_hint() -> None:
    assert refresh_at(HINT, jitter=timedelta(0)) == HINT


@pytest.mark.parametrize(
    ("hint", "not_after", "expected"),
    [
        pytest.param(None, NA, NB + DAY * 0.8, id="no hint: 80% of a 24h lifetime"),
        pytest.param(
            None, NB + timedelta(hours=1), NB + 48 * MIN, id="no hint: 80% of the 1h minimum"
        ),
        pytest.param(NA + MIN, NA, NB + DAY * 0.8, id="hint after expiry is ignored"),
        pytest.param(NB - MIN, NA, NB + DAY * 0.8, id="hint before notBefore is ignored"),
    ],
)
def test_fallback_when_the_hint_is_missing_or_unusable(
    hint: datetime | None, not_after: datetime, expected: datetime
) -> None:
    assert refresh_at(hint, jitter=timedelta(0), not_after=not_after) == expected


def test_fallback_stays_inside_the_api_window_for_short_lifetimes() -> None:
    # 80% of 30 min is 24 min, later than notAfter - 10 min: the API window wins.
    assert fallback_refresh(NB, NB + 30 * MIN) == NB + 20 * MIN


def test_jitter_never_pushes_refresh_past_one_minute_before_expiry() -> None:
    for seed in range(20):
        at = refresh_at(NA - 10 * MIN, seed=seed, jitter=timedelta(hours=2))
        assert NA - 10 * MIN <= at <= NA - MIN


def test_a_point_already_passed_is_spread_after_now() -> None:
    now = HINT + timedelta(hours=2)  # a restart long after the refresh point
    points = [refresh_at(HINT, seed=seed, now=now) for seed in range(50)]
    assert all(now <= at <= now + 5 * MIN for at in points)
    assert max(points) - min(points) > 3 * MIN  # a restarted node does not ask all at once


def test_an_expired_credential_is_due_now() -> None:
    now = NA + timedelta(hours=1)
    assert refresh_at(HINT, now=now) == now


def test_close_to_expiry_the_spread_is_cut_at_the_latest_point() -> None:
    now = NA - 2 * MIN
    for seed in range(20):
        assert now <= refresh_at(HINT, seed=seed, now=now) <= NA - MIN


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"not_before": NB.replace(tzinfo=None)}, "timezone", id="naive notBefore"),
        pytest.param({"now": NB.replace(tzinfo=None)}, "timezone", id="naive now"),
        pytest.param({"not_after": NB}, "later", id="empty lifetime"),
        pytest.param({"jitter": -MIN}, "negative", id="negative jitter"),
        pytest.param({"begin_refresh_at": HINT.replace(tzinfo=None)}, "timezone", id="naive hint"),
    ],
)
def test_nonsense_inputs_are_rejected(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "not_before": NB,
        "not_after": NA,
        "begin_refresh_at": HINT,
        "rng": random.Random(1),
        "now": NB,
        "jitter": REFRESH_JITTER,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        next_refresh(**args)  # type: ignore[arg-type]


REFRESH = HINT + 2 * MIN


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        pytest.param(NB, "fresh", id="fresh right after issuance"),
        pytest.param(NB - 3 * MIN, "fresh", id="fresh while notBefore is slightly ahead"),
        pytest.param(REFRESH + MIN, "fresh", id="fresh just after the refresh point"),
        pytest.param(REFRESH + 10 * MIN, "fresh", id="fresh exactly ten minutes late"),
        pytest.param(
            REFRESH + 10 * MIN + timedelta(microseconds=1),
            "overdue_for_refresh",
            id="overdue past ten minutes late",
        ),
        pytest.param(
            NA - timedelta(microseconds=1), "overdue_for_refresh", id="overdue to the end"
        ),
        pytest.param(NA, "expired", id="expired at notAfter"),
        pytest.param(NA + DAY, "expired", id="expired long after"),
    ],
)
def test_credential_state(now: datetime, expected: str) -> None:
    # As the shim labels it (the kubelet's metric states): a credential past its refresh point
    # stays "fresh" until it is overdue.
    assert label(credential_state(NB, NA, REFRESH, now)) == expected


def test_overdue_grace_is_injectable() -> None:
    assert credential_state(NB, NA, REFRESH, REFRESH + 2 * MIN, overdue_grace=MIN) == (
        "overdue_for_refresh"
    )


SECOND = timedelta(seconds=1)


@pytest.mark.parametrize(
    ("attempt", "low", "high"),
    [
        pytest.param(0, SECOND, SECOND, id="first retry waits the base"),
        pytest.param(1, SECOND, 2 * SECOND, id="second retry up to twice the base"),
        pytest.param(5, SECOND, 32 * SECOND, id="exponential growth"),
        pytest.param(9, SECOND, 5 * MIN, id="capped at five minutes"),
        pytest.param(10**6, SECOND, 5 * MIN, id="huge attempt numbers do not overflow"),
    ],
)
def test_backoff_bounds(attempt: int, low: timedelta, high: timedelta) -> None:
    for seed in range(30):
        assert low <= backoff(attempt, rng=random.Random(seed)) <= high


def test_backoff_is_jittered_across_the_range() -> None:
    delays = [backoff(8, rng=random.Random(seed)) for seed in range(200)]
    assert min(delays) < 30 * SECOND
    assert max(delays) > 200 * SECOND


def test_backoff_parameters_are_injectable() -> None:
    delay = backoff(3, rng=random.Random(3), base=2 * SECOND, cap=10 * SECOND)
    assert 2 * SECOND <= delay <= 10 * SECOND


@pytest.mark.parametrize(
    ("attempt", "base", "cap"),
    [
        pytest.param(-1, SECOND, MIN, id="negative attempt"),
        pytest.param(0, timedelta(0), MIN, id="zero base"),
        pytest.param(0, MIN, SECOND, id="cap below base"),
    ],
)
def test_backoff_rejects_nonsense(attempt: int, base: timedelta, cap: timedelta) -> None:
    with pytest.raises(ValueError):
        backoff(attempt, rng=random.Random(1), base=base, cap=cap)
