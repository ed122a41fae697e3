"""The alerts and the dashboard that ship in manifests/monitoring/ say what they mean.

Every expression is parsed by a real PromQL parser (`promql-parser`, Prometheus's grammar), every
metric it names is one the signer or the shim exports (read from their registries, so a renamed
metric fails here) or the kubelet's `kubelet_podcertificate_states` (its labels pinned against a
real kubelet by test_real_kubelet.py), and label values that are closed sets (outcomes,
projection and CA states) are ones the code writes. Every projection alert watches the kubelet's
nodes and the shim's alike, and every alert links a runbook that exists in docs/runbooks/.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import promql_parser
import pytest
import yaml

from devcluster import docref
from kubelet_shim import metrics as shim_metrics
from kubelet_shim.projection import ProjectionState
from podcert.api.requests import Outcome
from signer import metrics as signer_metrics
from signer.authority import schedule

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "manifests" / "monitoring"
RULES = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "podcert-dashboard.json"
RUNBOOKS = ROOT / "docs" / "runbooks"
# The series of the kubelet itself the rules may name, with their labels.
KUBELET = {shim_metrics.KUBELET_GAUGE: frozenset(shim_metrics.PROJECTION_LABELS)}

# The series each metric type is exposed as (prometheus_client's text format; no `_created`
# series: podcert.serving.health turns them off).
_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}
# Labels whose values are closed types in the code: a typo here would match nothing, silently.
CLOSED_VALUES: dict[tuple[str, str], frozenset[str]] = {
    ("podcert_signer_requests_total", "outcome"): frozenset(get_args(Outcome)),
    ("podcert_signer_issue_latency_seconds_bucket", "outcome"): frozenset(get_args(Outcome)),
    ("podcert_shim_request_outcomes_total", "outcome"): frozenset(get_args(Outcome)),
    ("podcert_shim_projections", "state"): frozenset(s.value for s in ProjectionState),
    (shim_metrics.KUBELET_GAUGE, "state"): frozenset(s.value for s in ProjectionState),
    ("podcert_signer_ca_generations", "state"): frozenset(schedule.STATES),
}


def exported() -> dict[str, frozenset[str]]:
    """Every series name the signer, the shim and the kubelet export, with the labels each
    carries."""
    registries = [
        signer_metrics.Metrics().registry,
        shim_metrics.Metrics(lambda: [("x.dev/s", ProjectionState.FRESH)]).registry,
    ]
    # A labelled metric with no series yet shows no labels when collected: read its label names
    # from the metric itself (prometheus_client keeps them in `_labelnames`).
    collectors = [c for r in registries for c in list(r._collector_to_names)]
    labels = {getattr(c, "_name", ""): tuple(getattr(c, "_labelnames", ())) for c in collectors}
    out: dict[str, frozenset[str]] = {}
    for registry in registries:
        for family in registry.collect():
            names = set(labels.get(family.name, ())) | {k for s in family.samples for k in s.labels}
            for suffix in _SUFFIXES[family.type]:
                extra = {"le"} if suffix == "_bucket" else set()
                out[family.name + suffix] = frozenset(names | extra)
    return out | KUBELET


EXPORTED = exported()


def selectors(expr: promql_parser.Expr) -> Iterator[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(expr, visit)
    yield from found


def problems(text: str) -> list[str]:
    """What is wrong with one expression: it does not parse, or names what nobody exports."""
    try:
        expr = promql_parser.parse(text)
    except ValueError as err:
        return [f"does not parse: {err}"]
    out = []
    used = list(selectors(expr))
    if not used:
        out.append("names no metric")
    for selector in used:
        name = selector.name
        if name is None:
            out.append("selects without a metric name")
            continue
        if name not in EXPORTED:
            out.append(f"{name} is not exported by the signer, the shim or the kubelet")
            continue
        for matcher in selector.matchers.matchers:
            if matcher.name not in EXPORTED[name]:
                out.append(f"{name} has no label {matcher.name}")
            closed = CLOSED_VALUES.get((name, matcher.name))
            if closed is not None:
                regex = matcher.op in (promql_parser.MatchOp.Re, promql_parser.MatchOp.NotRe)
                values = matcher.value.split("|") if regex else [matcher.value]
                out += [
                    f"{name}{{{matcher.name}}} is never {v!r}" for v in values if v not in closed
                ]
    return out


def rules(group: str | None = None) -> list[dict[str, Any]]:
    """Every alert of the rule file (of one group)."""
    doc = yaml.safe_load(RULES.read_text())
    return [
        rule for g in doc["spec"]["groups"] if group in (None, g["name"]) for rule in g["rules"]
    ]


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target, Grafana's interval variables given values as
    Grafana would."""
    board = json.loads(DASHBOARD.read_text())
    out = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = re.sub(r"\$__(rate_)?interval", "5m", target["expr"])
            out.append((f"{panel['title']} / {target['refId']}", expr))
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["definition"])
            assert match, f"variable {var['name']}: expected label_values(selector, label)"
            out.append((f"variable {var['name']}", match.group(1)))
    return out


def test_the_exported_names_are_found() -> None:
    """The collection above sees both components (the check is not vacuous)."""
    assert "podcert_signer_requests_total" in EXPORTED
    assert "podcert_signer_issue_latency_seconds_bucket" in EXPORTED
    assert "podcert_shim_projections" in EXPORTED
    assert {"signer_name", "outcome", "reason"} <= EXPORTED["podcert_signer_requests_total"]


