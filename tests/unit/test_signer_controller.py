"""Workers start once the node and ServiceAccount caches hold a full list (as controllers wait
for informers), and start anyway, on live reads, when a list does not come in time; the pod
cache, the cluster's largest list, is not waited for (start-up at 150,000 pods), and a
request's pod is read live while it lists. The signer's pool on the runtime: waits are driven by
an injected clock, so nothing here sleeps."""

from __future__ import annotations

import logging
import threading
from typing import cast

import pytest

from podcert.reconcile.runtime import Runtime, wait_for_sync
from signer.authority.castore import CAStore
from signer.issue.controller import Controller, Settings, utcnow
from signer.issue.decide import binding_problem
from signer.kube import SignerKube
from signer.metrics import Metrics
from signer.policy import default_policy
from tests.signer_world import LiveKube, make_request

SIGNER = "podcert.dev/test"
DEADLINE = 10.0  # seconds a condition may take before the test fails


class Clock:
    """A monotonic clock that moves only when a wait moves it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Event.wait on this clock: at once when set, else after `seconds`."""
        if event.is_set():
            return True
        self.now += seconds
        return event.is_set()


def controller(timeout: float, stop: threading.Event | None = None) -> Controller:
    # Nothing here reaches the API: the caches' lists are never started.
    kube = cast(SignerKube, object())
    return Controller(
        kube,
        [SIGNER],
        default_policy([SIGNER], "cluster.local"),
        CAStore(kube, "podcert-system", "podcert-ca", utcnow),
        Metrics(),
        settings=Settings(facts_sync_timeout=timeout),
        stop=stop,
    )


def test_workers_wait_until_the_node_and_account_caches_have_listed() -> None:
    ctrl = controller(timeout=600)
    pool = ctrl.pool()
    assert [s.name for s in pool.waits_for] == ["nodes", "serviceaccounts"]
    ctrl.bindings.nodes.reflector.synced.set()
    clock = Clock()
    waited = wait_for_sync(
        pool.waits_for, threading.Event(), timeout=pool.sync_timeout, clock=clock, wait=clock.wait
    )
    assert waited.timed_out == "serviceaccounts", "started before the ServiceAccount cache listed"
    assert clock.now == pytest.approx(100.0 + 600)

    ctrl.bindings.service_accounts.reflector.synced.set()
    assert wait_for_sync(pool.waits_for, threading.Event(), timeout=600, clock=Clock()).synced
    runtime = Runtime("signer", stop=ctrl._stop)
    runtime.add_pool(pool)
    runtime.start()
    try:
        assert pool.started.wait(DEADLINE)
    finally:
        runtime.stop()


def test_workers_start_on_live_reads_when_a_list_does_not_come(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctrl = controller(timeout=0.0)
    runtime = Runtime("signer", stop=ctrl._stop)
    pool = runtime.add_pool(ctrl.pool())
    with caplog.at_level(logging.WARNING):
        runtime.start()
        try:
            assert pool.started.wait(DEADLINE)
        finally:
            runtime.stop()
    assert "the nodes cache has not synced" in caplog.text
    # Every worker goes straight on: the wait happens once per process, not per worker.
    assert caplog.text.count("has not synced") == 1
    workers = [t.name for t in runtime.threads() if t.name.startswith("worker-")]
    assert sorted(workers) == ["worker-0", "worker-1", "worker-2", "worker-3", "worker-start"]


def test_a_stopping_controller_does_not_hold_its_workers() -> None:
    ctrl = controller(timeout=600)
    pool = ctrl.pool()
    stop = threading.Event()
    stop.set()
    clock = Clock()
    waited = wait_for_sync(pool.waits_for, stop, timeout=600, clock=clock, wait=clock.wait)
    assert waited.stopped
    assert clock.now < 100.0 + 600, "waited for the timeout although stopping"

    runtime = Runtime("signer", stop=ctrl._stop)
    runtime.add_pool(pool)
    runtime.start()
    runtime.stop()
    [starter] = [t for t in runtime.threads() if t.name == "worker-start"]
    starter.join(DEADLINE)
    assert not starter.is_alive()
    assert not pool.started.is_set()


def test_while_the_pods_list_a_requests_pod_is_read_live_and_the_rest_from_the_caches() -> None:
    live = LiveKube()
    kube = cast(SignerKube, live)
    ctrl = Controller(
        kube,
        [SIGNER],
        default_policy([SIGNER], "cluster.local"),
        CAStore(kube, "podcert-system", "podcert-ca", utcnow),
        Metrics(),
    )
    # The node and ServiceAccount caches listed (at 50) after the request was seen (at 40).
    for cache, item in (
        (ctrl.bindings.nodes, {"metadata": {"name": "node-a", "uid": "node-uid-1"}}),
        (
            ctrl.bindings.service_accounts,
            {"metadata": {"namespace": "web", "name": "api", "uid": "sa-uid-1"}},
        ),
    ):
        cache._on_list([item])
        cache.reflector.listed_at = 50.0
    request = make_request(signer_name=SIGNER)
    facts = ctrl.facts(request, seen_at=40.0)
    assert live.reads == ["pod"], "read more than the pod live"
    assert facts.pod is not None and facts.pod.uid == "pod-uid-1"
    assert binding_problem(request, facts) is None
