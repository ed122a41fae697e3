"""The signer's Prometheus metrics and its small HTTP face: /metrics, /healthz, /readyz."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Final, Literal, get_args

from cryptography import x509
from prometheus_client import (
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from podcert.serving import health
from podcert.serving.connections import Limits
from signer import model
from signer.authority import downstream, schedule

# Why a reconcile will be retried, as `podcert_signer_retries_total` labels it: closed types like
# the Denied reasons, so a label mistyped anywhere fails the type check (and a dashboard's
# series cannot silently split in two).
ApiRetryLabel = Literal[
    "APIUnavailable",  # no answer at all (connection refused or reset, timeout)
    "API400",
    "API401",
    "API403",
    "API404",
    "API405",
    "API406",
    "API408",
    "API409",
    "API410",
    "API413",
    "API415",
    "API422",
    "API425",
    "API429",
    "API500",
    "API501",
    "API502",
    "API503",
    "API504",
    "APIOther",  # any other status: rare, and kept out of the label set (the log names it)
]
"""An API call failed with this status; the statuses the API server sends, each its own label."""
RetryLabel = Literal[
    model.RetryReason,  # a decision's Retry (no CA yet, CA too short...)
    "AuditLogUnwritable",  # the write-ahead audit entry was refused
    "StatusRejected",  # the API server refused our status (422)
    ApiRetryLabel,
    "Unexpected",  # a bug: the log has the traceback
]

_API_LABELS: Final[Mapping[str, ApiRetryLabel]] = {
    label: label for label in get_args(ApiRetryLabel)
}


def api_retry_label(status: int) -> ApiRetryLabel:
    """The label of an API error's HTTP status (0: no answer)."""
    return _API_LABELS.get(f"API{status or 'Unavailable'}", "APIOther")


class Metrics:
    """One registry per signer process (tests build their own, so nothing is global), with
    `health.registry`'s build, process and GC metrics. The signer's label is `signer_name`, the
    kubelet's name for it, so one query joins the signer's series with the nodes'."""

    def __init__(self) -> None:
        self.registry = health.registry("signer")
        self.requests = Counter(
            "podcert_signer_requests",
            "PodCertificateRequests settled, by signer name, outcome and reason.",
            ["signer_name", "outcome", "reason"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "podcert_signer_issue_latency_seconds",
            "Time from PodCertificateRequest creation to the status write that settled it.",
            ["signer_name", "outcome"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "podcert_signer_queue_depth", "Requests waiting for a worker.", registry=self.registry
        )
        self._retries = Counter(
            "podcert_signer_retries",
            "Reconciles that will be retried, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "podcert_signer_rate_limited",
            "Reconciles held back by a rate limit (requeued for later, never denied), by signer "
            "name and limit; never by node, to keep the series few (the log names the node).",
            ["signer_name", "reason"],
            registry=self.registry,
        )
        self.live_reads = Counter(
            "podcert_signer_live_reads",
            "Pods, nodes and ServiceAccounts read live (GET) for a request rather than from the "
            "watched caches: for requests made after the caches last listed, and for any a "
            "cache would deny; by resource.",
            ["resource"],
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
        self.ca_upstream_successor_due = Gauge(
            "podcert_signer_ca_upstream_successor_due",
            "1 while the signing intermediate was signed by an upstream (podcert cannot make "
            "its successor), has used the schedule's prepare fraction of its life (or has 7 "
            "days left), and no successor is prepared: the operator must prepare and import "
            "one (`podcert signer ca status` says which; alert on it).",
            registry=self.registry,
        )
        self.token_errors = Counter(
            "podcert_signer_token_errors",
            "Signatures the CA key's PKCS#11 token refused or could not make (the request "
            "retries): alert on any increase.",
            registry=self.registry,
        )
        self.ca_generations = Gauge(
            "podcert_signer_ca_generations",
            "CA generations in the CA Secret, by state (prepared, active, retired): an expiring "
            "CA with no prepared successor is a rotation that did not happen.",
            ["state"],
            registry=self.registry,
        )
        self.upstream_expiry = Gauge(
            "podcert_signer_upstream_intermediate_expiry_timestamp_seconds",
            "Expiry (unix time) of the intermediate an upstream (SPIRE) signed that signs now; "
            "0 without --upstream spire.",
            registry=self.registry,
        )
        self.upstream_renew_by = Gauge(
            "podcert_signer_upstream_renew_by_timestamp_seconds",
            "When (unix time) the upstream-signed intermediate must have been renewed: its "
            "expiry less the longest leaf and the overlap. Later, new leaves are cut short "
            "(alert on it); 0 without --upstream spire.",
            registry=self.registry,
        )
        self.upstream_renewal_pending = Gauge(
            "podcert_signer_upstream_renewal_pending",
            "1 while a new intermediate is due from the upstream (SPIRE) and not yet had.",
            registry=self.registry,
        )
        self.upstream_renewal_failures = Counter(
            "podcert_signer_upstream_renewal_failures",
            "Attempts to reach the upstream (SPIRE's agent or server) or to use its answer "
            "that failed; retried with backoff, issuance goes on from the current intermediate.",
            registry=self.registry,
        )
        self.leader = Gauge(
            "podcert_signer_leader",
            "1 while this replica leads (issues, publishes trust bundles, rotates the CA); alert "
            "when no replica does.",
            registry=self.registry,
        )
        self.audit_checkpoint = Gauge(
            "podcert_signer_audit_checkpoint",
            "Number of the newest audit log checkpoint written: `podcert audit "
            "--min-checkpoint` with this value catches a log cut back to an earlier one.",
            registry=self.registry,
        )

    def count_retry(self, reason: RetryLabel) -> None:
        """One reconcile that will be retried (the only way to count one: `reason` is checked)."""
        self._retries.labels(reason=reason).inc()

    def observe_generations(self, states: Iterable[schedule.State]) -> None:
        """The CA set's count by state, every state exported (zeros too, for the rules)."""
        counts = dict.fromkeys(schedule.STATES, 0)
        for state in states:
            counts[state] += 1
        for state, count in counts.items():
            self.ca_generations.labels(state=state).set(count)

    def observe_upstream(
        self, intermediate: x509.Certificate, settings: downstream.RenewalSettings
    ) -> None:
        """The upstream-signed intermediate's expiry and the time it must be renewed by."""
        self.upstream_expiry.set(intermediate.not_valid_after_utc.timestamp())
        self.upstream_renew_by.set(downstream.renew_by(intermediate, settings).timestamp())

    def render(self) -> bytes:
        return generate_latest(self.registry)


def serve(
    metrics: Metrics,
    port: int,
    ready: Callable[[], bool],
    healthy: Callable[[], bool] = lambda: True,
    host: str = "0.0.0.0",  # noqa: S104 (a pod's metrics port is meant to be scraped)
    limits: Limits = health.METRICS_LIMITS,
) -> health.BoundedHTTPServer:
    """Serve /metrics, /healthz and /readyz in daemon threads within `limits`."""
    return health.serve(metrics.render, port, ready, healthy, host, limits)


class UpstreamObserver:
    """What the SPIRE upstream's loop reports (`spireupstream.Observer`), as metrics."""

    def __init__(self, m: Metrics) -> None:
        self.m = m

    def renewed(self, bundle: object) -> None:
        del bundle  # the CA Secret's watch reports it once it signs (`observe_upstream`)

    def failed(self) -> None:
        self.m.upstream_renewal_failures.inc()

    def pending(self, due: bool) -> None:
        self.m.upstream_renewal_pending.set(1 if due else 0)
