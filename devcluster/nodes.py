"""Real kubelets for the devcluster, of the cluster's own Kubernetes version, each with its node's
own identity (client certificate CN=system:node:<node>, O=system:nodes). Two kinds:

- real: the kubelet on Debian's containerd + runc + bridge CNI, running real containers from
  images made on this machine (`devcluster.images`). One per machine at a time: the kubelet and
  containerd also use fixed host paths (/var/lib/kubelet/device-plugins, /run/containerd, ...).
- hollow: kubemark's hollow kubelet (`--morph=kubelet`): the real kubelet code (pod certificate
  manager, projected volumes, atomic writer) with a fake runtime and mounter. Files are written
  for real; no container runs. Cheap enough for many nodes.

Like the control plane, a kubelet is detached and recorded under the cluster's folder
(`nodes/<node>/state.json`); `stop` (and `cluster.down`) stop it, remove its root directory and
whatever it left on the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client import ApiException

from devcluster import build, cluster, images, kube

Progress = Callable[[str], None]
READY_TIMEOUT = 120.0

REAL, HOLLOW = "real", "hollow"
CNI_BIN = Path("/usr/lib/cni")
# What a real node needs from Debian, by the file that shows each package is there.
DEBIAN_PACKAGES = {
    "containerd": Path("/usr/bin/containerd"),
    "runc": Path("/usr/sbin/runc"),
    "containernetworking-plugins": CNI_BIN / "bridge",
    "busybox-static": images.BUSYBOX,
    "iproute2": Path("/sbin/ip"),
}
CGROUP_V1 = Path("/sys/fs/cgroup")
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
BRIDGE = "podcert0"
POD_SUBNET = "10.89.0.0/24"
# Where a real node is recorded while it runs: there is room for one per machine.
REAL_NODE_SLOT = Path("/run/podcert-devcluster-real-node")


class NodeError(RuntimeError):
    """A kubelet did not start or stop; the message says why, with its log tail."""


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

    @property
    def root(self) -> Path:
        return Path(self.root_dir)


def node_dir(root: Path, node: str) -> Path:
    return cluster.Paths(root.resolve()).root / "nodes" / node


def _state_file(root: Path, node: str) -> Path:
    return node_dir(root, node) / "state.json"


def read_state(root: Path, node: str) -> NodeState | None:
    try:
        raw = json.loads(_state_file(root, node).read_text())
        raw["created"] = tuple(raw.get("created", ()))
        raw["leftovers"] = tuple(raw.get("leftovers", ()))
        return NodeState(**raw)
    except (OSError, ValueError, TypeError):
        return None


def _save(root: Path, state: NodeState) -> None:
    _state_file(root, state.node).write_text(json.dumps(asdict(state)))


# --- can this machine run a real node? ---------------------------------------------------------


def missing_packages() -> list[str]:
    """Debian packages a real node needs that are not installed (busybox-static counts only if
    /bin/busybox is the static one: the dynamic busybox package would not run in an image)."""
    missing = [name for name, path in DEBIAN_PACKAGES.items() if not path.exists()]
    if "busybox-static" not in missing and not _static(images.BUSYBOX):
        missing.append("busybox-static")
    return missing


def _static(binary: Path) -> bool:
    """An ELF file without a PT_INTERP program header needs no dynamic loader."""
    try:
        head = binary.read_bytes()
    except OSError:
        return False
    if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only
        return False
    phoff = int.from_bytes(head[0x20:0x28], "little")
    size, count = (
        int.from_bytes(head[0x36:0x38], "little"),
        int.from_bytes(head[0x38:0x3A], "little"),
    )
    types = (
        int.from_bytes(head[phoff + i * size : phoff + i * size + 4], "little")
        for i in range(count)
    )
    return 3 not in types  # PT_INTERP


def install_packages(progress: Progress = lambda _line: None) -> list[str]:
    """apt-get install what a real node lacks (nothing at all when nothing is missing); returns
    the packages installed. Needs root, and a machine that reaches Debian's archive."""
    missing = missing_packages()
    if not missing:
        return []
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise NodeError(
            f"a real node needs {', '.join(missing)}: install them (apt-get install "
            f"{' '.join(missing)}) or run this as root on Debian"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for args in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
    ):
        progress("$ " + " ".join(args))
        done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
            raise NodeError(f"`{' '.join(args)}` failed:\n{tail}")
    return missing


