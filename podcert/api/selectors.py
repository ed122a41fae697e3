"""Label selectors (metav1.LabelSelector): reading one from a pod spec, and matching labels.

A clusterTrustBundle source picks bundles by signer name and label selector; `pods` reads the
selector with `parse_selector` and the shim matches each bundle's labels with `matches_selector`.
What is valid and what matches are apimachinery's (`metav1.LabelSelectorAsSelector`: keys are
qualified names, values label values), pinned by tests/integration/test_api_selectors.py.
Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, get_args

from podcert.api.fields import ErrorKind, Report, is_map, string

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
OPERATORS: Final[tuple[Operator, ...]] = get_args(Operator)


# apimachinery's validation.IsQualifiedName and IsValidLabelValue, character for character.
_NAME: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MAX_NAME: Final = 63  # a key's name part, and a value
MAX_PREFIX: Final = 253  # a key's DNS subdomain prefix


def key_problem(key: str) -> str | None:
    """Why `key` is not a label key (`[prefix/]name`), or None when it is one."""
    prefix, slash, name = key.rpartition("/")
    if slash and "/" in prefix:
        return "must be a name with at most one '/' (prefix/name)"
    if slash and not prefix:
        return "prefix part must be non-empty"
    if prefix and (len(prefix) > MAX_PREFIX or _SUBDOMAIN.fullmatch(prefix) is None):
        return f"prefix part must be a lowercase DNS subdomain of at most {MAX_PREFIX} characters"
    if not name:
        return "name part must be non-empty"
    if len(name) > MAX_NAME or _NAME.fullmatch(name) is None:
        return (
            f"name part must be at most {MAX_NAME} alphanumeric characters, '-', '_' or '.', "
            "starting and ending with an alphanumeric character"
        )
    return None


def value_problem(value: str) -> str | None:
    """Why `value` is not a label value (empty, or a name part), or None when it is one."""
    if value and (len(value) > MAX_NAME or _NAME.fullmatch(value) is None):
        return (
            f"must be empty or at most {MAX_NAME} alphanumeric characters, '-', '_' or '.', "
            "starting and ending with an alphanumeric character"
        )
    return None


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
        for key, value in labels:
            for problem in (key_problem(key), value_problem(value)):
                if problem is not None:
                    counted("Invalid", f"{path}.matchLabels", f"{key!r}: {problem}")
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
    problems = [f"{value!r}: {p}" for value in values if (p := value_problem(value)) is not None]
    for problem in problems:
        report("Invalid", f"{path}.values", problem)
    if key is not None and (bad_key := key_problem(key)) is not None:
        report("Invalid", f"{path}.key", f"{key!r}: {bad_key}")
        return None
    if key is None or operator is None or problems:
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
