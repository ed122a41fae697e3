from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from devcluster import nodes
from devcluster.testing import DevCluster, Kubelet, running

# The xdist group of every module that holds what the machine has only one of: the real node
# (`nodes.REAL_NODE_SLOT`, containerd, kube-proxy's iptables) or the podman store the images are
# built in. Those modules run one after another in one worker; each other module runs whole in
# whichever worker is free, so its module-scoped fixtures start once.
MACHINE_GROUP = "machine"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in str(item.path).replace(os.sep, "/"):
            item.add_marker(pytest.mark.integration)
        machine = item.get_closest_marker("machine") is not None
        if "real_kubelet" in getattr(item, "fixturenames", ()) and not machine:
            raise pytest.UsageError(f"{item.nodeid} uses the real node: mark its module `machine`")
        group = MACHINE_GROUP if machine else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))


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
