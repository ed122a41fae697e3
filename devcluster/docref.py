"""The site's reference pages, made from the code itself: every command's flags from the real
argparse parsers, the policy file's fields from the signer's policy reader, every metric from
the processes' registries, every alert from the shipped rules, the exit codes from
`podcert.errors` (the reasons and Events: `devcluster.docevents`).

Each `*_markdown` function returns one page's Markdown body (MyST), which `devcluster.docsite`
puts where the page says `<!-- podcert-reference: NAME -->` at build time, so the reference
cannot lag the code: a new flag, policy key, metric or alert shows on the next build. Pure but
for reading the repository's own files (the rules, `podcert/errors.py`).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import yaml

ROOT: Final = Path(__file__).resolve().parents[1]
RULES: Final = ROOT / "manifests" / "monitoring" / "prometheusrule.yaml"
SITE_URL: Final = "https://podcert.github.io/podcert/"
"""Where the site is published (docs/conf.py's html_baseurl); alerts link their runbooks here."""


def runbook_url(alert: str) -> str:
    """The published page of `alert`'s runbook (docs/runbooks/<alert>.md, built to .html)."""
    return f"{SITE_URL}runbooks/{alert}.html"


def _cell(text: object) -> str:
    """`text` fit for one Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: object) -> str:
    """`text` as an inline code span that survives backticks inside it."""
    value = _cell(text)
    fence = "``" if "`" in value else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{value}{pad}{fence}"


# --- commands -------------------------------------------------------------------------------


def subcommands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """`parser`'s whole tree of subcommand parsers, depth first, in the order they were added
    (aliases once)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for sub in action.choices.values():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield sub
                    yield from subcommands(sub)


def _option_line(parser: argparse.ArgumentParser, action: argparse.Action) -> str | None:
    if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
        return None
    formatter = parser._get_formatter()
    if action.option_strings:
        name = ", ".join(action.option_strings)
        if action.nargs != 0:
            metavar = formatter._format_args(action, action.dest.upper())
            name = f"{name} {metavar}"
    else:
        name = formatter._format_args(action, action.dest)
    said = formatter._expand_help(action) if action.help else ""
    extra = []
    if action.choices is not None and not isinstance(action.choices, Mapping):
        extra.append("one of " + ", ".join(_code(c) for c in action.choices))
    if action.required and action.option_strings:
        extra.append("required")
    default = action.default
    if (
        action.option_strings
        and action.nargs != 0
        and default not in (None, argparse.SUPPRESS, [], ())
        and "default" not in said
    ):
        extra.append(f"default {_code(default)}")
    tail = f" ({'; '.join(extra)})" if extra else ""
    return f"- {_code(name)}: {_cell(said)}{tail}"


def commands_markdown(parser: argparse.ArgumentParser) -> str:
    """Every command of `parser`'s tree: one section each (heading = the command line, so its
    anchor is e.g. `#podcert-signer-ca`), with its usage, description and every argument."""
    out: list[str] = []
    for sub in (parser, *subcommands(parser)):
        out += [f"## {sub.prog}", ""]
        if sub.description:
            out += [_cell(sub.description), ""]
        usage = " ".join(sub.format_usage().split())
        out += ["```text", usage, "```", ""]
        lines = [line for a in sub._actions if (line := _option_line(sub, a)) is not None]
        out += [*lines, ""]
        children = [
            s.prog for s in subcommands(sub) if s.prog.count(" ") == sub.prog.count(" ") + 1
        ]
        if children:
            out += ["Subcommands: " + ", ".join(f"[{c}](#{_slug(c)})" for c in children), ""]
    return "\n".join(out)


def _slug(heading: str) -> str:
    """The anchor MyST gives a heading (GitHub's rule: lowercase, punctuation dropped, spaces
    to hyphens)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


# --- policy ---------------------------------------------------------------------------------

_SHAPE_LINE: Final = re.compile(
    r"^(?P<indent> *)(?:- )?(?P<key>[A-Za-z]+):(?P<value>[^#]*?)\s*(?:#\s?(?P<comment>.*))?$"
)
_CONTINUED: Final = re.compile(r"^ +#\s?(?P<comment>.*)$")


def shape_fields(doc: str) -> list[tuple[str, str, str]]:
    """(dotted key, example value, comment) of every key in the first `::` block of a policy
    docstring (signer.policy's and signer.federation.domains' "file shape"), comments continued
    on the next lines joined; list items' keys are written `allow[].namespaces`."""
    block = doc.split("::\n", 1)[1]
    fields: list[tuple[str, str, str]] = []
    stack: list[tuple[int, str]] = []  # (column of the key, its dotted path) of open mappings
    for line in block.splitlines():
        if line and not line.startswith(" "):
            break
        if (more := _CONTINUED.match(line)) and fields:
            key, value, comment = fields[-1]
            fields[-1] = (key, value, f"{comment} {more['comment'].strip()}".strip())
            continue
        match = _SHAPE_LINE.match(line)
        if not match:
            continue
        raw = line[: match.start("key")]
        column = len(raw)
        while stack and stack[-1][0] >= column:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        if raw.rstrip().endswith("-"):  # a list item: its keys sit under `parent[]`
            parent = f"{parent}[]"
            stack.append((column - 1, parent))
        key = f"{parent}.{match['key']}".lstrip(".")
        stack.append((column, key))
        fields.append((key, match["value"].strip(), (match["comment"] or "").strip()))
    return fields


def _constraint(schema: Mapping[str, Any]) -> str:
    parts = []
    kind = schema.get("type")
    if kind:
        parts.append(str(kind))
    if "enum" in schema.get("items", {}):
        parts.append("of " + ", ".join(_code(v) for v in schema["items"]["enum"]))
    if "pattern" in schema.get("items", {}):
        parts.append("of names or globs")
    for bound, word in (("minimum", "≥"), ("maximum", "≤")):
        if bound in schema:
            parts.append(f"{word} {schema[bound]}")
    if schema.get("required"):
        parts.append("requires " + ", ".join(_code(k) for k in schema["required"]))
    return " ".join(parts)


def schema_constraints(schema: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Dotted key -> its type and bounds, for every property of a JSON schema, nested too."""
    out: dict[str, str] = {}
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        out[path] = _constraint(sub)
        if sub.get("type") == "object":
            out |= schema_constraints(sub, f"{path}.")
        if sub.get("type") == "array" and sub.get("items", {}).get("type") == "object":
            out |= schema_constraints(sub["items"], f"{path}[].")
    return out


def policy_markdown() -> str:
    """The policy file: its shape as the reader's docstrings give it, then one row per field with
    the reader's own types and bounds (`signer.policy.entry_schema`, the chart's schema too)."""
    from signer import policy
    from signer.federation import domains

    constraints = {
        f"signers[].{k}": v for k, v in schema_constraints(policy.entry_schema()).items()
    }
    out = [
        "A YAML file given to `podcert signer --policy` (the chart writes it from its `policy`",
        "value). Every key is optional unless marked; an unknown key stops the signer with the",
        "file, line and field named.",
        "",
    ]
    for title, module in (("Signers", policy), ("Federation", domains)):
        doc = module.__doc__ or ""
        shape = doc.split("::\n", 1)[1]
        block = []
        for line in shape.splitlines():
            if line and not line.startswith(" "):
                break
            block.append(line[4:])
        out += [f"## {title}", "", "```yaml", "\n".join(block).strip("\n"), "```", ""]
        out += ["| field | example | type and bounds | what it means |", "|---|---|---|---|"]
        for key, value, comment in shape_fields(doc):
            if key.startswith("federation") and title == "Signers":
                continue
            out.append(
                f"| {_code(key)} | {_code(value) if value else ''} | "
                f"{_cell(constraints.get(key, ''))} | {_cell(comment)} |"
            )
        out.append("")
    return "\n".join(out)


# --- metrics and alerts ---------------------------------------------------------------------

_SUFFIX: Final = {"counter": "_total"}


def metric_families() -> list[tuple[str, str, str, str, tuple[str, ...]]]:
    """(component, exposed name, type, help, labels) of every metric the signer and the shim
    serve, podcert's own first, then the standard process and interpreter ones."""
    from kubelet_shim import metrics as shim_metrics
    from kubelet_shim.projection import ProjectionState
    from signer import metrics as signer_metrics

    registries = {
        "signer": signer_metrics.Metrics().registry,
        "shim": shim_metrics.Metrics(lambda: [("x.dev/s", next(iter(ProjectionState)))]).registry,
    }
    out = []
    for component, registry in registries.items():
        named = {
            getattr(c, "_name", ""): tuple(getattr(c, "_labelnames", ()))
            for c in list(registry._collector_to_names)
        }
        for family in registry.collect():
            labels = set(named.get(family.name, ())) | {k for s in family.samples for k in s.labels}
            name = family.name + _SUFFIX.get(family.type, "")
            out.append((component, name, family.type, family.documentation, tuple(sorted(labels))))
    return sorted(out, key=lambda m: (not m[1].startswith("podcert_"), m[0], m[1]))


def metrics_markdown() -> str:
    out = [
        "What `/metrics` serves on the signer's `metrics` port and on the shim's loopback port.",
        "Counters are exposed with `_total`; histograms as `_bucket`, `_sum` and `_count`.",
        "",
        "| metric | component | type | labels | help |",
        "|---|---|---|---|---|",
    ]
    seen: set[tuple[str, str]] = set()
    for component, name, kind, help_text, labels in metric_families():
        if (component, name) in seen:
            continue
        seen.add((component, name))
        out.append(
            f"| {_code(name)} | {component} | {kind} | "
            f"{', '.join(_code(x) for x in labels)} | {_cell(help_text)} |"
        )
    return "\n".join(out) + "\n"


def alerts(path: Path = RULES) -> list[dict[str, Any]]:
    """Every alerting rule of the shipped PrometheusRule, in file order."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [r for g in doc["spec"]["groups"] for r in g["rules"] if "alert" in r]


def alerts_markdown(path: Path = RULES) -> str:
    out = [
        "The alerts of `manifests/monitoring/prometheusrule.yaml` (`kubectl apply -k",
        "manifests/monitoring`). Each links its runbook.",
        "",
    ]
    for rule in alerts(path):
        name = rule["alert"]
        notes = rule.get("annotations", {})
        out += [
            f"## {name}",
            "",
            f"{_cell(notes.get('summary', ''))}. {_cell(notes.get('description', ''))}",
            "",
            f"- severity: {_code(rule.get('labels', {}).get('severity', ''))}",
            f"- for: {_code(rule.get('for', '0s'))}",
            f"- runbook: [{name}](../runbooks/{name}.md)",
            "",
            "```text",
            rule["expr"].strip(),
            "```",
            "",
        ]
    return "\n".join(out)


def exit_codes_markdown(source: Path = ROOT / "podcert" / "errors.py") -> str:
    """Every command's exit codes: podcert.errors' EXIT_* constants and their comments."""
    rows = re.findall(r"^EXIT_(\w+): Final = (\d+)(?:\s*#\s*(.*))?$", source.read_text(), re.M)
    out = ["| code | name | when |", "|---|---|---|"]
    out += [f"| {code} | `EXIT_{name}` | {_cell(said or 'success')} |" for name, code, said in rows]
    return "\n".join(out) + "\n"
