"""Every binary of one Kubernetes release the devcluster runs, built in one `go build`.

Built one at a time, each binary paid its own `go mod tidy` over the release's whole module graph
and the serial end of its own build (its last packages, then one link of 80-120 MB) while the
second core idled. In one build of a wrapper module that names them all, the graph is tidied once
and each link runs beside the compiles still to do. Each binary lands where `build.cached_path`
keeps it, so `build.ensure_component` (one binary, built alone when missing) and this agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from devcluster import build
from devcluster.build import Component, Progress

MODULE = "podcert.local/build"


def release_files(components: Sequence[Component], upstream_go_mod: str) -> dict[str, str]:
    """The wrapper module's files, by path inside it: its go.mod, a tools.go that keeps each
    upstream main package in the graph, and a folder of our own for each generated main (the
    folder is the binary's name, so its package is `MODULE/<binary>`)."""
    first = components[0]
    if any(c.module != first.module or c.version != first.version for c in components):
        raise build.BuildError("one release build takes binaries of one module and version")
    files = {"go.mod": build.wrapper_go_mod(first, upstream_go_mod, MODULE)}
    upstream = sorted(c.package for c in components if not c.main_go)
    if upstream:
        imports = "".join(f'\t_ "{package}"\n' for package in upstream)
        files["tools.go"] = f"//go:build tools\n\npackage build\n\nimport (\n{imports})\n"
    for component in components:
        if component.main_go:
            package = f"{MODULE}/{component.binary}"
            if component.package != package:
                raise build.BuildError(f"{component.binary}'s own main must be {package}")
            files[f"{component.binary}/main.go"] = component.main_go
    return files


def build_args(components: Sequence[Component], out: Path) -> list[str]:
    """`go build` for all of them at once, each binary written into `out` under its own name."""
    stamps = {c.stamps for c in components}
    if len(stamps) != 1:
        raise build.BuildError("binaries of one release carry the same version stamps")
    ldflags = " ".join(["-s", "-w", *(f"-X {stamp}" for stamp in stamps.pop())])
    packages = [c.package for c in components]
    return ["build", "-v", "-trimpath", f"-ldflags={ldflags}", "-o", f"{out}/", *packages]


def ensure_release(
    kube_version: str, binaries: Sequence[str], progress: Progress | None = None
) -> dict[str, Path]:
    """The cached path of each of `binaries` of one minor, building the missing ones together."""
    say: Progress = progress or build._default_progress
    components = [build.kubernetes_component(name, kube_version) for name in binaries]
    missing = [c for c in components if not build.cached_path(c).is_file()]
    if missing:
        _build(missing, say)
    return {c.binary: build.cached_path(c) for c in components}


def _build(components: Sequence[Component], say: Progress) -> None:
    first = components[0]
    work = build.cache_root() / "build" / f"kubernetes-{first.version}"
    work.mkdir(parents=True, exist_ok=True)
    names = ", ".join(c.binary for c in components)
    say(f"building {names} from {first.module}@{first.version} in one go build")
    upstream = build._upstream_go_mod(first, work, say)
    for stale in ("tools.go", *(f"{c.binary}/main.go" for c in components)):
        (work / stale).unlink(missing_ok=True)
    for relative, text in release_files(components, upstream).items():
        (work / relative).parent.mkdir(parents=True, exist_ok=True)
        (work / relative).write_text(text)
    build._run_go(["mod", "tidy"], work, first, say)
    out = work / "out"
    out.mkdir(exist_ok=True)
    build._run_go(build_args(components, out), work, first, say, every=100)
    for component in components:
        dest = build.cached_path(component)
        dest.parent.mkdir(parents=True, exist_ok=True)
        (out / component.binary).replace(dest)
