"""The release artefacts `podcert devcluster release` builds (devcluster/release.py; the
`released` fixture builds them once), each checked the way a user would use it: SHA256SUMS
verified by `sha256sum -c`; the wheel installed with pip into a new virtual environment from the
runtime lock, where `podcert --version` prints the version and `import bundles` works; the sdist
building the same wheel, byte for byte; every SBOM valid CycloneDX 1.6, the wheel's listing every
package of locks/runtime.txt, the image's exactly the Python packages installed in it (those,
and podcert) and the Debian packages of the image,
the chart's naming the image by the archive's manifest digest. test_helm_install installs the
chart package and runs the image archive on the real node."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packaging.utils import canonicalize_name

from devcluster import imagebuild, podman, release
from devcluster.release import Artefacts
from podcert import __version__
from tests.unit.test_locks import read_lock

ROOT = Path(__file__).resolve().parents[2]
SITE = "/usr/local/lib/python3.11/dist-packages"  # where the Dockerfile installs (pip --root)

pytestmark = pytest.mark.timeout(900)  # the first test builds the release


def ok(argv: list[str | Path], cwd: Path) -> str:
    done = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, check=False, cwd=cwd, timeout=600
    )
    assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


def test_sha256sum_verifies_every_artefact_of_the_version(released: Artefacts) -> None:
    out = ok(["sha256sum", "--check", "--strict", "SHA256SUMS"], released.folder)
    chart = f"podcert-{released.chart.name.removeprefix('podcert-')}"
    artefacts = [
        f"podcert-{__version__}-py3-none-any.whl",
        f"podcert-{__version__}.tar.gz",
        f"podcert-image-{__version__}.oci.tar",
        chart,
    ]
    sboms = [f"{name}.cdx.json" for name in (artefacts[0], artefacts[2], chart)]
    assert sorted(line.split(": ")[0] for line in out.splitlines()) == sorted(artefacts + sboms)
    assert all(line.endswith(": OK") for line in out.splitlines())


def test_the_wheel_installed_by_pip_in_a_new_environment_runs(
    released: Artefacts, tmp_path: Path
) -> None:
    """What the release notes tell a user: the runtime lock, then the wheel with nothing left
    to resolve, in a virtual environment made by the standard library."""
    env = tmp_path / "venv"
    ok([sys.executable, "-m", "venv", env], tmp_path)
    pip = [env / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    ok([*pip, "--require-hashes", "-r", ROOT / "locks" / "runtime.txt"], tmp_path)
    ok([*pip, "--no-deps", released.wheel], tmp_path)
    ok([env / "bin" / "python", "-m", "pip", "check"], tmp_path)
    version = ok([env / "bin" / "podcert", "--version"], tmp_path)
    assert version.startswith(f"podcert {__version__} (Kubernetes ")
    where = ok([env / "bin" / "python", "-c", "import bundles; print(bundles.__file__)"], tmp_path)
    assert Path(where.strip()).is_relative_to(env), "bundles came from elsewhere than the wheel"


def test_the_sdist_builds_the_same_wheel_byte_for_byte(released: Artefacts, tmp_path: Path) -> None:
    with tarfile.open(released.sdist) as sdist:
        sdist.extractall(tmp_path, filter="data")
    [tree] = tmp_path.iterdir()
    out = tmp_path / "out"
    out.mkdir()
    rebuilt = release.build_hook("build_wheel", tree, out, release.source_date_epoch())
    assert rebuilt.name == released.wheel.name
    with zipfile.ZipFile(released.wheel) as ours, zipfile.ZipFile(rebuilt) as theirs:
        assert ours.namelist() == theirs.namelist()
        for name in ours.namelist():
            assert ours.read(name) == theirs.read(name), name
    assert rebuilt.read_bytes() == released.wheel.read_bytes(), "same contents, other bytes"


def bom(path: Path) -> dict[str, Any]:
    text = path.read_text()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None, path.name
    parsed: dict[str, Any] = json.loads(text)
    return parsed


def purls(parsed: dict[str, Any]) -> set[str]:
    return {c["purl"] for c in parsed["components"]}


LOCKED = {f"pkg:pypi/{name}@{pin.version}" for name, pin in read_lock("runtime.txt").items()}


def test_the_wheels_sbom_lists_every_locked_package_under_the_wheel(released: Artefacts) -> None:
    parsed = bom(released.sboms[0])
    assert purls(parsed) == LOCKED
    subject = parsed["metadata"]["component"]
    assert subject["purl"] == f"pkg:pypi/podcert@{__version__}"
    assert subject["hashes"][0]["content"] == release.sha256_of(released.wheel)


def test_the_images_sbom_lists_the_lock_podcert_and_its_debian_packages(
    released: Artefacts,
) -> None:
    parsed = bom(released.sboms[1])
    listed = purls(parsed)
    assert listed >= {*LOCKED, f"pkg:pypi/podcert@{__version__}"}
    debian = {p.split("@")[0] for p in listed if p.startswith("pkg:deb/debian/")}
    assert {"pkg:deb/debian/python3.11", "pkg:deb/debian/libc6", "pkg:deb/debian/libssl3"} <= debian
    assert len(debian) > 50
    subject = parsed["metadata"]["component"]
    digest = release.manifest_digest(released.image)
    assert subject["purl"].startswith(f"pkg:oci/podcert@{digest}?")
    assert (subject["name"], subject["version"]) == tuple(imagebuild.IMAGE.rsplit(":", 1))


def test_the_images_sbom_lists_exactly_the_python_packages_the_image_holds(
    released: Artefacts,
) -> None:
    """What pip finds installed in the image (its /usr/local, where the Dockerfile installs the
    lock and the wheel; Debian's own Python packages are the SBOM's Debian packages)."""
    found = podman.run(
        "run",
        *imagebuild.CONFINED,
        "--entrypoint=python",
        imagebuild.IMAGE,
        *("-m", "pip", "list", "--format=json", "--disable-pip-version-check"),
        f"--path={SITE}",
    ).stdout
    installed = {
        f"pkg:pypi/{canonicalize_name(p['name'])}@{p['version']}" for p in json.loads(found)
    }
    listed = {p for p in purls(bom(released.sboms[1])) if p.startswith("pkg:pypi/")}
    assert listed == installed


def test_the_image_archive_names_the_image_the_chart_deploys(released: Artefacts) -> None:
    with tarfile.open(released.image) as archive:
        index = archive.extractfile("index.json")
        assert index is not None
        [manifest] = json.load(index)["manifests"]
    assert manifest["annotations"]["org.opencontainers.image.ref.name"] == imagebuild.IMAGE
    with tarfile.open(released.chart) as chart:
        member = chart.extractfile("podcert/Chart.yaml")
        assert member is not None
        meta = yaml.safe_load(io.TextIOWrapper(member, encoding="utf-8"))
    assert meta["appVersion"] == __version__
    assert released.chart.name == f"podcert-{meta['version']}.tgz"


def test_the_charts_sbom_names_the_released_image_by_digest(released: Artefacts) -> None:
    parsed = bom(released.sboms[2])
    [image] = parsed["components"]
    digest = release.manifest_digest(released.image)
    assert image["purl"] == bom(released.sboms[1])["metadata"]["component"]["purl"]
    assert image["purl"].startswith(f"pkg:oci/podcert@{digest}?")
    assert parsed["metadata"]["component"]["hashes"][0]["content"] == release.sha256_of(
        released.chart
    )
