"""signer.authority.canarying: the SPIFFE Filesystem Delivery labels on the signer's bundles."""

from __future__ import annotations

import pytest

from signer.authority import canarying


def test_the_three_labels_name_the_channel_and_both_trust_domains() -> None:
    assert canarying.labels("preview", "a.test", "b.test") == {
        "k8s.spiffe.io/canarying": "preview",
        "k8s.spiffe.io/workload-trust-domain": "a.test",
        "k8s.spiffe.io/peer-trust-domain": "b.test",
    }


def test_a_trust_domain_that_is_no_label_value_gets_no_label() -> None:
    long = "a" * 64 + ".test"
    assert canarying.labels("live", long, "b.test") == {
        "k8s.spiffe.io/canarying": "live",
        "k8s.spiffe.io/peer-trust-domain": "b.test",
    }


@pytest.mark.parametrize(
    ("labels", "live"),
    [
        pytest.param({"k8s.spiffe.io/canarying": "live"}, True, id="live"),
        pytest.param({"k8s.spiffe.io/canarying": "preview"}, False, id="preview"),
        pytest.param({}, False, id="unlabelled"),
        pytest.param(None, False, id="no labels at all"),
        pytest.param("live", False, id="not a mapping"),
    ],
)
def test_is_live_reads_the_canarying_label(labels: object, live: bool) -> None:
    assert canarying.is_live(labels) is live