@pytest.mark.parametrize(
    "text, wanted",
    [
        pytest.param("sum(rate(podcert_signer_requests_total[5m])", "does not parse", id="syntax"),
        pytest.param("podcert_signer_request_total > 0", "not exported", id="misspelt metric"),
        pytest.param('podcert_shim_projections{state="overdue"} > 0', "never", id="bad state"),
        pytest.param('podcert_signer_leader{pod_name="x"}', "no label", id="unknown label"),
    ],
)
def test_the_checker_refuses_what_it_should(text: str, wanted: str) -> None:
    assert any(wanted in p for p in problems(text)), problems(text)


def test_the_rules_cover_the_alerts_the_readme_promises() -> None:
    names = {rule["alert"] for rule in rules()}
    assert names == {
        "PodcertNoLeader",
        "PodcertDenialsRising",
        "PodcertSignerRetrying",
        "PodcertAuditLogUnwritable",
        "PodcertCATokenRefusing",
        "PodcertCATooShort",
        "PodcertCAExpiringWithoutSuccessor",
        "PodcertUpstreamCASuccessorDue",
        "PodcertUpstreamRenewalFailing",
        "PodcertUpstreamIntermediateExpiring",
        "PodcertIssueLatencyHigh",
        "PodcertProjectionsOverdue",
        "PodcertProjectionsExpired",
        "PodcertProjectionsFailed",
    }


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_every_alert_parses_and_uses_exported_metrics(rule: dict[str, Any]) -> None:
    assert problems(rule["expr"]) == []
    assert rule["labels"]["severity"] in {"critical", "warning"}
    assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    if "for" in rule:
        promql_parser.parse_duration(rule["for"])


@pytest.mark.parametrize("rule", rules("podcert-projections"), ids=lambda r: r["alert"])
def test_every_projection_alert_watches_kubelet_and_shim_nodes_alike(rule: dict[str, Any]) -> None:
    """The kubelet projects credentials itself on 1.37 nodes, the shim on its own: an alert on
    one gauge alone leaves the other nodes unwatched. Both selectors ask for the same states."""
    used = list(selectors(promql_parser.parse(rule["expr"])))
    by_metric = {
        s.name: sorted((m.name, str(m.op), m.value) for m in s.matchers.matchers) for s in used
    }
    assert set(by_metric) == {shim_metrics.KUBELET_GAUGE, "podcert_shim_projections"}
    assert len(used) == 2
    kubelet, shim = by_metric[shim_metrics.KUBELET_GAUGE], by_metric["podcert_shim_projections"]
    assert kubelet == shim and kubelet, "the same states from both"


def test_a_projection_alert_would_fire_on_a_kubelet_node_alone() -> None:
    """The union (`or`) keeps a kubelet node's series with no shim anywhere: no rule joins the
    two gauges with an operator that needs both (`+`, `and`, `unless`)."""
    for rule in rules("podcert-projections"):
        text = " ".join(rule["expr"].split())
        assert " or " in text and not re.search(r"\b(and|unless)\b| \+ ", text), rule["alert"]


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_every_alert_links_a_runbook_that_exists(rule: dict[str, Any]) -> None:
    """The link is the site's page built from docs/runbooks/<alert>.md (docs/conf.py publishes
    at docref.SITE_URL; the site's build, `make docs`, fails on a page in no toctree)."""
    url = rule["annotations"].get("runbook_url", "")
    assert url == docref.runbook_url(rule["alert"])
    assert url == f"{docref.SITE_URL}runbooks/{rule['alert']}.html"
    page = RUNBOOKS / f"{rule['alert']}.md"
    assert page.is_file(), f"{page} is missing"
    text = page.read_text()
    assert text.startswith(f"# {rule['alert']}\n")
    for section in ("## Meaning", "## Check", "## Fix"):
        assert f"\n{section}\n" in text, f"{page.name} has no {section}"


def test_every_runbook_is_an_alerts_and_the_index_lists_them_all() -> None:
    alerts = {rule["alert"] for rule in rules()}
    pages = {p.stem for p in RUNBOOKS.glob("*.md") if p.name != "README.md"}
    assert pages == alerts
    index = (RUNBOOKS / "README.md").read_text()
    assert {a for a in alerts if f"]({a}.md)" in index} == alerts


def test_the_rule_object_is_a_prometheus_rule() -> None:
    doc = yaml.safe_load(RULES.read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    groups = [g["name"] for g in doc["spec"]["groups"]]
    assert len(groups) == len(set(groups))


@pytest.mark.parametrize("where, expr", dashboard_queries(), ids=lambda v: str(v)[:60])
def test_every_dashboard_query_parses_and_uses_exported_metrics(where: str, expr: str) -> None:
    assert problems(expr) == [], where


def test_the_dashboard_is_importable() -> None:
    """What Grafana needs to import it: a uid, unique panel ids, a Prometheus data source
    chosen by variable, every panel placed."""
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    names = {v["name"] for v in board["templating"]["list"]}
    assert "datasource" in names
    for panel in board["panels"]:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"
            assert panel["targets"], panel["title"]
    # Every metric an alert uses has a panel.
    shown = {s.name for _, e in dashboard_queries() for s in selectors(promql_parser.parse(e))}
    alerted = {s.name for r in rules() for s in selectors(promql_parser.parse(r["expr"]))}
    assert alerted <= shown, alerted - shown
