"""The signer's Prometheus metrics and its small HTTP face: /metrics, /healthz, /readyz."""

from __future__ import annotations

from collections.abc import Callable
from http.server import ThreadingHTTPServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from podcert import health


class Metrics:
    """One registry per signer process (tests build their own, so nothing is global)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "podcert_signer_requests",
            "PodCertificateRequests settled, by signer, outcome and reason.",
            ["signer", "outcome", "reason"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "podcert_signer_issue_latency_seconds",
            "Time from PodCertificateRequest creation to the status write that settled it.",
            ["signer", "outcome"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "podcert_signer_queue_depth", "Requests waiting for a worker.", registry=self.registry
        )
        self.retries = Counter(
            "podcert_signer_retries",
            "Reconciles that will be retried, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "podcert_signer_rate_limited",
            "Reconciles held back by a rate limit (requeued for later, never denied), by signer "
            "and limit; never by node, to keep the series few (the log names the node).",
            ["signer", "reason"],
            registry=self.registry,
        )
        self.ca_not_after = Gauge(
            "podcert_signer_ca_not_after_timestamp_seconds",
            "Expiry (unix time) of the CA that signs now.",
            registry=self.registry,
        )
        self.ca_too_short = Gauge(
            "podcert_signer_ca_too_short",
            "1 while the issuing CA cannot cover a 1 h leaf (alert on it).",
            registry=self.registry,
        )
        self.audit_log_writable = Gauge(
            "podcert_signer_audit_log_writable",
            "1 while the audit log takes writes; 0 stops issuance and readiness (alert on it).",
            registry=self.registry,
        )
        self.audit_log_errors = Counter(
            "podcert_signer_audit_log_errors",
            "Audit log writes (entries, fsyncs, checkpoints) that failed.",
            registry=self.registry,
        )
        self.audit_checkpoint = Gauge(
            "podcert_signer_audit_checkpoint",
            "Number of the newest audit log checkpoint written: `podcert audit "
            "--min-checkpoint` with this value catches a log cut back to an earlier one.",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


def serve(
    metrics: Metrics,
    port: int,
    ready: Callable[[], bool],
    healthy: Callable[[], bool] = lambda: True,
    host: str = "0.0.0.0",  # noqa: S104 (a pod's metrics port is meant to be scraped)
) -> ThreadingHTTPServer:
    """Serve /metrics, /healthz and /readyz in a daemon thread."""
    return health.serve(metrics.render, port, ready, healthy, host)
