"""signer.revokeplan: a pod is stale when the newest issued request for it chains to a revoked
generation, or when it has a volume for a watched signer name and no issued request at all; a
pod whose requests the shim made is re-keyed, any other is on a kubelet node and evicted in
waves; terminating pods are left alone."""

from __future__ import annotations

import datetime as dt

import pytest

from kubelet_shim.kube import ROTATE_ANNOTATION
from signer import revokeplan
from signer.authority import ca, revoke, schedule
from tests.unit.test_signer_revoke import leaf

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SIGNER = "podcert.dev/workload"
MINUTE = dt.timedelta(minutes=1)


@pytest.fixture(scope="module")
def bundles() -> list[ca.CABundle]:
    return [ca.new_ca(f"gen{i}", T0) for i in range(2)]


def revoked_first(bundles: list[ca.CABundle]) -> list[revoke.Revocation]:
    gen = schedule.Generation("g0", bundles[0], "retired", T0)
    return [revoke.record(gen, T0, untrusted=False)]


def pod(name: str, node: str = "n1", *, terminating: bool = False) -> revokeplan.Pod:
    return revokeplan.Pod("ns", name, f"uid-{name}", node, frozenset({SIGNER}), terminating)


def issued(
    name: str, bundle: ca.CABundle, minutes: int = 0, manager: str = "podcert/0.3.0"
) -> revokeplan.Issued:
    created = T0 + dt.timedelta(minutes=minutes)
    return revokeplan.Issued(
        f"uid-{name}", SIGNER, created, (leaf(bundle), bundle.intermediate), manager
    )


def test_the_shim_and_the_signer_name_the_same_annotation() -> None:
    assert revokeplan.ROTATE_ANNOTATION == ROTATE_ANNOTATION


def test_only_the_newest_issued_leaf_of_a_pod_counts(bundles: list[ca.CABundle]) -> None:
    revoked = revoked_first(bundles)
    pods = [pod("renewed"), pod("stale")]
    requests = [
        issued("renewed", bundles[0], 0),
        issued("renewed", bundles[1], 5),
        issued("stale", bundles[1], 0),
        issued("stale", bundles[0], 5),
    ]
    stale = revokeplan.stale_pods(pods, requests, revoked)
    assert [s.pod.name for s in stale] == ["stale"]
    assert "revoked CA g0" in stale[0].why


@pytest.mark.parametrize(
    ("manager", "replacer"),
    [
        pytest.param("podcert/0.3.0", "shim", id="made by the shim: re-keyed"),
        pytest.param("kubelet", "kubelet", id="made by a kubelet: evicted"),
        pytest.param("kubemark", "kubelet", id="made by a hollow kubelet: evicted"),
    ],
)
def test_who_made_the_request_says_who_replaces_the_leaf(
    bundles: list[ca.CABundle], manager: str, replacer: str
) -> None:
    stale = revokeplan.stale_pods(
        [pod("a")], [issued("a", bundles[0], manager=manager)], revoked_first(bundles)
    )
    assert [s.replacer for s in stale] == [replacer]


def test_a_pod_with_no_issued_request_is_stale_only_for_a_watched_signer(
    bundles: list[ca.CABundle],
) -> None:
    revoked = revoked_first(bundles)
    assert revokeplan.stale_pods([pod("a")], [], revoked) == []
    stale = revokeplan.stale_pods([pod("a")], [], revoked, [SIGNER])
    assert [(s.pod.name, s.replacer) for s in stale] == [("a", "kubelet")]


def test_terminating_pods_are_left_alone(bundles: list[ca.CABundle]) -> None:
    stale = revokeplan.stale_pods(
        [pod("a", terminating=True)], [issued("a", bundles[0])], revoked_first(bundles)
    )
    assert stale == []


def test_kubelet_pods_go_in_waves_node_by_node(bundles: list[ca.CABundle]) -> None:
    names = [("a", "n2"), ("b", "n1"), ("c", "n1"), ("d", "n2"), ("e", "n3")]
    pods = [pod(n, node) for n, node in names]
    requests = [issued(n, bundles[0], manager="kubelet") for n, _ in names]
    requests.append(issued("e", bundles[0], 1, manager="podcert/0.3.0"))
    stale = revokeplan.stale_pods(pods, requests, revoked_first(bundles))
    waves = revokeplan.waves(stale, 2)
    assert [[s.pod.name for s in w] for w in waves] == [["b", "c"], ["a", "d"]]
    assert revokeplan.waves(stale, 0)[0] == [stale[0]]


