"""A user's values are held to the chart's schema after helm's merge over values.yaml."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster import chartvalues


def test_the_charts_own_values_are_valid_and_a_partial_file_is_merged_over_them() -> None:
    assert chartvalues.values_problems({}) == []
    assert chartvalues.values_problems({"trustDomain": "prod.example.com"}) == []


def test_a_merge_keeps_sibling_keys_and_replaces_lists_whole() -> None:
    base = {"image": {"repository": "r", "tag": ""}, "signerNames": ["a", "b"]}
    over = {"image": {"tag": "1"}, "signerNames": ["c"]}
    assert chartvalues._merged(base, over) == {
        "image": {"repository": "r", "tag": "1"},
        "signerNames": ["c"],
    }


@pytest.mark.parametrize(
    "values, said",
    [
        pytest.param({"nope": 1}, "values.nope: not a key the chart knows", id="unknown key"),
        pytest.param({"image": {"tag": 3}}, "values.image.tag: 3 is not string", id="a type"),
        pytest.param(
            {"policy": {"maxLifetimeSeconds": 60}}, "is below 3600", id="the policy's bounds"
        ),
        pytest.param(
            {"policy": {"keyTypes": ["DSA"]}}, "'DSA' is not one of", id="a key type enum"
        ),
    ],
)
def test_what_the_schema_refuses_is_named(values: dict[str, Any], said: str) -> None:
    assert any(said in p for p in chartvalues.values_problems(values)), values
