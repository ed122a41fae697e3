from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from devcluster import nodes
from devcluster.testing import DevCluster, Kubelet, running


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in str(item.path).replace(os.sep, "/"):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def devcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """One real control plane (etcd, kube-apiserver, controller-manager, scheduler) for the whole
    session."""
    with running(tmp_path_factory.mktemp("devcluster")) as handle:
        yield handle


@pytest.fixture(scope="module")
def real_kubelet(devcluster: DevCluster) -> Iterator[Kubelet]:
    """A real kubelet (containerd + runc, real containers) as node `node-real`, for one module."""
    reason = nodes.real_node_unavailable()
    if reason:
        pytest.fail(f"cannot run a real node on this machine: {reason}")
    kubelet = devcluster.kubelet("node-real")
    try:
        yield kubelet
    finally:
        kubelet.stop()


@pytest.fixture(scope="module")
def hollow_kubelet(devcluster: DevCluster) -> Iterator[Kubelet]:
    """kubemark's hollow kubelet (real kubelet code, fake runtime) as `node-hollow`, for one
    module."""
    kubelet = devcluster.kubelet("node-hollow", hollow=True)
    try:
        yield kubelet
    finally:
        kubelet.stop()
