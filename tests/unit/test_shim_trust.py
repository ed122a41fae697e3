"""kubelet_shim.trust: ClusterTrustBundle objects read once as they arrive (`parse_bundle`, an
unusable one skipped), and the trust file of each clusterTrustBundle source resolved from them
(`resolve`): bundles picked by name or by signer and label selector, their distinct roots in an
order that does not depend on the index's, an empty file for an optional source with nothing
picked, and no file, with the reason, for a required one. The agent writing these files is
test_shim_agent.py's."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from kubelet_shim.trust import Bundle, Resolved, parse_bundle, resolve, selects
from podcert.api.pods import TrustBundleSource
from podcert.api.selectors import LabelSelector
from tests.unit.test_bundles_formats import Authority

SIGNER = "example.com/roots"
ONE, TWO, THREE = Authority("one"), Authority("two"), Authority("three")


def bundle_obj(name: Any, pem: bytes, signer: Any = SIGNER, labels: Any = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"trustBundle": pem.decode(), "signerName": signer},
    }


def source(
    *,
    name: str | None = None,
    signer: str | None = None,
    selector: LabelSelector | None = None,
    optional: bool = False,
) -> TrustBundleSource:
    return TrustBundleSource(
        volume="trust",
        index=0,
        name=name,
        signer_name=signer,
        label_selector=selector,
        optional=optional,
        path="ca.pem",
    )


def bundle(name: str, *roots: Authority, signer: str | None = SIGNER, **labels: str) -> Bundle:
    return Bundle(name, signer, labels, tuple(root.pem for root in roots))


# --- parse_bundle ---------------------------------------------------------------------------------


def test_a_bundle_is_read_with_its_roots_in_the_order_it_lists_them() -> None:
    parsed = parse_bundle(bundle_obj("b", TWO.pem + ONE.pem, labels={"tier": "gold"}))
    assert parsed == Bundle("b", SIGNER, {"tier": "gold"}, (TWO.pem, ONE.pem))


def test_a_bundle_without_a_signer_or_with_odd_labels_is_still_read() -> None:
    parsed = parse_bundle(bundle_obj("b", ONE.pem, signer="", labels=["not", "a", "map"]))
    assert parsed == Bundle("b", None, {}, (ONE.pem,))


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(bundle_obj("", ONE.pem), id="no name"),
        pytest.param(bundle_obj(7, ONE.pem), id="a name that is no string"),
        pytest.param({"spec": {"trustBundle": ONE.pem.decode()}}, id="no metadata"),
    ],
)
def test_a_bundle_without_a_name_is_nothing(obj: dict[str, Any]) -> None:
    assert parse_bundle(obj) is None


@pytest.mark.parametrize(
    "pem",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"not PEM at all", id="not PEM"),
        pytest.param(
            ONE.leaf().public_bytes(serialization.Encoding.PEM),
            id="a leaf, not a CA",
        ),
    ],
)
def test_an_unusable_bundle_is_skipped_with_one_warning_naming_it(
    pem: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "podcert.shim"):
        assert parse_bundle(bundle_obj("broken", pem)) is None
    [record] = caplog.records
    assert record.getMessage().startswith("ClusterTrustBundle broken is unusable: ")


# --- selects and resolve --------------------------------------------------------------------------

GOLD = LabelSelector(match_labels=(("tier", "gold"),))


@pytest.mark.parametrize(
    ("by", "candidate", "picked"),
    [
        pytest.param(source(name="a"), bundle("a", ONE), True, id="by its name"),
        pytest.param(source(name="a"), bundle("b", ONE), False, id="another name"),
        pytest.param(
            source(name="a", signer="other.example/x", selector=GOLD),
            bundle("a", ONE),
            True,
            id="a name wins over signer and selector",
        ),
        pytest.param(
            source(signer=SIGNER, selector=GOLD),
            bundle("a", ONE, tier="gold"),
            True,
            id="signer and selector",
        ),
        pytest.param(
            source(signer=SIGNER, selector=GOLD),
            bundle("a", ONE, tier="silver"),
            False,
            id="a selector that does not match",
        ),
        pytest.param(
            source(signer="other.example/x", selector=LabelSelector()),
            bundle("a", ONE),
            False,
            id="another signer's bundle",
        ),
        pytest.param(
            source(signer=SIGNER, selector=LabelSelector()),
            bundle("a", ONE, tier="any"),
            True,
            id="an empty selector matches all of the signer's",
        ),
        pytest.param(
            source(signer=SIGNER, selector=None),
            bundle("a", ONE),
            False,
            id="no selector matches nothing",
        ),
    ],
)
def test_which_bundles_a_source_picks(
    by: TrustBundleSource, candidate: Bundle, picked: bool
) -> None:
    assert selects(by, candidate) is picked


def test_the_roots_of_every_picked_bundle_come_once_ordered_by_bundle_name() -> None:
    index = {
        "c": bundle("c", THREE, ONE, tier="gold"),
        "a": bundle("a", TWO, ONE, tier="gold"),
        "b": bundle("b", THREE, tier="silver"),
    }
    resolved = resolve(source(signer=SIGNER, selector=GOLD), index)
    assert resolved == Resolved(TWO.pem + ONE.pem + THREE.pem)
    # The same bundles, known in another order, give the same bytes.
    assert resolve(source(signer=SIGNER, selector=GOLD), dict(reversed(index.items()))) == resolved


def test_an_optional_source_with_nothing_picked_gets_an_empty_file() -> None:
    assert resolve(source(name="missing", optional=True), {}) == Resolved(b"")
    assert resolve(source(signer=SIGNER, selector=GOLD, optional=True), {}) == Resolved(b"")


@pytest.mark.parametrize(
    ("by", "problem"),
    [
        pytest.param(source(name="missing"), "ClusterTrustBundle 'missing' not found", id="name"),
        pytest.param(
            source(signer=SIGNER, selector=GOLD),
            f"no ClusterTrustBundle for signer {SIGNER!r} matches the selector",
            id="signer",
        ),
    ],
)
def test_a_required_source_with_nothing_picked_gets_no_file_and_a_reason(
    by: TrustBundleSource, problem: str
) -> None:
    index = {"other": bundle("other", ONE, tier="silver")}
    assert resolve(by, index) == Resolved(None, problem)
