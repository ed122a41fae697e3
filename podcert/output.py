"""What every read command prints: a table for people, or one JSON or YAML document for
programs, the same document in both, carrying `apiVersion` and `kind` so that a script can tell
which schema it reads (docs/OUTPUT.md lists every kind's fields).

Guarantees: a document is a mapping whose first two keys are `apiVersion` and `kind`; within one
`apiVersion` a field is only ever added, never renamed, removed or given another type; times are
RFC 3339 strings in UTC; absent values are null, never left out.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, get_args

API_VERSION: Final = "podcert.dev/v1alpha1"

Format = Literal["table", "json", "yaml"]
FORMATS: Final[tuple[Format, ...]] = get_args(Format)


def add_output_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`-o/--output table|json|yaml`, the same on every read command."""
    parser.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default="table",
        help="table for people; json or yaml for programs, with apiVersion "
        f"{API_VERSION} and a kind (docs/OUTPUT.md)",
    )


def document(kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """`body` under the apiVersion and `kind` header."""
    return {"apiVersion": API_VERSION, "kind": kind, **body}


def dumps(doc: Mapping[str, Any], fmt: Format) -> str:
    """`doc` as JSON (indented) or YAML (block style, keys in the order given), ending in a
    newline. YAML is imported here only: a table costs nothing of it."""
    if fmt == "yaml":
        import yaml

        text: str = yaml.safe_dump(dict(doc), sort_keys=False, default_flow_style=False)
        return text
    return json.dumps(doc, indent=2) + "\n"


def render(doc: Mapping[str, Any], fmt: Format, table: Callable[[], str]) -> str:
    """The text a read command prints: `table()` for "table", else `doc` in `fmt`."""
    if fmt == "table":
        text = table()
        return text if text.endswith("\n") else text + "\n"
    return dumps(doc, fmt)