def _v1_hierarchies() -> list[Path]:
    """The hierarchies of a cgroup v1 host (cpu, memory, ...; with the unified one beside them
    where it is mounted too, as here): a node's cgroup is made in each."""
    if (CGROUP_V1 / "cgroup.controllers").exists():  # cgroup v2 only
        return []
    try:
        return sorted(
            p for p in CGROUP_V1.iterdir() if p.is_dir() and (p / "cgroup.procs").exists()
        )
    except OSError:
        return []


def real_node_unavailable() -> str | None:
    """Why this machine cannot run a real node now (one line), or None when it can."""
    if os.geteuid() != 0:
        return "a real node needs root (containerd, cgroups, mounts)"
    missing = missing_packages()
    if missing:
        return f"{', '.join(missing)} not installed (`podcert devcluster deps` installs them)"
    hierarchies = _v1_hierarchies()
    if not {"cpu", "cpuset", "memory"} <= {p.name for p in hierarchies}:
        return "no writable cgroup v1 cpu/cpuset/memory hierarchies (only that layout is set up)"
    if not os.access(hierarchies[0], os.W_OK):
        return f"{hierarchies[0]} is not writable"
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
    if state is None or not cluster._alive(state.kubelet_pid, state.kubelet_binary):
        return None
    return f"{state.node} under {path.parent}"


# --- processes and host clean-up -----------------------------------------------------------------


def _move_into(cgroup: str) -> Callable[[], None]:
    """A preexec function: the child joins `cgroup` in every v1 hierarchy before it execs, so it
    and everything it starts (shims, containers) can be found and stopped later."""
    procs = [h / cgroup.lstrip("/") / "cgroup.procs" for h in _v1_hierarchies()]

    def join() -> None:
        for path in procs:
            with contextlib.suppress(OSError):
                path.write_text("0")

    return join


def _spawn(
    args: list[str],
    log: Path,
    *,
    env: dict[str, str] | None = None,
    cgroup: str = "",
) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            preexec_fn=_move_into(cgroup) if cgroup else None,
        )


def _cgroup_pids(cgroup: str) -> set[int]:
    pids: set[int] = set()
    for hierarchy in _v1_hierarchies():
        top = hierarchy / cgroup.lstrip("/")
        if not top.is_dir():
            continue
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(line) for line in procs.read_text().split())
    return pids


def _kill_cgroup(cgroup: str, timeout: float = 15.0) -> None:
    """SIGKILL every process left in the node's cgroup (containers, shims) until none is left."""
    deadline = time.monotonic() + timeout
    while pids := _cgroup_pids(cgroup):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise NodeError(f"processes {sorted(pids)} in cgroup {cgroup} did not die")
        time.sleep(0.05)


