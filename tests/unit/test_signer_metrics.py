"""signer.metrics: the signer's registry and its small HTTP face. The series it exports carry
the names and labels pinned here (dashboards and rules depend on them; `signer_name` as the
kubelet says it, outcomes as the API's condition types); an API error is counted under a closed
set of status labels; every CA state is exported, zeros too; and /metrics, /healthz and /readyz
answer from the registry and the checks they are given."""

from __future__ import annotations

import datetime as dt
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import get_args

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from prometheus_client.parser import text_string_to_metric_families

from podcert.serving import health
from signer import metrics
from signer.authority import downstream
from tests.unit.test_signer_offline import make_ca

SIGNER = "example.com/podcert"

# Every podcert series the signer exports once each metric has been written, with its labels.
EXPORTED = {
    "podcert_build_info": {"component", "version", "python_version"},
    "podcert_signer_requests_total": {"signer_name", "outcome", "reason"},
    "podcert_signer_issue_latency_seconds_bucket": {"signer_name", "outcome", "le"},
    "podcert_signer_issue_latency_seconds_count": {"signer_name", "outcome"},
    "podcert_signer_issue_latency_seconds_sum": {"signer_name", "outcome"},
    "podcert_signer_queue_depth": set(),
    "podcert_signer_retries_total": {"reason"},
    "podcert_signer_rate_limited_total": {"signer_name", "reason"},
    "podcert_signer_live_reads_total": {"resource"},
    "podcert_signer_ca_not_after_timestamp_seconds": set(),
    "podcert_signer_ca_too_short": set(),
    "podcert_signer_ca_upstream_successor_due": set(),
    "podcert_signer_audit_log_writable": set(),
    "podcert_signer_audit_log_errors_total": set(),
    "podcert_signer_token_errors_total": set(),
    "podcert_signer_ca_generations": {"state"},
    "podcert_signer_leader": set(),
    "podcert_signer_upstream_intermediate_expiry_timestamp_seconds": set(),
    "podcert_signer_upstream_renew_by_timestamp_seconds": set(),
    "podcert_signer_upstream_renewal_pending": set(),
    "podcert_signer_upstream_renewal_failures_total": set(),
    "podcert_signer_audit_checkpoint": set(),
}


def test_the_signer_exports_these_series_with_these_labels_and_no_created_series() -> None:
    m = metrics.Metrics()
    m.requests.labels(signer_name=SIGNER, outcome="Issued", reason="Issued").inc()
    m.latency.labels(signer_name=SIGNER, outcome="Issued").observe(0.3)
    m.count_retry("API503")
    m.rate_limited.labels(signer_name=SIGNER, reason="NodeRateLimit").inc()
    m.live_reads.labels(resource="pods").inc()
    m.observe_generations(["active"])
    series: dict[str, set[str]] = {}
    components = set()
    for family in text_string_to_metric_families(m.render().decode()):
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
            if sample.name == health.BUILD_INFO:
                components.add(sample.labels["component"])
    assert {n: ls for n, ls in series.items() if n.startswith("podcert_")} == EXPORTED
    assert [n for n in series if n.endswith("_created")] == []
    assert components == {"signer"}
    assert {"process_resident_memory_bytes", "python_gc_collections_total"} <= set(series)


@pytest.mark.parametrize(
    ("status", "label"),
    [
        pytest.param(503, "API503", id="a status the API server sends is its own label"),
        pytest.param(429, "API429", id="throttled"),
        pytest.param(0, "APIUnavailable", id="no answer at all"),
        pytest.param(418, "APIOther", id="any other status joins one label"),
    ],
)
def test_api_errors_are_counted_under_a_closed_set_of_labels(status: int, label: str) -> None:
    assert metrics.api_retry_label(status) == label
    assert label in get_args(metrics.ApiRetryLabel)


def test_every_ca_state_is_exported_zeros_too() -> None:
    """`podcert_signer_ca_generations{state="prepared"}` exists at 0, so the expiry alert's
    `unless` has a series to compare with."""
    m = metrics.Metrics()
    m.observe_generations(["active", "retired", "retired"])
    text = m.render().decode()
    assert 'podcert_signer_ca_generations{state="prepared"} 0.0' in text
    assert 'podcert_signer_ca_generations{state="active"} 1.0' in text
    assert 'podcert_signer_ca_generations{state="retired"} 2.0' in text


class Checks:
    def __init__(self) -> None:
        self.ready = False
        self.healthy = True


@pytest.fixture
def served() -> Iterator[tuple[metrics.Metrics, Checks, str]]:
    registry, checks = metrics.Metrics(), Checks()
    server = metrics.serve(
        registry, 0, lambda: checks.ready, lambda: checks.healthy, host="127.0.0.1"
    )
    try:
        yield registry, checks, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (a local test URL)
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_the_http_face_serves_this_registry_and_answers_each_check_as_it_stands(
    served: tuple[metrics.Metrics, Checks, str],
) -> None:
    registry, checks, url = served
    registry.count_retry("API503")

    status, text = get(f"{url}/metrics")
    assert status == 200
    assert 'podcert_signer_retries_total{reason="API503"} 1.0' in text

    assert get(f"{url}/readyz") == (503, "not ready\n")
    checks.ready = True
    assert get(f"{url}/readyz") == (200, "ok\n")
    assert get(f"{url}/healthz") == (200, "ok\n")
    checks.healthy = False
    assert get(f"{url}/healthz") == (503, "unhealthy\n")


def test_the_spire_upstreams_loop_reports_through_the_metrics() -> None:
    m = metrics.Metrics()
    observer = metrics.UpstreamObserver(m)
    observer.failed()
    observer.failed()
    observer.pending(True)
    assert m.upstream_renewal_failures._value.get() == 2
    assert m.upstream_renewal_pending._value.get() == 1
    observer.pending(False)
    assert m.upstream_renewal_pending._value.get() == 0
    start = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)
    cert = make_ca(
        "ours",
        ec.generate_private_key(ec.SECP256R1()),
        not_before=start,
        not_after=start + dt.timedelta(days=10),
    )
    m.observe_upstream(cert, downstream.RenewalSettings())
    end = (start + dt.timedelta(days=10)).timestamp()
    assert m.upstream_expiry._value.get() == end
    assert m.upstream_renew_by._value.get() == end - 25 * 3600  # a day's leaf, an hour's overlap
