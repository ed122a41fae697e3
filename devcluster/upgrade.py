"""In-place upgrades of a running devcluster, the way kubeadm does them, one function per step:

- `control_plane(root, "1.37")` restarts kube-apiserver, then kube-controller-manager, then
  kube-scheduler on the target minor's binaries with that minor's flags and feature gates, on
  the same ports, against the same etcd (kept running: its data and its version stay). Each
  component is answering before the next stops; the recorded state (`devcluster status`) names
  each component's minor as soon as it runs it.
- `kubelet(root, node)` restarts one node's kubelet on the newer binary (the API server's minor
  unless told), its pods kept (`nodes.restart_kubelet` says what a real and a hollow node keep).

Both return once their step is done, and leave out what already runs the target, so an upgrade
cut short is finished by asking again. What is allowed is `devcluster.skew`'s decision; a
refusal, or a target whose binaries are not built yet, raises `skew.RefusedError` before
anything is stopped (no build starts in the middle of an upgrade).
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from devcluster import build, cluster, nodes, nodestate, planestate, skew
from devcluster.flags import apiserver_args, controller_manager_args, scheduler_args
from devcluster.identities import Paths, admin_ssl
from devcluster.nodestate import HOLLOW, NodeState
from devcluster.supervise import (
    ClusterError,
    Progress,
    exited,
    get_ok,
    spawn,
    stop,
    wait_until,
)

READY_TIMEOUT = 180.0
OFFERED = tuple(build.KUBERNETES_VERSIONS)


def unbuilt(kube_version: str, binaries: Iterable[str]) -> str | None:
    """None when every one of `binaries` (build.KUBERNETES_BINARIES names) of `kube_version` is
    in the cache; else one line naming them and the build command that makes them."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    missing = [
        name
        for name in binaries
        if not build.cached_path(build.kubernetes_component(name, kube_version)).is_file()
        and not (
            assets
            and kube_version == build.DEFAULT_KUBE_VERSION
            and name in build.CONTROL_PLANE
            and (Path(assets) / name).is_file()
        )
    ]
    if not missing:
        return None
    kubelets = {build.REAL_KUBELET, build.HOLLOW_KUBELET} & set(missing)
    command = f"podcert devcluster build --kube-version {kube_version}" + (
        " --kubelets" if kubelets else ""
    )
    return (
        f"{', '.join(missing)} {build.release(kube_version)} not built yet: run `{command}` first"
    )


def kubelets(root: Path) -> dict[str, skew.Minor]:
    """The minor of every kubelet started under `root`, by node."""
    found: dict[str, skew.Minor] = {}
    for node in nodes.started(root):
        state = nodestate.read_state(root, node)
        if state is not None:
            found[node] = skew.require(skew.parse(state.kube_version))
    return found


def _running(paths: Paths) -> planestate.State:
    state = planestate.running(paths)
    if state is None:
        raise ClusterError(f"no devcluster runs under {paths.root}")
    return state


# --- the control plane ---------------------------------------------------------------------------


def control_plane(
    root: Path,
    kube_version: str,
    *,
    progress: Progress = lambda _line: None,
    timeout: float = READY_TIMEOUT,
) -> planestate.State:
    """Upgrade the running control plane under `root` to `kube_version` in place; returns the
    state once every component runs it and answers."""
    target = skew.require(skew.offered(kube_version, OFFERED))
    line = unbuilt(str(target), build.CONTROL_PLANE)
    if line:
        raise skew.RefusedError(line)
    paths = Paths(root.resolve())
    state = _running(paths)
    running = {name: skew.require(skew.parse(v)) for name, v in state.versions().items()}
    steps = skew.require(skew.control_plane_steps(running, target, kubelets(paths.root)))
    if not steps:
        progress(f"the control plane already runs {target}")
        return state
    bins = build.ensure_binaries(progress, str(target))
    deadline = time.monotonic() + timeout
    for component in steps:
        progress(f"upgrading {component} {running[component]} -> {target}")
        state = _upgrade_component(paths, state, component, bins, str(target), deadline)
    progress(f"control plane upgraded to {target} at {state.server}")
    return state


