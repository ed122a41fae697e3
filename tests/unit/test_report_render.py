"""The tables of `podcert status`, `explain pod` and `version`: each section says what a
person asks first, and an unhealthy state says why in its last line."""

from __future__ import annotations

import datetime as dt

import pytest

from signer.report.explain import explain_pod
from signer.report.render import ago, columns, explain_table, status_table, version_table
from signer.report.status import build_status, leadership
from signer.report.versions import version_info
from tests.unit.test_report_explain import pcr as explain_pcr
from tests.unit.test_report_explain import pod
from tests.unit.test_report_status import NOW, _inputs, lease, pcr


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(5, "5s"), (119, "119s"), (300, "5m"), (3600, "1h"), (3720, "1h2m"), (90000, "1d1h")],
)
def test_ages_read_as_kubectl_prints_them(seconds: int, shown: str) -> None:
    assert ago(dt.timedelta(seconds=seconds)) == shown


def test_columns_line_up() -> None:
    assert columns([["A", "BB"], ["ccc", "d"]], indent="") == ["A    BB", "ccc  d"]


def test_the_status_table_names_the_leader_the_stuck_and_the_denials() -> None:
    denied = pcr("d", NOW, ("Denied", "PolicyDenied", NOW - dt.timedelta(minutes=1)))
    stuck = pcr("s", NOW - dt.timedelta(minutes=7))

    text = status_table(build_status(_inputs(requests=[denied, stuck]), NOW))

    assert "Leader:        signer-0 (lease podcert-system/podcert-signer" in text
    assert "podcert 0.2.0" in text
    assert "CA (podcert-system/podcert-ca): unreadable: the Secret does not exist" in text
    assert "STUCK" in text
    assert "PolicyDenied  1" in text
    assert text.rstrip().endswith("NOT healthy: 1 request(s) stuck")


def test_a_status_without_a_leader_says_nothing_is_issued() -> None:
    text = status_table(build_status(_inputs(lease=None, requests=[]), NOW))

    assert "Leader:        none: no lease podcert-system/podcert-signer" in text
    assert "no signer leads, so nothing is issued" in text


def test_the_explanation_ends_each_source_with_its_verdict_and_next_step() -> None:
    denied = explain_pcr("req-1", dt.timedelta(minutes=1), ("Denied", "PolicyDenied", "no rule"))
    leader = leadership(lease(), "podcert-system/podcert-signer", NOW)

    text = explain_table(explain_pod(pod(), [denied], [], leader, NOW))

    assert "request req-1" in text and "Denied PolicyDenied" in text
    assert "=> DENIED: the signer denied req-1: PolicyDenied: no rule" in text
    assert "next step: no rule of the signer's policy" in text


def test_the_version_table_says_where_the_signers_version_comes_from() -> None:
    discovery = {"v1": {"resources": [{"name": "podcertificaterequests"}]}, "v1beta1": None}
    leader = leadership(lease(), "podcert-system/podcert-signer", NOW)
    text = version_table(version_info({"gitVersion": "v1.37.2"}, discovery, leader, None))

    assert "Server:            Kubernetes v1.37.2" in text
    assert "v1 (podcertificaterequests); requests read at v1" in text
    assert "Signer:            podcert 0.2.0 (signer-0, leading" in text
    nobody = version_info({}, {}, leadership(None, "ns/l", NOW), None)
    assert "unknown: no leader holds ns/l" in version_table(nobody)


def test_an_unreadable_lease_is_an_unknown_leader_not_a_missing_one() -> None:
    problem = "the lease podcert-system/podcert-signer is not readable by this identity (403)"
    text = status_table(build_status(_inputs(lease=problem, requests=[]), NOW))

    assert f"Leader:        unknown: {problem}" in text
    assert "NOT healthy: who leads is unknown" in text
    refused = leadership(problem, "podcert-system/podcert-signer", NOW)
    assert f"Signer:            unknown: {problem}" in version_table(
        version_info({}, {}, refused, None)
    )
