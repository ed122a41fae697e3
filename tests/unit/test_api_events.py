"""podcert.api.events: the core/v1 Event body the signer records on requests and the shim on pods,
as `kubectl describe` shows it: named after the object and the caller's suffix, in the object's
namespace, about that object (its resourceVersion when known), from the component (and the node,
when given), its message cut to a bound and its times whole seconds in UTC."""

from __future__ import annotations

import datetime as dt

import pytest

from podcert.api.events import MAX_MESSAGE, ObjectRef, event_body

POD = ObjectRef("v1", "Pod", "shop", "web", "uid-1")
NOW = dt.datetime(2026, 11, 29, 21, 0, 0, 987654, tzinfo=dt.timezone(dt.timedelta(hours=1)))


def test_an_event_about_a_pod_from_the_shim_on_its_node() -> None:
    body = event_body(
        POD,
        event_type="Warning",
        reason="CertificateExpired",
        message="example.com/x certificate has expired",
        now=NOW,
        component="podcert-shim",
        suffix="18b2c4",
        instance="node-a",
    )
    assert body == {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": "web.18b2c4", "namespace": "shop"},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "web",
            "namespace": "shop",
            "uid": "uid-1",
        },
        "reason": "CertificateExpired",
        "message": "example.com/x certificate has expired",
        "type": "Warning",
        "source": {"component": "podcert-shim", "host": "node-a"},
        "reportingComponent": "podcert-shim",
        "reportingInstance": "node-a",
        "firstTimestamp": "2026-11-29T20:00:00Z",
        "lastTimestamp": "2026-11-29T20:00:00Z",
        "count": 1,
    }


def test_an_event_without_an_instance_names_no_host() -> None:
    about = ObjectRef(
        "certificates.k8s.io/v1", "PodCertificateRequest", "shop", "web-x", "uid-2", "41"
    )
    body = event_body(
        about,
        event_type="Normal",
        reason="Issued",
        message="issued",
        now=NOW,
        component="podcert-signer",
        suffix="1",
    )
    assert body["source"] == {"component": "podcert-signer"}
    assert "reportingInstance" not in body
    assert body["involvedObject"]["resourceVersion"] == "41"
    assert body["involvedObject"]["kind"] == "PodCertificateRequest"
    assert body["metadata"] == {"name": "web-x.1", "namespace": "shop"}


@pytest.mark.parametrize(
    ("length", "kept"),
    [(0, 0), (MAX_MESSAGE, MAX_MESSAGE), (MAX_MESSAGE + 1, MAX_MESSAGE), (100_000, MAX_MESSAGE)],
)
def test_a_long_message_is_cut_to_the_bound(length: int, kept: int) -> None:
    message = "m" * length
    body = event_body(
        POD,
        event_type="Warning",
        reason="R",
        message=message,
        now=NOW,
        component="c",
        suffix="s",
    )
    assert body["message"] == message[:kept]
