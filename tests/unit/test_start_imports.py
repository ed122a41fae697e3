"""A component's start-up imports only what it uses. Importing is most of the time
from process start to the signer's first issuance, and `kubernetes` (its generated models,
pydantic), aiohttp and asyncio each cost a tenth of a second or so: the product never imports
`kubernetes` (an import-linter contract holds that for the code; this for what runs), and the
signer loads aiohttp and asyncio only when it serves the webhook or the bundle endpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("kubernetes", "aiohttp", "asyncio", "urllib3", "requests", "pydantic")


def loaded(*modules: str) -> set[str]:
    """The top-level packages of HEAVY that importing `modules` loads, in a fresh interpreter."""
    code = (
        f"import sys; import {', '.join(modules)}; import json; "
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    return set(json.loads(done.stdout))


@pytest.mark.parametrize(
    "modules",
    [
        pytest.param(("signer.cli", "signer.build"), id="the signer"),
        pytest.param(("kubelet_shim.cli", "kubelet_shim.build"), id="the shim"),
        pytest.param(("audit.cli",), id="the audit"),
    ],
)
def test_a_component_starts_without_the_heavy_packages(modules: tuple[str, ...]) -> None:
    assert loaded(*modules) == set()


def test_the_webhook_brings_aiohttp_when_it_is_served() -> None:
    assert {"aiohttp", "asyncio"} <= loaded("signer.admission.webhook")
