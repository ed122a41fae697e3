"""podcert's one version: set in podcert/__init__.py only, read from there by the build backend,
printed by `podcert --version`, carried by the API client's User-Agent."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.version import Version
from setuptools.config.expand import read_attr  # type: ignore[import-untyped]

import podcert
from devcluster import build
from podcert import cli
from podcert.client import rest

ROOT = Path(__file__).resolve().parents[2]


def test_podcert_version_prints_one_unwrapped_line_on_stdout_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["--version"])

    assert caught.value.code == 0
    out, err = capsys.readouterr()
    assert out == (
        f"podcert {podcert.__version__} (Kubernetes 1.35, 1.36, 1.37; "
        "tested with v1.35.4, v1.36.3, v1.37.2)\n"
    )
    assert err == ""


def test_the_wheel_takes_its_version_from_podcert_init_and_nowhere_else() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    # What setuptools puts in the wheel's metadata, read the way the build reads it.
    assert read_attr(attr, root_dir=ROOT) == podcert.__version__
    assert str(Version(podcert.__version__)) == podcert.__version__  # PEP 440, normalised


def test_the_user_agent_names_the_version() -> None:
    assert f"podcert/{podcert.__version__}" == rest.USER_AGENT


def test_the_kubernetes_releases_named_are_the_ones_the_devcluster_builds() -> None:
    assert podcert.KUBERNETES_TESTED == build.KUBERNETES_VERSIONS
