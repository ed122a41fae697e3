"""`podcert.client.pages` pinned to msgspec decoding the whole page, on generated pages.

A list page read an element at a time, from pieces cut anywhere, must give the same items and the
same metadata as msgspec decoding the page whole into `{items: list[shape] | None, metadata}`, or
fail where that fails: members in any order (the metadata after the items too), strings holding
brackets, quotes, escapes and the API server's own element separator, nesting deeper than the
fast pattern follows, elements longer than the read buffer, broken bytes anywhere. The one listed
difference: a page naming `items` or `metadata` twice is refused (msgspec keeps the last).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from podcert.client import pages


class Meta(msgspec.Struct, frozen=True):
    name: str = ""
    labels: msgspec.Raw = msgspec.Raw(b"null")


class Item(msgspec.Struct, frozen=True):
    """A shape as the signer's caches use: a few fields, one read raw, the rest skipped."""

    metadata: Meta = Meta()
    spec: Any = None


class DictPage(msgspec.Struct, frozen=True):
    """The reference: the page decoded whole, as `podcert.client.rest` did before it streamed."""

    items: list[dict[str, Any]] | None = None
    metadata: pages.ListMeta = pages.ListMeta()


class ItemPage(msgspec.Struct, frozen=True):
    items: list[Item] | None = None
    metadata: pages.ListMeta = pages.ListMeta()


SHAPES: dict[str, Any] = {"dict": dict[str, Any], "shape": Item}
WHOLE: dict[str, Any] = {"dict": DictPage, "shape": ItemPage}


def whole(data: bytes, shape: str) -> tuple[list[Any] | None, pages.ListMeta]:
    page = msgspec.json.decode(data, type=WHOLE[shape])
    return page.items, page.metadata


def streamed(data: bytes, shape: Any, cuts: list[int]) -> tuple[list[Any], pages.ListMeta]:
    """(items, metadata) as `podcert.client.rest` reads them: the metadata first, then the items."""
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    page = pages.Page((data[a:b] for a, b in itertools.pairwise(bounds)), pages.Shape(shape))
    first = page.metadata()
    items = list(page)
    assert page.metadata() == first, "the metadata read first is the page's"
    return items, first


def raw(item: Any) -> Any:
    """Items comparable: a Raw field as its bytes."""
    if isinstance(item, Item):
        return (item.metadata.name, bytes(item.metadata.labels), item.spec)
    return item


TRICKY = st.sampled_from(
    ['},{"metadata":', '"', "\\", "]", "[", "{", "}", ",", ":", "\u00e9", "\u2028", "\ud7ff"]
)
STRINGS = st.lists(st.one_of(TRICKY, st.text(max_size=8)), max_size=6).map("".join)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63), st.floats(allow_nan=False), STRINGS
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(STRINGS, inner, max_size=4)
    ),
    max_leaves=25,
)


@st.composite
def items(draw: st.DrawFn) -> dict[str, Any]:
    item: dict[str, Any] = {}
    if draw(st.booleans()):
        meta = {"name": draw(STRINGS)}
        if draw(st.booleans()):
            meta["labels"] = draw(st.dictionaries(STRINGS, STRINGS, max_size=5))
        meta.update(draw(st.dictionaries(STRINGS, VALUES, max_size=2)))
        item["metadata"] = meta
    item.update(draw(st.dictionaries(st.sampled_from(["spec", "status", "x"]), VALUES, max_size=3)))
    return item


@st.composite
def documents(draw: st.DrawFn) -> bytes:
    members: list[tuple[str, Any]] = []
    if draw(st.booleans()):
        members.append(("kind", "PodList"))
    if draw(st.booleans()):
        meta: dict[str, Any] = {
            "resourceVersion": draw(st.from_regex(r"[0-9]{1,6}", fullmatch=True))
        }
        if draw(st.booleans()):
            meta["continue"] = draw(STRINGS)
        members.append(("metadata", meta))
    if draw(st.integers(0, 9)):
        members.append(("items", draw(st.lists(items(), max_size=6))))
    elif draw(st.booleans()):
        members.append(("items", draw(VALUES)))
    members += draw(st.lists(st.tuples(STRINGS, VALUES), max_size=2))
    members = draw(st.permutations(members))
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", "\t:\r")]))
    body = (
        "{"
        + separators[0].join(
            json.dumps(k) + separators[1] + json.dumps(v, separators=separators, ensure_ascii=False)
            for k, v in members
        )
        + "}"
    )
    data = body.encode("utf-8", "surrogatepass")
    for _ in range(draw(st.integers(0, 2)) if draw(st.integers(0, 3)) == 0 else 0):
        at = draw(st.integers(0, len(data)))
        byte = draw(st.sampled_from([b"", b"{", b"}", b"]", b'"', b"\\", b",", b"\xff", b" "]))
        data = data[:at] + byte + data[at + draw(st.integers(0, 1)) :]
    return data


