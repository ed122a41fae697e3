"""Label selectors (metav1.LabelSelector): reading one from a pod spec, and matching labels.

A clusterTrustBundle source picks bundles by signer name and label selector; `pods` reads the
selector with `parse_selector` and the shim matches each bundle's labels with `matches_selector`.
Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, get_args

from podcert.api.fields import ErrorKind, Report, is_map, string

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
OPERATORS: Final[tuple[Operator, ...]] = get_args(Operator)


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class LabelSelector:
    """A parsed metav1.LabelSelector; requirements are ANDed, an empty selector matches all."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()


def parse_selector(raw: object, path: str, report: Report) -> LabelSelector | None:
    """The selector at `path`, or None after reporting what is wrong with it."""
    if not is_map(raw):
        report("Invalid", path, "must be an object")
        return None
    problems = 0

    def counted(kind: ErrorKind, at: str, message: str) -> None:
        nonlocal problems
        problems += 1
        report(kind, at, message)

    labels: list[tuple[str, str]] = []
    raw_labels = raw.get("matchLabels") or {}
    if is_map(raw_labels) and all(isinstance(v, str) for v in raw_labels.values()):
        labels = sorted((k, str(v)) for k, v in raw_labels.items())
    else:
        counted("Invalid", f"{path}.matchLabels", "must map strings to strings")

    requirements: list[Requirement] = []
    raw_expressions = raw.get("matchExpressions") or []
    if not isinstance(raw_expressions, list):
        counted("Invalid", f"{path}.matchExpressions", "must be a list")
        raw_expressions = []
    for i, expression in enumerate(raw_expressions):
        requirement = _parse_requirement(counted, expression, f"{path}.matchExpressions[{i}]")
        if requirement is not None:
            requirements.append(requirement)
    if problems:
        return None
    return LabelSelector(tuple(labels), tuple(requirements))


def _parse_requirement(report: Report, raw: object, path: str) -> Requirement | None:
    if not is_map(raw):
        report("Invalid", path, "must be an object")
        return None
    key = string(report, raw, "key", path, required=True)
    raw_operator = string(report, raw, "operator", path, required=True)
    operator: Operator | None = None
    for known in OPERATORS:
        if raw_operator == known:
            operator = known
    if raw_operator is not None and operator is None:
        report(
            "NotSupported", f"{path}.operator", f"{raw_operator!r}; one of {', '.join(OPERATORS)}"
        )
    raw_values = raw.get("values") or []
    if not isinstance(raw_values, list) or not all(isinstance(v, str) for v in raw_values):
        report("Invalid", f"{path}.values", "must be a list of strings")
        return None
    values = tuple(str(v) for v in raw_values)
    if key is None or operator is None:
        return None
    if operator in ("In", "NotIn") and not values:
        report("Required", f"{path}.values", f"must be non-empty for {operator}")
        return None
    if operator in ("Exists", "DoesNotExist") and values:
        report("Forbidden", f"{path}.values", f"must be empty for {operator}")
        return None
    return Requirement(key, operator, values)


def matches_selector(
    labels: Mapping[str, str], selector: LabelSelector | Mapping[str, object] | None
) -> bool:
    """Whether an object's labels satisfy a label selector.

    `None` matches nothing (the clusterTrustBundle rule for an unset selector) and an empty
    selector matches everything. A raw selector dict is parsed first; a malformed one raises
    ValueError, since quietly matching nothing or everything would both be wrong.
    """
    if selector is None:
        return False
    if not isinstance(selector, LabelSelector):
        problems: list[str] = []
        parsed = parse_selector(
            selector,
            "labelSelector",
            lambda kind, at, message: problems.append(f"{at}: {kind}: {message}"),
        )
        if parsed is None:
            raise ValueError("; ".join(problems))
        selector = parsed
    if any(labels.get(key) != value for key, value in selector.match_labels):
        return False
    for requirement in selector.match_expressions:
        present = requirement.key in labels
        if requirement.operator == "Exists":
            ok = present
        elif requirement.operator == "DoesNotExist":
            ok = not present
        elif requirement.operator == "In":
            ok = present and labels[requirement.key] in requirement.values
        else:  # NotIn: an object without the label is not in any set
            ok = not present or labels[requirement.key] not in requirement.values
        if not ok:
            return False
    return True
