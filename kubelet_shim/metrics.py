"""The shim's Prometheus metrics and its small HTTP face: /metrics, /healthz, /readyz.

`podcert_shim_projections{signer,state}` mirrors the kubelet's podcertificate gauges: it is
computed at scrape time from the agent's projection states, so a credential turning overdue or
expired shows without waiting for the agent to wake. Labels are signer names and states only;
nothing derived from key material is ever exported.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kubelet_shim.projection import ProjectionState
from podcert.serving import health
from podcert.serving.connections import Limits

# (signer name, state) of every projection the agent serves, read at scrape time.
Snapshot = Callable[[], Iterable[tuple[str, ProjectionState]]]


class _Projections(Collector):
    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "podcert_shim_projections",
            "podCertificate projections on this node, by signer and state.",
            labels=["signer", "state"],
        )
        counts = Tally(self._snapshot())
        signers = sorted({signer for signer, _ in counts})
        for signer in signers:
            # Every state is exported (zeros too), so a rule like `state="denied" > 0` has a series.
            for state in ProjectionState:
                gauge.add_metric([signer, state.value], counts[signer, state])
        yield gauge


class Metrics:
    """One registry per shim process (tests build their own, so nothing is global)."""

    def __init__(self, snapshot: Snapshot = lambda: ()) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_Projections(snapshot))
        self.requests = Counter(
            "podcert_shim_requests_created",
            "PodCertificateRequests created, by signer and why (initial, refresh, forced, "
            "replace_abandoned).",
            ["signer", "reason"],
            registry=self.registry,
        )
        self.outcomes = Counter(
            "podcert_shim_request_outcomes",
            "Answers seen to our requests, by signer and outcome (issued, denied, failed).",
            ["signer", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "podcert_shim_issue_latency_seconds",
            "From creating a request to seeing it issued.",
            ["signer"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=self.registry,
        )
        self.writes = Counter(
            "podcert_shim_volume_writes",
            "Projected volume versions published, by result (ok, error).",
            ["result"],
            registry=self.registry,
        )
        self.errors = Counter(
            "podcert_shim_api_errors",
            "API calls that failed and will be retried, by operation.",
            ["operation"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


def serve(
    metrics: Metrics,
    port: int,
    ready: Callable[[], bool],
    healthy: Callable[[], bool] = lambda: True,
    host: str = "127.0.0.1",
    limits: Limits = health.METRICS_LIMITS,
) -> health.BoundedHTTPServer:
    """Serve /metrics, /healthz and /readyz in daemon threads within `limits`."""
    return health.serve(metrics.render, port, ready, healthy, host, limits)
