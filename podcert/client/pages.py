"""One page of a list answer read as it arrives, its `items` decoded one element at a time.

A list page is one JSON object, `{"kind", "apiVersion", "metadata", "items": [...]}`, and its
items are as large as a tenant makes them: Kubernetes bounds each label, not their number, so 500
pods a page can be hundreds of MB of JSON. Decoded whole, a page is held whole (and its decoded
form beside it) however few fields the caller keeps. Read here, a page costs what one element
costs plus a fixed buffer: the body comes in pieces (`podcert.client.transport.Response.pieces`),
the object's members are found by their JSON structure (strings, escapes, nesting), each `items`
element is decoded with msgspec into the caller's shape on its own, and bytes already decoded are
dropped. What comes out is what msgspec decoding the whole page would give, or an error where it
would give one (tests/unit/test_pages.py holds the two together on generated pages), except that
a page naming `items` or `metadata` twice is refused (msgspec keeps the last; the API server
never writes one).

Chosen over a smaller page limit, which bounds the count and not the bytes (one page of ten
1.5 MiB pods is still 15 MiB) and costs a round trip per page at 150,000 small pods.

The structure is found by regular expressions, so the interpreter steps per nested value, not per
byte; and where elements follow one another with the first element's opening (`},{"metadata":`
in what the API server writes), every element complete in the buffer is decoded by one msgspec
call on `[` + those bytes + `]`. A guess the decode refuses (the text inside a string, say) costs
that call, and those elements are then found one by one: the guess decides only how fast, never
what comes out, since bytes that decode as a whole array of values end on an element boundary.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, Generic, TypeVar, cast

import msgspec

T = TypeVar("T")

PIECE: Final = 1 << 20  # bytes read before a guess at the elements complete in the buffer
MAX_VALUE: Final = 1 << 30  # one element (or other member) larger is not one we read

_WS: Final = re.compile(rb"[ \t\n\r]*")
_STR: Final = rb'"(?:[^"\\]++|\\.)*+"'
_STRING: Final = re.compile(_STR, re.S)
_SCALAR: Final = re.compile(rb"[-+.0-9A-Za-z]+")
# A nested value up to _DEPTH levels, brackets of either kind (msgspec, decoding the value found,
# refuses a `[` closed by `}`); anything deeper goes through the bracket counter `_SKIP` steps.
_DEPTH: Final = 24
_SKIP_TEXT: Final = rb'(?:[^"{}\[\]]++|' + _STR + rb")*+"


def _nested(depth: int) -> bytes:
    atom = rb'[^"{}\[\]]++|' + _STR
    value = rb"[\[{](?:" + atom + rb")*+[\]}]"
    for _ in range(depth - 1):
        value = rb"[\[{](?:" + atom + rb"|" + value + rb")*+[\]}]"
    return value


_NESTED: Final = re.compile(_nested(_DEPTH), re.S)
_SKIP: Final = re.compile(_SKIP_TEXT, re.S)
_HEAD: Final = re.compile(rb'\{"[^"\\]{1,64}":')


class ListError(ValueError):
    """The answer is not a JSON object of the list's shape."""


class ListMeta(msgspec.Struct, frozen=True):
    resourceVersion: str = ""
    continue_: str = msgspec.field(default="", name="continue")


_META: Final = msgspec.json.Decoder(ListMeta)
_ANY: Final = msgspec.json.Decoder(msgspec.Raw)  # validates the JSON of a member nobody reads
_NAME: Final = msgspec.json.Decoder(str)


class Shape(Generic[T]):
    """The decoders of one item shape: an element alone, a run of elements, `items` not an array."""

    def __init__(self, shape: type[T]) -> None:
        self.one: msgspec.json.Decoder[T] = msgspec.json.Decoder(shape)
        self.run: msgspec.json.Decoder[list[T]] = msgspec.json.Decoder(list[shape])  # type: ignore[valid-type]
        self.other: msgspec.json.Decoder[list[T] | None] = msgspec.json.Decoder(
            list[shape] | None  # type: ignore[valid-type]
        )

    def element(self, data: bytes, what: str) -> T:
        """One element; raises ListError for what is not JSON of the shape."""
        try:
            return self.one.decode(data)
        except msgspec.DecodeError as err:
            raise ListError(f"{what}: {err}") from None


