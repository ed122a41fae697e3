"""Shell completion generated from the parsers: every command, nested command, flag and choice
completes, in a real bash, zsh and fish (Debian's, installed through the devcluster's apt helper
when missing, as the PKCS#11 tests install SoftHSM2)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from devcluster import host
from podcert import completion
from podcert.cli import build_parser, main

PARSER = build_parser(every=True)
NODES = {node.path: node for node in completion.tree(PARSER)}

# The same questions for every shell: what it offers for the words typed so far.
CASES = [
    pytest.param(("podcert", "st"), ["status"], id="a command"),
    pytest.param(("podcert", "status", "-o", ""), ["table", "json", "yaml"],
                 id="a flag's choices"),
    pytest.param(("podcert", "status", "--ou"), ["--output"], id="a flag"),
    pytest.param(("podcert", "signer", "ca", "re"), ["retire", "revoke"],
                 id="a nested command's choices"),
    pytest.param(("podcert", "explain", ""), ["pod"], id="a positional choice"),
    pytest.param(("kubectl-podcert", "inspect", "cred"), ["credential-bundle.pem"],
                 id="a file"),
]  # fmt: skip


@pytest.fixture(scope="module")
def shells() -> None:
    """zsh and fish, from Debian when missing (bash is always there)."""
    missing = [name for name in ("zsh", "fish") if shutil.which(name) is None]
    if missing:
        host.apt_install(missing, purpose="the completion tests")


def test_the_tree_holds_every_command_nested_command_flag_and_choice() -> None:
    assert set(NODES[()].subcommands) >= {"status", "explain", "inspect", "version", "audit"}
    assert NODES[("signer", "ca")].arguments == (
        "status",
        "prepare",
        "promote",
        "activate",
        "retire",
        "import",
        "revoke",
    )
    assert NODES[("status",)].choices["-o"] == ("table", "json", "yaml")
    assert "--kubeconfig" in NODES[("explain",)].options
    assert "--help" in NODES[()].options


def _complete(script: Path, *words: str) -> list[str]:
    probe = (
        f"source {script}; COMP_WORDS=({' '.join(repr(w) for w in words)}); "
        'COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 )); _podcert; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(
        ["bash", "--norc", "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        cwd=script.parent,
    )
    assert done.stderr == ""
    return [line for line in done.stdout.splitlines() if line]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")
@pytest.mark.parametrize(("words", "offered"), CASES)
def test_bash_completes_from_the_parsers(
    tmp_path: Path, words: tuple[str, ...], offered: list[str]
) -> None:
    script = tmp_path / "podcert.bash"
    script.write_text(completion.script("bash", PARSER))
    (tmp_path / "credential-bundle.pem").write_text("")

    assert _complete(script, *words) == offered


def _run(argv: list[str], cwd: Path) -> list[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=cwd)
    assert done.stderr == ""
    return [line for line in done.stdout.splitlines() if line]


@pytest.mark.usefixtures("shells")
@pytest.mark.parametrize(("words", "offered"), CASES)
def test_zsh_completes_from_the_parsers(
    tmp_path: Path, words: tuple[str, ...], offered: list[str]
) -> None:
    """The script's own `_podcert` in a real zsh, with zsh's completion builtins standing in
    for the line editor: `compadd` prints what it is given, `_files` the matching files."""
    script = tmp_path / "_podcert"
    script.write_text(completion.script("zsh", PARSER))
    (tmp_path / "credential-bundle.pem").write_text("")
    typed = " ".join(repr(w) for w in words)
    probe = (
        'compdef() { :; }; compadd() { [[ "$1" == -- ]] && shift; print -rl -- "$@"; }; '
        "_files() { print -rl -- ${words[CURRENT]}*(N); }; "
        f"source {script}; words=({typed}); CURRENT=${{#words}}; _podcert"
    )
    found = _run(["zsh", "-f", "-c", probe], tmp_path)

    # zsh's compadd itself filters by the typed prefix; the stand-in does not, so filter here.
    assert [word for word in found if word.startswith(words[-1])] == offered


@pytest.mark.usefixtures("shells")
@pytest.mark.parametrize(("words", "offered"), CASES)
def test_fish_completes_from_the_parsers(
    tmp_path: Path, words: tuple[str, ...], offered: list[str]
) -> None:
    """fish's own `complete -C`, which answers exactly what the line editor would offer."""
    script = tmp_path / "podcert.fish"
    script.write_text(completion.script("fish", PARSER))
    (tmp_path / "credential-bundle.pem").write_text("")
    line = " ".join(words)
    found = _run(["fish", "--no-config", "-c", f"source {script}; complete -C {line!r}"], tmp_path)

    assert [entry.split("\t")[0] for entry in found] == sorted(offered)  # fish sorts them


@pytest.mark.parametrize("shell", completion.SHELLS)
def test_every_shells_script_registers_both_commands_and_lists_every_command(
    shell: completion.Shell, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["completion", shell]) == 0
    text = capsys.readouterr().out

    for command in ("podcert", "kubectl-podcert"):
        assert command in text
    for name in NODES[()].subcommands:
        assert name in text
    assert "table json yaml" in text
