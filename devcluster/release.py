"""`podcert devcluster release`: the release artefacts of the version in the tree
(`podcert.__version__`), in one folder (`dist/` unless `--out`):

- `podcert-<V>-py3-none-any.whl` and `podcert-<V>.tar.gz`: setuptools' PEP 517 hooks in this
  environment (the locked setuptools of locks/build.txt, no isolation), in a copy of the product's
  sources, with SOURCE_DATE_EPOCH the last commit's time, so the wheel is the same bytes each time;
- `podcert-image-<V>.oci.tar`: the image `devcluster.imagebuild` builds and checks (podman's
  cache makes it once), saved as an OCI archive;
- `podcert-<chart version>.tgz`: `helm package` of charts/podcert, whose version, appVersion and
  default image must be this version's;
- `<artefact>.cdx.json`: a CycloneDX SBOM of the wheel, the image and the chart (`devcluster.sbom`);
- `SHA256SUMS` over all of them, as `sha256sum -c` reads it.

It refuses, before building anything, a version CHANGELOG.md has no section for
(`changelog_heading`): a development version (`.devN`) builds from `## [Unreleased]`, any other
needs its own `## [<V>] - YYYY-MM-DD`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

from devcluster import imagebuild, imagecheck, podman, sbom, tools
from devcluster.podman import ImageError
from devcluster.supervise import Progress
from podcert import __version__

REPO = Path(__file__).resolve().parent.parent
CHART = Path("charts") / "podcert"  # in the checkout
# What the sdist holds beside the product's packages (setuptools adds PKG-INFO and egg-info).
SOURCE_FILES = ("pyproject.toml", "README.md", "LICENSE")


class ReleaseError(RuntimeError):
    """A release that cannot be built as asked; the message names the file or step and why."""


# --- pure rules ----------------------------------------------------------------------------------


def changelog_heading(changelog: str, version: str) -> str:
    """The CHANGELOG.md heading a build of `version` takes its notes from, which must have at
    least one entry (`- ...`) before the next `## ` heading: `## [Unreleased]` for a development
    version, `## [<version>] - YYYY-MM-DD` (a real date) for any other."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise ReleaseError(f"version {version!r} is not a PEP 440 version") from None
    if str(parsed) != version:
        raise ReleaseError(f"version {version!r} is not normalised: {parsed}")
    if parsed.is_devrelease:
        pattern, wanted = r"## \[Unreleased\]", "## [Unreleased]"
    else:
        pattern = rf"## \[{re.escape(version)}\] - (\d{{4}}-\d{{2}}-\d{{2}})"
        wanted = f"## [{version}] - YYYY-MM-DD"
    match = re.search(rf"^{pattern}[ \t]*$", changelog, flags=re.MULTILINE)
    if not match:
        raise ReleaseError(
            f"CHANGELOG.md has no `{wanted}` section for {version}"
            + ("" if parsed.is_devrelease else ": rename [Unreleased] to it before releasing")
        )
    if match.groups():
        try:
            dt.date.fromisoformat(match[1])
        except ValueError:
            raise ReleaseError(f"CHANGELOG.md: {match[0]!r} has no real date") from None
    section = changelog[match.end() :].split("\n## ", 1)[0]
    if not re.search(r"^- ", section, flags=re.MULTILINE):
        raise ReleaseError(f"CHANGELOG.md: the `{match[0]}` section lists no change")
    return match[0]


def check_chart(meta: dict[str, Any], values: dict[str, Any], version: str) -> str:
    """The chart's version (SemVer 2 of `version`), once its Chart.yaml and default image are
    this release's: a chart that deploys another image than the one released is refused."""
    chart_version = str(meta.get("version", ""))
    try:
        same = Version(chart_version) == Version(version)
    except InvalidVersion:
        same = False
    if not same:
        raise ReleaseError(f"charts/podcert/Chart.yaml: version {chart_version!r} is not {version}")
    if str(meta.get("appVersion")) != version:
        raise ReleaseError(f"charts/podcert/Chart.yaml: appVersion is not {version!r}")
    image = values.get("image") or {}
    repository, tag = image.get("repository"), image.get("tag") or meta["appVersion"]
    if f"{repository}:{tag}" != imagebuild.IMAGE:
        raise ReleaseError(
            f"charts/podcert/values.yaml: image {repository}:{tag} is not {imagebuild.IMAGE}"
        )
    return chart_version


