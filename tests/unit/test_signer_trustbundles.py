"""The desired ClusterTrustBundle and when it differs from what the cluster holds."""

from __future__ import annotations

import datetime as dt
import threading
from typing import cast

from bundles.formats import dump_roots
from podcert.client.rest import JSON
from podcert.reconcile.workqueue import WorkQueue
from signer.authority import ca, trustbundles
from signer.kube import SignerKube

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
            "trustBundle": dump_roots(reversed(roots)).decode(),
        },
    }
    assert not trustbundles.differs(want, same_but_reordered)
    assert trustbundles.differs(want, None)
    edited = {**want, "spec": {**want["spec"], "trustBundle": dump_roots(roots[:1]).decode()}}
    assert trustbundles.differs(want, edited)
    relabelled = {**want, "metadata": {**want["metadata"], "labels": {}}}
    assert trustbundles.differs(want, relabelled)


def test_the_live_bundle_keeps_the_old_label_and_both_carry_the_standards() -> None:
    root = ca.new_ca("a", T0).root
    live = trustbundles.desired("example.com/podcert", "td.test", [root], "live")
    preview = trustbundles.desired("example.com/podcert", "td.test", [root], "preview")
    assert live["metadata"]["name"] == "example.com:podcert:roots"
    assert preview["metadata"]["name"] == "example.com:podcert:roots-preview"
    standard = {
        "k8s.spiffe.io/workload-trust-domain": "td.test",
        "k8s.spiffe.io/peer-trust-domain": "td.test",
    }
    assert live["metadata"]["labels"] == {
        **trustbundles.MANAGED_BY,
        trustbundles.TRUST_DOMAIN_LABEL: "td.test",  # what selectors before the standard use
        "k8s.spiffe.io/canarying": "live",
        **standard,
    }
    # No podcert.dev/trust-domain: an older selector keeps matching the live bundle alone.
    assert preview["metadata"]["labels"] == {
        **trustbundles.MANAGED_BY,
        "k8s.spiffe.io/canarying": "preview",
        **standard,
    }


def test_a_preview_root_is_published_in_the_preview_bundle_only() -> None:
    old, new = ca.new_ca("old", T0).root, ca.new_ca("new", T0).root
    written: dict[str, JSON] = {}

    class Kube:
        def put_trust_bundle(self, body: JSON, existing: JSON | None) -> JSON:
            written[body["metadata"]["name"]] = body
            return body

    publisher = trustbundles.Publisher(
        cast(SignerKube, Kube()),
        {"a.test/one": "td.test"},
        roots=lambda: [old],
        active=lambda: True,
        stop=threading.Event(),
        preview_roots=lambda: [old, new],
    )
    assert publisher.reconcile("a.test/one")
    live, preview = written["a.test:one:roots"], written["a.test:one:roots-preview"]
    assert live["spec"]["trustBundle"] == dump_roots([old]).decode()
    assert preview["spec"]["trustBundle"] == dump_roots([old, new]).decode()


def test_duplicate_roots_are_published_once() -> None:
    root = ca.new_ca("a", T0).root
    want = trustbundles.desired("example.com/podcert", "td.test", [root, root])
    assert want["spec"]["trustBundle"].count("BEGIN CERTIFICATE") == 1


class _Kube:
    """What the publisher writes, and a cluster that holds no bundle yet."""

    def __init__(self) -> None:
        self.put: list[str] = []

    def put_trust_bundle(self, body: JSON, existing: JSON | None) -> JSON:
        self.put.append(body["spec"]["signerName"])
        return body


def _drain(publisher: trustbundles.Publisher) -> None:
    while (key := publisher.queue.get(timeout=0)) is not None:
        publisher._publish(key)
        publisher.queue.done(key)


def test_a_publish_that_came_before_the_last_list_was_in_is_tried_again() -> None:
    """Each bundle list's arrival queues its signer, but its reflector says synced only after:
    with two signer names, both can be looked at, and skipped, before the second list is in."""
    now = [0.0]
    kube = _Kube()
    publisher = trustbundles.Publisher(
        cast(SignerKube, kube),
        {"a.test/one": "td.test", "a.test/two": "td.test"},
        roots=lambda: [ca.new_ca("a", T0).root],
        active=lambda: True,
        stop=threading.Event(),
    )
    publisher.queue = WorkQueue(clock=lambda: now[0])
    first, second = publisher.reflectors
    publisher._on_list("a.test/one", [])
    first.synced.set()
    publisher._on_list("a.test/two", [])  # its reflector not yet synced
    _drain(publisher)
    assert kube.put == []

    second.synced.set()
    now[0] += trustbundles.Publisher.UNSYNCED_RETRY
    _drain(publisher)
    assert sorted(kube.put) == ["a.test/one", "a.test/one", "a.test/two", "a.test/two"]


def test_a_follower_does_not_keep_looking() -> None:
    kube = _Kube()
    publisher = trustbundles.Publisher(
        cast(SignerKube, kube),
        {"a.test/one": "td.test"},
        roots=lambda: [ca.new_ca("a", T0).root],
        active=lambda: False,
        stop=threading.Event(),
    )
    publisher._on_list("a.test/one", [])
    _drain(publisher)
    assert kube.put == [] and len(publisher.queue) == 0
