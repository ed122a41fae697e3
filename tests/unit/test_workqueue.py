"""The work queue's contract: dedupe, one worker per key, latest state wins, delays by clock."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podcert.reconcile.workqueue import ShutDown, WorkQueue


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_key_added_twice_is_handed_out_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add("a")
    assert q.get(timeout=0) == "a"
    assert q.get(timeout=0) is None


def test_a_key_being_processed_is_not_handed_to_a_second_worker() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.add("a")  # changed while a worker holds it
    assert q.get(timeout=0) is None
    q.done("a")  # ... so it comes back once the worker is done
    assert q.get(timeout=0) == "a"


def test_delayed_keys_wait_for_the_clock() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock)
    q.add_after("a", 5.0)
    assert q.get(timeout=0) is None
    clock.now += 5.0
    assert q.get(timeout=0) == "a"


def test_backoff_doubles_to_the_cap_and_forget_resets_it() -> None:
    q: WorkQueue[str] = WorkQueue(base_delay=1.0, max_delay=8.0, rng=random.Random(1))
    delays = [q.backoff("a") for _ in range(6)]
    for delay, nominal in zip(delays, [1, 2, 4, 8, 8, 8], strict=True):
        assert 0.75 * nominal <= delay <= 1.25 * nominal
    q.forget("a")
    assert q.failures("a") == 0
    assert q.backoff("a") <= 1.25


def test_shut_down_wakes_blocked_workers() -> None:
    q: WorkQueue[str] = WorkQueue()
    raised = threading.Event()

    def worker() -> None:
        try:
            q.get()
        except ShutDown:
            raised.set()

    thread = threading.Thread(target=worker)
    thread.start()
    q.shut_down()
    thread.join(timeout=5)
    assert raised.is_set()
    with pytest.raises(ShutDown):
        q.get(timeout=0)


# --- fair queuing -----------------------------------------------------------------------------


def by_node(key: str) -> tuple[str]:
    """Keys are '<node>/<n>': the flow is the node."""
    return (key.split("/")[0],)


def by_node_and_namespace(key: str) -> tuple[str, str]:
    """Keys are '<node>/<namespace>/<n>'."""
    node, namespace, _ = key.split("/")
    return node, namespace


def drain(q: WorkQueue[str]) -> list[str]:
    out = []
    while (key := q.get(timeout=0)) is not None:
        q.done(key)
        out.append(key)
    return out


def test_without_a_flow_the_queue_is_one_fifo() -> None:
    q: WorkQueue[str] = WorkQueue()
    keys = [f"{node}/{i}" for i in range(5) for node in ("a", "b", "a", "c")]
    for key in dict.fromkeys(keys):
        q.add(key)
    assert drain(q) == list(dict.fromkeys(keys))


@pytest.mark.parametrize(
    "flood",
    [
        pytest.param(1, id="one key ahead"),
        pytest.param(1500, id="a 1500-key flood ahead"),
    ],
)
def test_another_flow_is_served_within_two_gets_however_long_the_flood(flood: int) -> None:
    q: WorkQueue[str] = WorkQueue(flow=by_node)
    for i in range(flood):
        q.add(f"a/{i}")
    q.add("b/0")
    first_two = [q.get(timeout=0), q.get(timeout=0)]
    assert "b/0" in first_two
    assert first_two[0] == "a/0", "flow a keeps its place: it was there first"


def test_flows_take_turns_and_each_flow_stays_in_order() -> None:
    q: WorkQueue[str] = WorkQueue(flow=by_node)
    for key in ["a/0", "a/1", "a/2", "b/0", "b/1", "c/0"]:
        q.add(key)
    assert drain(q) == ["a/0", "b/0", "c/0", "a/1", "b/1", "a/2"]


def test_a_flow_that_turns_up_later_joins_the_end_of_the_round() -> None:
    q: WorkQueue[str] = WorkQueue(flow=by_node)
    for key in ["a/0", "a/1", "a/2", "b/0", "b/1"]:
        q.add(key)
    assert q.get(timeout=0) == "a/0"
    q.add("c/0")
    assert [q.get(timeout=0) for _ in range(4)] == ["b/0", "a/1", "c/0", "b/1"]


def test_within_a_node_namespaces_take_turns() -> None:
    """A flood in one namespace naming node b leaves b's other namespaces their turns, and
    node a its own turns as well."""
    q: WorkQueue[str] = WorkQueue(flow=by_node_and_namespace)
    for i in range(100):
        q.add(f"b/spoof/{i}")
    q.add("b/web/0")
    q.add("a/web/0")
    assert [q.get(timeout=0) for _ in range(3)] == ["b/spoof/0", "a/web/0", "b/web/0"]


def test_a_key_requeued_while_processing_returns_to_the_back_of_its_own_flow() -> None:
    q: WorkQueue[str] = WorkQueue(flow=by_node)
    for key in ["a/0", "a/1", "b/0"]:
        q.add(key)
    assert q.get(timeout=0) == "a/0"
    q.add("a/0")  # changed while held: queued again at done, behind a/1
    q.done("a/0")
    assert drain(q) == ["b/0", "a/1", "a/0"]


def test_delayed_keys_join_their_flow_when_due() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock, flow=by_node)
    for i in range(50):
        q.add(f"a/{i}")
    q.add_after("b/0", 2.0)
    assert q.get(timeout=0) == "a/0"
    clock.now += 2.0
    assert "b/0" in [q.get(timeout=0), q.get(timeout=0)]


def test_dedup_and_length_hold_across_flows() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(clock=clock, flow=by_node)
    for key in ["a/0", "b/0", "a/0", "b/0", "a/1"]:
        q.add(key)
    q.add_after("c/0", 1.0)
    assert len(q) == 4
    assert drain(q) == ["a/0", "b/0", "a/1"]
    assert len(q) == 1
    clock.now += 1.0
    assert drain(q) == ["c/0"]
    assert len(q) == 0


def test_the_flow_function_is_called_outside_the_queue_lock() -> None:
    """The signer's flow reads its store; it must be free to take the caller's locks, and a
    flow that reads the queue itself must not deadlock."""
    q: WorkQueue[str] = WorkQueue()

    def flow(key: str) -> tuple[str]:
        len(q)  # takes the queue's lock: would deadlock if called under it
        return (key[0],)

    q = WorkQueue(flow=flow)
    q.add("a1")
    q.add_after("b1", 0.001)
    assert q.get(timeout=5) == "a1"


def test_keys_added_together_are_ready_together_so_a_listed_flood_stays_fair() -> None:
    """While `add_all` is still placing a list (here: computing the last key's flow), a worker
    finds nothing ready; once it returns, the other node's key is served second, not after
    the part of the flood a worker could have taken meanwhile."""
    placing_last, checked = threading.Event(), threading.Event()
    flood = [f"a{i:03d}" for i in range(400)]

    def flow(key: str) -> tuple[str]:
        if key == "b-lone":
            placing_last.set()
            assert checked.wait(5)
        return (key[0],)

    q: WorkQueue[str] = WorkQueue(flow=flow)
    adder = threading.Thread(target=q.add_all, args=([*flood, "b-lone"],))
    adder.start()
    assert placing_last.wait(5)
    ready_meanwhile = q.get(timeout=0)
    checked.set()
    adder.join(5)
    assert ready_meanwhile is None
    assert [q.get(timeout=0), q.get(timeout=0)] == ["a000", "b-lone"]
    q.add_all(["a001", "c1"])  # a key already queued is not queued twice
    assert len(q) == 400


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "get", "done"]), st.sampled_from("abcd"), st.integers(0, 5)
        ),
        max_size=80,
    )
)
def test_between_two_turns_of_a_flow_every_other_flow_is_served_at_most_once(
    ops: list[tuple[str, str, int]],
) -> None:
    """Against a model of the queue: a key is handed out only when ready and never to two
    workers; none is lost; and while a flow has keys ready, no other flow gets two turns
    before its next one, so a ready key's wait is bounded by the flows ahead, not their size."""
    q: WorkQueue[str] = WorkQueue(flow=by_node)
    dirty: set[str] = set()
    processing: set[str] = set()
    since: dict[str, set[str]] = {}  # flow with keys ready -> flows served since its last turn
    for op, node, n in ops:
        if op == "add":
            key = f"{node}/{n}"
            q.add(key)
            dirty.add(key)
        elif op == "done":
            if not processing:
                continue
            key = sorted(processing)[n % len(processing)]
            q.done(key)
            processing.discard(key)
        else:
            got = q.get(timeout=0)
            if got is None:
                assert not dirty - processing
                continue
            assert got in dirty - processing
            flow = by_node(got)[0]
            for other, served in since.items():
                if other != flow:
                    assert flow not in served, f"{flow} had a second turn while {other} waited"
                    served.add(flow)
            since[flow] = set()
            dirty.discard(got)
            processing.add(got)
        since = {f: since.get(f, set()) for f in {by_node(k)[0] for k in dirty - processing}}
    for key in processing:
        q.done(key)
    assert sorted(drain(q)) == sorted(dirty)
