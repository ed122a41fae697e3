"""kubelet_shim.build: a shim process's pieces wired from its configuration. The agent works over
the node's projected volumes under `--root`, on the clock the configuration shifts (for tests);
/healthz is the runtime's and the node identity's, so a node the API server keeps refusing turns
the shim unhealthy and well again once it is accepted. (That `run` says in one line why it cannot
run against a server without PodCertificateRequests is test_proof_of_possession.py's; the agent
on the runtime, ready only once every cache has listed, test_shim_agent.py's.)"""

from __future__ import annotations

import datetime as dt
import http.client
from pathlib import Path

import pytest

from kubelet_shim import build
from kubelet_shim.agent import Settings
from kubelet_shim.atomic import AtomicDirStorage
from kubelet_shim.build import Config, Shim
from podcert.client.refusals import WINDOW, Refusals
from podcert.reconcile.runtime import Runtime
from podcert.serving import health
from tests.unit.test_shim_agent import FakeKube

T0 = dt.datetime(2026, 11, 29, 20, 0, tzinfo=dt.UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# --- build ----------------------------------------------------------------------------------------


def test_the_agent_works_over_the_volumes_under_the_root_with_its_settings(tmp_path: Path) -> None:
    settings = Settings(workers=3)
    config = Config(node_name="node-a", root=tmp_path, agent=settings)
    shim = build.build(config, FakeKube(), Runtime("shim"))  # type: ignore[arg-type]
    assert isinstance(shim.agent.storage, AtomicDirStorage)
    assert shim.agent.storage.root == tmp_path
    assert shim.agent.settings is settings
    assert (shim.config, shim.server) == (config, None)


@pytest.mark.parametrize(
    "offset",
    [dt.timedelta(0), dt.timedelta(hours=5), dt.timedelta(minutes=-30)],
    ids=["none", "5 h ahead", "30 min behind"],
)
def test_the_agents_clock_is_shifted_by_the_configured_offset(
    monkeypatch: pytest.MonkeyPatch, offset: dt.timedelta
) -> None:
    monkeypatch.setattr(build, "utcnow", lambda: T0)
    config = Config(node_name="node-a", clock_offset=offset)
    shim = build.build(config, FakeKube(), Runtime("shim"))  # type: ignore[arg-type]
    assert shim.agent.clock() == T0 + offset


# --- health ---------------------------------------------------------------------------------------


def test_a_shim_is_healthy_while_its_runtime_runs_and_its_identity_is_accepted() -> None:
    runtime = Runtime("shim")
    # No agent: what `healthy` reads is the runtime and the identity.
    shim = Shim(Config(node_name="a"), runtime, object())  # type: ignore[arg-type]
    assert shim.healthy()
    accepted = [False]
    shim.identity_healthy = lambda: accepted[0]
    assert not shim.healthy()
    accepted[0] = True
    assert shim.healthy()
    runtime.stopping.set()
    assert not shim.healthy()


def probe(server: health.BoundedHTTPServer) -> int:
    host, port = server.server_address[:2]
    connection = http.client.HTTPConnection(str(host), port, timeout=5)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status
    finally:
        connection.close()


def test_the_shims_healthz_says_unhealthy_while_its_node_identity_is_refused() -> None:
    class Metrics:
        def render(self) -> bytes:
            return b""

    class Agent:
        def __init__(self) -> None:
            self.reflectors: list[object] = []
            self.metrics = Metrics()

        def pool(self) -> object:
            from podcert.reconcile.runtime import WorkerPool
            from podcert.reconcile.workqueue import WorkQueue

            return WorkerPool("agent", WorkQueue[str](), lambda key: None, workers=1)

    runtime = Runtime("shim")
    clock = Clock()
    refusals = Refusals(lambda: "node", clock=clock)
    shim = Shim(Config(node_name="a", metrics_port=0), runtime, Agent())  # type: ignore[arg-type]
    shim.identity_healthy = refusals.healthy
    shim.start()
    try:
        assert shim.server is not None
        assert probe(shim.server) == 200
        refusals.answer("GET", 401)
        clock.now += WINDOW
        refusals.answer("GET", 401)
        assert probe(shim.server) == 503
        refusals.answer("GET", 200)
        assert probe(shim.server) == 200
    finally:
        runtime.stop(timeout=5)
