"""The product stays in small modules a reader can hold in their head, each with its tests
found by its name."""

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


# --- where a module's tests are ------------------------------------------------------------------

WHEEL = ("podcert", "signer", "kubelet_shim", "bundles", "audit")


def _test_file_names(module: Path) -> set[str]:
    """The test file names that would be `module`'s: `a/b/c.py` is `test_a_b_c`, `test_b_c`,
    `test_a_c` or `test_c` (`podcert/api/keys.py`: `test_api_keys`; `signer/issue/decide.py`:
    `test_signer_decide`), and the shim's `test_shim_c`."""
    parts = module.relative_to(ROOT).with_suffix("").parts
    names = {"_".join(parts), "_".join(parts[-2:]), "_".join((parts[0], parts[-1])), parts[-1]}
    if parts[0] == "kubelet_shim":
        names.add(f"shim_{parts[-1]}")
    return {f"test_{name}" for name in names}


def test_a_modules_tests_are_found_by_its_name() -> None:
    """Where the test of module X is, is a path: `tests/unit/` or `tests/integration/`, a file
    named after it (`_test_file_names`), for every module of the wheel. Suites named for a
    behaviour (`test_hostile_input`, `test_end_to_end`...) may test a module too, besides."""
    found = {p.stem for p in (ROOT / "tests").rglob("test_*.py")}
    modules = [
        p
        for package in WHEEL
        for p in (ROOT / package).rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py")
    ]
    unnamed = sorted(str(m.relative_to(ROOT)) for m in modules if not _test_file_names(m) & found)
    assert not unnamed, f"no test file named after: {unnamed}"
