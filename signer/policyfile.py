"""Reading the policy file's composed YAML nodes, so that every error names the file, the line
and the field: the walker the signer's entries (`signer.policy`) and the federation section
(`signer.federation.domains`) are both read with. Pure: it works on nodes, never on files.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from bundles.spiffe import SpiffeIdError, parse_trust_domain
from podcert.errors import show


class PolicyError(Exception):
    """The policy file is unusable; the message reads `<file>:<line>: <field>: <problem>`."""


def trust_domain_problem(trust_domain: str) -> str | None:
    """Why `trust_domain` is not a SPIFFE trust domain name, or None when it is one.

    A name is accepted exactly when `bundles.spiffe` accepts it as a bare trust domain, so the
    signer never issues an ID its own workloads would refuse; the messages name the policy
    file's terms (a scheme, a port) first."""
    if "://" in trust_domain:
        return "must be a bare trust domain name, without a scheme such as spiffe://"
    if ":" in trust_domain:
        return "must not carry a port"
    try:
        parse_trust_domain(trust_domain)  # the SPIFFE rule workloads check peers' IDs by
    except SpiffeIdError:
        return (
            "must be 1 to 255 characters of lowercase letters, digits, dots, dashes and underscores"
        )
    return None


class PolicyReader:
    """Walks composed YAML nodes; each reading checks one node's type and names its path."""

    def __init__(self, source: str) -> None:
        self.source = source
        self._constructor = SafeConstructor()

    def error(self, node: Node, path: str, message: str) -> PolicyError:
        return PolicyError(f"{self.source}:{node.start_mark.line + 1}: {path}: {message}")

    def mapping(
        self, node: Node, path: str, allowed: Collection[str]
    ) -> dict[str, tuple[Node, Node]]:
        if not isinstance(node, MappingNode):
            raise self.error(node, path or "(top level)", "expected a mapping")
        keys: dict[str, tuple[Node, Node]] = {}
        for key_node, value_node in node.value:
            key = self.scalar(key_node, path or "(top level)")
            if not isinstance(key, str):
                raise self.error(
                    key_node, path or "(top level)", f"keys must be strings, got {_yaml_type(key)}"
                )
            key_path = f"{path}.{key}" if path else key
            if key not in allowed:
                raise self.error(
                    key_node,
                    key_path,
                    f"unknown key; expected one of {', '.join(sorted(allowed))}",
                )
            if key in keys:
                raise self.error(key_node, key_path, "duplicate key")
            keys[key] = (key_node, value_node)
        return keys

    def sequence(self, node: Node, path: str) -> list[Node]:
        if not isinstance(node, SequenceNode):
            raise self.error(node, path, "expected a list")
        return list(node.value)

    def string(self, node: Node, path: str) -> str:
        value = self.scalar(node, path)
        if not isinstance(value, str):
            raise self.error(node, path, f"expected a string, got {_yaml_type(value)}")
        return value

    def integer(self, node: Node, path: str) -> int:
        value = self.scalar(node, path)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(node, path, f"expected an integer, got {_yaml_type(value)}")
        return value

    def number(self, node: Node, path: str) -> float:
        value = self.scalar(node, path)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(node, path, f"expected a number, got {_yaml_type(value)}")
        if not math.isfinite(value):
            raise self.error(node, path, f"expected a finite number, got {value}")
        return float(value)

    def boolean(self, node: Node, path: str) -> bool:
        value = self.scalar(node, path)
        if not isinstance(value, bool):
            raise self.error(node, path, f"expected true or false, got {_yaml_type(value)}")
        return value

    def scalar(self, node: Node, path: str) -> object:
        """The Python value of a scalar node (YAML's own typing), or the node when not a scalar."""
        if not isinstance(node, ScalarNode):
            return node
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:  # e.g. an unknown tag such as !!python/object
            problem = getattr(exc, "problem", None) or str(exc)
            raise self.error(node, path, problem) from exc
        except Exception as exc:
            # An explicit tag on text that does not fit it ("!!int web", "!!bool x",
            # "!!timestamp x"): PyYAML's converters then raise ValueError, KeyError, IndexError
            # or AttributeError, none of them a YAMLError.
            kind = node.tag.rsplit(":", 1)[-1]
            raise self.error(node, path, f"{show(node.value, 40)} is not a valid {kind}") from exc


def _yaml_type(value: object) -> str:
    if isinstance(value, MappingNode):
        return "a mapping"
    if isinstance(value, SequenceNode):
        return "a list"
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, str):
        return f"a string ({show(value, 40)})"
    return f"{type(value).__name__} ({value!r})"
