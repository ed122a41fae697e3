"""`podcert status` on a revoked CA generation: followed while its root is trusted or a leaf it
signed may still be valid; the live pods still holding its leaves, split shim / kubelet; the pods
nothing vouches for; the trust bundles still holding its root; all judged at an injected `now`."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from podcert.api.times import format_time
from signer.authority import ca, revoke, schedule
from signer.report.render import status_table
from signer.report.revocations import followed, revocations, revoked_of
from signer.report.status import build_status
from tests.unit.test_report_status import _inputs
from tests.unit.test_signer_revoke import leaf

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
NOW = T0 + dt.timedelta(minutes=5)
SIGNER = "podcert.dev/workload"
SOURCE = {"signerName": SIGNER}


@pytest.fixture(scope="module")
def bundles() -> list[ca.CABundle]:
    return [ca.new_ca(f"gen{i}", T0) for i in range(2)]


def revocation(bundle: ca.CABundle, *, untrusted: bool = False, at: dt.datetime = T0) -> Any:
    return revoke.record(schedule.Generation("g0", bundle, "retired", T0), at, untrusted=untrusted)


def pem(*certs: x509.Certificate) -> str:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs).decode()


def pod(name: str, node: str = "n1", created: dt.datetime = T0 - dt.timedelta(hours=1)) -> Any:
    return {
        "metadata": {
            "namespace": "shop",
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": format_time(created),
        },
        "spec": {
            "nodeName": node,
            "volumes": [
                {
                    "name": "id",
                    "projected": {"sources": [{"podCertificate": {"signerName": SIGNER}}]},
                }
            ],
        },
    }


def pcr(name: str, bundle: ca.CABundle, manager: str) -> Any:
    return {
        "metadata": {
            "namespace": "shop",
            "name": f"req-{name}",
            "creationTimestamp": format_time(T0 - dt.timedelta(minutes=30)),
            "managedFields": [{"manager": manager}],
        },
        "spec": {"podUID": f"uid-{name}", "signerName": SIGNER, "podName": name},
        "status": {"certificateChain": pem(leaf(bundle), bundle.intermediate)},
    }


def ctb(name: str, *roots: x509.Certificate) -> Any:
    return {"metadata": {"name": name}, "spec": {"signerName": SIGNER, "trustBundle": pem(*roots)}}


@pytest.mark.parametrize(
    ("untrusted", "age", "is_followed"),
    [
        pytest.param(False, dt.timedelta(days=3), True, id="root still trusted: followed"),
        pytest.param(True, dt.timedelta(hours=2), True, id="untrusted, leaves may live: followed"),
        pytest.param(True, dt.timedelta(days=1), False, id="untrusted, every leaf expired: done"),
    ],
)
def test_a_revocation_is_followed_while_its_root_or_a_leaf_of_it_may_live(
    bundles: list[ca.CABundle], untrusted: bool, age: dt.timedelta, is_followed: bool
) -> None:
    r = revocation(bundles[0], untrusted=untrusted)
    assert (followed([r], T0 + age) == [r]) is is_followed


def test_live_pods_holding_its_leaves_are_split_by_who_replaces_them(
    bundles: list[ca.CABundle],
) -> None:
    old, new = bundles
    pods = [
        pod("shim-stale"),
        pod("kubelet-stale", "hollow-0"),
        pod("renewed"),
        pod("no-request-left"),
        pod("made-after", created=NOW),
    ]
    requests = [
        pcr("shim-stale", old, "podcert/0.3.0"),
        pcr("kubelet-stale", old, "kubelet"),
        pcr("renewed", new, "kubelet"),
    ]
    bundles_now = [ctb("live", old.root, new.root), ctb("preview", new.root)]

    [state] = revocations([revocation(old)], bundles_now, pods, requests, [SIGNER], NOW)

    doc = state.as_json()
    assert state.in_progress and doc["inProgress"] is True
    assert (doc["livePods"], doc["liveLeaves"]) == (2, 2)
    assert (doc["onShimNodes"], doc["onKubeletNodes"]) == (1, 1)
    assert doc["unverifiedPods"] == 1
    assert doc["trustBundlesWithRoot"] == ["live"] and doc["rootInTrustBundles"] is True
    assert {(p["name"], p["replacedBy"]) for p in doc["pods"]} == {
        ("shim-stale", "shim"),
        ("kubelet-stale", "kubelet"),
    }


def test_a_revocation_with_nothing_left_is_done(bundles: list[ca.CABundle]) -> None:
    old, new = bundles
    [state] = revocations(
        [revocation(old, untrusted=True)],
        [ctb("live", new.root)],
        [pod("renewed")],
        [pcr("renewed", new, "kubelet")],
        [SIGNER],
        NOW,
    )
    assert not state.in_progress
    assert state.as_json()["livePods"] == 0 and state.as_json()["rootInTrustBundles"] is False


def test_pods_the_identity_may_not_list_leave_the_revocation_unjudged(
    bundles: list[ca.CABundle],
) -> None:
    [state] = revocations(
        [revocation(bundles[0], untrusted=True)], [], "pods are not readable", [], [SIGNER], NOW
    )
    doc = state.as_json()
    assert state.in_progress
    assert doc["podsRead"] is False and doc["podsProblem"] == "pods are not readable"
    assert doc["livePods"] is None


def test_status_carries_the_revocation_in_json_and_table(bundles: list[ca.CABundle]) -> None:
    old, new = bundles
    secret = {
        **schedule.to_secret(
            [
                schedule.Generation("g0", old, "retired", T0, T0 + dt.timedelta(days=1)),
                schedule.Generation("g1", new, "active", T0),
            ]
        ),
        **revoke.to_secret([revocation(old)]),
    }
    inputs = _inputs(
        secret=secret,
        signer_names=(SIGNER,),
        trust_bundles=[ctb("podcert.dev:workload:live", old.root, new.root)],
        requests=[pcr("api", old, "kubelet")],
        pods=[pod("api", "hollow-0")],
    )

    status = build_status(inputs, NOW)

    [doc] = status.as_json()["revocations"]
    assert doc["id"] == "g0" and doc["onKubeletNodes"] == 1
    text = status_table(status)
    assert "revoked g0 at 2026-01-01T00:00:00Z: 1 live pod(s) hold its leaves" in text
    assert "(0 on shim nodes, 1 on kubelet nodes)" in text
    assert "its root is still in podcert.dev:workload:live" in text
    assert "shop/api on hollow-0 (kubelet)" in text


def test_an_unreadable_revocation_list_is_no_revocation() -> None:
    assert revoked_of({revoke.REVOKED_KEY: b"not json"}) == []
    assert revoked_of("the Secret does not exist") == []
