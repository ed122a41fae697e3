"""podcert.reconcile.ratelimit: token buckets per node that hold requests back (with a reserved
place) instead of refusing them; time is an argument, so every figure here is exact."""

from __future__ import annotations

import pytest

from podcert.reconcile.ratelimit import Rate, TokenBuckets

T0 = 1000.0


def test_a_full_bucket_lets_the_burst_through_then_spaces_the_rest_at_the_rate() -> None:
    buckets = TokenBuckets(Rate(per_second=2.0, burst=3))
    waits = [buckets.admit("node-a", f"r{i}", T0) for i in range(6)]
    assert waits == [0.0, 0.0, 0.0, 0.5, 1.0, 1.5]


def test_a_held_back_request_keeps_its_place_and_takes_no_second_token() -> None:
    buckets = TokenBuckets(Rate(per_second=1.0, burst=1))
    assert buckets.admit("n", "first", T0) == 0.0
    assert buckets.admit("n", "second", T0) == pytest.approx(1.0)
    assert buckets.admit("n", "third", T0) == pytest.approx(2.0)
    # Back early (an update woke it): the rest of its own wait, nothing new reserved.
    assert buckets.admit("n", "second", T0 + 0.25) == pytest.approx(0.75)
    # Back on time: it goes, and the next newcomer queues behind "third", not beside it.
    assert buckets.admit("n", "second", T0 + 1.0) == 0.0
    assert buckets.admit("n", "fourth", T0 + 1.0) == pytest.approx(2.0)
    assert buckets.admit("n", "third", T0 + 2.0) == 0.0


def test_nodes_have_their_own_buckets() -> None:
    buckets = TokenBuckets(Rate(per_second=1.0, burst=2))
    for i in range(10):
        buckets.admit("flooder", f"f{i}", T0)
    assert buckets.admit("quiet", "q0", T0) == 0.0
    assert buckets.admit("quiet", "q1", T0) == 0.0


@pytest.mark.parametrize(
    ("idle", "admitted"),
    [
        pytest.param(0.5, 1, id="half a second refills one token at 2/s"),
        pytest.param(1.0, 2, id="a second refills two"),
        pytest.param(3600.0, 4, id="refill stops at the burst"),
    ],
)
def test_tokens_refill_at_the_rate_up_to_the_burst(idle: float, admitted: int) -> None:
    buckets = TokenBuckets(Rate(per_second=2.0, burst=4))
    for i in range(4):
        assert buckets.admit("n", f"a{i}", T0) == 0.0
    later = T0 + idle
    waits = [buckets.admit("n", f"b{i}", later) for i in range(6)]
    assert waits.count(0.0) == admitted
    assert waits[admitted] == pytest.approx(0.5)


def test_fractional_rates_work() -> None:
    buckets = TokenBuckets(Rate(per_second=0.1, burst=1))
    assert buckets.admit("n", "a", T0) == 0.0
    assert buckets.admit("n", "b", T0) == pytest.approx(10.0)


def test_debt_stops_at_the_horizon_and_later_requests_come_back_without_a_place() -> None:
    buckets = TokenBuckets(Rate(per_second=1.0, burst=1), horizon=5.0)
    waits = [buckets.admit("n", f"r{i}", T0) for i in range(10)]
    assert waits[:6] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert waits[6:] == [5.0] * 4  # told to come back; no token taken for them
    # By then the reserved ones went; r6 finds the bucket as five seconds of refill left it.
    for i in range(1, 6):
        assert buckets.admit("n", f"r{i}", T0 + i) == 0.0
    assert buckets.admit("n", "r6", T0 + 5.0) == pytest.approx(1.0)


def test_the_horizon_always_leaves_room_for_one_reservation() -> None:
    buckets = TokenBuckets(Rate(per_second=0.01, burst=1), horizon=5.0)
    assert buckets.admit("n", "a", T0) == 0.0
    assert buckets.admit("n", "b", T0) == pytest.approx(100.0)


def test_abandoned_reservations_and_full_buckets_are_forgotten() -> None:
    buckets = TokenBuckets(Rate(per_second=10.0, burst=1), horizon=60.0)
    for node in ("a", "b", "c"):
        for i in range(20):
            buckets.admit(node, f"{node}{i}", T0)  # 19 reservations per node, never claimed
    assert len(buckets) == 3
    buckets.admit("d", "d0", T0 + 200.0)  # a sweep is due: only d's bucket is left
    assert len(buckets) == 1
    # A reservation that was dropped as abandoned does not come back to haunt its request.
    assert buckets.admit("a", "a5", T0 + 200.0) == 0.0


@pytest.mark.parametrize(
    "rate",
    [
        pytest.param(Rate(per_second=0.0, burst=1), id="zero rate"),
        pytest.param(Rate(per_second=-1.0, burst=1), id="negative rate"),
        pytest.param(Rate(per_second=1.0, burst=0), id="zero burst"),
    ],
)
def test_impossible_rates_are_refused(rate: Rate) -> None:
    with pytest.raises(ValueError, match="per_second > 0 and burst >= 1"):
        TokenBuckets(rate)
