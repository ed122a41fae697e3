"""`podcert devcluster image`: build podcert's image from the Dockerfile on this machine with
podman (`devcluster.podman`: Debian's packages, a locally made base, storage under the cache) and
check the result (`devcluster.imagecheck`), printing its size and each layer's.

Two images, both tagged with podcert's version (`podcert.__version__`, as the manifests, the
chart's appVersion and `examples/Dockerfile` name them: tests/unit/test_versions_pinned.py):
`ghcr.io/podcert/podcert:<version>`, the reference the manifests ship, and
`ghcr.io/podcert/podcert-examples:<version>`, the same plus the example mTLS pair
(`examples/Dockerfile`), which the cluster image does not carry. Rebuilds are cached by podman's
layers (the dependencies' layer changes only with `locks/runtime.txt`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from devcluster import imagecheck, podman
from devcluster.podman import ImageError
from devcluster.supervise import Progress
from podcert import __version__
from podcert.cli import SUBCOMMANDS

REPO = Path(__file__).resolve().parent.parent
IMAGE = f"ghcr.io/podcert/podcert:{__version__}"
EXAMPLES_IMAGE = f"ghcr.io/podcert/podcert-examples:{__version__}"
# The subcommands the cluster image runs; every other one is a development tool it lacks.
IMAGE_COMMANDS = (
    "signer",
    "shim",
    "audit",
    "status",
    "explain",
    "inspect",
    "version",
    "completion",
)
DEVELOPMENT_COMMANDS = tuple(name for name in SUBCOMMANDS if name not in IMAGE_COMMANDS)
USER = "65532:65532"
# What every check container runs with: the restrictions the manifests put on the signer.
CONFINED = (
    "--rm",
    "--network=none",
    "--read-only",
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
)


@dataclass
class Report:
    image: str
    size: int = 0
    layers: list[tuple[int, str]] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"{self.image}: {self.size / 1e6:.0f} MB in {len(self.layers)} layers"]
        out += [f"  {size / 1e6:8.1f} MB  {created[:90]}" for size, created in self.layers]
        out += [f"  ok: {line}" for line in self.passed]
        out += [f"  FINDING: {line}" for line in self.findings]
        return out


def build(progress: Progress, *, examples: bool = True) -> None:
    """Build the image (and the examples' image) from this checkout, cached by podman."""
    if missing := podman.install_packages(progress):
        progress(f"installed {', '.join(missing)}")
    with podman.locked():
        podman.ensure_base(progress)
        mounts = [f"--volume={podman.CA_BUNDLE}:{podman.CA_BUNDLE}:ro"]
        if not podman.CA_BUNDLE.is_file():
            mounts = []
        targets = [(IMAGE, "Dockerfile")]
        if examples:
            targets.append((EXAMPLES_IMAGE, "examples/Dockerfile"))
        for image, dockerfile in targets:
            progress(f"building {image} from {dockerfile}")
            podman.run_logged(
                [
                    "podman",
                    "build",
                    "--pull=never",
                    "--layers",
                    "--network=host",
                    *mounts,
                    f"--file={dockerfile}",
                    f"--tag={image}",
                    ".",
                ],
                progress,
                cwd=REPO,
            )
        # Images earlier builds left untagged (replaced images, finished stages), after a day:
        # younger ones are the next build's cache (the dependencies' stage above all).
        podman.run("image", "prune", "--force", "--filter=until=24h", check=False)


def _inspect(image: str) -> dict[str, Any]:
    out = podman.run("image", "inspect", image).stdout
    found: list[dict[str, Any]] = json.loads(out)
    return found[0]


def _measured(image: str) -> tuple[Report, dict[str, Any]]:
    """A report with the image's size and its layers' (oldest first), and its inspection."""
    info = _inspect(image)
    history = json.loads(podman.run("history", "--format=json", image).stdout)
    layers = [
        (int(h.get("size", 0)), str(h.get("CreatedBy") or h.get("createdBy") or ""))
        for h in reversed(history)
        if int(h.get("size", 0)) > 0
    ]
    return Report(image, int(info.get("Size", 0)), layers), info


def _members(archive: IO[bytes]) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=archive, mode="r|") as tar:
        return list(tar)


@dataclass
class Exported:
    """The flattened file system: its members, /etc/passwd and /etc/group, and a digest of each
    of podcert's installed modules."""

    members: list[tarfile.TarInfo] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)


def _exported(image: str) -> Exported:
    container = podman.run("create", image).stdout.strip()
    out = Exported()
    try:
        proc = podman.stream("export", container)
        assert proc.stdout is not None
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                out.members.append(member)
                name = imagecheck.normalized(member.name)
                module = imagecheck.product_module(name)
                if member.isfile() and (module or name in ("etc/passwd", "etc/group")):
                    handle = tar.extractfile(member)
                    data = handle.read() if handle else b""
                    if module:
                        out.modules[module] = hashlib.sha256(data).hexdigest()
                    else:
                        out.texts[name] = data.decode()
        _finish(proc, "export")
    finally:
        podman.run("rm", "--force", container, check=False)
    return out


