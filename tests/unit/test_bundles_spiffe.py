"""bundles.spiffe: strict SPIFFE ID parsing and reading an SVID's one URI SAN."""

from __future__ import annotations

import dataclasses
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bundles.spiffe import (
    MAX_ID_LENGTH,
    CertificateIdError,
    ForbiddenUriPartError,
    InvalidPathError,
    InvalidTrustDomainError,
    NoSanExtensionError,
    NotSpiffeSchemeError,
    NotSpiffeUriError,
    NoUriSanError,
    SeveralUriSansError,
    SpiffeId,
    SpiffeIdError,
    TooLongError,
    Workload,
    parse_trust_domain,
    spiffe_id_of,
    workload_of,
)
from tests.unit.test_bundles_formats import WORKLOAD, Authority


@pytest.fixture(scope="module")
def ca() -> Authority:
    return Authority()


@pytest.mark.parametrize(
    ("uri", "trust_domain", "path"),
    [
        pytest.param("spiffe://example.org", "example.org", "", id="trust domain alone"),
        pytest.param(WORKLOAD, "cluster.local", "/ns/shop/sa/checkout", id="pod workload"),
        pytest.param(
            "spiffe://my_td-1.example/A.b-c_D/9", "my_td-1.example", "/A.b-c_D/9",
            id="every allowed character",
        ),
        pytest.param("spiffe://td/.../..a", "td", "/.../..a", id="dots that are not dot segments"),
    ],
)  # fmt: skip
def test_valid_ids_parse_and_print_back(uri: str, trust_domain: str, path: str) -> None:
    parsed = SpiffeId.parse(uri)
    assert (parsed.trust_domain, parsed.path) == (trust_domain, path)
    assert str(parsed) == uri
    assert SpiffeId(trust_domain, path) == parsed
    assert hash(SpiffeId(trust_domain, path)) == hash(parsed)


@pytest.mark.parametrize(
    ("uri", "error"),
    [
        pytest.param("", NotSpiffeSchemeError, id="empty string"),
        pytest.param("https://example.org/a", NotSpiffeSchemeError, id="https scheme"),
        pytest.param("SPIFFE://example.org/a", NotSpiffeSchemeError, id="uppercase scheme"),
        pytest.param("spiffe:example.org/a", NotSpiffeSchemeError, id="scheme without //"),
        pytest.param("example.org/a", NotSpiffeSchemeError, id="no scheme at all"),
        pytest.param("spiffe://", InvalidTrustDomainError, id="nothing after the scheme"),
        pytest.param("spiffe:///ns/a", InvalidTrustDomainError, id="empty trust domain"),
        pytest.param("spiffe://Example.org/a", InvalidTrustDomainError, id="uppercase domain"),
        pytest.param("spiffe://exa mple.org", InvalidTrustDomainError, id="space in domain"),
        pytest.param("spiffe://ex%41mple.org", InvalidTrustDomainError, id="percent in domain"),
        pytest.param("spiffe://exämple.org", InvalidTrustDomainError, id="non-ASCII domain"),
        pytest.param("spiffe://" + "a" * 256, InvalidTrustDomainError, id="domain too long"),
        pytest.param("spiffe://example.org:443/a", ForbiddenUriPartError, id="port"),
        pytest.param("spiffe://example.org:/a", ForbiddenUriPartError, id="empty port"),
        pytest.param("spiffe://user@example.org/a", ForbiddenUriPartError, id="userinfo"),
        pytest.param("spiffe://example.org/a?x=1", ForbiddenUriPartError, id="query"),
        pytest.param("spiffe://example.org?x=1", ForbiddenUriPartError, id="query without path"),
        pytest.param("spiffe://example.org/a#frag", ForbiddenUriPartError, id="fragment"),
        pytest.param("spiffe://example.org/", InvalidPathError, id="bare trailing slash"),
        pytest.param("spiffe://example.org/a/", InvalidPathError, id="trailing slash"),
        pytest.param("spiffe://example.org//a", InvalidPathError, id="empty segment"),
        pytest.param("spiffe://example.org/a/./b", InvalidPathError, id="dot segment"),
        pytest.param("spiffe://example.org/a/../b", InvalidPathError, id="dot-dot segment"),
        pytest.param("spiffe://example.org/a%2Fb", InvalidPathError, id="percent-encoding"),
        pytest.param("spiffe://example.org/a:b", InvalidPathError, id="colon in path"),
        pytest.param("spiffe://example.org/a b", InvalidPathError, id="space in path"),
        pytest.param("spiffe://example.org/café", InvalidPathError, id="non-ASCII path"),
        pytest.param("spiffe://example.org/" + "a" * 2048, TooLongError, id="longer than 2048"),
        pytest.param("spiffe://example.org/" + "é" * 1020, TooLongError, id="over 2048 bytes"),
    ],
)  # fmt: skip
def test_malformed_ids_raise_their_own_error(uri: str, error: type[SpiffeIdError]) -> None:
    with pytest.raises(error):
        SpiffeId.parse(uri)


