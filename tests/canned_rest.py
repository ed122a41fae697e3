"""A Rest over canned JSON for the unit tests of the API adapters (`signer.kube`,
`kubelet_shim.kube`): lists and watches decode each object into the shape asked for, as
`podcert.client.rest.Rest` does, and what was asked and written is recorded."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any, cast

import msgspec

from podcert.client import pages


class CannedRest:
    """list, watch, get and write over `items`; a watch ends with a BOOKMARK at `bookmark`
    when one is given."""

    def __init__(self, items: list[dict[str, Any]], bookmark: str | None = None) -> None:
        self.raw = [json.dumps(item).encode() for item in items]
        self.bookmark = bookmark
        self.queries: list[Mapping[str, str]] = []
        self.sent: list[tuple[str, str, Any]] = []

    def list(
        self, path: str, shape: type[Any] | pages.Shape[Any], *, query: Mapping[str, str]
    ) -> tuple[Iterator[Any], str]:
        self.queries.append(query)
        return iter([_decode(raw, shape) for raw in self.raw]), "41"

    def watch(
        self, path: str, resource_version: str, shape: type[Any] | pages.Shape[Any], **query: str
    ) -> Iterator[dict[str, Any]]:
        self.queries.append(query)
        for raw in self.raw:
            yield {"type": "MODIFIED", "object": _decode(raw, shape)}
        if self.bookmark is not None:
            meta = {"resourceVersion": self.bookmark}
            mark = msgspec.json.encode({"kind": "Bookmark", "metadata": meta})
            yield {"type": "BOOKMARK", "object": _decode(mark, shape)}

    def get(self, path: str) -> dict[str, Any] | None:
        return cast(dict[str, Any], json.loads(self.raw[0]))

    def get_as(self, path: str, shape: type[Any] | pages.Shape[Any]) -> Any:
        self.sent.append(("GET", path, None))
        return _decode(self.raw[0], shape)

    def write(self, method: str, path: str, *, body: Any) -> None:
        self.sent.append((method, path, json.loads(msgspec.json.encode(body))))  # as Rest sends it


def _decode(raw: bytes, shape: type[Any] | pages.Shape[Any]) -> Any:
    """As `Rest` decodes: into a type, or through a shape's own decoders (`pages.Lenient`)."""
    if isinstance(shape, pages.Shape):
        return shape.element(raw, "object")
    return msgspec.json.decode(raw, type=shape)
