"""The report commands' usage errors: each exits 2 naming what the user typed wrong, before any
read (the kubeconfig names a closed port). A cluster that cannot be read (exit 3) and an unusable
kubeconfig (exit 2) are checked with every other command in `test_cli_errors.py`."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from podcert.cli import main
from podcert.errors import EXIT_USAGE


@pytest.fixture
def unreachable(tmp_path: Path) -> Path:
    """A kubeconfig naming a loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {{server: "https://127.0.0.1:{port}", insecure-skip-tls-verify: true}}
users:
- name: u
  user: {{token: abc}}
contexts:
- name: x
  context: {{cluster: c, user: u}}
current-context: x
"""
    )
    return path


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        pytest.param(["explain", "pod", "shop/Not_A_Name"], "is not a pod's", id="a bad pod name"),
        pytest.param(["status", "-n", "Bad_NS"], "is not a namespace name", id="a bad namespace"),
        pytest.param(["status", "--signer-name", "nope"], "--signer-name", id="a bad signer name"),
        pytest.param(["version", "--lease-name", "a/b"], "--lease-name", id="a bad lease name"),
    ],
)
def test_what_the_user_typed_wrong_exits_2_naming_it(
    argv: list[str], said: str, unreachable: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--kubeconfig", str(unreachable)]) == EXIT_USAGE
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["status", "-o", "wide"], id="an unknown format"),
        pytest.param(["explain", "deployment", "x"], id="an unknown kind"),
        pytest.param(["status", "--stuck-after", "0"], id="a threshold of zero"),
    ],
)
def test_argparse_refusals_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == EXIT_USAGE
