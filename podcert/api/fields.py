"""Reading an object someone else wrote, field by field, the way the API server validates it.

A pod spec is untrusted input. Each problem is reported at its field path (for example
`spec.volumes[0].projected.sources[1].podCertificate.keyType`) with the API server's error type,
and reading carries on: one pass names every problem, and what was well formed is still used.
`pods` and `selectors` read with these. Nothing here raises on bad input.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import repeat
from typing import Literal, TypeGuard

# The API server's field.ErrorType values that a pod's projected sources can earn.
ErrorKind = Literal["Required", "Invalid", "NotSupported", "Duplicate", "Forbidden"]
# Records one problem: (kind, field path, message).
Report = Callable[[ErrorKind, str, str], None]


def is_map(value: object) -> TypeGuard[Mapping[str, object]]:
    """A JSON object: a mapping whose keys are all strings."""
    return isinstance(value, Mapping) and all(map(isinstance, value, repeat(str)))


def is_int(value: object) -> TypeGuard[int]:
    """A JSON integer (a bool is not one, although Python says it is an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def string(
    report: Report, obj: Mapping[str, object], key: str, path: str, *, required: bool
) -> str | None:
    """`obj[key]` when it is a non-empty string; None (reported where it matters) otherwise.

    An empty string counts as unset, as the API server's `len(x) == 0` checks do.
    """
    value = obj.get(key)
    if value is None or value == "":
        if required:
            report("Required", f"{path}.{key}", "must be set")
        return None
    if not isinstance(value, str):
        report("Invalid", f"{path}.{key}", f"must be a string, not {type(value).__name__}")
        return None
    return value