def _upgrade_component(
    paths: Paths,
    state: planestate.State,
    component: str,
    bins: build.Binaries,
    version: str,
    deadline: float,
) -> planestate.State:
    log = paths.logs / f"{component}.log"
    if component == skew.KUBE_APISERVER:
        stop(state.apiserver_pid, state.apiserver_binary, 10.0)
        args = apiserver_args(
            bins.kube_apiserver,
            paths,
            state.etcd_port,
            state.apiserver_port,
            version,
            profiling=state.apiserver_profiling,
        )
        proc = spawn(args, log)
        # Its pid first (so `down` stops it whatever happens), its version once it answers.
        state = replace(state, apiserver_pid=proc.pid, apiserver_binary=str(bins.kube_apiserver))
        planestate.save(paths, state)
        ctx, server, release = admin_ssl(paths), state.server, build.release(version)
        wait_until(
            lambda: _git_version(server, ctx) == release,
            deadline,
            f"kube-apiserver {release}",
            interval=0.25,
            failed=exited(proc, log),
        )
        state = replace(state, kube_version=version)
    elif component == skew.CONTROLLER_MANAGER:
        stop(state.controller_manager_pid, state.controller_manager_binary, 10.0)
        binary = bins.kube_controller_manager
        port = state.controller_manager_port
        proc = spawn(controller_manager_args(binary, paths, port, version), log)
        state = replace(
            state, controller_manager_pid=proc.pid, controller_manager_binary=str(binary)
        )
        planestate.save(paths, state)
        _wait_healthz(component, port, proc, log, deadline)
        state = replace(state, controller_manager_version=version)
    else:
        stop(state.scheduler_pid, state.scheduler_binary, 10.0)
        binary, port = bins.kube_scheduler, state.scheduler_port
        proc = spawn(scheduler_args(binary, paths, port, version), log)
        state = replace(state, scheduler_pid=proc.pid, scheduler_binary=str(binary))
        planestate.save(paths, state)
        _wait_healthz(component, port, proc, log, deadline)
        state = replace(state, scheduler_version=version)
    planestate.save(paths, state)
    return state


def _wait_healthz(
    name: str, port: int, proc: subprocess.Popen[bytes], log: Path, deadline: float
) -> None:
    insecure = cluster.insecure_ssl()
    wait_until(
        lambda: get_ok(f"https://127.0.0.1:{port}/healthz", insecure),
        deadline,
        name,
        interval=0.25,
        failed=exited(proc, log),
    )


def _git_version(server: str, ctx: ssl.SSLContext) -> str | None:
    """The release the API server at `server` reports once it is ready, else None."""
    if not get_ok(f"{server}/readyz", ctx):
        return None
    try:
        with urllib.request.urlopen(f"{server}/version", timeout=2, context=ctx) as resp:  # noqa: S310 (own URL)
            found = json.loads(resp.read()).get("gitVersion")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return found if isinstance(found, str) else None


# --- one node's kubelet --------------------------------------------------------------------------


def kubelet(
    root: Path,
    node: str,
    kube_version: str | None = None,
    *,
    progress: Progress = lambda _line: None,
    timeout: float = nodes.READY_TIMEOUT,
) -> NodeState:
    """Restart `node`'s kubelet on `kube_version` (default: the API server's minor); returns
    once the new kubelet runs and the Node reports its release."""
    target = skew.require(skew.offered(kube_version, OFFERED)) if kube_version else None
    paths = Paths(root.resolve())
    plane = _running(paths)
    apiserver = skew.require(skew.parse(plane.kube_version))
    plan = skew.require(skew.kubelet_upgrade(node, kubelets(paths.root), apiserver, target))
    state = nodestate.read_state(paths.root, node)
    assert state is not None  # kubelet_upgrade refuses a node with no recorded kubelet
    if not plan.needed:
        progress(f"node {node} already runs kubelet {plan.target}")
        return state
    binary = build.HOLLOW_KUBELET if state.kind == HOLLOW else build.REAL_KUBELET
    line = unbuilt(str(plan.target), [binary])
    if line:
        raise skew.RefusedError(line)
    progress(f"upgrading node {node}'s {state.kind} kubelet {plan.current} -> {plan.target}")
    return nodes.restart_kubelet(
        paths.root, node, timeout=timeout, kube_version=str(plan.target), progress=progress
    )
