"""The chart's values as helm sees them: a user's values merged over charts/podcert/values.yaml,
then checked against values.schema.json, so a page's `# values.yaml` block is held to what
`helm install` would accept without running helm.

The check is the draft-7 subset the chart's schema uses (types, properties,
additionalProperties, required, enum, minimum/maximum, items, minItems, pattern): a keyword
outside it is ignored, so the check never refuses what helm accepts for that reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, Final

import yaml

CHART: Final = Path(__file__).resolve().parents[1] / "charts" / "podcert"


@cache
def chart_values(chart: Path = CHART) -> Any:
    return yaml.safe_load((chart / "values.yaml").read_text(encoding="utf-8"))


def values_problems(values: Any) -> list[str]:
    """What the chart's values.schema.json refuses in `values` merged over the chart's own
    values.yaml, as helm merges a user's file before validating (a small draft-7 subset:
    types, properties, additionalProperties, required, enum, bounds, items, pattern)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    return list(_schema_problems(_merged(chart_values(), values), schema, "values"))


def _merged(base: Any, over: Any) -> Any:
    """helm's merge of values: mappings key by key, anything else replaced (null included)."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merged(base.get(k), v) for k, v in over.items()}}
    return over


_TYPES: Final[dict[str, type | tuple[type, ...]]] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "integer": int,
    "number": (int, float),
    "null": type(None),
}


def _schema_problems(value: Any, schema: Any, path: str) -> Iterator[str]:
    if not isinstance(schema, dict):
        return
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        ok = any(
            isinstance(value, _TYPES[k]) and not (k in ("integer", "number") and value is True)
            for k in kinds
            if k in _TYPES
        )
        if not ok:
            yield f"{path}: {value!r} is not {' or '.join(kinds)}"
            return
    if "enum" in schema and value not in schema["enum"]:
        yield f"{path}: {value!r} is not one of {schema['enum']}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            yield f"{path}: {value} is below {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            yield f"{path}: {value} is above {schema['maximum']}"
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        yield f"{path}: {value!r} does not match {schema['pattern']}"
    if isinstance(value, list):
        for index, item in enumerate(value):
            yield from _schema_problems(item, schema.get("items"), f"{path}[{index}]")
        if len(value) < schema.get("minItems", 0):
            yield f"{path}: fewer than {schema['minItems']} items"
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for key in schema.get("required", ()):
            if key not in value:
                yield f"{path}.{key}: required"
        for key, item in value.items():
            if key in properties:
                yield from _schema_problems(item, properties[key], f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                yield f"{path}.{key}: not a key the chart knows"
            else:
                yield from _schema_problems(
                    item, schema.get("additionalProperties"), f"{path}.{key}"
                )
