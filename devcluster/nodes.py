"""Real kubelets for the devcluster, of the cluster's Kubernetes version or an older one the skew
policy allows (`devcluster.skew`), each with its node's own identity (client certificate
CN=system:node:<node>, O=system:nodes). Two kinds:

- real: the kubelet on Debian's containerd + runc + bridge CNI, running real containers from
  images made on this machine (`devcluster.images`). One per machine at a time: the kubelet and
  containerd also use fixed host paths (/var/lib/kubelet/device-plugins, /run/containerd, ...).
- hollow: kubemark's hollow kubelet (`devcluster.hollow`), the real kubelet code with a fake
  runtime. Cheap enough for many nodes.

Like the control plane, a kubelet is detached and recorded under the cluster's folder
(`devcluster.nodestate`); `restart_kubelet` restarts only the kubelet, as a crash does, or on
another minor's binary with that minor's flags and gates, as an upgrade does; `stop` (and
`cluster.down`) stop it, remove its root directory and whatever it left on the host.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client import ApiException

from devcluster import build, host, images, kube, network, nodestate, planestate, skew
from devcluster import hollow as hollow_kubelet
from devcluster.flags import DNS_SERVICE_IP, feature_gate_flags, feature_gates
from devcluster.identities import Paths
from devcluster.nodeconfig import BRIDGE, cni_config, containerd_config, kubelet_config
from devcluster.nodestate import HOLLOW, REAL, NodeState, node_dir, read_state
from devcluster.supervise import (
    ClusterError,
    NodeError,
    Progress,
    alive,
    exited,
    free_port,
    wait_until,
)
from devcluster.supervise import (
    stop as stop_process,
)

READY_TIMEOUT = 120.0

# Host paths the kubelet and containerd use whatever they are told: removed on stop when the node
# created them.
FIXED_PATHS = (
    Path("/var/lib/kubelet"),
    Path("/var/log/containers"),
    Path("/var/log/pods"),
    Path("/run/containerd"),
    Path("/run/netns"),
    Path("/etc/cni"),
    Path("/opt/cni"),
)
SHORT_DIR = host.RUN_DIR
# Where a real node is recorded while it runs: there is room for one per machine.
REAL_NODE_SLOT = Path("/run/podcert-devcluster-real-node")


def real_node_unavailable() -> str | None:
    """Why this machine cannot run a real node now (one line), or None when it can."""
    reason = host.unavailable()
    if reason:
        return reason
    holder = _real_slot_holder()
    if holder:
        return f"a real node already runs on this machine ({holder})"
    return None


def _real_slot_holder() -> str | None:
    try:
        path = Path(REAL_NODE_SLOT.read_text().strip())
    except OSError:
        return None
    state = read_state(path.parent.parent.parent, path.parent.name)
    if state is None or not alive(state.kubelet_pid, state.kubelet_binary):
        return None
    return f"{state.node} under {path.parent}"


# --- start ---------------------------------------------------------------------------------------


def _free_ports() -> tuple[int, int]:
    return free_port(), free_port()


def start(
    root: Path,
    node: str,
    *,
    hollow: bool = False,
    progress: Progress = lambda _line: None,
    timeout: float = READY_TIMEOUT,
    max_pods: int | None = None,
    sync_frequency: dt.timedelta | None = None,
    services: bool = False,
    kube_version: str | None = None,
) -> NodeState:
    """Start a kubelet for `node` on the devcluster under `root` and wait until the Node is
    Ready. Idempotent while that kubelet runs. `kube_version` (default: the API server's) may be
    older than the API server, as far as the skew policy allows (`skew.RefusedError`
    otherwise, and when the running kubelet is of another minor). `max_pods` raises the
    kubelet's limit of 110;
    `sync_frequency` (real nodes only: kubemark fixes its own at 10 s) shortens its pod resync.
    `services` (real nodes only) runs kube-proxy and the cluster DNS beside it
    (`devcluster.network`), its pods' nameserver, and returns once they answer."""
    if hollow and (sync_frequency is not None or services):
        raise NodeError(
            "a hollow kubelet resyncs pods every 10 s (kubemark's setting) and runs no "
            "containers: no sync_frequency, no services"
        )
    paths = Paths(root.resolve())
    plane = planestate.running(paths)
    if plane is None:
        raise NodeError(f"no devcluster runs under {paths.root}")
    version = kube_version or plane.kube_version
    skew.require(
        skew.kubelet_allowed(
            skew.require(skew.parse(version)), skew.require(skew.parse(plane.kube_version)), node
        )
    )
    current = read_state(paths.root, node)
    if current is not None and alive(current.kubelet_pid, current.kubelet_binary):
        if current.kube_version != version:
            raise skew.RefusedError(
                f"node {node} already runs kubelet {current.kube_version}; upgrade it "
                f"(kubelet {node} --upgrade --kube-version {version}) rather than start another"
            )
        return current
    stop(paths.root, node)  # the remains of a dead one
    if not hollow:
        reason = real_node_unavailable()
        if reason:
            raise NodeError(f"cannot run a real node here: {reason}")
    binary = build.ensure_kubelet(version, hollow=hollow, progress=progress)
    if services:  # built before the deadline starts, as the kubelet is
        build.ensure_network(plane.kube_version, progress)
    folder = node_dir(paths.root, node)
    folder.mkdir(parents=True, exist_ok=True)
    kubeconfig = kube.node_kubeconfig(paths.root, node, create_node=False)
    deadline = time.monotonic() + timeout
    try:
        if hollow:
            state = hollow_kubelet.start(
                paths, node, version, binary, kubeconfig, folder, progress, deadline, max_pods
            )
        else:
            state = _start_real(
                paths,
                node,
                plane,
                version,
                binary,
                kubeconfig,
                folder,
                progress,
                deadline,
                max_pods,
                sync_frequency,
                services,
            )
    except BaseException:
        stop(paths.root, node)  # whatever part of it started
        raise
    progress(f"node {node} Ready ({state.kind} kubelet {version}); root {state.root}")
    return state


def _start_real(
    paths: Paths,
    node: str,
    plane: planestate.State,
    version: str,
    binary: Path,
    kubeconfig: Path,
    folder: Path,
    progress: Progress,
    deadline: float,
    max_pods: int | None = None,
    sync_frequency: dt.timedelta | None = None,
    services: bool = False,
) -> NodeState:
    stale = host.clear_stale_node_mounts()  # the slot is ours: nothing else of a node runs
    if stale:
        progress(f"unmounted {len(stale)} mounts a killed real node left behind")
    # containerd's and the kubelet's sockets (containerd.sock.ttrpc, pod-resources/<n>, ...) must
    # fit a sockaddr_un (108 bytes): they and the kubelet's root live under /run, in a folder
    # named after the node's, whatever that folder's depth.
    short = SHORT_DIR.with_name(f"{SHORT_DIR.name}-{_short_hash(str(folder))}")
    short.mkdir(mode=0o700, parents=True, exist_ok=True)
    created = (*(str(p) for p in FIXED_PATHS if not p.exists()), str(short))
    cgroup = f"/podcert-devcluster-{node}"
    runtime = folder / "containerd"
    socket = short / "containerd.sock"
    kubelet_root = short / "kubelet"
    for sub in (runtime, folder / "cni", kubelet_root, folder / "pod-logs"):
        sub.mkdir(parents=True, exist_ok=True)
    (folder / "resolv.conf").write_text("")
    (folder / "cni" / "10-podcert.conflist").write_text(json.dumps(cni_config(folder / "ipam")))
    (runtime / "config.toml").write_text(containerd_config(runtime, folder / "cni", socket))
    host.make_cgroup(cgroup)
    host.make_cgroup(f"{cgroup}/runtime")
    port, _ = _free_ports()
    containerd = shutil.which("containerd") or "/usr/bin/containerd"
    state = NodeState(
        node,
        REAL,
        version,
        0,
        str(binary),
        str(kubelet_root),
        port,
        containerd_binary=containerd,
        containerd_socket=str(socket),
        cgroup=cgroup,
        created=created,
    )
    nodestate.save(paths.root, state)
    REAL_NODE_SLOT.write_text(str(nodestate.state_file(paths.root, node)))
    progress(f"starting containerd for {node}")
    ctrd_log = folder / "containerd.log"
    ctrd = host.spawn(
        [containerd, "--config", str(runtime / "config.toml")],
        ctrd_log,
        cgroup=f"{cgroup}/runtime",
    )
    state = NodeState(**{**asdict(state), "containerd_pid": ctrd.pid})
    nodestate.save(paths.root, state)
    wait_until(
        lambda: _ctr(socket, "version").returncode == 0,
        deadline,
        f"containerd for {node}",
        interval=0.2,
        failed=exited(ctrd, ctrd_log),
    )
    for archive in images.write_archives(folder / "images"):
        done = _ctr(socket, "-n", "k8s.io", "images", "import", str(archive))
        if done.returncode != 0:
            raise NodeError(f"ctr images import {archive.name} failed: {done.stderr.strip()}")
    ip = host.node_ip()
    config = kubelet_config(
        kube_version=version,
        folder=folder,
        socket=socket,
        cgroup=cgroup,
        address=ip,
        port=port,
        ca_file=paths.pki / "ca.crt",
        max_pods=max_pods,
        sync_frequency=sync_frequency,
        cluster_dns=DNS_SERVICE_IP if services else None,
    )
    (folder / "kubelet.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    log = folder / "kubelet.log"
    progress(f"starting kubelet {version} for {node} ({ip}:{port})")
    args = (
        str(binary),
        f"--config={folder / 'kubelet.yaml'}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={kubelet_root}",
        f"--cert-dir={folder / 'pki'}",
        f"--hostname-override={node}",
        f"--node-ip={ip}",
        "--v=1",
    )
    proc = host.spawn(list(args), log, cgroup=f"{cgroup}/runtime")
    state = replace(state, kubelet_pid=proc.pid, kubelet_args=args)
    nodestate.save(paths.root, state)
    nodestate.wait_ready(paths.root, node, proc, log, deadline)
    if services:
        network.start(paths.root, node, plane, cgroup, progress, deadline)
    return state


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def restart_kubelet(
    root: Path,
    node: str,
    *,
    timeout: float = READY_TIMEOUT,
    kube_version: str | None = None,
    progress: Progress = lambda _line: None,
) -> NodeState:
    """Stop only the kubelet for `node` and start it again, as a kubelet restarts on a crash:
    the same command line; or with `kube_version`, as an upgrade does: that minor's binary
    (built first if missing, before the old kubelet stops) with its own feature gates, the rest
    of its flags and configuration kept. A real node's containers keep running under containerd
    and its root directory is kept; a hollow kubelet comes back with a fresh root directory
    (kubemark makes one per start; the old one is removed) and projects its pods' volumes
    there anew. Returns once the new kubelet has renewed its node lease and, on another minor,
    the Node reports that release. Whether the change is allowed is `devcluster.skew`'s call,
    made by the caller (`devcluster.upgrade`)."""
    state = read_state(root, node)
    if state is None or not state.kubelet_args:
        raise NodeError(f"no kubelet for {node} was started under {root}")
    version = kube_version or state.kube_version
    if version != state.kube_version:
        binary = build.ensure_kubelet(version, hollow=state.kind == HOLLOW, progress=progress)
        args = retargeted_args(state.kubelet_args, binary, version)
        state = replace(state, kube_version=version, kubelet_args=args)
        if state.kind == REAL:  # read by the kubelet at its start only
            retarget_config(node_dir(root, node) / "kubelet.yaml", version)
    stop_process(state.kubelet_pid, state.kubelet_binary, 15.0)
    log = node_dir(root, node) / "kubelet.log"
    offset, before, old_root = (
        nodestate.file_size(log),
        hollow_kubelet.runtime_sockets(),
        state.root,
    )
    since = dt.datetime.now(dt.UTC)
    cgroup = f"{state.cgroup}/runtime" if state.kind == REAL else ""
    progress(f"starting {state.kind} kubelet {version} for {node}")
    proc = host.spawn(list(state.kubelet_args), log, cgroup=cgroup)
    state = replace(state, kubelet_pid=proc.pid, kubelet_binary=state.kubelet_args[0])
    nodestate.save(root, state)
    deadline = time.monotonic() + timeout
    if state.kind == HOLLOW:
        state = hollow_kubelet.find_parts(root, state, proc, log, offset, before, deadline)
        shutil.rmtree(old_root, ignore_errors=True)
    nodestate.wait_lease_renewed(root, node, since, proc, log, deadline)
    release = build.release(version)
    wait_until(
        lambda: kubelet_release(root, node) == release,
        deadline,
        f"node {node} to report kubelet {release}",
        interval=0.2,
        failed=exited(proc, log),
    )
    return state


def retargeted_args(args: tuple[str, ...], binary: Path, kube_version: str) -> tuple[str, ...]:
    """A kubelet's command line moved to another minor's `binary`: kubemark's takes that minor's
    feature gates as a flag (the real kubelet reads them from its config file)."""
    kept = [a for a in args[1:] if not a.startswith("--feature-gates=")]
    hollow = "--morph=kubelet" in args
    return (str(binary), *kept, *(feature_gate_flags(kube_version) if hollow else ()))


def retarget_config(path: Path, kube_version: str) -> None:
    """A real kubelet's config file moved to another minor: that minor's feature gates, the
    rest kept."""
    config = yaml.safe_load(path.read_text())
    config["featureGates"] = feature_gates(kube_version)
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def kubelet_release(root: Path, node: str) -> str | None:
    """The kubelet release ("v1.36.3") the Node last reported, or None."""
    try:
        with kube.admin_client(root) as api:
            found = client.CoreV1Api(api).read_node(node)
    except ApiException:
        return None
    info = found.status.node_info if found.status else None
    return info.kubelet_version if info else None


def _ctr(socket: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ctr", "--address", str(socket), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


# --- stop ----------------------------------------------------------------------------------------


def _drain(root: Path, state: NodeState, timeout: float = 30.0) -> None:
    """Delete the node's pods and its Node while the API server runs, and on a real node wait
    until the kubelet has stopped their containers (so their network and mounts are torn down
    the proper way)."""
    if planestate.running(Paths(root.resolve())) is None:
        return
    with kube.admin_client(root) as api:
        core = client.CoreV1Api(api)
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={state.node}")
        for pod in pods.items:
            meta = pod.metadata
            assert meta is not None and meta.name and meta.namespace
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(meta.name, meta.namespace, grace_period_seconds=0)
        if state.kind == REAL and alive(state.kubelet_pid, state.kubelet_binary):
            socket = Path(state.containerd_socket)
            with contextlib.suppress(ClusterError):
                wait_until(
                    lambda: "RUNNING" not in _ctr(socket, "-n", "k8s.io", "tasks", "ls").stdout,
                    time.monotonic() + timeout,
                    "pods to stop",
                    interval=0.2,
                )
        with contextlib.suppress(ApiException):
            core.delete_node(state.node)


def stop(root: Path, node: str) -> None:
    """Stop the kubelet for `node` (and its containerd and containers), remove its root and
    whatever it left on the host. A no-op when none was started."""
    state = read_state(root, node)
    if state is None:
        return
    network.stop(root, node)
    with contextlib.suppress(Exception):  # a broken API server must not keep the node running
        _drain(root, state)
    stop_process(state.kubelet_pid, state.kubelet_binary, 15.0)
    if state.kind == REAL:
        stop_process(state.containerd_pid, state.containerd_binary, 15.0)
        host.kill_cgroup(state.cgroup)
        folder = node_dir(root, node)
        host.unmount_under(folder, *(Path(p) for p in state.created))
        host.remove_cgroup(state.cgroup)
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
        for path in state.created:
            shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(OSError):
            if REAL_NODE_SLOT.read_text().strip() == str(nodestate.state_file(root, node)):
                REAL_NODE_SLOT.unlink()
    for leftover in map(Path, state.leftovers):
        leftover.unlink(missing_ok=True)
    if state.kind == HOLLOW and state.root_dir:  # kubemark's root lies outside the node folder
        shutil.rmtree(state.root, ignore_errors=True)
    shutil.rmtree(node_dir(root, node), ignore_errors=True)


def started(root: Path) -> list[str]:
    folder = Paths(root.resolve()).root / "nodes"
    return sorted(p.parent.name for p in folder.glob("*/state.json"))


def stop_all(root: Path) -> None:
    """Stop every kubelet started under the devcluster `root`."""
    for node in started(root):
        stop(root, node)


@contextlib.contextmanager
def running(root: Path, node: str, **kwargs: Any) -> Iterator[NodeState]:
    state = start(root, node, **kwargs)
    try:
        yield state
    finally:
        stop(root, node)
