"""The site's reference of reasons and Events, made from the code: the Denied, Failed and retry
reasons from `signer.model`'s closed types (each described by the code's own comment on it),
the Events the signer records (a request's denial or failure, and each module's `REASON`), and
the Events the shim records (the literal reasons at its call sites).

A call site the scans cannot read (a reason that is neither a literal nor a module's `REASON`)
raises, so a new kind of Event fails the site's build instead of going missing from it. Pure
but for reading the repository's sources.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, Final, get_args

from devcluster.docref import ROOT, _cell, _code


def literal_comments(source: str, name: str) -> dict[str, str]:
    """The trailing comment of each member of the `name = Literal[...]` block in `source`
    (empty when none): what each reason means, as the code says it."""
    out: dict[str, str] = {}
    match = re.search(rf"^{name} = Literal\[\n(.*?)^\]", source, re.M | re.S)
    lines = match[1].splitlines() if match else []
    if not match:  # a one-line Literal: its comment speaks for every member
        one = re.search(rf"^{name} = Literal\[(.*)$", source, re.M)
        lines = [one[1]] if one else []
    for line in lines:
        for value in re.findall(r'"(\w+)"', line.split("#")[0]):
            out[value] = line.split("#", 1)[1].strip() if "#" in line else ""
    return out


def shim_event_reasons(folder: Path = ROOT / "kubelet_shim") -> dict[str, str]:
    """reason -> type of every Event the shim records: the string literals its sources pass as
    the reason of `.event(pod, type, reason, ...)` and `RecordEvent(type, reason, ...)`, and
    STALE_EVENTS' reasons. A call whose reason is neither a literal nor from STALE_EVENTS raises,
    so a new kind of call site cannot be missed silently."""
    found: dict[str, str] = {}
    for path in sorted(folder.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            if any(isinstance(t, ast.Name) and t.id == "STALE_EVENTS" for t in targets):
                assert isinstance(node, ast.Assign | ast.AnnAssign)
                if isinstance(node.value, ast.Dict):
                    for item in node.value.values:
                        if isinstance(item, ast.Tuple) and isinstance(item.elts[0], ast.Constant):
                            found[str(item.elts[0].value)] = "Warning"
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            at = {"event": 1, "RecordEvent": 0}.get(called)
            if at is None or len(node.args) < at + 2:
                continue
            kind, reason = node.args[at], node.args[at + 1]
            if isinstance(reason, ast.Constant) and isinstance(reason.value, str):
                found[reason.value] = (
                    str(kind.value) if isinstance(kind, ast.Constant) else "Warning"
                )
            elif not (isinstance(reason, ast.Name | ast.Attribute)):
                raise ValueError(f"{path.name}:{node.lineno}: an Event reason that is not a name")
    return found


_SIGNER_EVENT_CALLS: Final = {
    "record_event": (1, "the PodCertificateRequest"),
    "record_secret_event": (2, "the CA Secret"),
}


def signer_event_reasons(folder: Path = ROOT / "signer") -> dict[str, tuple[str, str]]:
    """reason -> (the object it is recorded on, when: its module's docstring) of every Event the
    signer records besides a request's denial or failure (those carry the Denied/Failed reason):
    each call site passes a module's `REASON` constant. A call site passing anything else but
    the settlement's `event.reason` raises, so a new kind of Event cannot be missed silently."""
    constants: dict[str, str] = {}
    docs: dict[str, str] = {}  # module -> its docstring's first paragraph
    calls: list[tuple[str, str, str]] = []  # (module alias, object, where)
    for path in sorted(folder.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        relative = path.relative_to(folder.parent).with_suffix("")
        module = ".".join(relative.parts)
        said = (ast.get_docstring(tree) or "").split("\n\n")[0]
        for statement in tree.body:
            targets: list[ast.expr] = []
            if isinstance(statement, ast.AnnAssign):
                targets = [statement.target]
            elif isinstance(statement, ast.Assign):
                targets = statement.targets
            value = getattr(statement, "value", None)
            named = any(isinstance(t, ast.Name) and t.id == "REASON" for t in targets)
            if named and isinstance(value, ast.Constant) and isinstance(value.value, str):
                constants[module] = value.value
                docs[module] = " ".join(said.split())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in _SIGNER_EVENT_CALLS:
                continue
            at, recorded_on = _SIGNER_EVENT_CALLS[node.func.attr]
            reason = node.args[at] if len(node.args) > at else None
            where = f"{relative}.py:{node.lineno}"
            if isinstance(reason, ast.Attribute) and reason.attr == "reason":
                continue  # the settlement's: a Denied or Failed reason
            if not (
                isinstance(reason, ast.Attribute)
                and reason.attr == "REASON"
                and isinstance(reason.value, ast.Name)
            ):
                raise ValueError(f"{where}: an Event reason that is not a module's REASON")
            calls.append((reason.value.id, recorded_on, where))
    out: dict[str, tuple[str, str]] = {}
    for alias, recorded_on, where in calls:
        found = [m for m in constants if m.rsplit(".", 1)[-1] == alias]
        if len(found) != 1:
            raise ValueError(f"{where}: cannot tell which module's REASON {alias}.REASON is")
        out[constants[found[0]]] = (recorded_on, f"{docs[found[0]]} (`{found[0]}`)")
    return out


def reasons_markdown() -> str:
    """The Denied, Failed and retry reasons (signer.model's closed types, with the code's own
    comment on each), and the Events the signer and the shim record."""
    from signer import model

    source = (ROOT / "signer" / "model.py").read_text(encoding="utf-8")
    binding = literal_comments(source, "BindingReason")
    deny = literal_comments(source, "DenyReason")
    out = [
        "What a PodCertificateRequest's condition says (its `reason`), what the audit log",
        "records and what `podcert_signer_requests_total`'s `reason` label carries.",
        "",
        "## Denied",
        "",
        "A denial is final for that request: the pod's node asks again only after the cause",
        "is fixed (a new pod, a changed policy).",
        "",
        "| reason | what it means |",
        "|---|---|",
    ]
    for reason in _flat(model.DenyReason):
        note = binding.get(reason) or deny.get(reason) or ""
        if reason in binding:
            note = f"the NodeRestriction checks against live state. {note}".strip()
        out.append(f"| {_code(reason)} | {_cell(note)} |")
    fail = literal_comments(source, "FailReason")
    retry = literal_comments(source, "RetryReason")
    out += ["", "## Failed", "", "| reason | what it means |", "|---|---|"]
    out += [f"| {_code(r)} | {_cell(fail.get(r, ''))} |" for r in _flat(model.FailReason)]
    out += [
        "",
        "## Retried",
        "",
        "Transient, on the signer's side: the request stays pending and is decided again",
        "(`podcert_signer_retries_total`'s `reason`).",
        "",
        "| reason | what it means |",
        "|---|---|",
    ]
    out += [f"| {_code(r)} | {_cell(retry.get(r, ''))} |" for r in _flat(model.RetryReason)]
    out += [
        "",
        "## Events",
        "",
        "The signer records a Warning Event on the PodCertificateRequest for each denial and",
        "failure, with the reason above, and these:",
        "",
        "| reason | type | on | when |",
        "|---|---|---|---|",
    ]
    out += [
        f"| {_code(r)} | Warning | {on} | {_cell(when)} |"
        for r, (on, when) in sorted(signer_event_reasons().items())
    ]
    out += [
        "",
        "The shim records these on the pod:",
        "",
        "| reason | type | recorded by |",
        "|---|---|---|",
    ]
    out += [f"| {_code(r)} | {t} | shim |" for r, t in sorted(shim_event_reasons().items())]
    return "\n".join(out) + "\n"


def _flat(literal: Any) -> list[str]:
    """The string members of a (possibly nested) Literal type, in order."""
    out: list[str] = []
    for arg in get_args(literal):
        out += [arg] if isinstance(arg, str) else _flat(arg)
    return out
