"""podcert.api.selectors: label selectors pinned to apimachinery: `matches_selector` and
`metav1.LabelSelectorAsSelector(...).Matches` (tests/interop/reference) judge the same generated
selectors and label sets: both refuse the selector, or both give the same match.

The keys and values are drawn where validation bites (prefixes, lengths at 63 and 64, the first
and last character, uppercase in a prefix), and the operators include misspelled ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from podcert.api.selectors import matches_selector
from tests.integration.reference import DIFFERENTIAL, Reference

KEYS = [
    "app", "tier", "a", "A", "0", "app.kubernetes.io/name", "example.com/x", "EXAMPLE.com/x",
    "k8s.spiffe.io/canarying", "a" * 63, "a" * 64, "p/" + "a" * 63, "b" * 64 + ".io/x",
    "x" * 254 + "/a", "-a", "a-", "a_b", "a.b", "_a", "a b", "", "/a", "a/", "a/b/c", "é",
    "a\n", ".io/a", "io./a", "-io/a",
]  # fmt: skip
VALUES = ["", "v", "web", "V-1", "a.b_c", "-v", "v-", "a" * 63, "a" * 64, "a b", "é", "v\n"]
OPERATORS = ["In", "NotIn", "Exists", "DoesNotExist", "in", "Equals", "", "!="]

EXPRESSION = st.fixed_dictionaries(
    {"key": st.sampled_from(KEYS), "operator": st.sampled_from(OPERATORS)},
    optional={"values": st.none() | st.lists(st.sampled_from(VALUES), max_size=3)},
)
SELECTOR = st.none() | st.fixed_dictionaries(
    {},
    optional={
        "matchLabels": st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=3),
        "matchExpressions": st.lists(EXPRESSION, max_size=3),
    },
)
# Labels an object could carry: valid keys and values only (the API server admits no other).
VALID_KEYS = ["app", "tier", "a", "A", "0", "app.kubernetes.io/name", "example.com/x", "a_b"]
VALID_VALUES = ["", "v", "web", "V-1", "a.b_c"]
LABELS = st.dictionaries(st.sampled_from(VALID_KEYS), st.sampled_from(VALID_VALUES), max_size=4)


@pytest.fixture(scope="module")
def reference() -> Iterator[Reference]:
    with Reference.started() as started:
        yield started


@DIFFERENTIAL
@given(SELECTOR, LABELS)
@example({"matchLabels": {"a" * 64: "v"}}, {})
@example({"matchLabels": {"app": "a" * 64}}, {})
@example({"matchLabels": {"EXAMPLE.com/x": "v"}}, {})
@example({"matchExpressions": [{"key": "app", "operator": "In", "values": ["a b"]}]}, {})
@example({"matchExpressions": [{"key": "a b", "operator": "Exists"}]}, {})
@example({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["v"]}]}, {})
@example({}, {"app": "web"})
@example(None, {"app": "web"})
def test_selectors_match_as_apimachinery_matches_them(
    reference: Reference, selector: dict[str, Any] | None, labels: dict[str, str]
) -> None:
    theirs = reference.ask("selector", selector=selector, labels=labels)
    try:
        ours = matches_selector(labels, selector)
    except ValueError as err:
        assert "error" in theirs, f"apimachinery takes {selector}, podcert refuses: {err}"
        return
    assert "error" not in theirs, f"podcert takes {selector}, apimachinery: {theirs['error']}"
    # A nil selector: LabelSelectorAsSelector gives labels.Nothing(), as the bundle rule says.
    assert ours == theirs["matches"]
