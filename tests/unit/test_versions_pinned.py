"""The image tags and the chart carry podcert's one version (`podcert.__version__`), so neither
can drift from it. The chart's version is that version spelled as SemVer 2, which Helm requires
and orders by, and which PEP 440 reads back as the same version; the chart's appVersion (the
image tag its templates default to), devcluster.imagebuild's tags, every podcert image named in
manifests/ and examples/Dockerfile's base are the version as podcert spells it. A kustomize
base's image is a string someone must update with the version: these tests name each one."""

from __future__ import annotations

import io
import itertools
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.version import Version

from devcluster import imagebuild
from podcert import __version__

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "podcert"
REGISTRY = "ghcr.io/podcert/"
# semver.org's own expression for a SemVer 2 version.
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
# The manifests that run podcert's images: each must be found below, so none is skipped unseen.
IMAGE_USERS = (
    "manifests/signer/deployment.yaml",
    "manifests/shim/daemonset.yaml",
    "manifests/examples/mtls/pair.yaml",
)

Precedence = tuple[tuple[int, ...], int, tuple[tuple[int, int, str], ...]]


def precedence(version: str) -> Precedence:
    """A SemVer 2 version's sort key (semver.org, section 11): the core numbers; then a release
    above its pre-releases; pre-release identifiers in turn, numeric ones below alphanumeric
    ones, numbers by value, the rest in ASCII order, a shorter list first when one is a prefix
    of the other. Build metadata is ignored."""
    match = SEMVER.match(version)
    assert match, f"{version!r} is not SemVer 2"
    core = tuple(int(part) for part in match.group(1, 2, 3))
    if match[4] is None:
        return core, 1, ()
    ids = tuple(
        (0, int(part), "") if part.isdigit() else (1, 0, part) for part in match[4].split(".")
    )
    return core, 0, ids


def chart_metadata(text: str) -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load(text)
    return found


def kept_chart_versions() -> list[pytest.ParameterSet]:
    out = []
    for package in sorted((ROOT / "releases").glob("*/podcert-*.tgz")):
        with tarfile.open(package) as chart:
            member = chart.extractfile("podcert/Chart.yaml")
            assert member is not None
            meta = chart_metadata(io.TextIOWrapper(member, encoding="utf-8").read())
        out.append(pytest.param(meta["version"], id=f"newer than release {meta['version']}"))
    return out


def podcert_images() -> list[pytest.ParameterSet]:
    """Every podcert image a manifest names, by file and container."""
    out = []
    for path in sorted((ROOT / "manifests").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            for image in re.findall(r"'image': '([^']+)'", repr(doc)):
                if image.startswith(REGISTRY):
                    name = str(path.relative_to(ROOT))
                    out.append(pytest.param(name, image, id=f"{name} {image.split(':')[0]}"))
    return out


CHAIN = [  # semver.org's example of precedence, lowest first
    "1.0.0-alpha",
    "1.0.0-alpha.1",
    "1.0.0-alpha.beta",
    "1.0.0-beta",
    "1.0.0-beta.2",
    "1.0.0-beta.11",
    "1.0.0-rc.1",
    "1.0.0",
    "1.0.1-0",
    "1.1.0",
    "2.0.0+build.1",
]


@pytest.mark.parametrize(
    ("lower", "higher"),
    [pytest.param(a, b, id=f"{a} < {b}") for a, b in itertools.pairwise(CHAIN)],
)
def test_semver_precedence_is_the_specs(lower: str, higher: str) -> None:
    assert precedence(lower) < precedence(higher)


def test_the_chart_version_is_podcerts_version_spelled_as_semver_2() -> None:
    meta = chart_metadata((CHART / "Chart.yaml").read_text())

    assert SEMVER.match(str(meta["version"])), f"{meta['version']!r} is not SemVer 2"
    assert Version(str(meta["version"])) == Version(__version__)


def test_the_chart_app_version_and_its_default_images_are_podcerts_version() -> None:
    meta = chart_metadata((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    assert meta["appVersion"] == __version__
    # The templates default each tag to appVersion: the chart's images are the ones built here.
    assert f"{values['image']['repository']}:{meta['appVersion']}" == imagebuild.IMAGE
    examples = values["examples"]["image"]["repository"]
    assert f"{examples}:{meta['appVersion']}" == imagebuild.EXAMPLES_IMAGE


@pytest.mark.parametrize("kept", kept_chart_versions())
def test_the_chart_sorts_after_every_kept_release_as_helm_orders_charts(kept: str) -> None:
    tree = str(chart_metadata((CHART / "Chart.yaml").read_text())["version"])

    assert precedence(tree) > precedence(kept)


def test_the_built_images_are_tagged_with_podcerts_version() -> None:
    assert (
        f"{REGISTRY}podcert:{__version__}",
        f"{REGISTRY}podcert-examples:{__version__}",
    ) == (imagebuild.IMAGE, imagebuild.EXAMPLES_IMAGE)


@pytest.mark.parametrize(("manifest", "image"), podcert_images())
def test_every_podcert_image_a_manifest_names_is_one_built_here(manifest: str, image: str) -> None:
    assert image in (imagebuild.IMAGE, imagebuild.EXAMPLES_IMAGE), f"{manifest} runs {image}"


def test_every_manifest_that_runs_podcert_names_its_image() -> None:
    assert sorted({str(p.values[0]) for p in podcert_images()}) == sorted(IMAGE_USERS)


def test_the_examples_image_is_built_on_this_versions_image() -> None:
    text = (ROOT / "examples" / "Dockerfile").read_text()

    assert re.findall(r"^ARG PODCERT_IMAGE=(\S+)$", text, re.MULTILINE) == [imagebuild.IMAGE]
    assert re.findall(r" -t (\S+) \.$", text, re.MULTILINE) == [imagebuild.EXAMPLES_IMAGE]
