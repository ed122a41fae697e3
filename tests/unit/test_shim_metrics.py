"""kubelet_shim.metrics: the shim's registry. `podcert_shim_projections` is computed at each
scrape from the agent's projection states, with every state of every signer served (zeros
too); each `Metrics` has its own registry, so nothing is counted across instances; and `serve`
puts the registry on /metrics next to the probes. (That the alert rules and dashboard name only
exported series is test_monitoring.py's.)"""

from __future__ import annotations

import http.client
from collections.abc import Iterator

import pytest

from kubelet_shim.metrics import Metrics, serve
from kubelet_shim.projection import ProjectionState
from podcert.serving import health

GAUGE = "podcert_shim_projections"
A, B = "a.example.com/x", "b.example.com/y"


def gauge(metrics: Metrics) -> dict[tuple[str, str], float]:
    """The projections gauge as scraped now: (signer, state) -> value."""
    [family] = [f for f in metrics.registry.collect() if f.name == GAUGE]
    return {(s.labels["signer"], s.labels["state"]): s.value for s in family.samples}


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
    one.requests.labels(signer=A, reason="initial").inc()
    sample = "podcert_shim_requests_created_total"
    labels = {"signer": A, "reason": "initial"}
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
    assert f'{GAUGE}{{signer="{A}",state="fresh"}} 1.0' in body.decode()
    assert [get(server, p)[0] for p in ("/readyz", "/healthz")] == [503, 200]
    switches[:] = [True, False]
    assert [get(server, p)[0] for p in ("/readyz", "/healthz")] == [200, 503]