def test_a_progress_line_counts_each_kind_of_node(bundles: list[ca.CABundle]) -> None:
    stale = revokeplan.stale_pods(
        [pod("a"), pod("b")],
        [issued("a", bundles[0]), issued("b", bundles[0], manager="kubelet")],
        revoked_first(bundles),
    )
    line = revokeplan.progress_line("g0", stale, dt.timedelta(seconds=3))
    assert "2 live pod(s) still chain to g0 (1 on shim nodes, 1 on kubelet nodes)" in line


def test_a_pod_made_after_the_revocation_is_not_stale_for_want_of_a_request(
    bundles: list[ca.CABundle],
) -> None:
    revoked = revoked_first(bundles)
    later = revokeplan.Pod("ns", "b", "uid-b", "n1", frozenset({SIGNER}), created=T0 + MINUTE)
    earlier = revokeplan.Pod("ns", "a", "uid-a", "n1", frozenset({SIGNER}), created=T0 - MINUTE)
    stale = revokeplan.stale_pods([earlier, later], [], revoked, [SIGNER])
    assert [s.pod.name for s in stale] == ["a"]
    assert revokeplan.unverified([earlier, later], [], [SIGNER], T0) == [earlier]
    assert revokeplan.unverified([earlier], [issued("a", bundles[1])], [SIGNER], T0) == []


def test_each_of_a_pods_stale_leaves_is_counted(bundles: list[ca.CABundle]) -> None:
    other = "podcert.dev/other"
    both = revokeplan.Pod("ns", "a", "uid-a", "n1", frozenset({SIGNER, other}))
    second = revokeplan.Issued(
        "uid-a", other, T0, (leaf(bundles[0]), bundles[0].intermediate), "kubelet"
    )
    stale = revokeplan.stale_pods([both], [issued("a", bundles[0]), second], revoked_first(bundles))
    assert [s.leaves for s in stale] == [2]


def test_a_kubelet_pod_no_controller_owns_is_evicted_only_when_forced(
    bundles: list[ca.CABundle],
) -> None:
    bare = revokeplan.Pod("ns", "bare", "uid-bare", "n1", frozenset({SIGNER}), controlled=False)
    stale = revokeplan.stale_pods(
        [bare, pod("owned")],
        [
            issued("bare", bundles[0], manager="kubelet"),
            issued("owned", bundles[0], manager="kubelet"),
        ],
        revoked_first(bundles),
    )
    assert [s.pod.name for s in revokeplan.unowned(stale)] == ["bare"]
    assert [[s.pod.name for s in w] for w in revokeplan.waves(stale, 5)] == [["owned"]]
    assert [[s.pod.name for s in w] for w in revokeplan.waves(stale, 5, force=True)] == [
        ["bare", "owned"]
    ]


def test_the_pods_refreshed_in_place_are_the_kubelet_pods_not_evicted(
    bundles: list[ca.CABundle],
) -> None:
    bare = revokeplan.Pod("ns", "bare", "uid-bare", "n1", frozenset({SIGNER}), controlled=False)
    stale = revokeplan.stale_pods(
        [bare, pod("owned"), pod("shim")],
        [
            issued("bare", bundles[0], manager="kubelet"),
            issued("owned", bundles[0], manager="kubelet"),
            issued("shim", bundles[0]),
        ],
        revoked_first(bundles),
    )

    def names(wait_refresh: bool, force: bool) -> list[str]:
        chosen = revokeplan.in_place(stale, wait_refresh=wait_refresh, force=force)
        return [s.pod.name for s in chosen]

    assert names(wait_refresh=True, force=False) == ["bare", "owned"]
    assert names(wait_refresh=False, force=False) == ["bare"]
    assert names(wait_refresh=False, force=True) == []


def test_a_pod_with_no_request_left_is_replaced_as_its_nodes_other_pods_are(
    bundles: list[ca.CABundle],
) -> None:
    pods = [pod("gone", "shim-node"), pod("renewed", "shim-node"), pod("lost", "kubelet-node")]
    requests = [issued("renewed", bundles[1])]  # the shim made it
    stale = revokeplan.stale_pods(pods, requests, revoked_first(bundles), [SIGNER])
    assert [(s.pod.name, s.replacer) for s in stale] == [("lost", "kubelet"), ("gone", "shim")]
