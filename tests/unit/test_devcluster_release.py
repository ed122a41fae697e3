"""devcluster.release's rules: which CHANGELOG.md section a version builds from (a development
version from Unreleased, any other from its own dated heading), the chart it may package, and
SHA256SUMS as sha256sum writes it. The build itself: tests/integration/test_release.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from devcluster import imagebuild, release
from devcluster.release import ReleaseError, changelog_heading, check_chart
from podcert import __version__

ROOT = Path(__file__).resolve().parents[2]

CHANGELOG = """# Changelog

## [Unreleased]

### Added (issue 31: release)
- a thing

## [0.2.0] - 2026-12-20

### Added
- another thing

## [0.1.0] - 2026-12-01

- the first
"""


@pytest.mark.parametrize(
    ("version", "heading"),
    [
        pytest.param("0.3.0.dev0", "## [Unreleased]", id="a dev version builds from Unreleased"),
        pytest.param("0.2.0", "## [0.2.0] - 2026-12-20", id="a final version from its heading"),
        pytest.param("0.1.0", "## [0.1.0] - 2026-12-01", id="the last section is found too"),
    ],
)
def test_the_section_a_version_builds_from(version: str, heading: str) -> None:
    assert changelog_heading(CHANGELOG, version) == heading


@pytest.mark.parametrize(
    ("version", "changelog", "message"),
    [
        pytest.param(
            "0.3.0",
            CHANGELOG,
            "CHANGELOG.md has no `## [0.3.0] - YYYY-MM-DD` section for 0.3.0: rename "
            "[Unreleased] to it before releasing",
            id="a final version without its heading",
        ),
        pytest.param(
            "0.3.0rc1",
            CHANGELOG,
            "no `## [0.3.0rc1] - YYYY-MM-DD` section",
            id="a release candidate needs its own heading",
        ),
        pytest.param(
            "0.2.0",
            CHANGELOG.replace("## [0.2.0] - 2026-12-20", "## [0.2.0]"),
            "no `## [0.2.0] - YYYY-MM-DD` section",
            id="a heading without its date",
        ),
        pytest.param(
            "0.2.0",
            CHANGELOG.replace("2026-12-20", "2026-13-40"),
            "'## [0.2.0] - 2026-13-40' has no real date",
            id="a date that is none",
        ),
        pytest.param(
            "0.2.0",
            CHANGELOG.replace("### Added\n- another thing\n", ""),
            "the `## [0.2.0] - 2026-12-20` section lists no change",
            id="an empty section",
        ),
        pytest.param(
            "0.3.0.dev0",
            CHANGELOG.replace("## [Unreleased]", "## Unreleased"),
            "no `## [Unreleased]` section for 0.3.0.dev0",
            id="a dev version without Unreleased",
        ),
        pytest.param("0.3.0-dev0", CHANGELOG, "is not normalised: 0.3.0.dev0", id="unnormalised"),
        pytest.param("three", CHANGELOG, "'three' is not a PEP 440 version", id="no version"),
    ],
)
def test_a_version_without_its_section_is_refused(
    version: str, changelog: str, message: str
) -> None:
    with pytest.raises(ReleaseError) as refused:
        changelog_heading(changelog, version)
    assert message in str(refused.value)


def test_the_trees_version_builds_from_the_trees_changelog() -> None:
    """What lets the test command build the release of the tree."""
    changelog_heading((ROOT / "CHANGELOG.md").read_text(), __version__)


def test_the_build_refuses_a_version_without_its_section_before_building_anything(
    tmp_path: Path,
) -> None:
    (tmp_path / "CHANGELOG.md").write_text(CHANGELOG)
    out = tmp_path / "dist"
    with pytest.raises(ReleaseError, match=r"no `## \[0\.3\.0\] - YYYY-MM-DD` section"):
        release.build(out, pytest.fail, version="0.3.0", root=tmp_path)
    assert not out.exists()


def _chart() -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    meta = yaml.safe_load((ROOT / release.CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / release.CHART / "values.yaml").read_text())
    return meta, values


def test_the_trees_chart_is_the_trees_version_and_deploys_its_image() -> None:
    meta, values = _chart()
    assert check_chart(meta, values, __version__) == meta["version"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"version": "0.1.0"}, "version '0.1.0' is not", id="another chart version"),
        pytest.param({"version": "latest"}, "version 'latest' is not", id="no version"),
        pytest.param({"appVersion": "0.1.0"}, "appVersion is not", id="another appVersion"),
        pytest.param(
            {"image": {"repository": "docker.io/me/podcert", "tag": ""}},
            f"image docker.io/me/podcert:{__version__} is not {imagebuild.IMAGE}",
            id="another image",
        ),
        pytest.param(
            {"image": {"repository": "ghcr.io/podcert/podcert", "tag": "latest"}},
            "image ghcr.io/podcert/podcert:latest is not",
            id="another tag",
        ),
    ],
)
def test_a_chart_that_is_not_the_release_is_refused(
    change: dict[str, object], message: str
) -> None:
    meta, values = _chart()
    if "image" in change:
        values = {**values, **change}  # type: ignore[dict-item]
    else:
        meta = {**meta, **change}  # type: ignore[dict-item]
    with pytest.raises(ReleaseError, match="charts/podcert/") as refused:
        check_chart(meta, values, __version__)
    assert message in str(refused.value)


def test_sha256sums_is_what_sha256sum_writes_by_name() -> None:
    assert release.sha256sums({"b.tgz": "2" * 64, "a.whl": "1" * 64}) == (
        f"{'1' * 64}  a.whl\n{'2' * 64}  b.tgz\n"
    )
