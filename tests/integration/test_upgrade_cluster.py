"""A whole cluster upgraded under traffic, kept short: a 1.35 devcluster upgraded in place to
1.36 and then 1.37 (the control plane first, then each node's kubelet) while pods hold podcert
credentials and the example mTLS pair calls at 50 requests a second. The full length is
bench/bench_upgrade.py; both drive devcluster/upgrade_traffic.py, which says what runs and how
each invariant is checked.

Kept short by the cluster's size, not by leaving a step out: both minors' steps all run, on one
real node (the pair's server lives on it: its kubelet keeps its root and re-keys every
projection at each restart, so the pair talks through two re-keys of the server), one hollow
node and the shim node, one pod each besides the pair's and the pods each control plane step
adds. Like every real-node test, it needs the machine's one real-node slot: it fails, naming
the holder, when another real node runs.

One upgrade for the module; each test judges one invariant of it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devcluster import cluster, nodes
from devcluster.upgrade_traffic import REAL_NODE, SHIM_NODE, Report, Shape, Upgrade
from podcert.api import requests

SHAPE = Shape(hollow_nodes=1, pods_per_node=1, real_node=True, rate=50.0)
HOLLOW = "node-hollow-0"
KUBELETS = (REAL_NODE, HOLLOW)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Report]:
    reason = nodes.real_node_unavailable()
    if reason:
        pytest.fail(f"cannot run a real node on this machine: {reason}")
    work = tmp_path_factory.mktemp("upgrade-cluster")
    root = work / "cluster"
    run = Upgrade(root, work / "work", SHAPE, lambda line: print(line, flush=True))
    try:
        run.start()
        run.run()
        yield run.finish()
    finally:
        run.stop()
        for node in list(run.kubelets):
            nodes.stop(root, node)
        cluster.down(root)


def test_every_step_of_both_minors_ran_in_order(report: Report) -> None:
    assert [s.name for s in report.steps] == [
        "start on 1.35",
        "control plane 1.35 -> 1.36",
        *(f"node {n} 1.35 -> 1.36" for n in KUBELETS),
        "control plane 1.36 -> 1.37",
        *(f"node {n} 1.36 -> 1.37" for n in KUBELETS),
    ]


def test_every_pod_holds_a_valid_credential_after_each_step(report: Report) -> None:
    assert {s.name: s.invalid for s in report.steps if s.invalid} == {}


def test_pods_whose_files_outlive_a_restart_never_lack_a_valid_credential(
    report: Report,
) -> None:
    assert report.gaps == []


def test_no_request_is_denied_or_failed_and_none_is_decided_twice(report: Report) -> None:
    assert report.outcomes, "the requests were listed"
    outcomes = {uid: o for uid, o in report.outcomes.items() if o != "Issued"}
    assert outcomes == {}
    assert set(report.decisions) == {"issued"}, report.decisions
    assert sum(report.decisions.values()) == len(report.outcomes)
    assert report.answered_twice == []


def test_the_pair_counts_no_failed_call_through_two_rekeys_of_its_server(report: Report) -> None:
    client = report.pair["client"]
    assert (client["failed"], client["errors"]) == (0, {})
    assert client["ok"] > 0
    # The server's credential, re-keyed by each of the real kubelet's two restarts, was seen.
    assert len(client["server_serials"]) == 3, client["server_serials"]


def test_each_kubelet_restart_asks_once_for_each_of_its_pods(report: Report) -> None:
    storms = {s.name: (s.storm.created, s.storm.issued) for s in report.steps if s.storm}
    # Pods per node: one, the pair's server on the real node, one per control plane step before.
    expected = {}
    for minor, (old, late) in {"1.36": ("1.35", 1), "1.37": ("1.36", 2)}.items():
        for node in KUBELETS:
            count = SHAPE.pods_per_node + late + (node == REAL_NODE)
            expected[f"node {node} {old} -> {minor}"] = (count, count)
    assert storms == expected


def test_a_kubelet_still_on_the_old_minor_asks_the_new_api_server_in_its_own_form(
    report: Report,
) -> None:
    forms = {s.name: s.forms for s in report.steps if s.forms}
    pop, stub = requests.PROOF_OF_POSSESSION, requests.STUB_CSR
    assert forms == {
        "control plane 1.35 -> 1.36": {REAL_NODE: pop, HOLLOW: pop, SHIM_NODE: pop},
        "control plane 1.36 -> 1.37": {REAL_NODE: stub, HOLLOW: stub, SHIM_NODE: pop},
    }


def test_podcert_audit_is_clean_on_every_node_at_the_end(report: Report) -> None:
    assert {n: a for n, a in report.audits.items() if a[0] != 0} == {}
    assert set(report.audits) == {SHIM_NODE, *KUBELETS}
