"""audit.report: the table a human reads first. Only projections that need attention are listed
(all with `--all`), at most `max_rows` of them; every finding in full; and text from the inputs
(names, messages) is printed as it is, never read as rich markup."""

from __future__ import annotations

import datetime as dt

import pytest

from audit.model import Finding, Projection, Report, Root
from audit.report import print_table

NOW = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)


def projection(pod: str, state: str = "fresh", *findings: Finding, **fields: object) -> Projection:
    values: dict[str, object] = {
        "pod_uid": f"uid-{pod}",
        "namespace": "shop",
        "pod": pod,
        "volume": "identity",
        "path": "credentialbundle.pem",
        "signer_name": "example.com/podcert",
        "spiffe_id": f"spiffe://td.example/ns/shop/sa/{pod}",
        "serial": "1f2e3d4c5b6a79880",
        "not_before": NOW,
        "not_after": NOW + dt.timedelta(days=1),
        "begin_refresh_at": NOW + dt.timedelta(hours=12),
        "refresh_hint": "request",
        "state": state,
        "rotations": 1,
        "findings": findings,
    }
    values.update(fields)
    return Projection(**values)  # type: ignore[arg-type]


def table(
    capsys: pytest.CaptureFixture[str],
    *projections: Projection,
    findings: tuple[Finding, ...] = (),
    roots: tuple[Root, ...] = (),
    **options: object,
) -> str:
    report = Report(NOW, (), projections, roots, None, findings, ())
    print_table(report, **options)  # type: ignore[arg-type]
    return capsys.readouterr().out


def test_when_every_projection_is_fresh_it_says_so_instead_of_listing_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = table(capsys, projection("web-0"), projection("web-1"))

    assert "All 2 projections are fresh (--all lists them)." in out
    assert "shop/web-0" not in out
    listed = table(capsys, projection("web-0"), projection("web-1"), show_all=True)
    assert "shop/web-0" in listed and "shop/web-1" in listed


def test_only_projections_needing_attention_are_listed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    late = Finding("overdue", "shop/late identity/credentialbundle.pem", "20m0s past it")

    out = table(
        capsys,
        projection("fine"),
        projection("late", "overdue", late),
        projection("soon", "refresh due", refresh_hint="estimated"),
        findings=(late,),
    )

    assert "shop/fine" not in out
    assert "shop/late" in out and "shop/soon" in out
    assert "2026-05-02T00:00Z est." in out  # an estimated refresh point says so
    assert "overdue shop/late identity/credentialbundle.pem: 20m0s past it" in out
    assert "1 finding(s): 1 overdue" in out.splitlines()[-1]


def test_rows_past_max_rows_are_counted_not_printed(capsys: pytest.CaptureFixture[str]) -> None:
    stuck = [projection(f"p{i}", "stuck") for i in range(5)]

    out = table(capsys, *stuck, max_rows=2)

    assert "shop/p1" in out and "shop/p2" not in out
    assert "… and 3 more rows (--max-rows 0 for all, -o json for machines)" in out
    assert "shop/p4" in table(capsys, *stuck, max_rows=0)


def test_text_from_the_inputs_is_printed_as_it_is_never_as_markup(
    capsys: pytest.CaptureFixture[str],
) -> None:
    odd = Finding("denied", "shop/web identity", "denied: [bold red]forged[/] by [link=x]")

    out = table(capsys, projection("web", "denied", odd), findings=(odd,))

    assert "denied: [bold red]forged[/] by [link=x]" in out
