"""What a real node needs from the machine it runs on: Debian's packages, writable cgroup v1
hierarchies, the host's address; and the host-level clean-up of what a node leaves behind (its
cgroups with every process in them, its mounts)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from devcluster import images, supervise
from devcluster.supervise import NodeError, Progress

# What a real node needs from Debian, by the file that shows each package is there.
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
    if missing:
        apt_install(missing, progress, purpose="a real node")
    return missing


def apt_install(
    packages: list[str], progress: Progress = lambda _line: None, *, purpose: str = "this"
) -> None:
    """apt-get update, then install `packages` without their recommendations. Needs root, and a
    machine that reaches Debian's archive."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise NodeError(
            f"{purpose} needs {', '.join(packages)}: install them (apt-get install "
            f"{' '.join(packages)}) or run this as root on Debian"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for args in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
    ):
        progress("$ " + " ".join(args))
        done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
            raise NodeError(f"`{' '.join(args)}` failed:\n{tail}")


def v1_hierarchies() -> list[Path]:
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


def move_into(cgroup: str) -> Callable[[], None]:
    """A preexec function: the child joins `cgroup` in every v1 hierarchy before it execs, so it
    and everything it starts (shims, containers) can be found and stopped later."""
    procs = [h / cgroup.lstrip("/") / "cgroup.procs" for h in v1_hierarchies()]

    def join() -> None:
        for path in procs:
            with contextlib.suppress(OSError):
                path.write_text("0")

    return join


def spawn(args: list[str], log: Path, *, cgroup: str = "") -> subprocess.Popen[bytes]:
    """supervise.spawn, with the child in the node's `cgroup` (when given) from its first
    instruction on."""
    return supervise.spawn(args, log, preexec=move_into(cgroup) if cgroup else None)


def cgroup_pids(cgroup: str) -> set[int]:
    pids: set[int] = set()
    for hierarchy in v1_hierarchies():
        top = hierarchy / cgroup.lstrip("/")
        if not top.is_dir():
            continue
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(line) for line in procs.read_text().split())
    return pids


def kill_cgroup(cgroup: str, timeout: float = 15.0) -> None:
    """SIGKILL every process left in the node's cgroup (containers, shims) until none is left."""
    deadline = time.monotonic() + timeout
    while pids := cgroup_pids(cgroup):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise NodeError(f"processes {sorted(pids)} in cgroup {cgroup} did not die")
        time.sleep(0.05)


def remove_cgroup(cgroup: str) -> None:
    for hierarchy in v1_hierarchies():
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


def make_cgroup(cgroup: str) -> None:
    for hierarchy in v1_hierarchies():
        folder = hierarchy / cgroup.lstrip("/")
        folder.mkdir(parents=True, exist_ok=True)
        if hierarchy.name == "cpuset":  # a cpuset without cpus and mems takes no process
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if not (folder / knob).read_text().strip():
                    (folder / knob).write_text((hierarchy / knob).read_text())


def _mount_points() -> list[str]:
    with contextlib.suppress(OSError):
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
        return [line.split()[4].replace("\\040", " ") for line in lines]
    return []


def mounts_under(*folders: Path) -> list[str]:
    prefixes = [str(f) for f in folders]
    return [
        point
        for point in _mount_points()
        if any(point == p or point.startswith(p + "/") for p in prefixes)
    ]


def _unmount(points: list[str]) -> None:
    for point in sorted(set(points), key=lambda p: -len(p)):  # the deepest first
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def unmount_under(*folders: Path) -> None:
    _unmount(mounts_under(*folders))


# What a real node mounts: its short folder (the kubelet's root, its pods' volumes) and its
# containerd's container root filesystems under the node's folder.
RUN_DIR = Path("/run/podcert-node")  # each real node's is RUN_DIR-<hash of its folder>
STALE_ROOTFS = re.compile(r"/nodes/[^/]+/containerd/state/io\.containerd\.runtime\.v2\.task/")


def node_mounts(points: list[str]) -> list[str]:
    """Of these mount points, those a real node of the devcluster made."""
    prefix = f"{RUN_DIR}-"
    return [p for p in points if p.startswith(prefix) or STALE_ROOTFS.search(p)]


def clear_stale_node_mounts() -> list[str]:
    """Unmount what a real node left behind when it was killed before its own clean-up (a test
    run cut short): its kubelet root's volumes, its containers' root filesystems. Call it only
    while no real node runs: there is room for one per machine, so any such mount is stale."""
    stale = node_mounts(_mount_points())
    _unmount(stale)
    for folder in RUN_DIR.parent.glob(f"{RUN_DIR.name}-*"):
        shutil.rmtree(folder, ignore_errors=True)
    return stale


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


def unavailable() -> str | None:
    """Why this machine cannot run a real node at all (one line), or None when it can."""
    if os.geteuid() != 0:
        return "a real node needs root (containerd, cgroups, mounts)"
    missing = missing_packages()
    if missing:
        return f"{', '.join(missing)} not installed (`podcert devcluster deps` installs them)"
    hierarchies = v1_hierarchies()
    if not {"cpu", "cpuset", "memory"} <= {p.name for p in hierarchies}:
        return "no writable cgroup v1 cpu/cpuset/memory hierarchies (only that layout is set up)"
    if not os.access(hierarchies[0], os.W_OK):
        return f"{hierarchies[0]} is not writable"
    return None
