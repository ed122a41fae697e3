"""The desired ClusterTrustBundle and when it differs from what the cluster holds."""

from __future__ import annotations

import datetime as dt

from signer import ca, trustbundles

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_name_follows_the_signer_linked_prefix_rule() -> None:
    assert trustbundles.bundle_name("example.com/podcert") == "example.com:podcert:roots"


def test_nothing_to_write_when_the_roots_and_labels_already_match() -> None:
    roots = [ca.new_ca("a", T0).root, ca.new_ca("b", T0).root]
    want = trustbundles.desired("example.com/podcert", "td.test", roots)
    assert want["metadata"]["labels"][trustbundles.TRUST_DOMAIN_LABEL] == "td.test"
    assert want["spec"]["trustBundle"].count("BEGIN CERTIFICATE") == 2
    same_but_reordered = {
        **want,
        "spec": {
            **want["spec"],
            "trustBundle": trustbundles.pem_bundle(list(reversed(roots))),
        },
    }
    assert not trustbundles.differs(want, same_but_reordered)
    assert trustbundles.differs(want, None)
    edited = {**want, "spec": {**want["spec"], "trustBundle": trustbundles.pem_bundle(roots[:1])}}
    assert trustbundles.differs(want, edited)
    relabelled = {**want, "metadata": {**want["metadata"], "labels": {}}}
    assert trustbundles.differs(want, relabelled)


def test_duplicate_roots_are_published_once() -> None:
    root = ca.new_ca("a", T0).root
    assert trustbundles.pem_bundle([root, root]).count("BEGIN CERTIFICATE") == 1
