"""signer.authority.tokenkeys against a real SoftHSM2 token (tests/unit/softhsm_cases.py), in a
pytest process of its own: SoftHSM2, once loaded, changes OpenSSL's process-wide state, which
breaks other tests' encrypted PEM keys in a shared worker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CASES = Path(__file__).with_name("softhsm_cases.py")


def test_the_token_key_cases_pass_in_a_process_of_their_own() -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", str(CASES), "-q", "-p", "no:cacheprovider"),
            *("-o", "python_files=softhsm_cases.py", "-n", "0"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=CASES.parents[2],
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "14 passed" in done.stdout, done.stdout[-2000:]
