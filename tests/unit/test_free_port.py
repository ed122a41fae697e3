"""The devcluster's ports: outside the ranges the kernel and Kubernetes hand out, and never one
port for two pytest-xdist workers."""

from __future__ import annotations

import itertools
import socket

import pytest

from devcluster.supervise import FIRST_PORT, LAST_PORT, free_port, port_stretch


def _workers(count: int) -> list[tuple[int, int, int]]:
    return [
        port_stretch(
            {"PYTEST_XDIST_WORKER": f"gw{i}", "PYTEST_XDIST_WORKER_COUNT": str(count)}, 4242
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_each_worker_walks_its_own_stretch(count: int) -> None:
    stretches = _workers(count)
    for (_, high, _), (next_low, _, _) in itertools.pairwise(stretches):
        assert high < next_low
    for low, high, start in stretches:
        assert FIRST_PORT <= low <= start <= high <= LAST_PORT


def test_outside_pytest_the_whole_range_is_walked() -> None:
    low, high, start = port_stretch({}, 1)
    assert (low, high) == (FIRST_PORT, LAST_PORT)
    assert low <= start <= high


@pytest.mark.parametrize(
    "environ",
    [
        {"PYTEST_XDIST_WORKER": "gw9", "PYTEST_XDIST_WORKER_COUNT": "2"},
        {"PYTEST_XDIST_WORKER": "gwx", "PYTEST_XDIST_WORKER_COUNT": "2"},
        {"PYTEST_XDIST_WORKER": "gw0", "PYTEST_XDIST_WORKER_COUNT": "many"},
        {"PYTEST_XDIST_WORKER": "gw0"},
    ],
)
def test_an_odd_worker_environment_falls_back_to_the_whole_range(environ: dict[str, str]) -> None:
    assert port_stretch(environ, 1)[:2] == (FIRST_PORT, LAST_PORT)


def test_a_child_begins_far_from_its_parent() -> None:
    """A worker's child inherits its stretch; the pid moves its start thousands of ports on."""
    environ = {"PYTEST_XDIST_WORKER": "gw0", "PYTEST_XDIST_WORKER_COUNT": "2"}
    _, _, parent = port_stretch(environ, 3308)
    _, _, child = port_stretch(environ, 3309)
    assert abs(parent - child) > 1000


def test_the_ports_handed_out_are_distinct_unbound_and_below_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(FIRST_PORT <= port <= LAST_PORT for port in ports)


def test_a_bound_port_is_skipped() -> None:
    first = free_port()
    # Whatever comes next, bind it before asking again: the walk must step over it.
    with socket.socket() as held:
        following = first + 1
        held.bind(("127.0.0.1", following))
        assert free_port() != following