def _remove_cgroup(cgroup: str) -> None:
    for hierarchy in _v1_hierarchies():
        top = hierarchy / cgroup.lstrip("/")
        if not top.is_dir():
            continue
        for folder in sorted(
            (p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
        ):
            with contextlib.suppress(OSError):
                folder.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def _make_cgroup(cgroup: str) -> None:
    for hierarchy in _v1_hierarchies():
        folder = hierarchy / cgroup.lstrip("/")
        folder.mkdir(parents=True, exist_ok=True)
        if hierarchy.name == "cpuset":  # a cpuset without cpus and mems takes no process
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if not (folder / knob).read_text().strip():
                    (folder / knob).write_text((hierarchy / knob).read_text())


def _mounts_under(*folders: Path) -> list[str]:
    prefixes = [str(f) for f in folders]
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if any(point == p or point.startswith(p + "/") for p in prefixes):
                found.append(point)
    return found


def _unmount_under(*folders: Path) -> None:
    for point in sorted(set(_mounts_under(*folders)), key=lambda p: -len(p)):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


# kubemark's fake runtime listens on /tmp/kubelet_remote_<random>.sock and leaves it behind.
FAKE_RUNTIME_SOCKETS = "kubelet_remote_*.sock"


def _fake_runtime_sockets() -> set[Path]:
    return set(Path("/tmp").glob(FAKE_RUNTIME_SOCKETS))  # noqa: S108 (kubemark's fixed folder)


# --- start ---------------------------------------------------------------------------------------


def _free_ports() -> tuple[int, int]:
    return cluster.free_port(), cluster.free_port()


def node_ip() -> str:
    """The host's first global IPv4 address: the kubelet refuses a loopback node IP, and the API
    server reaches kubelets (logs, exec) at their node's InternalIP."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"],
        capture_output=True,
        text=True,
        check=False,
    )
    for line in out.stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    raise NodeError("no global IPv4 address on this machine for the node to report")


def containerd_config(folder: Path, cni_conf: Path) -> str:
    """containerd 1.6 (config version 2) with everything under `folder`; see issue 13."""
    return f"""version = 2
root = "{folder / "root"}"
state = "{folder / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "{folder / "containerd.sock"}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{folder / "opt"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{images.PAUSE_IMAGE}"
  # This VM withholds CAP_SYS_RESOURCE: a sandbox's oom_score_adj of -998 fails otherwise.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{folder / "runc"}"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni_conf}"
"""


def cni_config(ipam_dir: Path) -> dict[str, Any]:
    """A host-only bridge: pods get an address, nothing is routed or masqueraded off the host."""
    return {
        "cniVersion": "0.4.0",
        "name": "podcert-devcluster",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "dataDir": str(ipam_dir),
                },
            }
        ],
    }


def kubelet_config(
    *,
    kube_version: str,
    folder: Path,
    socket: Path,
    cgroup: str,
    address: str,
    port: int,
    ca_file: Path,
) -> dict[str, Any]:
    """The KubeletConfiguration for a real node on this VM (issue 13 lists why each line)."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{socket}",
        "enforceNodeAllocatable": [],
        "makeIPTablesUtilChains": False,
        "resolvConf": str(folder / "resolv.conf"),
        "podLogsDir": str(folder / "pod-logs"),
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        # Only holders of a devcluster certificate (the API server's kubelet client) get in.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        # Images cannot be pulled again here: never collect them, never evict for disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "featureGates": cluster.feature_gates(kube_version),
    }


def _wait_ready(
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

    cluster.wait_until(
        ready, deadline, f"kubelet for {node}", interval=0.2, failed=cluster._exited(proc, log)
    )


def start(
    root: Path,
    node: str,
    *,
    hollow: bool = False,
    progress: Progress = lambda _line: None,
    timeout: float = READY_TIMEOUT,
) -> NodeState:
    """Start a kubelet for `node` on the devcluster under `root` and wait until the Node is
    Ready. Idempotent while that kubelet runs."""
    paths = cluster.Paths(root.resolve())
    plane = cluster.running(paths)
    if plane is None:
        raise NodeError(f"no devcluster runs under {paths.root}")
    current = read_state(paths.root, node)
    if current is not None and cluster._alive(current.kubelet_pid, current.kubelet_binary):
        return current
    stop(paths.root, node)  # the remains of a dead one
    if not hollow:
        reason = real_node_unavailable()
        if reason:
            raise NodeError(f"cannot run a real node here: {reason}")
    binary = build.ensure_kubelet(plane.kube_version, hollow=hollow, progress=progress)
    folder = node_dir(paths.root, node)
    folder.mkdir(parents=True, exist_ok=True)
    kubeconfig = kube.node_kubeconfig(paths.root, node, create_node=False)
    deadline = time.monotonic() + timeout
    start_one = _start_hollow if hollow else _start_real
    state = start_one(paths, node, plane, binary, kubeconfig, folder, progress, deadline)
    progress(f"node {node} Ready ({state.kind} kubelet {plane.kube_version}); root {state.root}")
    return state


def _start_hollow(
    paths: cluster.Paths,
    node: str,
    plane: cluster.State,
    binary: Path,
    kubeconfig: Path,
    folder: Path,
    progress: Progress,
    deadline: float,
) -> NodeState:
    port, _ = _free_ports()
    log = folder / "kubelet.log"
    progress(f"starting hollow kubelet {plane.kube_version} for {node} (kubelet port {port})")
    before = _fake_runtime_sockets()
    proc = _spawn(
        [
            str(binary),
            "--morph=kubelet",
            f"--name={node}",
            f"--kubeconfig={kubeconfig}",
            "--use-host-image-service=false",
            f"--kubelet-port={port}",
            "--kubelet-read-only-port=0",
            *cluster.feature_gate_flags(plane.kube_version),
        ],
        log,
    )
    state = NodeState(node, HOLLOW, plane.kube_version, proc.pid, str(binary), "", port)
    _save(paths.root, state)
    try:
        # kubemark makes its root as /tmp/hollow-kubelet.NNNN (no flag, not even TMPDIR) and
        # says which in its log.
        found = cluster.wait_until_value(
            lambda: _hollow_root(log),
            deadline,
            f"hollow kubelet root for {node}",
            failed=cluster._exited(proc, log),
        )
        state = NodeState(**{**asdict(state), "root_dir": str(found)})
        _save(paths.root, state)
        # The fake runtime's socket: the one that appeared since this kubelet started.
        sockets = cluster.wait_until_value(
            lambda: (_fake_runtime_sockets() - before) or None,
            deadline,
            f"hollow kubelet runtime socket for {node}",
            failed=cluster._exited(proc, log),
        )
        leftovers = tuple(sorted(str(s) for s in sockets))
        state = NodeState(**{**asdict(state), "leftovers": leftovers})
        _save(paths.root, state)
        _wait_ready(paths.root, node, proc, log, deadline)
    except BaseException:
        stop(paths.root, node)
        raise
    return state


_HOLLOW_ROOT = re.compile(r"Using (\S+) as root dir for hollow-kubelet")


def _hollow_root(log: Path) -> Path | None:
    try:
        match = _HOLLOW_ROOT.search(log.read_text(errors="replace"))
    except OSError:
        return None
    return Path(match.group(1)) if match else None


def _start_real(
    paths: cluster.Paths,
    node: str,
    plane: cluster.State,
    binary: Path,
    kubeconfig: Path,
    folder: Path,
    progress: Progress,
    deadline: float,
) -> NodeState:
    created = tuple(str(p) for p in FIXED_PATHS if not p.exists())
    cgroup = f"/podcert-devcluster-{node}"
    runtime = folder / "containerd"
    socket = runtime / "containerd.sock"
    kubelet_root = folder / "root"
    for sub in (runtime, folder / "cni", kubelet_root, folder / "pod-logs"):
        sub.mkdir(parents=True, exist_ok=True)
    (folder / "resolv.conf").write_text("")
    (folder / "cni" / "10-podcert.conflist").write_text(json.dumps(cni_config(folder / "ipam")))
    (runtime / "config.toml").write_text(containerd_config(runtime, folder / "cni"))
    _make_cgroup(cgroup)
    _make_cgroup(f"{cgroup}/runtime")
    port, _ = _free_ports()
    containerd = shutil.which("containerd") or "/usr/bin/containerd"
    state = NodeState(
        node,
        REAL,
        plane.kube_version,
        0,
        str(binary),
        str(kubelet_root),
        port,
        containerd_binary=containerd,
        containerd_socket=str(socket),
        cgroup=cgroup,
        created=created,
    )
    _save(paths.root, state)
    REAL_NODE_SLOT.write_text(str(_state_file(paths.root, node)))
    try:
        progress(f"starting containerd for {node}")
        ctrd_log = folder / "containerd.log"
        ctrd = _spawn(
            [containerd, "--config", str(runtime / "config.toml")],
            ctrd_log,
            cgroup=f"{cgroup}/runtime",
        )
        state = NodeState(**{**asdict(state), "containerd_pid": ctrd.pid})
        _save(paths.root, state)
        cluster.wait_until(
            lambda: _ctr(socket, "version").returncode == 0,
            deadline,
            f"containerd for {node}",
            interval=0.2,
            failed=cluster._exited(ctrd, ctrd_log),
        )
        for archive in images.write_archives(folder / "images"):
            done = _ctr(socket, "-n", "k8s.io", "images", "import", str(archive))
            if done.returncode != 0:
                raise NodeError(f"ctr images import {archive.name} failed: {done.stderr.strip()}")
        ip = node_ip()
        config = kubelet_config(
            kube_version=plane.kube_version,
            folder=folder,
            socket=socket,
            cgroup=cgroup,
            address=ip,
            port=port,
            ca_file=paths.pki / "ca.crt",
        )
        (folder / "kubelet.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        log = folder / "kubelet.log"
        progress(f"starting kubelet {plane.kube_version} for {node} ({ip}:{port})")
        proc = _spawn(
            [
                str(binary),
                f"--config={folder / 'kubelet.yaml'}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={kubelet_root}",
                f"--cert-dir={folder / 'pki'}",
                f"--hostname-override={node}",
                f"--node-ip={ip}",
                "--v=1",
            ],
            log,
            cgroup=f"{cgroup}/runtime",
        )
        state = NodeState(**{**asdict(state), "kubelet_pid": proc.pid})
        _save(paths.root, state)
        _wait_ready(paths.root, node, proc, log, deadline)
    except BaseException:
        stop(paths.root, node)
        raise
    return state


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
    if cluster.running(cluster.Paths(root.resolve())) is None:
        return
    with kube.admin_client(root) as api:
        core = client.CoreV1Api(api)
        pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={state.node}")
        for pod in pods.items:
            meta = pod.metadata
            assert meta is not None and meta.name and meta.namespace
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(meta.name, meta.namespace, grace_period_seconds=0)
        if state.kind == REAL and cluster._alive(state.kubelet_pid, state.kubelet_binary):
            socket = Path(state.containerd_socket)
            with contextlib.suppress(cluster.ClusterError):
                cluster.wait_until(
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
    with contextlib.suppress(Exception):  # a broken API server must not keep the node running
        _drain(root, state)
    cluster._stop(state.kubelet_pid, state.kubelet_binary, 15.0)
    if state.kind == REAL:
        cluster._stop(state.containerd_pid, state.containerd_binary, 15.0)
        _kill_cgroup(state.cgroup)
        folder = node_dir(root, node)
        _unmount_under(folder, *(Path(p) for p in state.created))
        _remove_cgroup(state.cgroup)
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
        for path in state.created:
            shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(OSError):
            if REAL_NODE_SLOT.read_text().strip() == str(_state_file(root, node)):
                REAL_NODE_SLOT.unlink()
    for leftover in map(Path, state.leftovers):
        leftover.unlink(missing_ok=True)
    if state.kind == HOLLOW and state.root_dir:  # kubemark's root lies outside the node folder
        shutil.rmtree(state.root, ignore_errors=True)
    shutil.rmtree(node_dir(root, node), ignore_errors=True)


def started(root: Path) -> list[str]:
    folder = cluster.Paths(root.resolve()).root / "nodes"
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
