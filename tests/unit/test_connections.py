"""podcert.serving.connections: which connection a full port closes, and when an idle one is
overdue."""

from __future__ import annotations

import argparse

import pytest

from podcert.serving import connections
from podcert.serving.connections import Admission, Limits, Table


def table(max_connections: int = 3, idle_timeout: float = 10.0) -> Table[str]:
    return Table(Limits(max_connections=max_connections, idle_timeout=idle_timeout))


def test_a_port_below_its_cap_holds_every_new_connection() -> None:
    held = table()
    assert [held.admit(k, 0.0) for k in "abc"] == [Admission(admitted=True)] * 3
    assert len(held) == 3


def test_a_full_port_closes_the_connection_idle_the_longest() -> None:
    held = table()
    for at, key in enumerate("abc"):
        held.admit(key, float(at))
    assert held.admit("d", 3.0) == Admission(admitted=True, evicted="a")
    assert "a" not in held and "d" in held and len(held) == 3


def test_a_connection_serving_a_request_is_never_closed_to_make_room() -> None:
    held = table()
    for key in "abc":
        held.admit(key, 0.0)
    assert held.busy("a") and held.busy("b")
    assert held.admit("d", 1.0) == Admission(admitted=True, evicted="c")
    assert held.busy("d")
    assert held.admit("e", 2.0) == Admission(admitted=False)
    assert "e" not in held


def test_a_kept_alive_connection_counts_as_idle_from_its_answer() -> None:
    held = table()
    for at, key in enumerate("abc"):
        held.admit(key, float(at))
    held.busy("a")
    held.idle("a", 5.0)  # answered: now the most recently idle
    assert held.admit("d", 6.0).evicted == "b"


def test_a_probe_outlasts_an_attacker_that_keeps_the_port_full() -> None:
    """The probe connects among thousands of idle connections and is answered: each newcomer
    closes the oldest idle one, and the probe sends its request before it is the oldest."""
    held = table(max_connections=32)
    now = 0.0
    for n in range(100):
        now += 0.001
        held.admit(f"attacker-{n}", now)
    held.admit("probe", now)
    for n in range(100, 120):  # the attacker goes on while the probe's request travels
        now += 0.001
        assert held.admit(f"attacker-{n}", now).evicted != "probe"
    assert held.busy("probe")
    for n in range(120, 5000):
        now += 0.001
        assert held.admit(f"attacker-{n}", now).evicted != "probe"
    assert "probe" in held


def test_a_connection_closed_meanwhile_does_not_begin_serving() -> None:
    held = table(max_connections=1)
    held.admit("a", 0.0)
    held.admit("b", 1.0)  # closes a
    assert not held.busy("a")
    assert "a" not in held


@pytest.mark.parametrize(
    ("now", "late"),
    [
        pytest.param(9.99, [], id="none before the idle timeout"),
        pytest.param(10.0, ["a"], id="idle exactly the timeout"),
        pytest.param(12.5, ["a", "b"], id="every one idle that long, oldest first"),
    ],
)
def test_idle_connections_are_overdue_after_the_idle_timeout(now: float, late: list[str]) -> None:
    held = table(max_connections=4)
    held.admit("a", 0.0)
    held.admit("b", 2.0)
    held.admit("c", 4.0)
    held.busy("c")  # serving: never overdue
    assert held.overdue(now) == late
    assert all(key not in held for key in late)
    assert "c" in held


def test_the_next_deadline_is_the_longest_idle_connections() -> None:
    held = table()
    assert held.next_deadline() is None
    held.admit("a", 1.0)
    held.admit("b", 2.0)
    assert held.next_deadline() == 11.0
    held.busy("a")
    assert held.next_deadline() == 12.0
    held.remove("b")
    assert held.next_deadline() is None


@pytest.mark.parametrize(
    ("limits", "problem"),
    [
        pytest.param(Limits(max_connections=0), "max_connections", id="no connection at all"),
        pytest.param(Limits(handshake_timeout=0), "handshake_timeout", id="no handshake time"),
        pytest.param(Limits(idle_timeout=-1), "idle_timeout", id="negative idle timeout"),
        pytest.param(Limits(), None, id="the defaults"),
    ],
)
def test_limits_name_the_field_that_is_wrong(limits: Limits, problem: str | None) -> None:
    found = limits.problem()
    assert found == problem if problem is None else problem in str(found)


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        pytest.param(["--max-connections=0"], "--max-connections", id="cap of zero"),
        pytest.param(["--idle-timeout=0"], "--idle-timeout", id="idle timeout of zero"),
        pytest.param(["--idle-timeout=nan"], "--idle-timeout", id="idle timeout not a number"),
        pytest.param(["--max-connections=7", "--idle-timeout=2.5"], None, id="both set"),
    ],
)
def test_the_flags_are_checked_and_read(argv: list[str], problem: str | None) -> None:
    parser = argparse.ArgumentParser()
    connections.add_flags(parser, "the ports")
    args = parser.parse_args(argv)
    found = connections.flags_problem(args)
    if problem is None:
        assert found is None
        assert connections.from_flags(args) == Limits(max_connections=7, idle_timeout=2.5)
    else:
        assert found is not None and found.startswith(problem)
