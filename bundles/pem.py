"""PEM blocks (RFC 7468) as Go's `encoding/pem` reads them, but strict: the one PEM reader
behind every credential and trust bundle `bundles.formats` parses.

A block is what `pem.Decode` takes: a BEGIN line that starts a line, optional header lines
(`Key: value`) right after it, base64 split by spaces, tabs and line breaks (LF or CRLF), and
the matching END line, which nothing but spaces follows. Text between blocks is allowed. Where
`pem.Decode` would skip a broken block and read on (a BEGIN or END marker in mid-line, junk after
one, a body that is not base64, a BEGIN without its END), `read` refuses the whole input: a
bundle that silently lost a root or a key is worse than one refused. So does an empty block or a
label that is not RFC 7468's printable words, which Go takes.
tests/integration/test_bundles_pem.py pins all of it to Go and to cryptography.

Built from bytes.find only, so hostile input costs linear time, never regex backtracking. Pure.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass, field
from typing import Final

_BEGIN: Final = b"-----BEGIN "
_END: Final = b"-----END "
_DASHES: Final = b"-----"
_NEWLINE: Final = ord("\n")
_CR: Final = ord("\r")


class PemError(ValueError):
    """Not PEM as RFC 7468 and Go both read it; the message says where (never key bytes)."""


@dataclass(frozen=True)
class Block:
    label: str
    der: bytes = field(repr=False)
    # RFC 1421 headers (e.g. "Proc-Type: 4,ENCRYPTED"): only legacy encrypted keys have them.
    has_headers: bool = False


def read(data: bytes, *, what: str = "PEM") -> list[Block]:
    """Every block of `data` in order (none for text without a marker); `what` names the input
    in messages."""
    blocks: list[Block] = []
    position = 0
    while True:
        begin = data.find(_BEGIN, position)
        if data.find(_END, position, begin if begin >= 0 else len(data)) >= 0:
            raise PemError(f"{what} has an END line without a BEGIN line")
        if begin < 0:
            return blocks
        if begin > 0 and data[begin - 1] != _NEWLINE:
            raise PemError(f"{what} has a BEGIN line that does not start a line")
        line, position = _line(data, begin)
        raw_label = line[len(_BEGIN) : -len(_DASHES)]
        if not line.endswith(_DASHES) or not valid_label(raw_label):
            raise PemError(f"{what} has a cut-off or malformed BEGIN line")
        label = raw_label.decode("ascii")
        has_headers = False
        while position < len(data):
            header, after = _line(data, position)
            if b":" not in header or header.startswith(_END):
                break
            has_headers, position = True, after
        body_end = data.find(_END, position)
        if body_end < 0 or _BEGIN in data[position:body_end]:
            raise PemError(f"{what}: the {label} block has no END line (truncated?)")
        end_line, after = _line(data, body_end)
        if data[body_end - 1] != _NEWLINE or end_line != _END + raw_label + _DASHES:
            raise PemError(f"{what}: the {label} block's END line is malformed")
        der = _base64(data[position:body_end].translate(None, b" \t\r\n"))
        position = after
        if der is None:
            raise PemError(f"{what}: the {label} block is not valid base64")
        if not der:
            raise PemError(f"{what}: the {label} block is empty")
        blocks.append(Block(label, der, has_headers=has_headers))


def valid_label(label: bytes) -> bool:
    """RFC 7468's label: printable ASCII except '-', single spaces between words."""
    return (
        0 < len(label) <= 64
        and all((0x21 <= byte <= 0x7E and byte != 0x2D) or byte == 0x20 for byte in label)
        and not label.startswith(b" ")
        and not label.endswith(b" ")
    )


def _base64(text: bytes) -> bytes | None:
    """Padded standard base64 as Go's StdEncoding reads it, or None. CPython's strict mode alone
    takes padding after a whole quantum (`AAAA==`): the padding is checked here first."""
    padding = len(text) - len(text.rstrip(b"="))
    if len(text) % 4 or padding > 2 or (padding and (len(text) - padding) % 4 != 4 - padding):
        return None
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        return None


def _line(data: bytes, start: int) -> tuple[bytes, int]:
    """The line at `start` without its line break (LF or CRLF) and trailing spaces and tabs, and
    where the next line starts: Go's `pem` reads lines so."""
    newline = data.find(b"\n", start)
    if newline < 0:
        return data[start:].rstrip(b" \t"), len(data)
    stop = newline - 1 if newline > start and data[newline - 1] == _CR else newline
    return data[start:stop].rstrip(b" \t"), newline + 1
