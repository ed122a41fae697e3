from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster import cluster
from devcluster.testing import DevCluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration/" in str(item.path).replace(os.sep, "/"):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def devcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """One real etcd + kube-apiserver for the whole session."""
    root: Path = tmp_path_factory.mktemp("devcluster")
    state = cluster.up(root, progress=lambda line: print(line, flush=True))
    try:
        handle = DevCluster(root, state)
        yield handle
        handle.admin.close()
    finally:
        cluster.down(root)
