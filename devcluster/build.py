"""Build the real kube-apiserver and etcd from Go modules, once, into a cache outside the repo.

`go install k8s.io/kubernetes/cmd/kube-apiserver@vX` refuses to work because that module's go.mod
carries `replace` lines pointing into its own staging tree (etcd's server module does the same). So
each binary is built inside a small generated wrapper module that requires the upstream module and
pins every module it replaces to the published version of the same release.

Where KUBEBUILDER_ASSETS names a folder that already holds both binaries (the controller-runtime
envtest convention), those are used and nothing is built.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.7.3"

Progress = Callable[[str], None]


class BuildError(RuntimeError):
    """A binary could not be built; the message names the module and carries Go's own error."""


@dataclass(frozen=True)
class Component:
    binary: str
    module: str
    version: str
    package: str  # the main package to build
    # Version every replaced module is pinned to: staging modules of Kubernetes are published
    # as v0.<minor>.<patch>, etcd's own submodules share the server's version.
    replace_version: str
    # -X settings: without them the binary reports v0.0.0-master from /version.
    stamps: tuple[str, ...] = ()


# Part of every cache key: bump it when the way a binary is built changes.
RECIPE = "r1"

KUBE_APISERVER = Component(
    binary="kube-apiserver",
    module="k8s.io/kubernetes",
    version=KUBERNETES_VERSION,
    package="k8s.io/kubernetes/cmd/kube-apiserver",
    replace_version="v0" + KUBERNETES_VERSION[2:],
    stamps=tuple(
        f"k8s.io/{pkg}.{var}={value}"
        for pkg in ("component-base/version", "client-go/pkg/version")
        for var, value in (
            ("gitVersion", KUBERNETES_VERSION),
            ("gitMajor", KUBERNETES_VERSION[1:].split(".")[0]),
            ("gitMinor", KUBERNETES_VERSION.split(".")[1]),
            ("gitTreeState", "clean"),
        )
    ),
)
ETCD = Component(
    binary="etcd",
    module="go.etcd.io/etcd/server/v3",
    version=ETCD_VERSION,
    package="go.etcd.io/etcd/server/v3",
    replace_version=ETCD_VERSION,
)


@dataclass(frozen=True)
class Binaries:
    kube_apiserver: Path
    etcd: Path


def cache_root() -> Path:
    """PODCERT_CACHE, else $XDG_CACHE_HOME/podcert, else ~/.cache/podcert."""
    if explicit := os.environ.get("PODCERT_CACHE"):
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "podcert"


_REPLACE_LINE = re.compile(r"^\s*(?:replace\s+)?(\S+)\s*=>\s*\.\.?/\S*\s*$")


def local_replaces(go_mod: str) -> list[str]:
    """Module paths that a go.mod replaces with a directory inside its own source tree."""
    found: list[str] = []
    in_block = False
    for raw in go_mod.splitlines():
        line = raw.split("//", 1)[0].rstrip()
        stripped = line.strip()
        if stripped.startswith("replace ("):
            in_block = True
            continue
        if in_block and stripped == ")":
            in_block = False
            continue
        if in_block or stripped.startswith("replace "):
            match = _REPLACE_LINE.match(stripped)
            if match:
                found.append(match.group(1))
    return found


def go_directive(go_mod: str) -> str:
    match = re.search(r"^go\s+(\S+)\s*$", go_mod, re.MULTILINE)
    return match.group(1) if match else "1.22"


def wrapper_go_mod(component: Component, upstream_go_mod: str) -> str:
    """The go.mod of the wrapper module: require upstream, pin what it replaces locally."""
    pins = "".join(
        f"\t{path} => {path} {component.replace_version}\n"
        for path in local_replaces(upstream_go_mod)
    )
    replace_block = f"replace (\n{pins})\n" if pins else ""
    return (
        "module podcert.local/build/" + component.binary + "\n\n"
        f"go {go_directive(upstream_go_mod)}\n\n"
        f"require {component.module} {component.version}\n\n" + replace_block
    )


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    # A module that needs a newer Go than the machine's gets it through the same module proxy.
    env["GOTOOLCHAIN"] = "auto"
    env.setdefault("GOFLAGS", "-buildvcs=false")
    env["CGO_ENABLED"] = "0"
    return env


def _run_go(
    args: list[str],
    cwd: Path,
    component: Component,
    progress: Progress,
    *,
    every: int = 1,
) -> str:
    """Run go, relaying its output; with `every` > 1 only each every-th line (`go build -v`
    names each package it compiles: thousands of lines, a count is progress enough)."""
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            f"building {component.module}@{component.version} needs the Go toolchain, "
            "and `go` is not on PATH"
        )
    progress(f"  $ go {' '.join(args)}")
    proc = subprocess.Popen(
        [go, *args],
        cwd=cwd,
        env=_go_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        if len(lines) % every == 0:
            progress(f"    [{len(lines)}] {line.rstrip()}" if every > 1 else "    " + line.rstrip())
    if proc.wait() != 0:
        tail = "\n".join(lines[-40:])
        raise BuildError(
            f"`go {' '.join(args)}` failed for {component.module}@{component.version}:\n{tail}"
        )
    return "\n".join(lines)


def _upstream_go_mod(component: Component, workdir: Path, progress: Progress) -> str:
    out = _run_go(
        ["mod", "download", "-json", f"{component.module}@{component.version}"],
        workdir,
        component,
        lambda _line: None,
    )
    info = json.loads(out[out.index("{") :])
    if "Error" in info:
        raise BuildError(f"cannot download {component.module}@{component.version}: {info['Error']}")
    return Path(info["GoMod"]).read_text()


def build_component(component: Component, dest: Path, progress: Progress) -> Path:
    """Build one binary into `dest` (atomically renamed into place) and return its path."""
    work = cache_root() / "build" / f"{component.binary}-{component.version}"
    work.mkdir(parents=True, exist_ok=True)
    progress(f"building {component.binary} from {component.module}@{component.version}")
    upstream = _upstream_go_mod(component, work, progress)
    (work / "go.mod").write_text(wrapper_go_mod(component, upstream))
    (work / "tools.go").write_text(
        f'//go:build tools\n\npackage build\n\nimport _ "{component.package}"\n'
    )
    _run_go(["mod", "tidy"], work, component, progress)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    ldflags = " ".join(["-s", "-w", *(f"-X {stamp}" for stamp in component.stamps)])
    _run_go(
        ["build", "-v", "-trimpath", f"-ldflags={ldflags}", "-o", str(partial), component.package],
        work,
        component,
        progress,
        every=100,
    )
    partial.replace(dest)
    return dest


def _from_assets() -> Binaries | None:
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if not assets:
        return None
    folder = Path(assets)
    found = Binaries(folder / "kube-apiserver", folder / "etcd")
    if found.kube_apiserver.is_file() and found.etcd.is_file():
        return found
    return None


def ensure_binaries(progress: Progress | None = None) -> Binaries:
    """Binaries to run, building (once per version) whatever the cache lacks."""
    say: Progress = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    assets = _from_assets()
    if assets is not None:
        return assets
    bin_dir = cache_root() / "bin"
    paths: dict[str, Path] = {}
    for component in (ETCD, KUBE_APISERVER):
        dest = bin_dir / f"{component.binary}-{component.version}-{RECIPE}"
        if not dest.is_file():
            say(
                f"{component.binary} {component.version} is not cached yet; building it once "
                "(the first build takes a while on 2 cores)"
            )
            build_component(component, dest, say)
        paths[component.binary] = dest
    return Binaries(kube_apiserver=paths["kube-apiserver"], etcd=paths["etcd"])