def twice(data: bytes) -> bool:
    """Whether the page names items or metadata twice at its top level."""
    found: list[str] = []

    def pairs(kv: list[tuple[str, Any]]) -> dict[str, Any]:
        found.extend(k for k, _ in kv)
        return dict(kv)

    try:
        json.loads(data, object_pairs_hook=lambda kv: (found.clear(), pairs(kv))[1])
    except ValueError:
        return False
    return found.count("items") > 1 or found.count("metadata") > 1


def check(data: bytes, shape: str, cuts: list[int]) -> None:
    try:
        expected: Any = whole(data, shape)
    except msgspec.DecodeError as err:
        expected = err
    try:
        got, meta = streamed(data, SHAPES[shape], cuts)
    except pages.ListError as err:
        assert isinstance(expected, Exception) or twice(data), (data, expected, err)
        return
    assert not isinstance(expected, Exception), (data, got, expected)
    assert [raw(i) for i in got] == [raw(i) for i in expected[0] or []]
    assert meta == expected[1]


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents(), st.sampled_from(sorted(SHAPES)), st.lists(st.integers(0, 1 << 16), max_size=8))
@example(b'{"items":[{"a":1}],"metadata":{"resourceVersion":"7","continue":"t"}}', "dict", [3])
@example(b'{"items":[{"metadata":{"name":"},{\\"metadata\\":"}}]}', "shape", [])
@example(b'{"items":[1,]}', "dict", [])
@example(b'{"it\\u0065ms":[{}],"\xff":1}', "dict", [9])
@example(b'{"kind":"PodList","items":null,"\xff},{\\"metadata\\":":null}', "shape", [])
def test_a_page_read_in_pieces_is_the_page_decoded_whole(
    data: bytes, shape: str, cuts: list[int]
) -> None:
    check(data, shape, cuts)


def big_item(i: int, labels: int, depth: int = 0) -> dict[str, Any]:
    nested: Any = "deep"
    for _ in range(depth):
        nested = {"n": [nested]}
    return {
        "metadata": {
            "name": f"pod-{i}",
            "labels": {f"tenant.example/k{n:05d}": f"v{i}" + "v" * 40 for n in range(labels)},
            "annotations": {"a": '},{"metadata":' * 200 + "\\"},
        },
        "spec": {"nested": nested, "containers": [{"name": "a"}, {"name": "b"}]},
    }


@pytest.mark.parametrize(
    ("count", "labels", "depth", "piece"),
    [
        pytest.param(500, 2, 0, 1 << 20, id="500 small elements in one buffer"),
        pytest.param(30, 7000, 0, 1 << 16, id="elements many times the buffer"),
        pytest.param(20, 10, 40, 997, id="nesting deeper than the fast pattern, cut anywhere"),
    ],
)
def test_large_and_deep_pages_give_the_whole_pages_items(
    count: int, labels: int, depth: int, piece: int
) -> None:
    data = json.dumps(
        {
            "metadata": {"resourceVersion": "9"},
            "items": [big_item(i, labels, depth) for i in range(count)],
        },
        separators=(",", ":"),
    ).encode()
    cuts = list(range(piece, len(data), piece))
    for shape in SHAPES:
        check(data, shape, cuts)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b'{"items":[],"items":[{}]}', id="items twice"),
        pytest.param(b'{"metadata":{},"metadata":{"resourceVersion":"1"}}', id="metadata twice"),
    ],
)
def test_a_member_given_twice_is_refused(data: bytes) -> None:
    msgspec.json.decode(data, type=dict)  # msgspec takes it (keeping the last)
    with pytest.raises(pages.ListError, match="twice"):
        streamed(data, dict[str, Any], [])


def test_a_page_holds_one_element_and_a_buffer_however_large_the_page() -> None:
    """The buffer never holds more than about two elements and two pieces."""
    item = big_item(0, 7000)
    one = len(json.dumps(item, separators=(",", ":")))
    data = json.dumps({"items": [item] * 40}, separators=(",", ":")).encode()
    piece = 1 << 16
    page = pages.Page((data[i : i + piece] for i in range(0, len(data), piece)), pages.Shape(Item))
    largest = 0
    for _ in page:
        largest = max(largest, len(page._buf))
    assert largest <= 2 * (one + pages.PIECE), (largest, one, len(data))
