"""bundles.pem: PEM reading pinned to Go's `encoding/pem` and to cryptography: it (the reader behind
every bundle `bundles.formats` parses) reads the same generated PEM-ish bytes (headers, junk between
blocks, CRLF, missing END lines, wrong base64, trailing data, markers in mid-line) as a `pem.Decode`
loop (tests/interop/reference) and as `cryptography.x509.load_pem_x509_certificates`.

Whatever podcert reads, Go reads as the same blocks (type, bytes, whether it has headers), and
cryptography as the same certificates. Where podcert refuses, the format demands it, each case
deliberate:
- Go would drop something and read on: a BEGIN or END marker outside every block Go returned
  (a marker in mid-line, junk after a BEGIN or END line, a body that is not base64, a BEGIN
  without its END, an END without a BEGIN). A trust bundle that silently lost a root, or a
  credential bundle its key, must be refused, not used;
- a block Go returns but RFC 7468 forbids: an empty body, or a label that is not printable
  ASCII words (Go takes any type, even an empty one).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from hypothesis import example, given
from hypothesis import strategies as st

from bundles import pem
from tests.integration.reference import DIFFERENTIAL, Reference

MARKERS = (b"-----BEGIN ", b"-----END ")
# Two distinct roots (DER), the certificates a trust bundle holds.
CA_DER = [
    x509.load_pem_x509_certificate(trustme.CA().cert_pem.bytes()).public_bytes(
        serialization.Encoding.DER
    )
    for _ in range(2)
]
LABELS = ["CERTIFICATE", "PRIVATE KEY", "X", "EC PRIVATE KEY", "", " X", "X ", "A--B", "é"]
EOLS = [b"\n", b"\r\n"]
# How a block may be damaged, each where a PEM reader looks.
DAMAGE = [
    None, None, None, "no end", "end mismatch", "bad char", "no padding", "junk after begin",
    "junk after end", "spaces after begin", "spaces after end", "mid-line begin", "vertical tab",
    "empty body", "spaces in body", "tabs in body", "blank lines", "headers", "colon in body",
    "excess padding", "end mid-line", "cr only",
]  # fmt: skip
BETWEEN = [b"", b"\n", b"junk\n", b"a: b\n", b"  \n", b"-----END X-----\n", b"x", b"\r\n", b"-"]


@st.composite
def pem_block(draw: st.DrawFn) -> bytes:
    label = draw(st.sampled_from(LABELS)).encode()
    payload = draw(st.sampled_from(CA_DER) | st.binary(max_size=40))
    if label != b"CERTIFICATE" and draw(st.booleans()):
        label = b"CERTIFICATE"
    eol = draw(st.sampled_from(EOLS))
    damage = draw(st.sampled_from(DAMAGE))
    text = base64.b64encode(payload)
    width = draw(st.sampled_from([64, 76, 16, 10_000]))
    lines = [text[i : i + width] for i in range(0, len(text), width)]
    begin = b"-----BEGIN " + label + b"-----"
    end = b"-----END " + label + b"-----"
    if damage == "no padding":
        lines = [line.rstrip(b"=") for line in lines]
    elif damage == "excess padding":
        lines.append(b"==")
    elif damage == "bad char" and lines:
        lines[0] = b"*" + lines[0][1:]
    elif damage == "vertical tab":
        lines.insert(0, b"\x0b")
    elif damage == "empty body":
        lines = []
    elif damage == "spaces in body":
        lines = [b" " + line + b"  " for line in lines]
    elif damage == "tabs in body":
        lines = [b"\t" + line for line in lines]
    elif damage == "blank lines":
        lines = [b"", *lines, b""]
    elif damage == "headers":
        lines = [b"Proc-Type: 4,ENCRYPTED", b"DEK-Info: AES-128-CBC,00", b"", *lines]
    elif damage == "colon in body":
        lines.append(b"a:b")
    elif damage == "end mismatch":
        end = b"-----END OTHER-----"
    elif damage == "junk after begin":
        begin += b"junk"
    elif damage == "junk after end":
        end += b"junk"
    elif damage == "spaces after begin":
        begin += b" \t"
    elif damage == "spaces after end":
        end += b"  "
    body = b"".join(line + eol for line in lines)
    block = begin + eol + body + end
    if damage == "no end":
        block = begin + eol + body
    elif damage == "mid-line begin":
        block = b"junk" + block
    elif damage == "end mid-line":
        block = begin + eol + body.rstrip(b"\r\n") + end
    elif damage == "cr only":
        block = block.replace(b"\n", b"")
    return block


PEM_ISH = st.lists(
    st.tuples(st.sampled_from(BETWEEN), pem_block()), min_size=1, max_size=4
).flatmap(
    lambda parts: st.sampled_from([b"", b"\n", b"trailing data", b"\n\n"]).map(
        lambda tail: b"".join(junk + block + b"\n" for junk, block in parts) + tail
    )
)


@pytest.fixture(scope="module")
def reference() -> Iterator[Reference]:
    with Reference.started() as started:
        yield started


def go_blocks(reference: Reference, data: bytes) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = reference.ask("pem", data=data)["blocks"]
    for block in blocks:
        block["bytes"] = base64.b64decode(block["bytes"] or "")
        # Go returns where it began looking and where the block ends; its BEGIN line is the last
        # one in between (Go pairs the first END with the last BEGIN before it).
        block["begin"] = data.rfind(MARKERS[0], block["start"], block["end"])
    return blocks


def dropped_by_go(data: bytes, blocks: list[dict[str, Any]]) -> bool:
    """Whether some BEGIN or END marker lies outside every block Go returned."""
    for marker in MARKERS:
        at = data.find(marker)
        while at >= 0:
            if not any(b["begin"] <= at < b["end"] for b in blocks):
                return True
            at = data.find(marker, at + 1)
    return False


def deliberate(data: bytes, theirs: list[dict[str, Any]]) -> bool:
    """Whether podcert's refusal of `data` is one of the deliberate strictnesses listed above."""
    return dropped_by_go(data, theirs) or any(
        not b["bytes"] or not pem.valid_label(b["type"].encode()) for b in theirs
    )


