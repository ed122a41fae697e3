"""bundles.authz: who may talk to us, decided by SPIFFE ID, as values with readable reasons."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from cryptography.hazmat.primitives import serialization
from hypothesis import given, settings
from hypothesis import strategies as st

from bundles.authz import (
    ANY_TRUST_DOMAIN,
    Authorizer,
    Verdict,
    allow_any_of,
    allow_ids,
    allow_trust_domain,
    allow_workloads,
    authorize_peer_chain,
)
from bundles.spiffe import SpiffeId, SpiffeIdError
from tests.unit.test_bundles_formats import WORKLOAD, Authority

CHECKOUT = SpiffeId.parse(WORKLOAD)  # spiffe://cluster.local/ns/shop/sa/checkout
PAYMENTS = SpiffeId.parse("spiffe://cluster.local/ns/pay/sa/payments")
FOREIGN = SpiffeId.parse("spiffe://partner.example/ns/shop/sa/checkout")
NODE = SpiffeId.parse("spiffe://cluster.local/node/worker-1")
LOCAL = "cluster.local"


def local(namespace_glob: str, service_account_glob: str) -> Authorizer:
    return allow_workloads(namespace_glob, service_account_glob, trust_domain=LOCAL)


def test_allow_ids_allows_exactly_the_listed_ids() -> None:
    authorize = allow_ids([WORKLOAD, PAYMENTS])
    assert authorize(CHECKOUT) == Verdict(True, f"{CHECKOUT} is one of the 2 allowed IDs.")
    assert authorize(FOREIGN) == Verdict(False, f"{FOREIGN} is not one of the 2 allowed IDs.")


def test_allow_ids_names_the_one_id_it_allows() -> None:
    assert allow_ids([PAYMENTS])(CHECKOUT).reason == f"{CHECKOUT} is not the allowed ID {PAYMENTS}."
    assert allow_ids([])(CHECKOUT) == Verdict(False, f"{CHECKOUT} is not one of the 0 allowed IDs.")


def test_allow_ids_refuses_a_malformed_id_when_configured() -> None:
    with pytest.raises(SpiffeIdError):
        allow_ids(["spiffe://cluster.local/ns/shop/sa/checkout/"])


def test_allow_trust_domain_accepts_members_only() -> None:
    authorize = allow_trust_domain("spiffe://cluster.local")
    assert authorize(NODE).allowed
    denied = authorize(FOREIGN)
    assert not denied.allowed
    assert denied.reason == f"{FOREIGN} is not in trust domain cluster.local."


def test_allow_trust_domain_refuses_a_malformed_trust_domain() -> None:
    with pytest.raises(SpiffeIdError):
        allow_trust_domain("Cluster.Local")


@pytest.mark.parametrize(
    ("authorizer", "peer", "allowed"),
    [
        pytest.param(local("shop", "checkout"), CHECKOUT, True, id="exact names"),
        pytest.param(
            local("shop", "checkout"),
            FOREIGN,
            False,
            id="denied: the same path in a federated trust domain",
        ),
        pytest.param(
            allow_workloads("*", "checkout", trust_domain=ANY_TRUST_DOMAIN),
            FOREIGN,
            True,
            id="any trust domain, when said so",
        ),
        pytest.param(
            allow_workloads("*", "*", trust_domain="partner.example"),
            FOREIGN,
            True,
            id="a partner's trust domain, when named",
        ),
        pytest.param(local("sh?p", "check*"), CHECKOUT, True, id="glob wildcards"),
        pytest.param(local("[ps]*", "*"), PAYMENTS, True, id="glob character class"),
        pytest.param(local("shop", "pay*"), CHECKOUT, False, id="other account"),
        pytest.param(local("SHOP", "checkout"), CHECKOUT, False, id="case-sensitive"),
        pytest.param(local("*", "*"), NODE, False, id="denied when not a pod ID"),
    ],
)
def test_allow_workloads_matches_namespace_and_service_account_globs(
    authorizer: Authorizer, peer: SpiffeId, allowed: bool
) -> None:
    verdict = authorizer(peer)
    assert verdict.allowed is allowed
    assert str(peer) in verdict.reason
    assert verdict.reason.endswith(".")


def test_a_workload_rule_cannot_be_built_without_a_trust_domain() -> None:
    """With no trust domain a rule used to match every trust domain,
    so a federated partner's /ns/shop/sa/web passed as ours. Now the rule must name one."""
    rule: Callable[..., Authorizer] = allow_workloads
    with pytest.raises(TypeError, match="trust_domain"):
        rule("shop", "web")
    with pytest.raises(SpiffeIdError):
        allow_workloads("shop", "web", trust_domain="")


