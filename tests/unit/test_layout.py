"""The product stays in small modules a reader can hold in their head."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("podcert", "signer", "kubelet_shim", "bundles", "audit", "devcluster", "examples")
LIMITS = {"audit": 400}  # the audit's steps are held to ~400 lines; every other module to 500


def _modules() -> list[Path]:
    return sorted(p for package in PRODUCT for p in (ROOT / package).rglob("*.py"))


def test_the_product_packages_are_found() -> None:
    assert len(_modules()) > 50


@pytest.mark.parametrize("module", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_product_module_is_over_its_line_limit(module: Path) -> None:
    package = module.relative_to(ROOT).parts[0]
    limit = LIMITS.get(package, 500)
    lines = len(module.read_text().splitlines())
    assert lines <= limit, f"{module.relative_to(ROOT)} has {lines} lines (limit {limit})"
