"""The shim's Prometheus metrics and its small HTTP face: /metrics, /healthz, /readyz.

`podcert_shim_projections{signer_name,state}` mirrors the kubelet's own gauge,
`kubelet_podcertificate_states{signer_name,state}`, label for label and state for state, so one
rule watches kubelet-projected and shim-projected nodes alike. It is computed at scrape time from
the agent's projection states, so a credential turning overdue or expired shows without waiting
for the agent to wake. Labels are signer names and states only; nothing derived from key
material is ever exported.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from typing import Final

from prometheus_client import (
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kubelet_shim.projection import ProjectionState
from podcert.api.requests import Outcome
from podcert.serving import health
from podcert.serving.connections import Limits

KUBELET_GAUGE: Final = "kubelet_podcertificate_states"
"""The kubelet's gauge of its podCertificate projections (pkg/kubelet/metrics/collectors)."""
PROJECTION_LABELS: Final = ("signer_name", "state")
"""The labels of the kubelet's gauge, and so of `podcert_shim_projections`."""

# (signer name, state) of every projection the agent serves, read at scrape time.
Snapshot = Callable[[], Iterable[tuple[str, ProjectionState]]]


class _Projections(Collector):
    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "podcert_shim_projections",
            "podCertificate projections on this node, by signer name and state.",
            labels=list(PROJECTION_LABELS),
        )
        counts = Tally(self._snapshot())
        signers = sorted({signer for signer, _ in counts})
        for signer in signers:
            # Every state is exported (zeros too), so a rule like `state="denied" > 0` has a series.
            for state in ProjectionState:
                gauge.add_metric([signer, state.value], counts[signer, state])
        yield gauge


class Metrics:
    """One registry per shim process (tests build their own, so nothing is global), with
    `health.registry`'s build, process and GC metrics."""

    def __init__(self, snapshot: Snapshot = lambda: ()) -> None:
        self.registry = health.registry("shim")
        self.registry.register(_Projections(snapshot))
        self.requests = Counter(
            "podcert_shim_requests",
            "PodCertificateRequests created, by signer name and why (initial, refresh, forced, "
            "replace_abandoned).",
            ["signer_name", "reason"],
            registry=self.registry,
        )
        self._outcomes = Counter(
            "podcert_shim_request_outcomes",
            "Answers seen to our requests, by signer name and outcome (Issued, Denied, Failed: "
            "the condition types, as the signer's metrics write them).",
            ["signer_name", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "podcert_shim_issue_latency_seconds",
            "From creating a request to seeing it issued.",
            ["signer_name"],
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

    def count_outcome(self, signer_name: str, outcome: Outcome) -> None:
        """One answer seen to a request of ours (the only way to count one: `outcome` is
        checked, so the casing cannot drift from the signer's)."""
        self._outcomes.labels(signer_name=signer_name, outcome=outcome).inc()

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
