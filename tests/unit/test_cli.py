"""The `podcert` dispatcher: each subcommand's module is imported only when it runs, and a
subcommand whose package is not installed (the cluster image has no devcluster) says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from podcert import cli


def test_a_subcommand_whose_package_is_missing_exits_2_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(cli.SUBCOMMANDS, "devtool", ("no_such_podcert_pkg.cli", "a dev tool"))

    with pytest.raises(SystemExit) as caught:
        cli.main(["devtool"])

    assert caught.value.code == 2
    assert "'devtool' is not installed here" in capsys.readouterr().err


def test_a_broken_import_inside_an_installed_package_is_not_hidden(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The package exists; a module it imports does not: that is a bug to show, not "missing".
    monkeypatch.setitem(cli.SUBCOMMANDS, "broken", ("podcert.no_such_module", "broken"))

    with pytest.raises(ModuleNotFoundError):
        cli.main(["broken"])


def test_help_lists_every_subcommand_without_importing_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for name in ("signer", "shim", "audit", "devcluster", "demo"):
        assert name in out


KUBECONFIGS = [
    pytest.param(None, "no such file", id="a missing kubeconfig"),
    pytest.param("garbage: [", "not valid YAML", id="a kubeconfig that is not YAML"),
    pytest.param(
        "apiVersion: v1\nkind: Config\n", "current-context", id="a kubeconfig with no context"
    ),
]


@pytest.mark.parametrize(("content", "says"), KUBECONFIGS)
@pytest.mark.parametrize("command", ["signer", "shim", "audit"])
def test_an_unusable_kubeconfig_is_one_line_and_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    content: str | None,
    says: str,
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    if content is not None:
        kubeconfig.write_text(content)
    argv = {
        "signer": ["signer", f"--kubeconfig={kubeconfig}", "--signer-name=a.example.com/b"],
        "shim": ["shim", f"--kubeconfig={kubeconfig}", "--node-name=n", f"--root={tmp_path}"],
        "audit": ["audit", f"--kubeconfig={kubeconfig}"],
    }[command]

    code = cli.main(argv)

    err = capsys.readouterr().err
    assert code == 2
    assert says in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
