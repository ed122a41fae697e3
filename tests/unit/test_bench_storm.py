"""bench.bench_storm: the figures a re-key storm is judged by, from what its watch and the
signer's audit log recorded."""

from __future__ import annotations

import json

from bench import bench_storm
from podcert import auditlog
from tests.auditlog_world import entry


def test_the_drain_rate_counts_the_10_to_90_percent_window_only() -> None:
    # 100 settlements: 10 slow ones at the start and at the end, 80 in between at 10 per second
    times = [float(i) for i in range(10)] + [10 + i / 10 for i in range(80)]
    times += [100.0 + i for i in range(10)]
    assert round(bench_storm.drain_rate(times), 1) == round(79 / (17.9 - 10.0), 1)


def test_fairness_is_the_slowest_nodes_last_over_the_fastest_nodes_last() -> None:
    assert bench_storm.fairness({"node-0": 30.0, "node-1": 45.0, "node-2": 40.0}) == 1.5
    assert bench_storm.fairness({"node-0": 30.0}) == 1.0


def test_answered_once_counts_decision_entries_per_request_not_checkpoints() -> None:
    first, second = entry(1), entry(2)
    lines = [
        json.dumps(auditlog.entry_fields(first)),
        json.dumps(auditlog.entry_fields(second)),
        json.dumps(auditlog.entry_fields(second)),
        json.dumps({"checkpoint": "eyJ..."}),
    ]
    assert bench_storm.decisions_per_request(lines) == {1: 1, 2: 1}


def test_the_shipped_memory_limit_is_read_from_the_signers_deployment() -> None:
    assert bench_storm.shipped_limit_mib() == 384.0
