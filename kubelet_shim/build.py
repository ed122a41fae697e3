"""Wiring: a shim process's pieces, built from its configuration and run on one runtime.

`run(config)` is the whole process: reach the API server and find the node (waiting out
transient trouble), `build` the agent, start it, wait for SIGTERM/SIGINT and stop.

| piece                  | job                                                              |
|------------------------|------------------------------------------------------------------|
| `Agent` (+ its pool)   | the node's pods, requests and trust bundles -> files in volumes  |
| `AtomicDirStorage`     | the kubelet's projected volumes under `--root`, atomically       |
| metrics server         | /metrics, /healthz, /readyz                                      |

/healthz is the runtime's (every long-running thread alive) and the node identity's: unhealthy
while the API server keeps refusing it (`podcert.client.refusals`), so a node certificate that
expired unrenewed restarts the shim instead of leaving it answering every new pod with a 401.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kubelet_shim import metrics
from kubelet_shim.agent import Agent, Settings, utcnow
from kubelet_shim.atomic import AtomicDirStorage
from kubelet_shim.kube import ShimApi, ShimKube
from podcert.client.discovery import Unserved
from podcert.client.rest import ApiError, Rest, load_client
from podcert.errors import Refused, refusal_is_final
from podcert.reconcile.runtime import GaveUp, Runtime, retry_until
from podcert.serving import health

log = logging.getLogger("podcert.shim")

DEFAULT_ROOT = Path("/var/lib/kubelet")


@dataclass(frozen=True)
class Config:
    """Everything `podcert shim` is told on its command line, validated. A field's default
    here is its flag's default too: the CLI reads it from the class (`Config.metrics_port`)."""

    node_name: str
    kubeconfig: Path | None = None
    root: Path = DEFAULT_ROOT
    # A non-node identity that may delete the pending requests of deleted pods; with neither,
    # the garbage collector removes them through their ownerReference.
    cleanup_kubeconfig: Path | None = None
    cleanup_in_cluster: bool = False
    agent: Settings = field(default_factory=Settings)
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9091
    clock_offset: dt.timedelta = dt.timedelta(0)  # testing only
    startup_timeout: float = 120.0  # seconds of API trouble at start before exit 1 (0: never)


def run(config: Config) -> int:
    runtime = Runtime("shim", logger=log)
    runtime.handle_signals()
    if config.clock_offset:
        log.warning("clock shifted by %+.0fs (testing only)", config.clock_offset.total_seconds())
    cleanup = (
        Rest(load_client(config.cleanup_kubeconfig))
        if config.cleanup_kubeconfig or config.cleanup_in_cluster
        else None
    )
    rest = Rest(load_client(config.kubeconfig))
    api = ShimKube(rest, config.node_name, cleanup)
    # Start-up waits out transient API trouble (and a node not registered yet) instead of
    # crashing into a restart loop.
    try:
        version = retry_until(
            refusal_is_final(lambda: (api.discover(), api.node_uid())[0]),
            runtime.stopping,
            transient=(ApiError,),
            logger=log,
            give_up_after=config.startup_timeout,
        )
    except Unserved as err:
        log.error("the shim cannot run here: %s", err)
        return 1
    except (Refused, GaveUp) as err:
        log.error("%s", err)
        return 1
    if version is None:
        return 0
    log.info(
        "serving node %s on certificates.k8s.io/%s (keys as %s) into %s",
        config.node_name,
        version,
        api.key_form,
        config.root,
    )
    shim = build(config, api, runtime)
    shim.identity_healthy = rest.refusals.healthy  # the node's; not the clean-up identity's
    shim.start()
    runtime.wait()
    log.info("shutting down")
    runtime.stop()
    sys.stderr.flush()
    return 0


@dataclass
class Shim:
    """The pieces of one shim process, wired and not yet started."""

    config: Config
    runtime: Runtime
    agent: Agent
    server: health.BoundedHTTPServer | None = None
    identity_healthy: Callable[[], bool] = lambda: True  # the API server accepts the node

    def healthy(self) -> bool:
        return self.runtime.healthy() and self.identity_healthy()

    def start(self) -> None:
        config, runtime = self.config, self.runtime
        # /readyz answers from the moment the metrics port listens: until the agent's pool is
        # added (its readiness: caches listed, workers started), it says no.
        wired = threading.Event()
        runtime.ready_when(wired.is_set)
        self.server = metrics.serve(
            self.agent.metrics,
            config.metrics_port,
            runtime.ready,
            self.healthy,
            host=config.metrics_host,
        )
        log.info("metrics on port %d", self.server.server_address[1])
        for reflector in self.agent.reflectors:
            runtime.spawn(reflector.name, reflector.run)
        runtime.add_pool(self.agent.pool())
        runtime.on_stopped(self.server.shutdown)
        runtime.start()
        wired.set()


def build(config: Config, api: ShimApi, runtime: Runtime) -> Shim:
    """The agent over the node's volumes, its reflectors ending with the runtime."""
    offset = config.clock_offset
    agent = Agent(
        api,
        AtomicDirStorage(config.root),
        settings=config.agent,
        clock=(lambda: utcnow() + offset) if offset else utcnow,
        stop=runtime.stopping,
    )
    return Shim(config, runtime, agent)
