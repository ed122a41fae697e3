"""Podman on this machine, for building podcert's image: Debian's packages, a configuration and a
storage of its own under the cache, and the base image the Dockerfile names, made locally.

No registry is reachable here, so `python:3.11-slim` cannot be pulled: it is made with debootstrap
(Debian's python3 with pip, from the mirror apt already uses), slimmed like the official slim
images (no apt lists or caches, documentation, manual pages or locales) and imported as
`localhost/python:3.11-slim`, which `FROM python:3.11-slim` finds with `--pull=never`.

What this VM needs of podman: runc, as crun refuses its hybrid cgroups;
ulimits no higher than the hard ones it already has (no CAP_SYS_RESOURCE); cgroupfs and file
events, with no systemd. Podman reads only the files written here (CONTAINERS_CONF,
CONTAINERS_STORAGE_CONF, CONTAINERS_REGISTRIES_CONF), never /etc/containers, and keeps its images
under `cache_root()/podman`, apart from the devcluster's containerd.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from devcluster import build, host
from devcluster.supervise import NodeError, Progress

# What building and checking images needs from Debian, by the file that shows each is there.
DEBIAN_PACKAGES = {
    "podman": Path("/usr/bin/podman"),
    "runc": Path("/usr/sbin/runc"),
    "uidmap": Path("/usr/bin/newuidmap"),
    "slirp4netns": Path("/usr/bin/slirp4netns"),
    "fuse-overlayfs": Path("/usr/bin/fuse-overlayfs"),
    "netavark": Path("/usr/lib/podman/netavark"),
    "aardvark-dns": Path("/usr/lib/podman/aardvark-dns"),
    "containernetworking-plugins": host.CNI_BIN / "bridge",
    "iptables": Path("/usr/sbin/iptables"),
    "catatonit": Path("/usr/bin/catatonit"),
    "debootstrap": Path("/usr/sbin/debootstrap"),
}

BASE_IMAGE = "localhost/python:3.11-slim"
BASE_SUITE = "bookworm"  # Debian 12: Python 3.11, as the Dockerfile's base names
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates")
# Bump when the way the base is made changes: a base with another label is made again.
BASE_RECIPE = "base-r1"
BASE_LABEL = "dev.podcert.base-recipe"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Removed from the debootstrapped tree, as the official slim images do; pip refuses to install
# into a Python marked EXTERNALLY-MANAGED, and podman mounts its own resolv.conf and hostname.
SLIMMED = (
    "var/cache/apt",
    "var/lib/apt/lists",
    "var/log",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/lib/python3.11/EXTERNALLY-MANAGED",
    "etc/resolv.conf",
    "etc/hostname",
)
# The host's CA bundle, mounted over the image's own during builds: outbound HTTPS may go
# through a proxy only the host trusts.
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


class ImageError(RuntimeError):
    """An image could not be built or failed its checks; the message says which step and why."""


def missing_packages() -> list[str]:
    return [name for name, path in DEBIAN_PACKAGES.items() if not path.exists()]


def install_packages(progress: Progress = lambda _line: None) -> list[str]:
    """apt-get install what podman and debootstrap need (nothing when nothing is missing)."""
    missing = missing_packages()
    if missing:
        try:
            host.apt_install(missing, progress, purpose="building images")
        except NodeError as err:
            raise ImageError(str(err)) from None
    return missing


def folder() -> Path:
    return build.cache_root() / "podman"


def environment() -> dict[str, str]:
    """The process environment podman runs with: its configuration written under the cache."""
    root = folder()
    conf = root / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 1048576 if hard == resource.RLIM_INFINITY else hard
    files = {
        "containers.conf": (
            "[containers]\n"
            f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc=32768:32768"]\n'
            "[engine]\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
        ),
        "storage.conf": (
            "[storage]\n"
            'driver = "overlay"\n'
            f'graphroot = "{root / "storage"}"\n'
            # Run-time state on tmpfs (short paths, gone at reboot like podman's own /run use).
            f'runroot = "/run/podcert-podman-{os.getuid()}"\n'
        ),
        # No registry is reachable, and none is searched for short names.
        "registries.conf": "unqualified-search-registries = []\n",
    }
    for name, text in files.items():
        path = conf / name
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
    return {
        **os.environ,
        "CONTAINERS_CONF": str(conf / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(conf / "storage.conf"),
        "CONTAINERS_REGISTRIES_CONF": str(conf / "registries.conf"),
    }


def run(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`podman ARGS` with the configuration above; with `check` a failure is an ImageError."""
    done = subprocess.run(
        ["podman", *args],
        env=environment(),
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    if check and done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise ImageError(f"`podman {' '.join(args)}` failed ({done.returncode}):\n{tail}")
    return done


def stream(*args: str) -> subprocess.Popen[bytes]:
    """`podman ARGS` with its standard output as a pipe (an archive to read as it comes)."""
    return subprocess.Popen(
        ["podman", *args], env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def run_logged(args: list[str], progress: Progress, cwd: Path | None = None) -> None:
    """Run a long command (debootstrap, podman build), relaying its output line by line."""
    progress("  $ " + " ".join(args))
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        progress("    " + line.rstrip())
    if proc.wait() != 0:
        tail = "\n".join(lines[-30:])
        raise ImageError(f"`{' '.join(args[:2])} ...` failed ({proc.returncode}):\n{tail}")


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """One build at a time on this machine's cache (sessions share it)."""
    folder().mkdir(parents=True, exist_ok=True)
    with (folder() / "build.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def mirror(sources: Path = Path("/etc/apt")) -> str:
    """The Debian mirror apt already uses here (its main archive, not security), else Debian's
    default: the base comes from wherever this machine is allowed to fetch packages."""
    texts = [p.read_text() for p in sorted(sources.glob("sources.list.d/*.sources"))]
    texts += [p.read_text() for p in (sources / "sources.list",) if p.is_file()]
    texts += [p.read_text() for p in sorted(sources.glob("sources.list.d/*.list"))]
    for text in texts:
        for match in re.finditer(r"^\s*(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+)", text, re.M):
            uri = match.group(1).rstrip("/")
            if uri.startswith("http") and not uri.endswith("-security"):
                return uri
    return DEFAULT_MIRROR


def base_ready() -> bool:
    labels = "{{json .Labels}}"
    done = run("image", "inspect", f"--format={labels}", BASE_IMAGE, check=False)
    if done.returncode != 0:
        return False
    found: dict[str, str] = json.loads(done.stdout or "null") or {}
    return found.get(BASE_LABEL) == BASE_RECIPE


def slim(rootfs: Path) -> None:
    for relative in SLIMMED:
        target = rootfs / relative
        if target.is_dir() and not target.is_symlink():
            for child in target.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
        else:
            target.unlink(missing_ok=True)
    docs = rootfs / "usr/share/doc"
    for path in sorted(docs.rglob("*"), key=lambda p: -len(p.parts)):
        if path.is_dir() and not path.is_symlink():
            with contextlib.suppress(OSError):
                path.rmdir()  # only once empty
        elif path.name != "copyright":  # the licences stay
            path.unlink()


def ensure_base(progress: Progress) -> None:
    """The locally made `python:3.11-slim`, made once (about 2 minutes) and kept in podman's
    storage under the cache."""
    if base_ready():
        return
    source = mirror()
    progress(f"making the base image {BASE_IMAGE} with debootstrap from {source} (once)")
    folder().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="base-", dir=folder()) as tmp:
        rootfs = Path(tmp) / "rootfs"
        run_logged(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                BASE_SUITE,
                str(rootfs),
                source,
            ],
            progress,
        )
        slim(rootfs)
        changes = [
            f"LABEL={BASE_LABEL}={BASE_RECIPE}",
            "ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV=LANG=C.UTF-8",
            'CMD=["python3"]',
        ]
        tar = subprocess.Popen(
            # The run-time file systems are mounted by the runtime, not shipped.
            [
                "tar",
                "-C",
                str(rootfs),
                "--numeric-owner",
                "--exclude=./dev/*",
                "--exclude=./proc/*",
                "--exclude=./sys/*",
                "-c",
                ".",
            ],
            stdout=subprocess.PIPE,
        )
        done = subprocess.run(
            ["podman", "import", *(f"--change={c}" for c in changes), "-", BASE_IMAGE],
            stdin=tar.stdout,
            env=environment(),
            capture_output=True,
            text=True,
            check=False,
        )
        if tar.wait() != 0 or done.returncode != 0:
            raise ImageError(f"podman import of the base failed: {done.stderr.strip()}")
    progress(f"base image {BASE_IMAGE} made")
