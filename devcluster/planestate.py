"""The control plane's state file (`state.json` under the devcluster's folder): the ports, pids
and binaries of etcd, kube-apiserver, kube-controller-manager and kube-scheduler, and whether
they still run. Apart from `cluster`, which starts and stops them, so that the modules which
only read it (the nodes, their network, the client) never import the control plane's start-up.
"""

import json
from dataclasses import asdict, dataclass

from devcluster.build import DEFAULT_KUBE_VERSION
from devcluster.identities import Paths
from devcluster.supervise import alive


@dataclass(frozen=True)
class State:
    etcd_pid: int
    apiserver_pid: int
    etcd_port: int
    apiserver_port: int
    etcd_binary: str
    apiserver_binary: str
    kube_version: str = DEFAULT_KUBE_VERSION
    controller_manager_pid: int = 0
    controller_manager_binary: str = ""
    controller_manager_port: int = 0
    scheduler_pid: int = 0
    scheduler_binary: str = ""
    scheduler_port: int = 0
    # The API server runs `kube_version`; these two lag it during an upgrade ("": the same).
    controller_manager_version: str = ""
    scheduler_version: str = ""
    # The API server serves /debug/pprof (benchmarks profile it); off as in a hardened cluster.
    apiserver_profiling: bool = False

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    def versions(self) -> dict[str, str]:
        """The minor each control-plane component runs, by its binary's name."""
        return {
            "kube-apiserver": self.kube_version,
            "kube-controller-manager": self.controller_manager_version or self.kube_version,
            "kube-scheduler": self.scheduler_version or self.kube_version,
        }


def read_state(paths: Paths) -> State | None:
    try:
        return State(**json.loads(paths.state.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def processes(state: State) -> list[tuple[int, str]]:
    """(pid, binary) of every control-plane process the state names, the API server's clients
    first (the stop order)."""
    found = [
        (state.scheduler_pid, state.scheduler_binary),
        (state.controller_manager_pid, state.controller_manager_binary),
        (state.apiserver_pid, state.apiserver_binary),
        (state.etcd_pid, state.etcd_binary),
    ]
    return [(pid, binary) for pid, binary in found if pid]


def running(paths: Paths) -> State | None:
    state = read_state(paths)
    if state is None or not state.apiserver_pid:
        return None
    if all(alive(pid, binary) for pid, binary in processes(state)):
        return state
    return None


def save(paths: Paths, state: State) -> None:
    paths.state.write_text(json.dumps(asdict(state)))
