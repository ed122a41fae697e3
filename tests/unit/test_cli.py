"""The `podcert` dispatcher: each subcommand's module is imported only when it runs, and a
subcommand that cannot run here (its extra or its development-only package is not installed)
says in one line what to install."""

from __future__ import annotations

import importlib.metadata
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from podcert import cli


def test_a_development_tool_missing_from_the_install_exits_2_saying_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(cli.SUBCOMMANDS, "devtool", ("no_such_podcert_pkg.cli", "a dev tool"))
    monkeypatch.setattr(cli, "DEVELOPMENT_ONLY", frozenset({"no_such_podcert_pkg"}))

    with pytest.raises(SystemExit) as caught:
        cli.main(["devtool"])

    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "'devtool' is a development tool" in err
    assert err.count("\n") == 1


def test_a_command_missing_its_extra_names_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "needs_a_dependency.py").write_text("import no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "needs_a_dependency", raising=False)
    monkeypatch.setitem(cli.SUBCOMMANDS, "served", ("needs_a_dependency", "a server"))
    monkeypatch.setattr(cli, "SERVER_EXTRA_MODULES", frozenset({"no_such_dependency"}))

    with pytest.raises(SystemExit) as caught:
        cli.main(["served"])

    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "pip install 'podcert[server]'" in err
    assert "module no_such_dependency is missing" in err


@pytest.mark.parametrize(
    ("module", "says"),
    [
        pytest.param("msgspec", "podcert[server]", id="an extra's module"),
        pytest.param("yaml.cyaml", "podcert[server]", id="a module inside an extra's package"),
        pytest.param("devcluster", "development tool", id="a development-only package"),
        pytest.param("devcluster.nodes", None, id="a module missing inside a present package"),
        pytest.param("signer.nothing", None, id="a module missing inside the product"),
        pytest.param("", None, id="an import error that names no module"),
    ],
)
def test_what_a_missing_module_says(module: str, says: str | None) -> None:
    said = cli.missing_module("signer", module)
    assert said is None if says is None else (said is not None and says in said)


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


def test_the_server_extra_table_is_the_extra_pyproject_declares() -> None:
    """Each module in SERVER_EXTRA_MODULES comes from a distribution of the `server` extra, and
    each of those distributions has a module in the table (a new dependency must be named)."""
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    extra = pyproject["project"]["optional-dependencies"]["server"]
    wanted = {canonicalize_name(Requirement(r).name) for r in extra}
    provides = importlib.metadata.packages_distributions()
    dists_of = {
        m: {canonicalize_name(d) for d in provides.get(m, [])} for m in cli.SERVER_EXTRA_MODULES
    }
    assert all(dists & wanted for dists in dists_of.values()), dists_of
    covered = set().union(*dists_of.values()) & wanted
    assert covered == wanted, f"no module named for {sorted(wanted - covered)}"


def test_the_kubectl_plugin_is_the_same_commands_under_kubectls_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    scripts = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"][
        "scripts"
    ]
    assert scripts["kubectl-podcert"] == "podcert.cli:kubectl_main"

    with pytest.raises(SystemExit) as caught:
        cli.main(["status", "--help"], prog="kubectl podcert")

    assert caught.value.code == 0
    assert capsys.readouterr().out.startswith("usage: kubectl podcert status ")


def test_top_level_help_shows_examples_and_no_default_noise(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])

    text = capsys.readouterr().out
    assert "examples:\n  podcert status\n" in text
    assert "(default: None)" not in text
