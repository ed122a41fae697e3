"""SPIFFE ID parsing pinned to go-spiffe: `bundles.spiffe` and go-spiffe's `spiffeid.FromString`
and `spiffeid.TrustDomainFromString` (tests/interop/reference) read the same generated strings.

Whatever one accepts the other accepts as the same trust domain and path, with two deliberate
strictnesses of podcert's, each refused with its own typed error:
- an ID longer than 2,048 bytes or a trust domain longer than 255 (the SPIFFE-ID spec's limits,
  which go-spiffe does not enforce): `TooLongError`, `InvalidTrustDomainError`;
- a workload ID where a trust domain is asked for (go-spiffe takes the ID's trust domain and drops
  the path; a policy naming a workload where a domain belongs is a mistake to report).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from bundles.spiffe import (
    MAX_ID_LENGTH,
    MAX_TRUST_DOMAIN_LENGTH,
    InvalidTrustDomainError,
    SpiffeId,
    SpiffeIdError,
    TooLongError,
    parse_trust_domain,
)
from tests.integration.reference import DIFFERENTIAL, Reference

# Pieces where parsers disagree: the scheme in both cases, separators, the URI parts SPIFFE
# forbids, dot segments, percent-encoding, characters outside the allowed sets.
PIECES = [
    "spiffe://", "SPIFFE://", "spiffe:", "/", "//", ".", "..", "a", "td", "Z", "0", "-", "_",
    ":", ":443", "@", "user@", "?", "?q=1", "#", "#f", "%", "%2F", "%41", " ", "\t", "é", "\u0000",
    "ns", "sa", "\\", "*", "+", "~", "[", "]", "[::1]",
]  # fmt: skip
SPIFFE_LIKE = st.one_of(
    st.lists(st.sampled_from(PIECES), max_size=12).map("".join),
    st.lists(st.sampled_from(PIECES), max_size=12).map(lambda p: "spiffe://" + "".join(p)),
    st.text(max_size=40).map(lambda t: "spiffe://" + t),
    st.text(max_size=40),
)


@pytest.fixture(scope="module")
def reference() -> Iterator[Reference]:
    with Reference.started() as started:
        yield started


def podcert_id(text: str) -> tuple[str, str] | SpiffeIdError:
    try:
        parsed = SpiffeId.parse(text)
    except SpiffeIdError as err:
        return err
    return parsed.trust_domain, parsed.path


def podcert_trust_domain(text: str) -> str | SpiffeIdError:
    try:
        return parse_trust_domain(text)
    except SpiffeIdError as err:
        return err


LONG_ID = "spiffe://td/" + "a" * MAX_ID_LENGTH
LONG_DOMAIN = "spiffe://" + "a" * (MAX_TRUST_DOMAIN_LENGTH + 1)


@DIFFERENTIAL
@given(SPIFFE_LIKE)
@example("spiffe://example.org/ns/shop/sa/web")
@example("spiffe://example.org/")
@example("spiffe://example.org/a/../b")
@example("spiffe://example.org:8443/a")
@example("spiffe://Example.org/a")
@example(LONG_ID)
@example(LONG_DOMAIN)
def test_spiffe_ids_are_read_as_go_spiffe_reads_them(reference: Reference, text: str) -> None:
    theirs = reference.ask("spiffeid", text=text)
    ours = podcert_id(text)
    if "id_error" in theirs:
        assert isinstance(ours, SpiffeIdError), f"go-spiffe refuses {text!r}: {theirs['id_error']}"
    elif isinstance(ours, SpiffeIdError):
        assert isinstance(ours, TooLongError | InvalidTrustDomainError), ours
        assert len(text.encode()) > MAX_ID_LENGTH or len(theirs["trust_domain"]) > 255, ours
    else:
        assert ours == (theirs["trust_domain"], theirs["path"])


@DIFFERENTIAL
@given(SPIFFE_LIKE)
@example("example.org")
@example("spiffe://example.org")
@example("spiffe://example.org/ns/a")
@example("example.org/")
@example("a" * (MAX_TRUST_DOMAIN_LENGTH + 1))
def test_trust_domains_are_read_as_go_spiffe_reads_them(reference: Reference, text: str) -> None:
    theirs = reference.ask("spiffeid", text=text)
    ours = podcert_trust_domain(text)
    if "td_error" in theirs:
        assert isinstance(ours, SpiffeIdError), f"go-spiffe refuses {text!r}: {theirs['td_error']}"
    elif isinstance(ours, SpiffeIdError):
        workload = "id_error" not in theirs and theirs["path"] != ""
        too_long = len(theirs["td"]) > MAX_TRUST_DOMAIN_LENGTH or len(text) > MAX_ID_LENGTH
        assert workload or too_long, f"go-spiffe takes {text!r} as {theirs['td']!r}: {ours}"
    else:
        assert ours == theirs["td"]
