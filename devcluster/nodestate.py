"""What the devcluster records of each kubelet it started (`nodes/<node>/state.json`), and the
waits that tell a kubelet is up: its Node Ready, its lease renewed."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from kubernetes import client
from kubernetes.client import ApiException

from devcluster import kube
from devcluster.identities import Paths
from devcluster.supervise import exited, wait_until

REAL, HOLLOW = "real", "hollow"


@dataclass(frozen=True)
class NodeState:
    node: str
    kind: str  # REAL or HOLLOW
    kube_version: str
    kubelet_pid: int
    kubelet_binary: str
    root_dir: str  # the kubelet's root directory: the folder that holds pods/
    port: int
    containerd_pid: int = 0
    containerd_binary: str = ""
    containerd_socket: str = ""
    cgroup: str = ""  # the cgroup (same path in every v1 hierarchy) holding all it runs
    created: tuple[str, ...] = ()  # fixed host paths this node created
    leftovers: tuple[str, ...] = ()  # files it leaves elsewhere, removed on stop
    kubelet_args: tuple[str, ...] = ()  # the kubelet's command line, for a restart

    @property
    def root(self) -> Path:
        return Path(self.root_dir)


def node_dir(root: Path, node: str) -> Path:
    return Paths(root.resolve()).root / "nodes" / node


def state_file(root: Path, node: str) -> Path:
    return node_dir(root, node) / "state.json"


def read_state(root: Path, node: str) -> NodeState | None:
    try:
        raw = json.loads(state_file(root, node).read_text())
        raw["created"] = tuple(raw.get("created", ()))
        raw["leftovers"] = tuple(raw.get("leftovers", ()))
        raw["kubelet_args"] = tuple(raw.get("kubelet_args", ()))
        return NodeState(**raw)
    except (OSError, ValueError, TypeError):
        return None


def save(root: Path, state: NodeState) -> None:
    state_file(root, state.node).write_text(json.dumps(asdict(state)))


def wait_ready(
    root: Path, node: str, proc: subprocess.Popen[bytes], log: Path, deadline: float
) -> None:
    def ready() -> bool:
        try:
            with kube.admin_client(root) as api:
                found = client.CoreV1Api(api).read_node(node)
        except ApiException:
            return False
        conditions = (found.status.conditions if found.status else None) or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    wait_until(ready, deadline, f"kubelet for {node}", interval=0.2, failed=exited(proc, log))


def wait_lease_renewed(
    root: Path,
    node: str,
    since: dt.datetime,
    proc: subprocess.Popen[bytes],
    log: Path,
    deadline: float,
) -> None:
    """Wait until the node's lease was renewed after `since`: the kubelet that renewed it is up
    (the Node's Ready condition still shows the old kubelet's last report)."""

    def renewed() -> bool:
        try:
            with kube.admin_client(root) as api:
                lease = client.CoordinationV1Api(api).read_namespaced_lease(node, "kube-node-lease")
        except ApiException:
            return False
        renew = lease.spec.renew_time if lease.spec else None
        return renew is not None and renew > since

    wait_until(
        renewed, deadline, f"kubelet for {node} to renew its lease", failed=exited(proc, log)
    )


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
