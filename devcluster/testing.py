"""What tests need from a running devcluster: one handle with the admin client and real identities.

Used by the pytest session fixture in tests/conftest.py and by the benchmarks.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from devcluster import cluster, kube, nodes, nodestate
from devcluster.planestate import State

T = TypeVar("T")

_counter = itertools.count()


@dataclass
class Kubelet:
    """A kubelet started for a test: its node name, kind and root directory (holds pods/)."""

    cluster_root: Path
    state: nodestate.NodeState

    @property
    def name(self) -> str:
        return self.state.node

    @property
    def hollow(self) -> bool:
        return self.state.kind == nodestate.HOLLOW

    @property
    def root(self) -> Path:
        return self.state.root

    def volume_dir(self, pod_uid: str, volume: str = "identity") -> Path:
        """Where the kubelet projects a pod's projected volume."""
        return self.root / "pods" / pod_uid / "volumes" / "kubernetes.io~projected" / volume

    def containers(self, pod_uid: str) -> list[str]:
        """The containers (the pod sandbox included) containerd holds for a pod: real nodes."""
        if self.hollow:
            raise ValueError(f"{self.name} is a hollow node: it runs no containers")
        done = subprocess.run(
            [
                "ctr",
                f"--address={self.state.containerd_socket}",
                "--namespace=k8s.io",
                "containers",
                "list",
                "--quiet",
                f'labels."io.kubernetes.pod.uid"=={pod_uid}',
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        return done.stdout.split()

    def restart(self) -> None:
        """Restart only the kubelet (containers keep running; a hollow one gets a new root)."""
        self.state = nodes.restart_kubelet(self.cluster_root, self.name)

    def stop(self) -> None:
        nodes.stop(self.cluster_root, self.name)


@dataclass
class DevCluster:
    root: Path
    state: State
    admin: kube.ApiClient = field(init=False)

    def __post_init__(self) -> None:
        self.admin = kube.admin_client(self.root)

    def node(self, name: str) -> kube.ApiClient:
        """An API client that authenticates as system:node:<name> (the Node object is created)."""
        return kube.api_client(kube.node_kubeconfig(self.root, name))

    def node_kubeconfig(self, name: str) -> Path:
        return kube.node_kubeconfig(self.root, name)

    def user(self, name: str, groups: tuple[str, ...] = ()) -> kube.ApiClient:
        return kube.api_client(kube.user_kubeconfig(self.root, name, groups))

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        return kube.service_account_kubeconfig(self.root, namespace, name)

    def namespace(self, prefix: str = "t") -> str:
        name = f"{prefix}-{next(_counter)}-{int(time.time() * 1000) % 100000}"
        kube.ensure_namespace(self.admin, name)
        return name

    def kubelet(
        self,
        name: str,
        *,
        hollow: bool = False,
        timeout: float = 120.0,
        sync_frequency: dt.timedelta | None = None,
    ) -> Kubelet:
        """Start a kubelet for node `name` (real containers unless `hollow`); it is Ready.
        `sync_frequency` shortens a real kubelet's pod resync (see `nodeconfig.kubelet_config`)."""
        state = nodes.start(
            self.root, name, hollow=hollow, timeout=timeout, sync_frequency=sync_frequency
        )
        return Kubelet(self.root, state)

    def pod(self, namespace: str, name: str, *, node: str, **kwargs: Any) -> Any:
        kube.ensure_node(self.admin, node)
        return kube.create_pod(self.admin, namespace, name, node=node, **kwargs)


def eventually(
    probe: Callable[[], T | None], *, timeout: float = 10.0, interval: float = 0.05, what: str = ""
) -> T:
    """Poll `probe` until it returns something true, or fail at the deadline. An empty list
    (or any other false value) is "not yet", so `[event] = eventually(events_of_pod)` waits
    for the event instead of taking the first empty answer."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what or probe!r} (last: {last!r})"
    )


@contextlib.contextmanager
def running(root: Path) -> Iterator[DevCluster]:
    """A devcluster up at `root` (its progress printed) for the block, taken down after it."""
    state = cluster.up(root, progress=lambda line: print(line, flush=True))
    try:
        handle = DevCluster(root, state)
        yield handle
        handle.admin.close()  # type: ignore[no-untyped-call]
    finally:
        cluster.down(root)