def test_workload_reasons_say_what_was_expected() -> None:
    authorize = allow_workloads("shop", "pay*", trust_domain="cluster.local")
    assert authorize(CHECKOUT).reason == (
        f"{CHECKOUT} does not match namespace 'shop' / service account 'pay*' "
        "in trust domain cluster.local."
    )
    assert authorize(FOREIGN).reason == f"{FOREIGN} is not in trust domain cluster.local."
    assert "is not a /ns/<namespace>/sa/<service account> ID" in authorize(NODE).reason
    anywhere = allow_workloads("shop", "checkout", trust_domain=ANY_TRUST_DOMAIN)
    assert anywhere(FOREIGN).reason.endswith("in any trust domain.")


def test_allow_any_of_returns_the_first_allowing_verdict() -> None:
    authorize = allow_any_of(allow_ids([PAYMENTS]), allow_trust_domain("cluster.local"))
    assert authorize(CHECKOUT) == Verdict(True, f"{CHECKOUT} is in trust domain cluster.local.")


def test_allow_any_of_lists_every_reason_when_all_deny() -> None:
    authorize = allow_any_of(allow_ids([PAYMENTS]), allow_trust_domain("cluster.local"))
    verdict = authorize(FOREIGN)
    assert not verdict.allowed
    assert verdict.reason == (
        f"{FOREIGN} is denied by every rule: {FOREIGN} is not the allowed ID {PAYMENTS}; "
        f"{FOREIGN} is not in trust domain cluster.local."
    )


def test_allow_any_of_nothing_denies_everyone() -> None:
    assert not allow_any_of()(CHECKOUT).allowed


def test_a_verdict_is_truthy_only_when_allowed() -> None:
    assert Verdict(True, "ok")
    assert not Verdict(False, "no")


# --- peer chains ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> Authority:
    return Authority()


def _der(ca: Authority, *uris: str, san: bool = True) -> bytes:
    return ca.leaf(*uris, san=san).public_bytes(serialization.Encoding.DER)


def _root(ca: Authority) -> bytes:
    return ca.cert.public_bytes(serialization.Encoding.DER)


def _ours(ca: Authority) -> dict[bytes, str | None]:
    return {_root(ca): None}


def test_a_peer_chain_is_authorized_by_its_leafs_spiffe_id(ca: Authority) -> None:
    verdict = authorize_peer_chain(
        [_der(ca, WORKLOAD), _root(ca)], _ours(ca), allow_ids([WORKLOAD])
    )
    assert verdict == Verdict(True, f"{WORKLOAD} is the allowed ID.")


