"""audit.model: what the report says of itself, its one-line summary and its JSON, and the
helpers every step names things with (durations, serials, a projection's subject)."""

from __future__ import annotations

import datetime as dt

import pytest

from audit.model import (
    AuditLogReport,
    Finding,
    Projection,
    Report,
    duration_text,
    short_serial,
    subject_of,
)

NOW = dt.datetime(2026, 5, 1, 12, 0, 0, 250_000, tzinfo=dt.UTC)


def projection(state: str, *findings: Finding, **fields: object) -> Projection:
    values: dict[str, object] = {
        "pod_uid": "uid-web",
        "namespace": "shop",
        "pod": "web",
        "volume": "identity",
        "path": "credentialbundle.pem",
        "signer_name": "example.com/podcert",
        "spiffe_id": "spiffe://td.example/ns/shop/sa/web",
        "serial": "1f",
        "not_before": NOW,
        "not_after": NOW + dt.timedelta(days=1),
        "begin_refresh_at": None,
        "refresh_hint": None,
        "state": state,
        "rotations": 1,
        "findings": findings,
    }
    values.update(fields)
    return Projection(**values)  # type: ignore[arg-type]


def log_report(**fields: object) -> AuditLogReport:
    values: dict[str, object] = {
        "name": "audit.jsonl",
        "lines": 12,
        "entries": 10,
        "checkpoints": 2,
        "unsigned_tail": 0,
        "anchored": True,
        "last_checkpoint": 2,
        "last_checkpoint_at": NOW,
        "anchors": frozenset(),
        "first_broken_line": None,
        "problems": (),
    }
    values.update(fields)
    return AuditLogReport(**values)  # type: ignore[arg-type]


def report(
    projections: tuple[Projection, ...] = (),
    findings: tuple[Finding, ...] = (),
    audit_logs: tuple[AuditLogReport, ...] | None = None,
) -> Report:
    return Report(NOW, ("a node root",), projections, (), audit_logs, findings, ())


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        pytest.param(dt.timedelta(seconds=0), "0s", id="nothing"),
        pytest.param(dt.timedelta(seconds=59.9), "59s", id="seconds, cut not rounded"),
        pytest.param(dt.timedelta(minutes=6), "6m0s", id="minutes and seconds"),
        pytest.param(dt.timedelta(hours=1, minutes=1, seconds=30), "1h1m", id="hours and minutes"),
        pytest.param(dt.timedelta(days=2, hours=3, minutes=59), "2d3h", id="days and hours"),
        pytest.param(dt.timedelta(minutes=-5), "-5m0s", id="negative"),
    ],
)
def test_a_duration_reads_in_its_two_largest_units(delta: dt.timedelta, text: str) -> None:
    assert duration_text(delta) == text


def test_a_serial_is_shown_by_its_first_sixteen_hex_digits() -> None:
    assert short_serial("0123456789abcdef") == "0123456789abcdef"
    assert short_serial("0123456789abcdef0") == "0123456789abcdef…"


@pytest.mark.parametrize(
    ("parts", "subject"),
    [
        pytest.param(("shop", "web", "uid-1", "identity", "tls.pem"), "shop/web identity/tls.pem"),
        pytest.param((None, None, "uid-1", "identity", "tls.pem"), "pod uid-1 identity/tls.pem"),
        pytest.param(("shop", None, "uid-1", "identity", None), "pod uid-1 identity"),
        pytest.param(("shop", "web", "uid-1", None, None), "shop/web"),
    ],
)
def test_a_projection_is_named_by_its_pod_when_known_else_by_its_uid(
    parts: tuple[str | None, str | None, str, str | None, str | None], subject: str
) -> None:
    assert subject_of(*parts) == subject


def test_the_summary_counts_states_worst_first_and_findings_by_kind() -> None:
    expired = Finding("expired", "shop/web identity", "serial 1f expired")
    stuck = Finding("stuck", "shop/api identity", "waited 6m0s")
    projections = (
        projection("fresh"),
        projection("expired", expired),
        projection("fresh"),
        projection("stuck", stuck),
    )
    broken = log_report(first_broken_line=3, problems=("line 3: edited",), anchored=False)

    summary = report(projections, (stuck, expired), (broken,)).summary()

    assert summary == (
        "4 projection(s) (1 expired, 1 stuck, 2 fresh); 0 trust root(s); "
        "audit log 10 entries broken at line 3, NOT anchored — 2 finding(s): 1 expired, 1 stuck"
    )


def test_a_report_without_findings_is_healthy_whatever_its_states() -> None:
    healthy = report((projection("pending"), projection("refresh due")), (), (log_report(),))

    assert healthy.healthy
    assert healthy.summary().endswith("audit log 10 entries verified, anchored — healthy")


def test_the_json_keeps_times_to_the_microsecond_and_tells_an_unread_log_from_none() -> None:
    finding = Finding("overdue", "shop/web identity/credentialbundle.pem", "late")
    document = report((projection("overdue", finding),), (finding,)).as_json()

    assert document["now"] == "2026-05-01T12:00:00.250000Z"
    assert document["healthy"] is False
    assert document["auditLogs"] is None  # not read, as opposed to read and empty
    (shown,) = document["projections"]
    assert shown["notAfter"] == "2026-05-02T12:00:00.250000Z"
    assert shown["beginRefreshAt"] is None
    assert (
        shown["findings"]
        == document["findings"]
        == [
            {
                "kind": "overdue",
                "subject": "shop/web identity/credentialbundle.pem",
                "message": "late",
            }
        ]
    )
    assert report(audit_logs=()).as_json()["auditLogs"] == []
