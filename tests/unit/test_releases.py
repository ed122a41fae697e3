"""The releases kept in releases/<version>/ are the bytes SHA256SUMS names, and nothing else;
each is the version its folder says, small, and in the changelog; the tree is newer than all."""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

import podcert

ROOT = Path(__file__).resolve().parents[2]
RELEASES = sorted(p for p in (ROOT / "releases").iterdir() if p.is_dir())
LARGEST = 1 << 20  # bytes: an artefact kept in git stays small
NOT_ARTEFACTS = frozenset({"README.md", "SHA256SUMS"})


def sums(folder: Path) -> dict[str, str]:
    """SHA256SUMS as sha256sum writes it: `<64 hex>  <name>` per line."""
    listed = {}
    for line in (folder / "SHA256SUMS").read_text().splitlines():
        match = re.fullmatch(r"([0-9a-f]{64}) [ *](\S+)", line)
        assert match, f"{folder.name}/SHA256SUMS: not a sha256sum line: {line!r}"
        listed[match[2]] = match[1]
    return listed


def by_release() -> list[pytest.ParameterSet]:
    return [pytest.param(folder, id=folder.name) for folder in RELEASES]


def test_release_0_1_0_is_kept() -> None:
    assert [folder.name for folder in RELEASES][:1] == ["0.1.0"]


@pytest.mark.parametrize("folder", by_release())
def test_every_kept_artefact_is_listed_in_sha256sums_and_matches_it(folder: Path) -> None:
    listed = sums(folder)
    present = {p.name for p in folder.iterdir()} - NOT_ARTEFACTS

    assert present == set(listed), "an artefact without a sum, or a sum without its artefact"
    for name, digest in listed.items():
        data = (folder / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, f"{folder.name}/{name} changed"
        assert len(data) < LARGEST, f"{folder.name}/{name} is {len(data)} bytes"


@pytest.mark.parametrize("folder", by_release())
def test_the_wheel_and_the_chart_are_the_version_their_folder_names(folder: Path) -> None:
    version = folder.name
    wheel = folder / f"podcert-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        metadata = Parser().parsestr(archive.read(f"podcert-{version}.dist-info/METADATA").decode())
        assert "podcert/__init__.py" in archive.namelist()
    assert (metadata["Name"], metadata["Version"]) == ("podcert", version)

    with tarfile.open(folder / f"podcert-{version}.tgz") as chart:
        member = chart.extractfile("podcert/Chart.yaml")
        assert member is not None
        meta = yaml.safe_load(io.TextIOWrapper(member, encoding="utf-8"))
    assert (meta["name"], meta["version"], meta["appVersion"]) == ("podcert", version, version)


def test_every_kept_release_has_its_changelog_section_and_the_tree_is_newer() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\]", changelog, flags=re.MULTILINE)

    assert headings[0] == "Unreleased"
    for folder in RELEASES:
        assert folder.name in headings, f"CHANGELOG.md has no section for {folder.name}"
        assert Version(podcert.__version__) > Version(folder.name)


# The digest of the Apache License 2.0 as apache.org publishes it (LICENSE-2.0.txt), the copy
# Debian ships in /usr/share/common-licenses/Apache-2.0 and many wheels in .dist-info/licenses.
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_the_licence_is_the_apache_2_0_text_verbatim_and_the_package_says_so() -> None:
    assert hashlib.sha256((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_0_SHA256
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert (project["license"], project["license-files"]) == ("Apache-2.0", ["LICENSE"])


def test_the_security_policy_names_the_private_channels_and_the_tested_kubernetes_minors() -> None:
    policy = (ROOT / "SECURITY.md").read_text()
    assert "https://github.com/podcert/podcert/security/advisories/new" in policy
    assert "security@podcert.dev" in policy
    assert "(docs/security.md)" in policy
    *first, last = podcert.KUBERNETES_TESTED
    minors = f"{', '.join(first)} and {last}"  # "1.35, 1.36 and 1.37"
    assert f"**{minors}**" in policy, f"SECURITY.md's Kubernetes minors are not {minors}"
