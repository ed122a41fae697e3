"""The locks in locks/ cover every dependency pyproject.toml declares, so an install
from them (make, CI, the image) never misses one that an install of the ranges would bring.

A dependency added to pyproject.toml without `make lock` fails here, naming it; so does a lock
edited by hand into an incomplete or unhashed state.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "locks"
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())


@dataclass(frozen=True)
class Pin:
    requirement: Requirement  # name==version ; marker
    hashes: tuple[str, ...]

    @property
    def version(self) -> str:
        (spec,) = self.requirement.specifier
        return spec.version


def read_lock(name: str) -> dict[str, Pin]:
    """A requirements file as uv and pip-compile write it: `name==version ; marker`, then
    `--hash=` options, continued with backslashes; `#` comments."""
    text = (LOCKS / name).read_text()
    pins: dict[str, Pin] = {}
    for entry in re.sub(r"\\\n", " ", text).splitlines():
        entry = entry.split("#", 1)[0].strip()
        if not entry:
            continue
        hashes = tuple(re.findall(r"--hash=(\S+)", entry))
        requirement = Requirement(re.sub(r"--hash=\S+", "", entry).strip())
        pins[canonicalize_name(requirement.name)] = Pin(requirement, hashes)
    return pins


def declared(lock: str) -> list[Requirement]:
    """What pyproject.toml asks of each lock."""
    base = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    server = [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["server"]]
    if lock == "base.txt":
        return base
    if lock == "runtime.txt":
        return base + server
    if lock == "dev.txt":
        groups = PYPROJECT["dependency-groups"]
        return base + server + [Requirement(r) for r in groups["dev"] if isinstance(r, str)]
    return [Requirement(r) for r in PYPROJECT["build-system"]["requires"]]


LOCK_FILES = ["base.txt", "runtime.txt", "dev.txt", "build.txt"]


def _extra_requirements(name: str, version: str, extra: str) -> list[Requirement]:
    """An extra's requirements, from the metadata of the locked version (installed here by
    `make`, from dev.txt)."""
    dist = importlib.metadata.distribution(name)
    assert dist.version == version, (
        f"{name} {dist.version} is installed but the lock pins {version}: run make to reinstall"
    )
    out = []
    for line in dist.requires or []:
        req = Requirement(line)
        marker = req.marker
        # Only what this extra adds: its marker holds with the extra and not without it.
        if marker is not None and marker.evaluate({"extra": extra}) and not marker.evaluate():
            out.append(req)
    return out


@pytest.mark.parametrize("lock", LOCK_FILES)
def test_every_pin_is_exact_and_hashed(lock: str) -> None:
    pins = read_lock(lock)
    assert pins, f"locks/{lock} pins nothing"
    for name, pin in pins.items():
        assert [s.operator for s in pin.requirement.specifier] == ["=="], f"{name} is not pinned"
        assert pin.hashes and all(h.startswith("sha256:") for h in pin.hashes), (
            f"{name} has no sha256 hash in locks/{lock}"
        )


@pytest.mark.parametrize("lock", LOCK_FILES)
def test_the_lock_holds_every_declared_dependency_and_its_extras(lock: str) -> None:
    pins = read_lock(lock)
    problems = []
    for req in declared(lock):
        pin = pins.get(canonicalize_name(req.name))
        if pin is None:
            problems.append(f"{req} is declared but not locked")
            continue
        if not req.specifier.contains(pin.version, prereleases=True):
            problems.append(f"{req.name}=={pin.version} is outside the declared {req}")
        for extra in sorted(req.extras):
            for needed in _extra_requirements(req.name, pin.version, extra):
                if canonicalize_name(needed.name) not in pins:
                    problems.append(f"{req.name}[{extra}] needs {needed.name}, not locked")
    assert problems == [], f"locks/{lock} is behind pyproject.toml (run make lock): {problems}"


def test_build_in_asks_for_what_pyproject_builds_with() -> None:
    wanted = {str(Requirement(r)) for r in PYPROJECT["build-system"]["requires"]}
    lines = (LOCKS / "build.in").read_text().splitlines()
    asked = {str(Requirement(line.split("#", 1)[0])) for line in lines if line.split("#", 1)[0]}
    assert wanted <= asked


@pytest.mark.parametrize("lock", ["base.txt", "runtime.txt", "dev.txt"])
def test_the_lock_is_closed_over_what_its_packages_require(lock: str) -> None:
    """Every requirement of every locked package (as it applies on this machine) is locked too:
    the lock was resolved, not trimmed by hand."""
    pins = read_lock(lock)
    missing = []
    for name, pin in pins.items():
        marker = pin.requirement.marker
        if marker is not None and not marker.evaluate({"extra": ""}):
            continue  # another platform's package (colorama on Windows...)
        dist = importlib.metadata.distribution(name)
        if dist.version != pin.version:
            pytest.fail(f"{name} {dist.version} is installed, locks/{lock} pins {pin.version}")
        for line in dist.requires or []:
            req = Requirement(line)
            applies = req.marker is None or req.marker.evaluate({"extra": ""})
            if applies and canonicalize_name(req.name) not in pins:
                missing.append(f"{name} needs {req.name}")
    assert missing == [], f"locks/{lock} is not closed: {missing}"


@pytest.mark.parametrize("lock", ["base.txt", "runtime.txt"])
def test_an_install_lock_agrees_with_the_dev_lock(lock: str) -> None:
    """The image, and a workload installing the base wheel, run the versions the tests ran."""
    installed, dev = read_lock(lock), read_lock("dev.txt")
    differ = {n: (p.version, dev[n].version) for n, p in installed.items() if n in dev}
    assert set(installed) <= set(dev)
    assert {n: v for n, v in differ.items() if v[0] != v[1]} == {}


def test_the_base_lock_is_what_a_workload_needs_and_no_server_package() -> None:
    """`pip install podcert` brings no aiohttp, msgspec, ... (they are the server extra's)."""
    server = {
        canonicalize_name(Requirement(r).name)
        for r in PYPROJECT["project"]["optional-dependencies"]["server"]
    }
    assert server & set(read_lock("base.txt")) == set()
