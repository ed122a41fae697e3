"""Workers start once the fact caches hold a full list (as controllers wait for informers), and
start anyway, on live reads, when a list does not come in time."""

from __future__ import annotations

import logging
import threading
from typing import cast

import pytest

from signer.castore import CAStore
from signer.controller import Controller, Settings, utcnow
from signer.kube import SignerKube
from signer.metrics import Metrics
from signer.policy import default_policy

SIGNER = "podcert.dev/test"


def controller(timeout: float) -> Controller:
    # Nothing here reaches the API: the caches' lists are never started.
    kube = cast(SignerKube, object())
    return Controller(
        kube,
        [SIGNER],
        default_policy([SIGNER], "cluster.local"),
        CAStore(kube, "podcert-system", "podcert-ca", utcnow),
        Metrics(),
        settings=Settings(facts_sync_timeout=timeout),
    )


def waiting_worker(ctrl: Controller) -> threading.Thread:
    thread = threading.Thread(target=ctrl._wait_for_facts, daemon=True)
    thread.start()
    return thread


def test_workers_wait_until_every_fact_cache_has_listed() -> None:
    ctrl = controller(timeout=600)
    worker = waiting_worker(ctrl)
    for cache in (ctrl.pods, ctrl.nodes):
        cache.reflector.synced.set()
    worker.join(0.5)
    assert worker.is_alive(), "started before the ServiceAccount cache listed"

    ctrl.service_accounts.reflector.synced.set()
    worker.join(10)
    assert not worker.is_alive()


def test_workers_start_on_live_reads_when_a_list_does_not_come(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctrl = controller(timeout=0.0)
    ctrl.pods.reflector.synced.set()
    with caplog.at_level(logging.WARNING):
        worker = waiting_worker(ctrl)
        worker.join(10)
    assert not worker.is_alive()
    assert "the nodes cache has not synced" in caplog.text
    # Every later worker goes straight on: the wait happens once per process.
    second = waiting_worker(ctrl)
    second.join(10)
    assert not second.is_alive()


def test_a_stopping_controller_does_not_hold_its_workers() -> None:
    ctrl = controller(timeout=600)
    worker = waiting_worker(ctrl)
    ctrl._stop.set()
    worker.join(10)
    assert not worker.is_alive()
