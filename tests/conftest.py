from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from devcluster import nodes
from devcluster.testing import DevCluster, Kubelet, running

# The modules that hold what the machine has only one of: the real node (`nodes.REAL_NODE_SLOT`,
# containerd, kube-proxy's iptables; the demo and the soak take it where the machine allows) or
# the podman store the images are built in.
MACHINE_MODULES = frozenset(
    f"tests/integration/{name}.py"
    for name in (
        "test_demo",
        "test_helm_install",
        "test_helm_upgrade",
        "test_image",
        "test_in_cluster",
        "test_real_kubelet",
        "test_real_kubelet_rotation",
        "test_release",
        "test_skew_matrix",
        "test_soak",
        "test_upgrade_cluster",
    )
)
MACHINE_SCOPE = "machine"


class ModuleScheduling(LoadScopeScheduling):
    """pytest-xdist's scheduling with one scope per module, so each module runs whole in one
    worker and its module fixtures start once, and one scope for all of `MACHINE_MODULES`, so
    they run one after another in one worker (a second real node would be refused)."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)


def scope_of(nodeid: str) -> str:
    """The xdist scope a test runs in: its module's, or the machine's."""
    module = nodeid.split("::", 1)[0]
    return MACHINE_SCOPE if module in MACHINE_MODULES else module


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> ModuleScheduling:
    return ModuleScheduling(config, log)


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Integration tests get their mark, and the machine's modules come first: one after another
    in one worker they are the suite's longest path, so they start while the other workers take
    everything else (the Makefile keeps xdist from reordering)."""
    for item in items:
        if "tests/integration/" in str(item.path).replace(os.sep, "/"):
            item.add_marker(pytest.mark.integration)
        if "real_kubelet" in getattr(item, "fixturenames", ()) and (
            _module(item) not in MACHINE_MODULES
        ):
            raise pytest.UsageError(f"{item.nodeid} uses the real node: add it to MACHINE_MODULES")
    items.sort(key=lambda item: _module(item) not in MACHINE_MODULES)


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