class Lenient(Shape[T]):
    """A shape whose elements that do not fit it are not errors: `read` makes something of
    them (a typed "unreadable" value naming the bad field), so one hostile object never costs
    the rest of the page. Elements that fit still decode in runs, at the shape's speed; only
    JSON that is not JSON at all is a ListError."""

    def __init__(self, shape: type[Any], read: Callable[[bytes], T]) -> None:
        super().__init__(cast(type[T], shape))
        self._read = read

    def element(self, data: bytes, what: str) -> T:
        try:
            return self.one.decode(data)
        except msgspec.ValidationError:
            pass
        except msgspec.DecodeError as err:
            raise ListError(f"{what}: {err}") from None
        try:
            return self._read(data)
        except msgspec.DecodeError as err:
            raise ListError(f"{what}: {err}") from None


class Page(Generic[T]):
    """One list page from `pieces` of its body. `metadata()` reads up to the list's metadata
    (the API server writes it before the items; elements read first are held meanwhile, decoded);
    iterating gives every element, each read and decoded as its bytes come; `metadata()` after
    the end is the page's whole. Raises ListError for what is not such a page."""

    def __init__(
        self, pieces: Iterable[bytes], shape: Shape[T], *, max_value: int = MAX_VALUE
    ) -> None:
        self._pieces = iter(pieces)
        self._shape = shape
        self._max = max_value
        self._buf = bytearray()
        self._pos = 0
        self._eof = False
        self._meta: ListMeta | None = None
        self._held: deque[list[T]] = deque()
        self._events = self._read()
        self._ended = False

    def metadata(self) -> ListMeta:
        while self._meta is None and not self._ended:
            batch = next(self._events, None)
            if batch is None:
                self._ended = True
            elif batch:
                self._held.append(batch)
        return self._meta or ListMeta()

    def __iter__(self) -> Iterator[T]:
        while self._held:
            yield from self._held.popleft()
        while not self._ended:
            batch = next(self._events, None)
            if batch is None:
                self._ended = True
            else:
                yield from batch

    # --- the buffer ----------------------------------------------------------------------------

    def _more(self) -> bool:
        """Read more of the body: at least as many bytes again as are unread (so a long value
        is scanned a bounded number of times), or to its end. False when nothing more came."""
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        had = len(self._buf)
        want = max(2 * had, had + PIECE)
        while len(self._buf) < want and not self._eof:
            piece = next(self._pieces, None)
            if piece is None:
                self._eof = True
            else:
                self._buf += piece
        if len(self._buf) > self._max + PIECE:
            raise ListError(f"a member of the list over {self._max} bytes")
        return len(self._buf) > had

    def _peek(self) -> int:
        """The next byte after blanks, or -1 at the end of the body."""
        while True:
            self._pos = _WS.match(self._buf, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._more():
                return -1

    def _expect(self, char: bytes) -> None:
        if self._peek() != char[0]:
            raise ListError(f"expected {char.decode()!r} {self._where()}")
        self._pos += 1

    def _where(self) -> str:
        got = bytes(self._buf[self._pos : self._pos + 20])
        return f"at {got!r}" if got else "at the end of the answer"

    def _string_end(self) -> int:
        """Where the string at the current position ends (-1: the answer ends first)."""
        while (found := _STRING.match(self._buf, self._pos)) is None:
            if not self._more():
                return -1
        return found.end()

    def _scalar_end(self) -> int:
        """Where the number or literal at the current position ends: at the first byte that
        cannot be part of one, or at the end of the answer."""
        while True:
            found = _SCALAR.match(self._buf, self._pos)
            end = found.end() if found is not None else self._pos
            if end < len(self._buf) or not self._more():
                return end

    def _nested_end(self) -> int:
        """Where the array or object at the current position ends (-1: the answer ends first)."""
        found = _NESTED.match(self._buf, self._pos)
        if found is not None:
            return found.end()
        depth, offset = 0, 0  # resumable: bytes already counted stay counted as the buffer grows
        while True:
            at = _SKIP.match(self._buf, self._pos + offset).end()  # type: ignore[union-attr]
            if at < len(self._buf):
                char = self._buf[at]
                if char in b"[{":
                    depth += 1
                elif char in b"]}":
                    depth -= 1
                    if depth == 0:
                        return at + 1
                if char != 0x22:  # a quote here begins a string not complete in the buffer yet
                    offset = at + 1 - self._pos
                    continue
            offset = at - self._pos
            if not self._more():
                return -1

    def _value(self) -> bytes:
        """The next JSON value's bytes (checked by the decoder it is handed to), consumed."""
        char = self._peek()
        if char == -1:
            raise ListError("the answer ends where a value was due")
        if char in b"[{":
            end = self._nested_end()
        elif char == 0x22:
            end = self._string_end()
        elif _SCALAR.match(self._buf, self._pos):
            end = self._scalar_end()
        else:
            raise ListError(f"expected a JSON value {self._where()}")
        if end < 0:
            raise ListError("the answer ends inside a value")
        value = bytes(self._buf[self._pos : end])
        self._pos = end
        return value

    @classmethod
    def _name(cls, raw: bytes) -> bytes:
        """A member's name as msgspec matches it: its bytes, escapes (rare) decoded. Bytes that
        are not UTF-8 are not checked, as msgspec does not check an unknown member's name: such a
        name matches no member the page is read for. A malformed escape is an error, as there."""
        if b"\\" not in raw:
            return raw[1:-1]
        try:
            name: str = cls._decode(_NAME, raw, "a member name")
        except ListError:
            cls._decode(_NAME, raw.decode("utf-8", "replace").encode(), "a member name")
            return raw  # only its UTF-8 was bad
        return name.encode("utf-8", "surrogatepass")

    @staticmethod
    def _decode(decoder: msgspec.json.Decoder[Any], data: bytes, what: str) -> Any:
        try:
            return decoder.decode(data)
        except msgspec.DecodeError as err:
            raise ListError(f"{what}: {err}") from None

    # --- the page ------------------------------------------------------------------------------

    def _read(self) -> Iterator[list[T]]:
        """Batches of elements in order; `_meta` set when the metadata is read."""
        self._expect(b"{")
        seen: set[bytes] = set()
        if self._peek() == ord("}"):
            self._pos += 1
        else:
            while True:
                if self._peek() != 0x22:
                    raise ListError(f"expected a member name {self._where()}")
                name = self._name(self._value())
                if name in (b"items", b"metadata"):
                    if name in seen:
                        raise ListError(f"{name.decode()} given twice")
                    seen.add(name)
                self._expect(b":")
                if name == b"items":
                    if self._peek() == ord("["):
                        yield from self._items()
                    else:  # null is no items; anything else is refused by the decoder
                        self._decode(self._shape.other, self._value(), "items")
                elif name == b"metadata":
                    self._meta = self._decode(_META, self._value(), "metadata")
                else:
                    self._decode(_ANY, self._value(), name.decode(errors="replace"))
                if self._peek() == ord(","):
                    self._pos += 1
                    continue
                self._expect(b"}")
                break
        if self._peek() != -1:
            raise ListError(f"more after the list {self._where()}")

    def _items(self) -> Iterator[list[T]]:
        self._expect(b"[")
        if self._peek() == ord("]"):
            self._pos += 1
            return
        separator: bytes | None = None
        guessed = -1  # the buffer's length when a guess was refused: no second guess in it
        while True:
            if separator is not None and guessed != len(self._buf):
                run = self._run(separator)
                if run is not None:
                    yield run
                    if self._more():
                        continue  # the element cut by the buffer's end comes in the next run
                guessed = len(self._buf)
            self._peek()
            if separator is None and (head := _HEAD.match(self._buf, self._pos)):
                separator = b"}," + head[0]
            yield [self._shape.element(self._value(), "items")]
            char = self._peek()
            self._pos += 1
            if char == ord("]"):
                return
            if char != ord(","):
                self._pos -= 1
                raise ListError(f"expected ',' or ']' between items {self._where()}")

    def _run(self, separator: bytes) -> list[T] | None:
        """Every element complete in the buffer from here, decoded in one call, when the last
        `separator` in it ends one; None when it does not (or none is there)."""
        start = _WS.match(self._buf, self._pos).end()  # type: ignore[union-attr]
        cut = self._buf.rfind(separator, start)
        if cut < 0:
            return None
        with memoryview(self._buf) as view:
            block = b"".join((b"[", view[start : cut + 1], b"]"))
        try:
            run = self._shape.run.decode(block)
        except msgspec.DecodeError:
            return None
        self._pos = cut + 2
        return run
