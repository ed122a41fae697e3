"""How `make test` spreads the suite over its xdist workers (tests/conftest.py): each module whole
in one worker, every module that holds the real node or the podman store in one shared scope."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import MACHINE_MODULES, MACHINE_SCOPE, scope_of

ROOT = Path(__file__).resolve().parents[2]


def test_a_module_is_one_scope_and_the_machines_modules_share_one() -> None:
    assert scope_of("tests/unit/test_locks.py::test_a[x]") == "tests/unit/test_locks.py"
    assert scope_of("tests/unit/test_locks.py::Cls::test_b") == "tests/unit/test_locks.py"
    assert {scope_of(f"{module}::test_x") for module in MACHINE_MODULES} == {MACHINE_SCOPE}


def test_every_module_that_starts_a_real_node_is_a_machine_module() -> None:
    """A module that starts a real kubelet outside the machine's scope would meet another
    worker's node and be refused: every one that names a real node is listed."""
    starts_real = {
        f"tests/integration/{path.name}"
        for path in (ROOT / "tests" / "integration").glob("test_*.py")
        if any(
            marker in path.read_text()
            for marker in ("real_kubelet", 'podcert", "demo', "bench.soak", "imagebuild")
        )
    }
    assert starts_real <= MACHINE_MODULES, starts_real - MACHINE_MODULES
    assert all((ROOT / module).is_file() for module in MACHINE_MODULES)
