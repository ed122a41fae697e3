"""SoftHSM2 tokens for the tests: Debian's `softhsm2`, installed through the devcluster's apt
helper when missing, and tokens initialised in a directory of the test's own (SOFTHSM2_CONF)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from devcluster import host

MODULE: Final = "/usr/lib/softhsm/libsofthsm2.so"
PIN: Final = "4711-test-pin"
SO_PIN: Final = "so-4711-test-pin"


def ensure_installed() -> None:
    """Install `softhsm2` (root, Debian) when its tool or module is missing."""
    if shutil.which("softhsm2-util") is None or not Path(MODULE).exists():
        host.apt_install(["softhsm2"], purpose="the PKCS#11 tests")


@dataclass(frozen=True)
class Tokens:
    """A SoftHSM2 configuration whose tokens live under `directory`."""

    conf: Path
    directory: Path
    pin_file: Path

    @property
    def env(self) -> dict[str, str]:
        return {"SOFTHSM2_CONF": str(self.conf)}

    def init_token(self, label: str) -> None:
        """A fresh token labelled `label`, its user PIN in `pin_file`. SoftHSM reads its token
        directory when a process loads it: make the tokens before the process opens any."""
        init = ["softhsm2-util", "--init-token", "--free", "--label", label]
        subprocess.run(
            [*init, "--pin", PIN, "--so-pin", SO_PIN],
            env=self.env,
            check=True,
            capture_output=True,
        )


def make(directory: Path) -> Tokens:
    ensure_installed()
    tokens = directory / "tokens"
    tokens.mkdir(parents=True)
    conf = directory / "softhsm2.conf"
    conf.write_text(
        f"directories.tokendir = {tokens}\nobjectstore.backend = file\nlog.level = ERROR\n"
    )
    pin_file = directory / "pin"
    pin_file.write_text(PIN + "\n")
    return Tokens(conf=conf, directory=tokens, pin_file=pin_file)
