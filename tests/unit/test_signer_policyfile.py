"""signer.policyfile: the walker the policy file is read with, on composed YAML nodes. Each
reading checks one node's type by YAML's own typing and names file, line and field when it is
wrong; a mapping takes only the keys it is told, once each; and a trust domain is accepted exactly
when workloads would accept it."""

from __future__ import annotations

import pytest
import yaml
from yaml.nodes import Node

from bundles.spiffe import SpiffeIdError, parse_trust_domain
from signer.policyfile import PolicyError, PolicyReader, trust_domain_problem

READER = PolicyReader("policy.yaml")


def node(text: str) -> Node:
    composed = yaml.compose(text)
    assert composed is not None
    return composed


def value_of(text: str) -> Node:
    """The value node of key `v` in the mapping `text`."""
    return READER.mapping(node(text), "", {"v", "x"})["v"][1]


def test_a_mapping_gives_each_allowed_key_with_its_nodes() -> None:
    keys = READER.mapping(node("name: web\ncount: 3\n"), "signers[0]", {"name", "count", "x"})

    assert sorted(keys) == ["count", "name"]
    assert READER.string(keys["name"][1], "signers[0].name") == "web"
    assert READER.integer(keys["count"][1], "signers[0].count") == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "a: 1\nb: 2\n",
            "policy.yaml:2: b: unknown key; expected one of a, c",
            id="a key it was not told names the allowed ones",
        ),
        pytest.param("a: 1\nc: 2\na: 3\n", "policy.yaml:3: a: duplicate key", id="a key twice"),
        pytest.param(
            "1: x\n",
            "policy.yaml:1: (top level): keys must be strings, got int (1)",
            id="a key that is no string",
        ),
        pytest.param("[a, c]\n", "policy.yaml:1: (top level): expected a mapping", id="a list"),
    ],
)
def test_a_mapping_refuses_what_it_was_not_told_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        READER.mapping(node(text), "", {"a", "c"})
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("read", "text", "value"),
    [
        pytest.param("string", "v: '7'\n", "7", id="a quoted number is a string"),
        pytest.param("integer", "v: 0x1f\n", 31, id="YAML's integer forms are integers"),
        pytest.param("number", "v: 3\n", 3.0, id="an integer is a number"),
        pytest.param("number", "v: 2.5e-1\n", 0.25, id="a float is a number"),
        pytest.param("boolean", "v: false\n", False, id="false is a boolean"),
    ],
)
def test_each_reading_takes_yamls_own_typing(read: str, text: str, value: object) -> None:
    found = getattr(READER, read)(value_of(text), "v")

    assert found == value and type(found) is type(value)


@pytest.mark.parametrize(
    ("read", "text", "problem"),
    [
        pytest.param("string", "v: 42\n", "expected a string, got int (42)", id="a number"),
        pytest.param("string", "v:\n", "expected a string, got nothing (null)", id="nothing"),
        pytest.param(
            "integer", "v: true\n", "expected an integer, got a boolean (true)", id="bool"
        ),
        pytest.param("integer", "v: 1.5\n", "expected an integer, got float (1.5)", id="a float"),
        pytest.param("number", "v: .inf\n", "expected a finite number, got inf", id="infinity"),
        pytest.param("number", "v: .nan\n", "expected a finite number, got nan", id="not a number"),
        pytest.param("number", "v: [1]\n", "expected a number, got a list", id="a list"),
        pytest.param(
            "boolean",
            "v: 'true'\n",
            "expected true or false, got a string ('true')",
            id="a quoted true",
        ),
        pytest.param("sequence", "v: {a: 1}\n", "expected a list", id="a mapping for a list"),
        pytest.param("integer", "v: !!int ten\n", "'ten' is not a valid int", id="a tag misfit"),
        pytest.param(
            "string",
            "v: !!python/name:os.system\n",
            "could not determine a constructor",
            id="a python tag is refused",
        ),
    ],
)
def test_each_reading_refuses_another_type_naming_line_and_field(
    read: str, text: str, problem: str
) -> None:
    with pytest.raises(PolicyError) as caught:
        getattr(READER, read)(value_of("x: 0\n\n" + text), "signers[0].v")
    assert str(caught.value).startswith(f"policy.yaml:3: signers[0].v: {problem}")


@pytest.mark.parametrize(
    "name",
    [
        "cluster.local",
        "td.example",
        "a",
        "x" * 255,
        "x" * 256,
        "under_score.example",
        "Upper.Example",
        "cluster.local:8443",
        "",
        "a/b",
        "dot..dot",
        "ünicode.example",
    ],
)
def test_a_bare_trust_domain_is_accepted_exactly_when_workloads_would_accept_it(name: str) -> None:
    try:
        parse_trust_domain(name)
        workloads_accept = True
    except SpiffeIdError:
        workloads_accept = False

    assert (trust_domain_problem(name) is None) == workloads_accept


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        pytest.param("spiffe://cluster.local", "without a scheme such as spiffe://", id="scheme"),
        pytest.param("cluster.local:8443", "must not carry a port", id="a port"),
        pytest.param("Cluster.Local", "lowercase letters, digits, dots", id="uppercase"),
    ],
)
def test_a_refused_trust_domain_is_told_in_the_policy_files_terms(name: str, problem: str) -> None:
    found = trust_domain_problem(name)

    assert found is not None and problem in found
