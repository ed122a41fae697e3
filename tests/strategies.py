"""Hypothesis strategies the hostile-input tests share: damaged DER, damaged JSON objects, hostile
annotation keys and DNS-name lists, and the `podcert-fuzz` settings profile.

They start from valid inputs and damage them where parsers look (see
tests/unit/test_hostile_input.py for what each parser may raise), so most examples get past the
first check.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

QUICK_EXAMPLES: Final = 100
settings.register_profile(
    "podcert-fuzz",
    max_examples=int(os.environ.get("PODCERT_FUZZ_EXAMPLES", QUICK_EXAMPLES)),
    deadline=None,
    # Seeds are certificates and 300 KB strings; generation is deliberately heavy.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ = settings.get_profile("podcert-fuzz")
# The suite's 300 s per test is for the quick run; a full run gets time in proportion.
FUZZ_TIMEOUT: Final = pytest.mark.timeout(300 + (FUZZ.max_examples or 0) // 4)


# === DER: parse into a tree, damage one element, re-encode ======================================


@dataclass(frozen=True)
class Der:
    """One DER element. Constructed ones (and BIT/OCTET STRINGs wrapping DER, as SPKI keys and
    extension values do) hold their children, so damage deep inside re-encodes with correct
    lengths all the way up and reaches the inner parser instead of failing at the outer framing."""

    tag: int
    content: bytes | tuple[Der, ...]
    prefix: bytes = b""  # the unused-bits octet of a BIT STRING that wraps DER


def _tlv(data: bytes, pos: int) -> tuple[int, int, int] | None:
    if pos + 2 > len(data) or data[pos] & 0x1F == 0x1F:
        return None
    length, start = data[pos + 1], pos + 2
    if length & 0x80:
        octets = length & 0x7F
        if not 0 < octets <= 4 or start + octets > len(data):
            return None
        length = int.from_bytes(data[start : start + octets], "big")
        start += octets
    end = start + length
    return (data[pos], start, end) if end <= len(data) else None


def parse_der(data: bytes) -> tuple[Der, ...] | None:
    items: list[Der] = []
    pos = 0
    while pos < len(data):
        found = _tlv(data, pos)
        if found is None:
            return None
        tag, start, end = found
        content = data[start:end]
        node = Der(tag, content)
        if tag & 0x20:
            children = parse_der(content)
            if children is None:
                return None
            node = Der(tag, children)
        elif tag == 0x04 and content[:1] == b"\x30":
            inner = parse_der(content)
            node = Der(tag, inner) if inner else node
        elif tag == 0x03 and content[:2] == b"\x00\x30":
            inner = parse_der(content[1:])
            node = Der(tag, inner, b"\x00") if inner else node
        items.append(node)
        pos = end
    return tuple(items)


def der_length(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    octets = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(octets)]) + octets


def encode_der(nodes: Sequence[Der]) -> bytes:
    out = bytearray()
    for node in nodes:
        body = (
            node.content
            if isinstance(node.content, bytes)
            else node.prefix + encode_der(node.content)
        )
        out += bytes([node.tag]) + der_length(len(body)) + body
    return bytes(out)


def der_paths(nodes: Sequence[Der], prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    paths: list[tuple[int, ...]] = []
    for i, node in enumerate(nodes):
        paths.append((*prefix, i))
        if not isinstance(node.content, bytes):
            paths += der_paths(node.content, (*prefix, i))
    return paths


def der_at(nodes: Sequence[Der], path: tuple[int, ...]) -> Der:
    node = nodes[path[0]]
    for i in path[1:]:
        assert not isinstance(node.content, bytes)
        node = node.content[i]
    return node


def der_replace(nodes: Sequence[Der], path: tuple[int, ...], new: Sequence[Der]) -> tuple[Der, ...]:
    """`nodes` with the element at `path` replaced by `new` (none: dropped; two: duplicated)."""
    head, rest = path[0], path[1:]
    if not rest:
        return (*nodes[:head], *new, *nodes[head + 1 :])
    node = nodes[head]
    assert not isinstance(node.content, bytes)
    changed = dataclasses.replace(node, content=der_replace(node.content, rest, new))
    return (*nodes[:head], changed, *nodes[head + 1 :])


def der_offsets(data: bytes, base: int = 0) -> list[int]:
    """Offsets of every well-framed element header in `data` (constructed ones walked)."""
    offsets: list[int] = []
    pos = 0
    while pos < len(data):
        found = _tlv(data, pos)
        if found is None:
            break
        tag, start, end = found
        offsets.append(base + pos)
        if tag & 0x20:
            offsets += der_offsets(data[start:end], base + start)
        pos = end
    return offsets


# Length fields that lie: absurdly large, indefinite (BER, not DER), non-minimal, off by one.
HUGE_LENGTHS: Final = [
    b"\x84\xff\xff\xff\xff",
    b"\x84\x7f\xff\xff\xff",
    b"\x88\xff\xff\xff\xff\xff\xff\xff\xff",
    b"\x80",
    b"\x81\x00",
    b"\x82\x00\x01",
    b"\xff",
]
HUGE_CONTENT: Final = [b"\x00" * 70_000, b"\xff" * 70_000, b"\x30\x80" * 5_000]
TAGS: Final = [0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x0C, 0x13, 0x17, 0x18, 0x30, 0x31, 0xA0]


@st.composite
def der_mutant(draw: st.DrawFn, seeds: Sequence[bytes], donors: Sequence[bytes] = ()) -> bytes:
    """A seed DER blob with up to three structural edits, then maybe one raw framing edit.
    Grafts come from `donors` (default: the seeds themselves)."""
    nodes = tree_of(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, 3))):
        paths = der_paths(nodes)
        if not paths:  # everything dropped
            break
        path = draw(st.sampled_from(paths))
        node = der_at(nodes, path)
        how = draw(
            st.sampled_from(
                ["drop", "duplicate", "retag", "content", "huge", "empty", "nest", "graft"]
            )
        )
        new: tuple[Der, ...]
        if how == "drop":
            new = ()
        elif how == "duplicate":
            new = (node, node)
        elif how == "retag":
            new = (dataclasses.replace(node, tag=draw(st.sampled_from(TAGS))),)
        elif how == "content":
            new = (Der(node.tag & ~0x20, draw(st.binary(max_size=40))),)
        elif how == "huge":
            new = (Der(node.tag & ~0x20, draw(st.sampled_from(HUGE_CONTENT))),)
        elif how == "empty":
            new = (Der(node.tag, b""),)
        elif how == "nest":
            wrapped = node
            for _ in range(draw(st.sampled_from([1, 2, 30, 300]))):
                wrapped = Der(0x30, (wrapped,))
            new = (wrapped,)
        else:  # a well-formed element from another structure: an RSA SPKI in an EC CSR, ...
            donor = tree_of(draw(st.sampled_from(list(donors) or list(seeds))))
            new = (der_at(donor, draw(st.sampled_from(der_paths(donor)))),)
        nodes = der_replace(nodes, path, new)
    data = encode_der(nodes)
    how = draw(st.sampled_from(["none", "none", "length", "truncate", "flip", "splice"]))
    if how == "length" and (offsets := der_offsets(data)):
        at = draw(st.sampled_from(offsets))
        found = _tlv(data, at)
        assert found is not None
        _, start, _ = found
        return data[: at + 1] + draw(st.sampled_from(HUGE_LENGTHS)) + data[start:]
    if how == "truncate" and data:
        return data[: draw(st.integers(0, len(data) - 1))]
    if how == "flip" and data:
        at = draw(st.integers(0, len(data) - 1))
        return data[:at] + bytes([data[at] ^ (1 << draw(st.integers(0, 7)))]) + data[at + 1 :]
    if how == "splice":
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.binary(min_size=1, max_size=24)) + data[at:]
    return data


def hostile_der(seeds: Sequence[bytes], donors: Sequence[bytes] = ()) -> st.SearchStrategy[bytes]:
    """Mostly structurally damaged seeds, sometimes random bytes."""
    mutants = der_mutant(seeds, donors)
    return st.one_of(mutants, mutants, st.binary(max_size=300))


TREES: dict[bytes, tuple[Der, ...]] = {}


def tree_of(seed: bytes) -> tuple[Der, ...]:
    if seed not in TREES:
        tree = parse_der(seed)
        assert tree is not None and encode_der(tree) == seed, "seed DER does not round-trip"
        TREES[seed] = tree
    return TREES[seed]


# === JSON objects as the API returns them, damaged ==============================================

HUGE_TEXT: Final = "a" * 300_000  # past the API's 256 KiB budget for all annotations together
DEEP_LIST: Final[Any] = []
_cursor: Any = DEEP_LIST
for _ in range(100):
    _cursor.append([])
    _cursor = _cursor[0]
HOSTILE_SCALARS: Final[list[Any]] = [
    None,
    True,
    False,
    0,
    -1,
    2**63,
    10**40,
    1.5,
    float("inf"),
    "",
    " ",
    "\x00",
    "../../etc/passwd",
    "WEB",
    "web\n",
    "é" * 300,
    "\u202ebackwards",
    "\ud800",
    HUGE_TEXT,
    "x" * 254,
    "a" * 64,
    "*",
    "-",
    DEEP_LIST,
]
json_leaves = st.one_of(
    st.sampled_from(HOSTILE_SCALARS), st.text(max_size=30), st.integers(), st.booleans()
)
hostile_json = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)

JsonPath = tuple[str | int, ...]


def json_paths(value: Any, prefix: JsonPath = ()) -> list[JsonPath]:
    paths = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            paths += json_paths(child, (*prefix, key))
    elif isinstance(value, list) and len(prefix) < 40:  # not every level of DEEP_LIST
        for index, child in enumerate(value):
            paths += json_paths(child, (*prefix, index))
    return paths


@st.composite
def json_mutant(draw: st.DrawFn, seeds: Sequence[Any], *, keep_root: bool = True) -> Any:
    """A seed object with one to four edits at random places: values replaced by hostile ones,
    keys deleted or renamed, list items duplicated, values wrapped, retyped or given siblings."""
    obj = copy.deepcopy(draw(st.sampled_from(seeds)))

    def hostile() -> Any:
        # A copy: later edits must not change the shared constants (DEEP_LIST), or the next
        # example would draw something else from the same choices.
        return copy.deepcopy(draw(hostile_json))

    for _ in range(draw(st.integers(1, 4))):
        paths = json_paths(obj)
        if keep_root:
            paths = paths[1:] or paths
        path = draw(st.sampled_from(paths))
        how = draw(
            st.sampled_from(["replace", "replace", "delete", "rename", "dup", "wrap", "str", "add"])
        )
        if not path:  # the root itself
            obj = hostile() if how == "replace" else [obj]
            continue
        parent = obj
        for part in path[:-1]:
            parent = parent[part]
        last = path[-1]
        value = parent[last]
        if how == "replace":
            parent[last] = hostile()
        elif how == "delete":
            del parent[last]
        elif how == "rename" and isinstance(parent, dict):
            parent[draw(st.text(max_size=12))] = parent.pop(last)
        elif how == "dup" and isinstance(parent, list):
            parent.insert(int(last), copy.deepcopy(value))
        elif how == "wrap":
            parent[last] = [value]
        elif how == "str":
            parent[last] = json.dumps(value) if not isinstance(value, str) else value * 2
        elif how == "add" and isinstance(value, dict):
            value[draw(st.text(max_size=12))] = hostile()
        else:
            parent[last] = hostile()
    return obj


# === request annotations: keys and DNS-name lists ===============================================

NAME_LIKE: Final = [
    "other.web.svc",
    "*.web.svc",
    "UP.web.svc",
    "a..b",
    ".a",
    "a.",
    "-a.svc",
    "a-.svc",
    "a" * 63 + ".svc",
    "a" * 64 + ".svc",
    ".".join(["a" * 63] * 4),
    "xn--bcher-kva.example",
    "bücher.example",
    "a b",
    "a\tb",
    "",
    " ",
    "a.svc\n",
    "a.svc\x00",
]


def dns_entries(entitled: Sequence[str]) -> st.SearchStrategy[str]:
    """One entry of a DNS-name list: a name the pod is entitled to, a near miss, or noise."""
    return st.one_of(
        st.sampled_from([*entitled, *NAME_LIKE]),
        st.from_regex(r"[a-z0-9-]{1,10}(\.[a-z0-9-]{1,10}){0,3}", fullmatch=True),
        st.text(max_size=20),
    )


def dns_values(entitled: Sequence[str]) -> st.SearchStrategy[str]:
    """A comma-separated DNS-name annotation value, badly joined or far too long."""
    return st.one_of(
        st.lists(dns_entries(entitled), max_size=8).flatmap(
            lambda entries: st.sampled_from([",", ", ", " ,", ",,"]).map(
                lambda sep: sep.join(entries)
            )
        ),
        st.sampled_from(
            [
                ",".join(["a.svc"] * 100),
                ",".join(["a.svc"] * 101),
                ",".join(f"n{i}.svc" for i in range(100)),
                "a.svc," * 50_000,
                HUGE_TEXT,
                ",".join(["a" * 63] * 4000),
            ]
        ),
    )


def annotation_keys(known: str) -> st.SearchStrategy[str]:
    """The annotation key a signer knows, near misses of it, and keys it must refuse."""
    return st.one_of(
        st.just(known),
        st.sampled_from(
            [
                known.upper(),
                known + " ",
                " " + known,
                known.replace("-", "_"),
                known[:-1] + "\u017f",  # the last letter as LATIN SMALL LETTER LONG S
                known.split("/")[0] + "/",
                "example.com/anything",
                "no-prefix",
                "",
                known.split("/")[0] + "/" + "x" * 300_000,
            ]
        ),
        st.text(max_size=40),
    )


def json_trees(
    keys: st.SearchStrategy[str] | None = None, max_leaves: int = 20
) -> st.SearchStrategy[Any]:
    """Arbitrary JSON values, with object keys from `keys` (default: short text)."""
    leaves = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
    names = keys if keys is not None else st.text(max_size=12)
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(names, inner, max_size=4),
        max_leaves=max_leaves,
    )