@DIFFERENTIAL
@given(PEM_ISH)
@example(b"-----BEGIN X-----\r\nAAAA\r\n-----END X-----\r\n")
@example(b"x-----BEGIN X-----\nAAAA\n-----END X-----\n")
@example(b"-----BEGIN X-----junk\nAAAA\n-----END X-----\n")
@example(b"-----BEGIN X-----\nAAAA\n-----END X-----junk\n")
@example(b"-----BEGIN X-----\n\x0bAAAA\n-----END X-----\n")
@example(b"-----BEGIN X-----\nAAAA-----END X-----\n")
@example(b"-----BEGIN X-----\nAAAA\n==\n-----END X-----\n")
@example(b"-----BEGIN X-----\nK: v\n\nAAAA\n-----END X-----\n")
def test_pem_blocks_are_read_as_go_reads_them(reference: Reference, data: bytes) -> None:
    theirs = go_blocks(reference, data)
    try:
        ours = pem.read(data)
    except pem.PemError as err:
        assert deliberate(data, theirs), f"Go reads {len(theirs)} block(s) of {data!r}; {err}"
        return
    assert [(b.label, b.der, b.has_headers) for b in ours] == [
        (b["type"], b["bytes"], bool(b["headers"])) for b in theirs
    ], data


CERTIFICATES_ONLY = st.lists(
    st.tuples(st.sampled_from(BETWEEN[:5]), st.sampled_from(CA_DER), st.sampled_from(EOLS)),
    min_size=1,
    max_size=4,
).map(
    lambda parts: b"".join(
        junk
        + x509.load_der_x509_certificate(der)
        .public_bytes(serialization.Encoding.PEM)
        .replace(b"\n", eol)
        for junk, der, eol in parts
    )
)


@DIFFERENTIAL
@given(PEM_ISH | CERTIFICATES_ONLY)
def test_certificates_are_read_as_cryptography_reads_them(
    reference: Reference, data: bytes
) -> None:
    """Every certificate cryptography reads, podcert reads (or refuses deliberately). Where
    cryptography is the stricter (it refuses blank lines inside a block, which Go takes), Go's
    reading, pinned above, is the one podcert follows."""
    try:
        theirs = [
            c.public_bytes(serialization.Encoding.DER)
            for c in x509.load_pem_x509_certificates(data)
        ]
    except ValueError:
        theirs = []  # cryptography refuses input without a certificate it can read
    try:
        ours = [b.der for b in pem.read(data) if b.label == "CERTIFICATE"]
    except pem.PemError as err:
        assert not theirs or deliberate(data, go_blocks(reference, data)), f"{data!r}: {err}"
        return
    if theirs:
        assert ours == theirs, data
