"""kubelet_shim.rekeyable: a pod whose requests the shim made is re-keyed by it; a pod whose
requests a kubelet made (real or hollow) is not, whatever its annotation says; a pod with no
request cannot be told."""

from __future__ import annotations

import pytest

from kubelet_shim import rekeyable


@pytest.mark.parametrize(
    ("managers", "verdict"),
    [
        pytest.param(["podcert/0.3.0"], "shim", id="made by the shim"),
        pytest.param(["kubelet"], "kubelet", id="made by a kubelet"),
        pytest.param(["kubemark"], "kubelet", id="made by a hollow kubelet"),
        pytest.param(["podcert/0.3.0", "kubelet"], "kubelet", id="a kubelet made one of them"),
        pytest.param([], "unknown", id="no request"),
    ],
)
def test_who_made_a_pods_requests_says_who_acts_on_its_annotation(
    managers: list[str], verdict: str
) -> None:
    assert rekeyable.verdicts(["a"], {"a": managers}) == {"a": verdict}


def test_a_pod_absent_from_the_requests_is_unknown() -> None:
    assert rekeyable.verdicts(["a", "b"], {"a": ["kubelet"]}) == {"a": "kubelet", "b": "unknown"}