def checkout_modules(root: Path = REPO) -> dict[str, str]:
    """Digests of the modules the Dockerfile copies from this checkout."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for package in imagecheck.PRODUCT_PACKAGES
        for path in sorted((root / package).rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def _layer_leftovers(image: str) -> list[str]:
    """Build leftovers in any layer (`podman save`: one tar per layer, named by its digest)."""
    proc = podman.stream("save", "--format=docker-archive", image)
    assert proc.stdout is not None
    findings: list[str] = []
    with tarfile.open(fileobj=proc.stdout, mode="r|") as outer:
        for member in outer:
            if member.isfile() and member.name.endswith(".tar"):
                layer = outer.extractfile(member)
                assert layer is not None
                findings += imagecheck.leftovers(_members(layer), member.name[:12])
    _finish(proc, "save")
    return findings


def _finish(proc: Any, what: str) -> None:
    if proc.wait() != 0:
        raise ImageError(f"podman {what} failed: {proc.stderr.read().decode().strip()}")


def _commands(image: str, report: Report) -> None:
    """Every subcommand's --help runs, read-only and unprivileged; the development tools are
    refused by name."""
    for name in ("--help", *IMAGE_COMMANDS):
        args = [name] if name == "--help" else [name, "--help"]
        done = podman.run("run", *CONFINED, image, *args, check=False)
        expected = "usage: podcert" + ("" if name == "--help" else f" {name}")
        if done.returncode == 0 and done.stdout.startswith(expected):
            report.passed.append(f"podcert {' '.join(args)}")
        else:
            report.findings.append(
                f"podcert {' '.join(args)} exited {done.returncode}: "
                f"{(done.stdout + done.stderr).strip()[-300:]}"
            )
    for name in DEVELOPMENT_COMMANDS:
        done = podman.run("run", *CONFINED, image, name, "--help", check=False)
        if done.returncode == 2 and "is a development tool" in done.stderr:
            report.passed.append(f"podcert {name}: not installed here")
        else:
            report.findings.append(
                f"podcert {name} --help exited {done.returncode}, not the usage error of a "
                f"tool the image lacks: {(done.stdout + done.stderr).strip()[-300:]}"
            )


def check(image: str = IMAGE) -> Report:
    """Every check of a built image: its user, its files (`imagecheck`), its podcert modules
    against the checkout's, each layer's leftovers and its commands; findings leave the report
    failing."""
    report, info = _measured(image)
    config = info.get("Config") or {}
    user = str(config.get("User", ""))
    if user != USER:
        report.findings.append(f"USER is {user!r}, not {USER}")
    exported = _exported(image)
    passwd, group = (exported.texts.get(f"etc/{name}", "") for name in ("passwd", "group"))
    account = imagecheck.account(user, passwd, group)
    report.findings += account
    if not account:
        report.passed.append(f"runs as {user}, a user and group the image names")
    found = imagecheck.filesystem(exported.members)
    report.findings += found
    if not found:
        report.passed.append(
            f"{len(exported.members)} files: no "
            f"{'/'.join(imagecheck.DEVELOPMENT_PACKAGES)} package, no compiler, nothing "
            "world-writable but /tmp-like sticky folders"
        )
    stale = imagecheck.stale(exported.modules, checkout_modules())
    report.findings += stale
    if not stale:
        report.passed.append(f"its {len(exported.modules)} podcert modules are the checkout's")
    leftover = _layer_leftovers(image)
    report.findings += leftover
    if not leftover:
        report.passed.append("no layer holds a wheel, /wheels, the lock or pip's cache")
    idented = podman.run("run", *CONFINED, "--entrypoint=id", image, check=False).stdout.strip()
    if idented.startswith("uid=65532(podcert) gid=65532(podcert)"):
        report.passed.append(f"id: {idented}")
    else:
        report.findings.append(f"id in the image says {idented!r}")
    _commands(image, report)
    return report


def check_examples(image: str = EXAMPLES_IMAGE) -> Report:
    """The examples' image runs both halves of the pair (their --help) under the same limits."""
    report, _ = _measured(image)
    for module in ("examples.mtls.server", "examples.mtls.client"):
        done = podman.run(
            "run", *CONFINED, "--entrypoint=python", image, "-m", module, "--help", check=False
        )
        if done.returncode == 0 and done.stdout.startswith("usage:"):
            report.passed.append(f"python -m {module} --help")
        else:
            report.findings.append(
                f"python -m {module} --help exited {done.returncode}: "
                f"{(done.stdout + done.stderr).strip()[-300:]}"
            )
    return report


def save(image: str, dest: Path) -> Path:
    """The image as a docker archive, as `ctr images import` takes it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    podman.run("save", "--format=docker-archive", f"--output={dest}", image)
    return dest


# --- command line --------------------------------------------------------------------------------


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        build(_say, examples=not args.no_examples)
        built = time.monotonic() - started
        reports = [check()] if args.no_examples else [check(), check_examples()]
    except ImageError as err:
        _say(f"devcluster image failed: {err}")
        return 1
    for report in reports:
        print("\n".join(report.lines()))
    print(f"built in {built:.0f} s, checked in {time.monotonic() - started - built:.0f} s")
    return 1 if any(r.findings for r in reports) else 0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "image",
        help=f"build {IMAGE} (and the examples' image) with podman from the Dockerfile, "
        "then check it: every subcommand's --help, its user, no development code, no "
        "compiler, nothing world-writable, no build leftovers; print its size",
    )
    parser.add_argument(
        "--no-examples", action="store_true", help="only the cluster image, not the examples'"
    )
    parser.set_defaults(run=_run)
