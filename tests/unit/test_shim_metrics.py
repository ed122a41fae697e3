"""kubelet_shim.metrics: the shim's registry. The series it exports carry the names and labels
pinned here (the projections gauge the kubelet's own labels, outcomes the API's condition types
as the signer writes them, no `_created` series); `podcert_shim_projections` is computed at each
scrape from the agent's projection states, with every state of every signer served (zeros
too); each `Metrics` has its own registry, so nothing is counted across instances; and `serve`
puts the registry on /metrics next to the probes. (That the alert rules and dashboard name only
exported series is test_monitoring.py's; that the kubelet's gauge has these labels,
test_real_kubelet.py's.)"""

from __future__ import annotations

import http.client
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kubelet_shim.metrics import PROJECTION_LABELS, Metrics, serve
from kubelet_shim.projection import ProjectionState
from podcert.api.requests import Outcome
from podcert.serving import health

GAUGE = "podcert_shim_projections"
A, B = "a.example.com/x", "b.example.com/y"


def gauge(metrics: Metrics) -> dict[tuple[str, str], float]:
    """The projections gauge as scraped now: (signer, state) -> value."""
    [family] = [f for f in metrics.registry.collect() if f.name == GAUGE]
    return {(s.labels["signer_name"], s.labels["state"]): s.value for s in family.samples}


# Every podcert series the shim exports once each metric has been written, with its labels.
EXPORTED = {
    "podcert_build_info": {"component", "version", "python_version"},
    "podcert_shim_projections": {"signer_name", "state"},
    "podcert_shim_requests_total": {"signer_name", "reason"},
    "podcert_shim_request_outcomes_total": {"signer_name", "outcome"},
    "podcert_shim_issue_latency_seconds_bucket": {"signer_name", "le"},
    "podcert_shim_issue_latency_seconds_count": {"signer_name"},
    "podcert_shim_issue_latency_seconds_sum": {"signer_name"},
    "podcert_shim_volume_writes_total": {"result"},
    "podcert_shim_api_errors_total": {"operation"},
}


def scrape(metrics: Metrics) -> dict[str, list[dict[str, str]]]:
    """Series name -> the label sets of its samples, as a scraper reads the text."""
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(dict(sample.labels))
    return out


def test_the_shim_exports_these_series_with_these_labels_and_no_created_series() -> None:
    metrics = Metrics(lambda: [(A, ProjectionState.FRESH)])
    metrics.requests.labels(signer_name=A, reason="initial").inc()
    metrics.count_outcome(A, "Issued")
    metrics.latency.labels(signer_name=A).observe(0.4)
    metrics.writes.labels(result="ok").inc()
    metrics.errors.labels(operation="create").inc()
    series = scrape(metrics)
    labels = {name: {k for s in samples for k in s} for name, samples in series.items()}
    assert {n: ls for n, ls in labels.items() if n.startswith("podcert_")} == EXPORTED
    assert [n for n in series if n.endswith("_created")] == []
    assert [s["component"] for s in series[health.BUILD_INFO]] == ["shim"]
    assert {"process_resident_memory_bytes", "python_gc_collections_total"} <= set(series)


def test_the_projections_gauge_has_the_kubelets_labels() -> None:
    assert PROJECTION_LABELS == ("signer_name", "state")
    [family] = [
        f
        for f in Metrics(lambda: [(A, ProjectionState.FRESH)]).registry.collect()
        if f.name == GAUGE
    ]
    assert {tuple(s.labels) for s in family.samples} == {PROJECTION_LABELS}


def test_outcomes_are_counted_in_the_condition_types_casing() -> None:
    metrics = Metrics()
    answers: list[Outcome] = ["Issued", "Issued", "Denied", "Failed"]
    for outcome in answers:
        metrics.count_outcome(A, outcome)
    seen = {
        s["outcome"]: metrics.registry.get_sample_value("podcert_shim_request_outcomes_total", s)
        for s in scrape(metrics)["podcert_shim_request_outcomes_total"]
    }
    assert seen == {"Issued": 2, "Denied": 1, "Failed": 1}


def test_every_state_of_every_served_signer_is_exported_zeros_too() -> None:
    states = [(A, ProjectionState.FRESH), (A, ProjectionState.FRESH), (B, ProjectionState.DENIED)]
    seen = gauge(Metrics(lambda: states))
    assert set(seen) == {(signer, s.value) for signer in (A, B) for s in ProjectionState}
    assert seen[A, "fresh"] == 2
    assert seen[B, "denied"] == 1
    assert sum(seen.values()) == 3


def test_the_gauge_is_computed_at_each_scrape() -> None:
    states = [(A, ProjectionState.FRESH)]
    metrics = Metrics(lambda: list(states))
    assert gauge(metrics)[A, "fresh"] == 1
    states[0] = (A, ProjectionState.EXPIRED)  # a credential turned expired between scrapes
    seen = gauge(metrics)
    assert (seen[A, "fresh"], seen[A, "expired"]) == (0, 1)
    states.clear()
    assert gauge(metrics) == {}, "no signer served: no series"


def test_each_metrics_counts_for_itself() -> None:
    one, two = Metrics(), Metrics()
    one.requests.labels(signer_name=A, reason="initial").inc()
    sample = "podcert_shim_requests_total"
    labels = {"signer_name": A, "reason": "initial"}
    assert one.registry.get_sample_value(sample, labels) == 1
    assert two.registry.get_sample_value(sample, labels) is None


@pytest.fixture
def served() -> Iterator[tuple[health.BoundedHTTPServer, list[bool]]]:
    """The metrics of one FRESH projection served on a free port; [ready, healthy] to set."""
    switches = [False, True]
    server = serve(
        Metrics(lambda: [(A, ProjectionState.FRESH)]),
        0,
        lambda: switches[0],
        lambda: switches[1],
    )
    yield server, switches
    server.shutdown()
    server.server_close()


def get(server: health.BoundedHTTPServer, path: str) -> tuple[int, str, bytes]:
    host, port = server.server_address[:2]
    connection = http.client.HTTPConnection(str(host), port, timeout=5)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, answer.getheader("Content-Type") or "", answer.read()
    finally:
        connection.close()


def test_the_registry_is_served_on_metrics_beside_the_probes(
    served: tuple[health.BoundedHTTPServer, list[bool]],
) -> None:
    server, switches = served
    status, content_type, body = get(server, "/metrics")
    assert (status, content_type.split(";")[0]) == (200, "text/plain")
    assert f'{GAUGE}{{signer_name="{A}",state="fresh"}} 1.0' in body.decode()
    assert [get(server, p)[0] for p in ("/readyz", "/healthz")] == [503, 200]
    switches[:] = [True, False]
    assert [get(server, p)[0] for p in ("/readyz", "/healthz")] == [200, 503]