@pytest.mark.parametrize(
    ("make_der", "reason"),
    [
        pytest.param(lambda ca: None, "presented no certificate", id="no certificate"),
        pytest.param(lambda ca: b"", "presented no certificate", id="empty certificate"),
        pytest.param(lambda ca: b"\x30\x03\x02\x01\x00", "cannot be parsed", id="garbage DER"),
        pytest.param(lambda ca: _der(ca, san=False), "no subjectAltName", id="no SAN"),
        pytest.param(
            lambda ca: _der(ca, WORKLOAD, str(PAYMENTS)), "2 URI subjectAltNames", id="two URIs"
        ),
        pytest.param(
            lambda ca: _der(ca, "https://a.example/"), "not a SPIFFE ID", id="URI not spiffe"
        ),
        pytest.param(lambda ca: _der(ca, str(PAYMENTS)), "is not the allowed ID", id="not allowed"),
    ],
)
def test_unusable_or_unauthorized_peers_get_a_denied_verdict(
    ca: Authority, make_der: Callable[[Authority], bytes | None], reason: str
) -> None:
    leaf = make_der(ca)
    chain = None if leaf is None else [leaf, _root(ca)] if leaf else []
    verdict = authorize_peer_chain(chain, _ours(ca), allow_ids([WORKLOAD]))
    assert not verdict.allowed
    assert reason in verdict.reason
    assert verdict.reason.endswith(".") and not verdict.reason.endswith("..")


_VALID_DER = Authority().leaf(WORKLOAD).public_bytes(serialization.Encoding.DER)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_random_bytes_as_a_peer_certificate_are_denied_never_raised(der: bytes) -> None:
    chain = [der, _VALID_DER]
    assert not authorize_peer_chain(chain, {_VALID_DER: None}, allow_trust_domain(LOCAL)).allowed


@pytest.mark.filterwarnings(
    "ignore:Parsed a serial number:cryptography.utils.CryptographyDeprecationWarning"
)
@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_VALID_DER) - 1), st.integers(0, 255)), max_size=4))
def test_corrupted_peer_certificates_give_a_verdict_never_an_exception(
    flips: list[tuple[int, int]],
) -> None:
    # Flipping bytes of a real certificate reaches deep into the SAN and extension decoding.
    data = bytearray(_VALID_DER)
    for position, value in flips:
        data[position] = value
    chain = [bytes(data), b"root"]
    verdict = authorize_peer_chain(chain, {b"root": None}, allow_trust_domain(LOCAL))
    assert isinstance(verdict, Verdict)


# --- federated roots ------------------------------------------------------------------------------


def test_a_federated_root_vouches_only_for_its_own_trust_domain(ca: Authority) -> None:
    """A chain TLS verified ends at a root: one of a federated trust domain's may certify only
    that domain's IDs; one of ours leaves the peer to the authorizer alone."""
    theirs = Authority("partner root")
    ours_der, theirs_der = _root(ca), _root(theirs)
    trusted: dict[bytes, str | None] = {ours_der: None, theirs_der: "partner.example"}
    foreign_ok = [_der(theirs, str(FOREIGN)), theirs_der]
    foreign_lying = [_der(theirs, WORKLOAD), theirs_der]
    ours_ok = [_der(ca, WORKLOAD), ours_der]
    assert authorize_peer_chain(foreign_ok, trusted, allow_ids([FOREIGN]))
    lying = authorize_peer_chain(foreign_lying, trusted, allow_ids([WORKLOAD]))
    assert not lying
    assert lying.reason == (
        f"{WORKLOAD} chains to a root of federated trust domain partner.example, which "
        "vouches for its own IDs only."
    )
    assert authorize_peer_chain(ours_ok, trusted, allow_ids([WORKLOAD]))
    assert not authorize_peer_chain(ours_ok, trusted, allow_ids([FOREIGN]))
    assert not authorize_peer_chain(None, trusted, allow_ids([FOREIGN]))
    assert not authorize_peer_chain([b"junk", theirs_der], trusted, allow_ids([FOREIGN]))


def test_a_chain_ending_at_a_root_we_never_trusted_is_refused(ca: Authority) -> None:
    """A library may load more roots into a shared context (requests loads certifi's): a
    chain OpenSSL verified to one of those is still no peer of ours."""
    public = Authority("some public root")
    verdict = authorize_peer_chain(
        [_der(public, WORKLOAD), _root(public)], _ours(ca), allow_ids([WORKLOAD])
    )
    assert verdict == Verdict(
        False, f"{WORKLOAD} chains to a root that is neither ours nor a federated one."
    )
