"""kubemark's hollow kubelet (`--morph=kubelet`): the real kubelet code (pod certificate manager,
projected volumes, atomic writer) with a fake runtime and mounter. Files are written for real; no
container runs. Cheap enough for many nodes."""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

from devcluster import host
from devcluster.flags import feature_gate_flags
from devcluster.identities import Paths
from devcluster.nodestate import HOLLOW, NodeState, file_size, save, wait_ready
from devcluster.supervise import Progress, exited, free_port, wait_until_value

# kubemark's fake runtime listens on /tmp/kubelet_remote_<random>.sock and leaves it behind.
FAKE_RUNTIME_SOCKETS = "kubelet_remote_*.sock"


def runtime_sockets() -> set[Path]:
    return set(Path("/tmp").glob(FAKE_RUNTIME_SOCKETS))  # noqa: S108 (kubemark's fixed folder)


# A real kubelet's client defaults (KubeletConfiguration kubeAPIQPS / kubeAPIBurst); kubemark's
# own are 10 / 20, which would throttle its pod certificate manager five times harder.
KUBELET_API_QPS, KUBELET_API_BURST = 50, 100


def kubemark_args(
    binary: Path,
    node: str,
    kubeconfig: Path,
    port: int,
    kube_version: str,
    max_pods: int | None = None,
) -> tuple[str, ...]:
    """kubemark's command line for a hollow kubelet that talks to the API server as a real
    kubelet does; `max_pods` raises its limit of 110 pods."""
    return (
        str(binary),
        "--morph=kubelet",
        f"--name={node}",
        f"--kubeconfig={kubeconfig}",
        "--use-host-image-service=false",
        f"--kubelet-port={port}",
        "--kubelet-read-only-port=0",
        f"--kube-api-qps={KUBELET_API_QPS}",
        f"--kube-api-burst={KUBELET_API_BURST}",
        *([f"--max-pods={max_pods}"] if max_pods is not None else []),
        *feature_gate_flags(kube_version),
    )


def start(
    paths: Paths,
    node: str,
    kube_version: str,
    binary: Path,
    kubeconfig: Path,
    folder: Path,
    progress: Progress,
    deadline: float,
    max_pods: int | None = None,
) -> NodeState:
    port = free_port()
    log = folder / "kubelet.log"
    progress(f"starting hollow kubelet {kube_version} for {node} (kubelet port {port})")
    before = runtime_sockets()
    offset = file_size(log)
    args = kubemark_args(binary, node, kubeconfig, port, kube_version, max_pods)
    proc = host.spawn(list(args), log)
    state = NodeState(
        node, HOLLOW, kube_version, proc.pid, str(binary), "", port, kubelet_args=args
    )
    save(paths.root, state)
    state = find_parts(paths.root, state, proc, log, offset, before, deadline)
    wait_ready(paths.root, node, proc, log, deadline)
    return state


_HOLLOW_ROOT = re.compile(r"Using (\S+) as root dir for hollow-kubelet")


def _hollow_root(log: Path, offset: int) -> Path | None:
    """The root a hollow kubelet announced in its log after byte `offset` (its latest start)."""
    try:
        with log.open("rb") as f:
            f.seek(offset)
            match = _HOLLOW_ROOT.search(f.read().decode(errors="replace"))
    except OSError:
        return None
    return Path(match.group(1)) if match else None


def find_parts(
    root: Path,
    state: NodeState,
    proc: subprocess.Popen[bytes],
    log: Path,
    offset: int,
    sockets_before: set[Path],
    deadline: float,
) -> NodeState:
    """Record what a hollow kubelet made for itself: kubemark makes its root as
    /tmp/hollow-kubelet.NNNN (no flag, not even TMPDIR) and says which in its log; its fake
    runtime's socket is the one that appeared since it started."""
    found = wait_until_value(
        lambda: _hollow_root(log, offset),
        deadline,
        f"hollow kubelet root for {state.node}",
        failed=exited(proc, log),
    )
    state = replace(state, root_dir=str(found))
    save(root, state)
    sockets = wait_until_value(
        lambda: (runtime_sockets() - sockets_before) or None,
        deadline,
        f"hollow kubelet runtime socket for {state.node}",
        failed=exited(proc, log),
    )
    state = replace(state, leftovers=tuple(sorted({*state.leftovers, *map(str, sockets)})))
    save(root, state)
    return state
