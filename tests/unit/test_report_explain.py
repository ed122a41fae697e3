"""`podcert explain pod`'s model: each podCertificate source followed to its requests, and a
verdict with its reason and next step, judged from objects as fetched and an injected `now`."""

from __future__ import annotations

import datetime as dt
from typing import Any, get_args

import pytest

from podcert.api.times import format_micro_time, format_time
from signer.model import DenyReason
from signer.report.explain import DENIAL_ADVICE, explain_pod
from signer.report.status import leadership

NOW = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)
SIGNER = "podcert.dev/workload"
UID = "0b0b-pod"


def pod(
    node: str = "node-a", created: dt.datetime = NOW - dt.timedelta(minutes=2)
) -> dict[str, Any]:
    source = {"podCertificate": {"signerName": SIGNER, "keyType": "ECDSAP256",
                                 "credentialBundlePath": "credentialbundle.pem"}}  # fmt: skip
    return {
        "metadata": {
            "namespace": "shop",
            "name": "api",
            "uid": UID,
            "creationTimestamp": format_time(created),
        },
        "spec": {
            "nodeName": node,
            "volumes": [{"name": "identity", "projected": {"sources": [source]}}],
        },
        "status": {"phase": "Pending"},
    }


def pcr(
    name: str,
    age: dt.timedelta,
    condition: tuple[str, str, str] | None = None,
    uid: str = UID,
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if condition is not None:
        kind, reason, message = condition
        status["conditions"] = [
            {
                "type": kind,
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": format_time(NOW),
            }
        ]
    return {
        "metadata": {
            "namespace": "shop",
            "name": name,
            "creationTimestamp": format_time(NOW - age),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "api", "uid": uid}],
        },
        "spec": {"signerName": SIGNER, "podUID": uid},
        "status": status,
    }


def event(name: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "involvedObject": {"kind": "PodCertificateRequest", "name": name},
        "type": "Warning",
        "reason": reason,
        "message": message,
        "count": 1,
        "lastTimestamp": format_time(NOW),
    }


def lease(renewed: dt.datetime = NOW, names: str = SIGNER) -> dict[str, Any]:
    return {
        "metadata": {"annotations": {"podcert.dev/signer-names": names}},
        "spec": {"holderIdentity": "signer-0", "renewTime": format_micro_time(renewed),
                 "leaseDurationSeconds": 15},
    }  # fmt: skip


LIVE = leadership(lease(), "podcert-system/podcert-signer", NOW)


def test_every_denial_reason_has_advice_for_the_user() -> None:
    assert set(DENIAL_ADVICE) == set(get_args(DenyReason))


def test_a_denied_request_is_explained_with_its_reason_event_and_next_step() -> None:
    denied = pcr("req-1", dt.timedelta(minutes=1), ("Denied", "PolicyDenied", "no rule allows"))
    events = [event("req-1", "PolicyDenied", "no rule allows shop/default")]

    explained = explain_pod(pod(), [denied], events, LIVE, NOW)

    (source,) = explained.sources
    assert source.verdict == "denied"
    assert "PolicyDenied: no rule allows" in source.why
    assert source.next_step is not None and "policy" in source.next_step
    assert source.requests[0].events[0].message == "no rule allows shop/default"
    assert not explained.healthy


@pytest.mark.parametrize(
    ("lease_obj", "age", "verdict", "said"),
    [
        pytest.param(None, 30, "no-signer", "no signer holds the lease", id="no lease at all"),
        pytest.param(lease(NOW - dt.timedelta(minutes=3)), 30, "no-signer", "ran out",
                     id="the lease ran out"),
        pytest.param({"spec": {"holderIdentity": ""}}, 30, "no-signer", "is released",
                     id="the lease was released"),
        pytest.param(lease(names="other.dev/x"), 30, "no-signer", "not podcert.dev/workload",
                     id="the leader serves other names"),
        pytest.param(lease(), 600, "not-answering", "although signer-0 leads",
                     id="a live leader silent past the threshold"),
        pytest.param(lease(), 5, "waiting", "usually answers", id="a young request"),
    ],
)  # fmt: skip
def test_a_pending_request_says_whether_any_signer_answers(
    lease_obj: dict[str, Any] | None, age: int, verdict: str, said: str
) -> None:
    leader = leadership(lease_obj, "podcert-system/podcert-signer", NOW)
    waiting = pcr("req-1", dt.timedelta(seconds=age))

    (source,) = explain_pod(pod(), [waiting], [], leader, NOW).sources

    assert source.verdict == verdict
    assert said in source.why


def test_the_newest_request_decides_and_an_issued_one_is_healthy() -> None:
    old = pcr("req-old", dt.timedelta(minutes=9), ("Denied", "PodNotFound", "gone"))
    new = pcr("req-new", dt.timedelta(minutes=1), ("Issued", "Issued", ""))
    strangers = pcr("req-x", dt.timedelta(seconds=1), uid="another-pod")

    explained = explain_pod(pod(), [old, new, strangers], [], LIVE, NOW)

    (source,) = explained.sources
    assert [r.name for r in source.requests] == ["req-new", "req-old"]
    assert source.verdict == "issued" and source.next_step is None
    assert explained.healthy


@pytest.mark.parametrize(
    ("the_pod", "verdict"),
    [
        pytest.param(pod(node=""), "not-scheduled", id="no node yet"),
        pytest.param(pod(), "not-requested", id="on a node that has not asked"),
    ],
)
def test_a_source_without_requests_says_who_has_not_acted(
    the_pod: dict[str, Any], verdict: str
) -> None:
    (source,) = explain_pod(the_pod, [], [], LIVE, NOW).sources
    assert source.verdict == verdict


def test_a_pod_without_pod_certificate_sources_has_nothing_to_explain() -> None:
    plain = pod()
    plain["spec"]["volumes"] = []

    explained = explain_pod(plain, [], [], LIVE, NOW)

    assert explained.sources == () and explained.healthy
    assert explained.as_json()["sources"] == []


def test_a_lease_this_identity_may_not_read_leaves_who_answers_unknown_not_absent() -> None:
    refused = leadership(
        "the lease p/l is not readable by this identity (403 Forbidden)", "p/l", NOW
    )
    waiting = pcr("req-1", dt.timedelta(minutes=10))

    (source,) = explain_pod(pod(), [waiting], [], refused, NOW).sources

    assert source.verdict == "not-answering"
    assert "who leads is unknown: the lease p/l is not readable" in source.why