def test_an_id_of_exactly_2048_bytes_is_accepted() -> None:
    prefix = "spiffe://example.org/"
    uri = prefix + "a" * (MAX_ID_LENGTH - len(prefix))
    assert str(SpiffeId.parse(uri)) == uri


def test_direct_construction_is_validated_like_parsing() -> None:
    with pytest.raises(InvalidTrustDomainError):
        SpiffeId("Example.org", "/a")
    with pytest.raises(InvalidPathError):
        SpiffeId("example.org", "a")  # a path must start with "/"
    with pytest.raises(InvalidTrustDomainError):
        dataclasses.replace(SpiffeId.parse(WORKLOAD), trust_domain="")


def test_segments_and_membership() -> None:
    spiffe_id = SpiffeId.parse(WORKLOAD)
    assert spiffe_id.segments == ("ns", "shop", "sa", "checkout")
    assert SpiffeId.parse("spiffe://td").segments == ()
    assert spiffe_id.member_of("cluster.local")
    assert not spiffe_id.member_of("cluster")


@pytest.mark.parametrize(
    ("given_name", "expected"),
    [
        pytest.param("example.org", "example.org", id="bare name"),
        pytest.param("spiffe://example.org", "example.org", id="trust domain ID"),
    ],
)
def test_trust_domains_are_accepted_in_both_spellings(given_name: str, expected: str) -> None:
    assert parse_trust_domain(given_name) == expected


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("", id="empty"),
        pytest.param("Example.org", id="uppercase"),
        pytest.param("example.org:8443", id="with a port"),
        pytest.param(WORKLOAD, id="a workload ID"),
    ],
)
def test_bad_trust_domains_are_refused(name: str) -> None:
    with pytest.raises(SpiffeIdError):
        parse_trust_domain(name)


# --- certificates -----------------------------------------------------------------------------


def test_the_single_uri_san_is_the_id(ca: Authority) -> None:
    leaf = ca.leaf(WORKLOAD, dns_names=["checkout.shop.svc"])
    assert spiffe_id_of(leaf) == SpiffeId.parse(WORKLOAD)


@pytest.mark.parametrize(
    ("leaf_args", "error"),
    [
        pytest.param({"uris": (), "san": False}, NoSanExtensionError, id="no SAN extension"),
        pytest.param(
            {"uris": (), "dns_names": ["a.example"]}, NoUriSanError, id="DNS SAN but no URI SAN"
        ),
        pytest.param(
            {"uris": (WORKLOAD, "spiffe://cluster.local/ns/x/sa/y")},
            SeveralUriSansError,
            id="several URI SANs are refused",
        ),
        pytest.param(
            {"uris": ("https://checkout.example/",)}, NotSpiffeUriError, id="URI is not spiffe"
        ),
        pytest.param(
            {"uris": ("spiffe://Cluster.local/ns/a/sa/b",)},
            NotSpiffeUriError,
            id="URI is a malformed SPIFFE ID",
        ),
    ],
)
def test_certificates_without_exactly_one_valid_id_are_refused(
    ca: Authority, leaf_args: dict[str, object], error: type[CertificateIdError]
) -> None:
    uris = leaf_args.pop("uris")
    assert isinstance(uris, tuple)
    leaf = ca.leaf(*uris, **leaf_args)  # type: ignore[arg-type]
    with pytest.raises(error) as raised:
        spiffe_id_of(leaf)
    if error is NotSpiffeUriError:
        assert isinstance(raised.value.__cause__, SpiffeIdError)


# --- workloads --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        pytest.param(WORKLOAD, Workload("shop", "checkout"), id="pod workload"),
        pytest.param("spiffe://td/ns/a/sa/b/extra", None, id="extra segment"),
        pytest.param("spiffe://td/sa/b/ns/a", None, id="segments swapped"),
        pytest.param("spiffe://td/ns/a", None, id="namespace only"),
        pytest.param("spiffe://td", None, id="trust domain ID"),
        pytest.param("spiffe://td/NS/a/SA/b", None, id="keywords are case-sensitive"),
    ],
)
def test_workload_of_reads_only_the_ns_sa_shape(uri: str, expected: Workload | None) -> None:
    assert workload_of(SpiffeId.parse(uri)) == expected


# --- hostile input ----------------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=300), st.text(max_size=300).map(lambda t: "spiffe://" + t)))
def test_random_text_parses_or_raises_a_typed_error(text: str) -> None:
    try:
        parsed = SpiffeId.parse(text)
    except SpiffeIdError:
        return
    assert str(parsed) == text  # anything accepted is canonical


_TD = st.text(string.ascii_lowercase + string.digits + ".-_", min_size=1, max_size=30)
_SEGMENT = st.text(string.ascii_letters + string.digits + ".-_", min_size=1, max_size=12).filter(
    lambda s: s not in (".", "..")
)


@settings(max_examples=300, deadline=None)
@given(_TD, st.lists(_SEGMENT, max_size=6))
def test_every_well_formed_id_parses(trust_domain: str, segments: list[str]) -> None:
    uri = "spiffe://" + trust_domain + "".join("/" + s for s in segments)
    parsed = SpiffeId.parse(uri)
    assert parsed.trust_domain == trust_domain
    assert parsed.segments == tuple(segments)
