"""podcert.api.fields: reading an untrusted object field by field. A JSON object has string keys;
a bool is no integer; a string field reads as its value, or as unset (empty counts as unset) and
reported as Required only where it must be set, or as Invalid naming the type it was, each
problem at its full field path, and nothing raised."""

from __future__ import annotations

import pytest

from podcert.api.fields import ErrorKind, is_int, is_map, string

Problem = tuple[ErrorKind, str, str]


@pytest.mark.parametrize(
    ("value", "holds"),
    [
        ({}, True),
        ({"a": 1, "b": [2]}, True),
        ({1: "a"}, False),
        ({"a": 1, None: 2}, False),
        ([("a", 1)], False),
        ("a", False),
        (None, False),
    ],
)
def test_a_map_is_a_mapping_with_string_keys(value: object, holds: bool) -> None:
    assert is_map(value) is holds


@pytest.mark.parametrize(
    ("value", "holds"),
    [
        (0, True),
        (-7, True),
        (2**70, True),
        (True, False),
        (False, False),
        (1.0, False),
        ("1", False),
    ],
)
def test_an_int_is_a_json_integer_and_never_a_bool(value: object, holds: bool) -> None:
    assert is_int(value) is holds


def read(obj: dict[str, object], *, required: bool) -> tuple[str | None, list[Problem]]:
    problems: list[Problem] = []
    value = string(
        lambda kind, path, message: problems.append((kind, path, message)),
        obj,
        "keyType",
        "spec.volumes[0].projected.sources[1].podCertificate",
        required=required,
    )
    return value, problems


AT = "spec.volumes[0].projected.sources[1].podCertificate.keyType"


def test_a_string_reads_as_itself_with_no_problem() -> None:
    assert read({"keyType": "ECDSAP256"}, required=True) == ("ECDSAP256", [])


@pytest.mark.parametrize("obj", [{}, {"keyType": None}, {"keyType": ""}])
def test_an_unset_string_is_a_problem_only_where_it_is_required(obj: dict[str, object]) -> None:
    assert read(obj, required=False) == (None, [])
    assert read(obj, required=True) == (None, [("Required", AT, "must be set")])


@pytest.mark.parametrize(
    ("value", "type_name"), [(5, "int"), (False, "bool"), (["a"], "list"), ({"a": "b"}, "dict")]
)
def test_a_string_of_another_type_is_invalid_naming_it(value: object, type_name: str) -> None:
    for required in (True, False):
        assert read({"keyType": value}, required=required) == (
            None,
            [("Invalid", AT, f"must be a string, not {type_name}")],
        )