def sha256sums(digests: dict[str, str]) -> str:
    """SHA256SUMS as sha256sum writes it (`<hex>  <name>`), by name."""
    return "".join(f"{digests[name]}  {name}\n" for name in sorted(digests))


# --- the build -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Artefacts:
    folder: Path
    wheel: Path
    sdist: Path
    image: Path
    chart: Path
    sboms: tuple[Path, Path, Path]  # the wheel's, the image's, the chart's
    sums: Path


def source_date_epoch(root: Path = REPO) -> int:
    """The last commit's time: what dates the wheel's entries and the SBOMs."""
    done = subprocess.run(
        ["git", "-C", str(root), "log", "-1", "--format=%ct"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not done.stdout.strip().isdigit():
        raise ReleaseError(f"git log in {root}: no last commit to date the release by")
    return int(done.stdout.strip())


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def copy_sources(root: Path, tree: Path) -> None:
    """The product's packages and SOURCE_FILES, as checked out (edits included, as the image
    build takes them), without caches."""
    for package in imagecheck.PRODUCT_PACKAGES:
        shutil.copytree(
            root / package, tree / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    for name in SOURCE_FILES:
        shutil.copy2(root / name, tree / name)


def build_hook(hook: str, tree: Path, out: Path, epoch: int) -> Path:
    """setuptools' PEP 517 `hook` (build_wheel, build_sdist) run in `tree`: the file it made."""
    code = f"import setuptools.build_meta as b; print(b.{hook}({str(out)!r}))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tree,
        env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise ReleaseError(f"setuptools {hook} failed:\n{done.stderr[-3000:]}")
    return out / done.stdout.strip().splitlines()[-1]


def _python_dists(root: Path, out: Path, epoch: int) -> tuple[Path, Path]:
    with tempfile.TemporaryDirectory(prefix="podcert-release-") as tmp:
        tree = Path(tmp) / "podcert"
        copy_sources(root, tree)
        return build_hook("build_wheel", tree, out, epoch), build_hook(
            "build_sdist", tree, out, epoch
        )


def _chart(folder: Path, out: Path, progress: Progress) -> Path:
    helm = tools.ensure_helm(progress)
    done = subprocess.run(
        [str(helm), "package", str(folder), f"--destination={out}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if done.returncode != 0:
        raise ReleaseError(f"helm package failed: {done.stderr.strip()}")
    return Path(done.stdout.strip().rsplit(": ", 1)[-1])


def manifest_digest(archive: Path) -> str:
    """The digest of the one image manifest an OCI archive's index.json names."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ReleaseError(f"{archive.name}: no index.json")
        index = json.load(member)
    manifests = index.get("manifests") or []
    if len(manifests) != 1:
        raise ReleaseError(f"{archive.name}: {len(manifests)} manifests, not one")
    return str(manifests[0]["digest"])


def _image(out: Path, version: str, progress: Progress) -> Path:
    imagebuild.build(progress, examples=False)
    report = imagebuild.check()
    if report.findings:
        raise ReleaseError("the image fails its checks:\n" + "\n".join(report.lines()))
    archive = out / f"podcert-image-{version}.oci.tar"
    archive.unlink(missing_ok=True)
    podman.run("save", "--format=oci-archive", f"--output={archive}", imagebuild.IMAGE)
    return archive


def _in_image(path: str) -> str:
    return podman.run(
        "run", *imagebuild.CONFINED, "--entrypoint=cat", imagebuild.IMAGE, path
    ).stdout


def _locked_bom(root: Path, epoch: int) -> sbom.Bom:
    """cyclonedx-py's BOM of locks/runtime.txt, podcert (pyproject.toml) its subject."""
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "cyclonedx-py"),
            "requirements",
            str(root / "locks" / "runtime.txt"),
            f"--pyproject={root / 'pyproject.toml'}",
            "--output-reproducible",
            "--output-file=-",
        ],
        env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch), "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise ReleaseError(f"cyclonedx-py failed: {done.stderr.strip()[-2000:]}")
    bom: sbom.Bom = json.loads(done.stdout)
    return bom


def write_bom(bom: sbom.Bom, dest: Path) -> Path:
    """Write a BOM once CycloneDX's schema accepts it."""
    # Imported here: its schemas load slowly, and only a release needs them.
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    text = json.dumps(bom, indent=2, sort_keys=True) + "\n"
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is not None:
        raise ReleaseError(f"{dest.name} is not valid CycloneDX 1.6: {error}")
    dest.write_text(text)
    return dest


def build(
    out: Path, progress: Progress, *, version: str = __version__, root: Path = REPO
) -> Artefacts:
    """Every artefact of `version` into `out`, then SHA256SUMS over them (files of other builds
    already in `out` are left alone and not summed)."""
    changelog_heading((root / "CHANGELOG.md").read_text(), version)
    folder = root / CHART
    meta = yaml.safe_load((folder / "Chart.yaml").read_text())
    chart_version = check_chart(meta, yaml.safe_load((folder / "values.yaml").read_text()), version)
    epoch = source_date_epoch(root)
    out = out.resolve()  # the build hooks run in a copy of the sources
    out.mkdir(parents=True, exist_ok=True)

    progress(f"podcert {version}: the wheel and the sdist")
    wheel, sdist = _python_dists(root, out, epoch)
    progress(f"podcert {version}: the chart {chart_version}")
    chart = _chart(folder, out, progress)
    progress(f"podcert {version}: the image {imagebuild.IMAGE}")
    image_archive = _image(out, version, progress)
    repository, tag = imagebuild.IMAGE.rsplit(":", 1)
    image = sbom.ImageRef(repository, tag, manifest_digest(image_archive))

    progress(f"podcert {version}: the SBOMs")
    locked = _locked_bom(root, epoch)
    debs = sbom.installed_debs(_in_image("/var/lib/dpkg/status"))
    distribution = sbom.distro(_in_image("/etc/os-release"))
    boms = (
        write_bom(
            sbom.wheel_bom(locked, version, sha256_of(wheel), epoch), out / f"{wheel.name}.cdx.json"
        ),
        write_bom(
            sbom.image_bom(locked, debs, distribution, image, version, epoch),
            out / f"{image_archive.name}.cdx.json",
        ),
        write_bom(
            sbom.chart_bom(meta["name"], chart_version, version, sha256_of(chart), image, epoch),
            out / f"{chart.name}.cdx.json",
        ),
    )
    made = [wheel, sdist, image_archive, chart, *boms]
    sums = out / "SHA256SUMS"
    sums.write_text(sha256sums({path.name: sha256_of(path) for path in made}))
    return Artefacts(out, wheel, sdist, image_archive, chart, boms, sums)


# --- command line --------------------------------------------------------------------------------


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        made = build(Path(args.out), _say)
    except (ReleaseError, ImageError, sbom.SbomError) as err:
        _say(f"devcluster release failed: {err}")
        return 1
    for line in made.sums.read_text().splitlines():
        print(f"{made.folder}/{line.split('  ', 1)[1]}")
    print(f"podcert {__version__} built in {time.monotonic() - started:.0f} s")
    return 0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "release",
        help=f"build the release artefacts of podcert {__version__}: the wheel, the sdist, "
        "the image as an OCI archive, the chart package, a CycloneDX SBOM of each and "
        "SHA256SUMS (docs/releasing.md)",
    )
    parser.add_argument(
        "--out", default=str(REPO / "dist"), help="the folder they go into (default: dist/)"
    )
    parser.set_defaults(run=_run)
