"""signer.upstreamcli: the offline upstream's flags of `podcert signer ca`, each misuse refused in
one line naming the flag before anything reads the cluster."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import cast

import pytest
from cryptography import x509

from podcert.cli import build_parser
from podcert.errors import CommandError, ConfigError
from signer import build, upstreamcli
from signer.authority.castore import CAStore
from signer.kube import SignerKube
from tests.ca_secrets import SecretKube

PARSER = build_parser(every=True)
NOW = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)


def problem(*argv: str) -> str | None:
    return upstreamcli.problem(PARSER.parse_args(["signer", "ca", *argv]))


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        pytest.param(
            ("activate", "--upstream", "offline"), "--upstream goes with", id="upstream-not-prepare"
        ),
        pytest.param(
            ("prepare", "--upstream", "offline", "--csr-out", "x"),
            "needs --trust-domain",
            id="no-td",
        ),
        pytest.param(
            ("prepare", "--upstream", "offline", "--trust-domain", "a.org"),
            "needs --trust-domain and --csr-out",
            id="no-csr-out",
        ),
        pytest.param(
            ("prepare", "--upstream", "offline", "--trust-domain", "Bad TD", "--csr-out", "x"),
            "--trust-domain 'Bad TD'",
            id="bad-td",
        ),
        pytest.param(
            (
                "prepare",
                "--upstream",
                "offline",
                "--preview",
                "--trust-domain",
                "a.org",
                "--csr-out",
                "x",
            ),
            "--preview goes with --upstream self",
            id="preview",
        ),
        pytest.param(
            ("prepare", "--csr-out", "x"),
            "go with `ca prepare --upstream offline` only",
            id="csr-out-alone",
        ),
        pytest.param(("import", "--id", "g"), "`ca import` needs --chain", id="import-no-chain"),
        pytest.param(("import", "--chain", "c.pem"), "`ca import` needs --id", id="import-no-id"),
        pytest.param(
            ("status", "--chain", "c.pem"),
            "--chain goes with `ca import` only",
            id="chain-elsewhere",
        ),
    ],
)
def test_each_misuse_is_refused_by_name(argv: tuple[str, ...], says: str) -> None:
    said = problem(*argv)
    assert said is not None and says in said and "\n" not in said


def test_the_offline_flags_pass_together_and_plain_actions_are_untouched() -> None:
    offline = ("--upstream", "offline", "--trust-domain", "a.org", "--csr-out", "x")
    assert problem("prepare", *offline) is None
    assert problem("import", "--id", "g-upstream", "--chain", "c.pem") is None
    assert problem("prepare") is None and problem("status") is None


def test_an_unwritable_csr_out_names_it_and_where_the_csr_is_kept(tmp_path: Path) -> None:
    kube = SecretKube(None)
    cas = CAStore(cast(SignerKube, kube), "podcert-system", "podcert-ca", lambda: NOW)
    assert cas.load() is not None
    out = tmp_path / "missing" / "podcert.csr"
    args = PARSER.parse_args(
        ["signer", "ca", "prepare", "--upstream", "offline", "--trust-domain", "a.org",
         "--csr-out", str(out)]
    )  # fmt: skip
    with pytest.raises(CommandError) as err:
        upstreamcli.run(args, cas)
    pending = cas.pending()
    assert pending is not None
    assert str(err.value).startswith(f"--csr-out {out}: No such file or directory")
    assert f"offline.{pending.id}.csr in podcert-system/podcert-ca" in str(err.value)


def test_prepare_writes_the_csr_and_import_refuses_a_chain_file_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kube = SecretKube(None)
    cas = CAStore(cast(SignerKube, kube), "podcert-system", "podcert-ca", lambda: NOW)
    assert cas.load() is not None
    out = tmp_path / "podcert.csr"
    args = PARSER.parse_args(
        ["signer", "ca", "prepare", "--upstream", "offline", "--trust-domain", "a.org",
         "--csr-out", str(out)]
    )  # fmt: skip
    assert upstreamcli.run(args, cas) == 0
    csr = x509.load_pem_x509_csr(out.read_bytes())
    gen = capsys.readouterr().out.split()[0]
    assert gen.endswith("-upstream") and csr.is_signature_valid
    chain = tmp_path / "nope.pem"
    args = PARSER.parse_args(["signer", "ca", "import", "--id", gen, "--chain", str(chain)])
    with pytest.raises(ConfigError, match=rf"^--chain {chain}: No such file"):
        upstreamcli.run(args, cas)


# --- the running signer's --upstream spire -------------------------------------------------------


def signer_config(*argv: str) -> object:
    from signer.cli import config_from

    args = PARSER.parse_args(["signer", "--signer-name", "example.com/podcert", *argv])
    return config_from(args)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        pytest.param(
            ("--upstream", "spire", "--spire-server", "127.0.0.1:8081", "--spire-agent-socket", ""),
            "--upstream spire needs --spire-agent-socket",
            id="no agent socket",
        ),
        pytest.param(
            ("--upstream", "spire", "--spire-agent-socket", "/run/a.sock"),
            "--spire-server ''",
            id="no server",
        ),
        pytest.param(
            ("--upstream", "spire", "--spire-agent-socket", "/a", "--spire-server", "host:99999"),
            "expected HOST:PORT",
            id="port out of range",
        ),
        pytest.param(
            (
                "--upstream",
                "spire",
                "--spire-agent-socket",
                "/a",
                "--spire-server",
                "h:1",
                "--spire-check-seconds",
                "0",
            ),
            "--spire-check-seconds must be between 1 and 3600",
            id="check interval zero",
        ),
        pytest.param(("--spire-server", "h:1"), "goes with --upstream spire", id="server alone"),
    ],
)
def test_signer_upstream_spire_flags_are_refused_naming_the_flag(
    argv: tuple[str, ...], says: str
) -> None:
    said = signer_config(*argv)
    assert isinstance(said, str) and says in said


def test_signer_upstream_spire_flags_make_the_endpoints() -> None:
    config = signer_config(
        "--upstream",
        "spire",
        "--spire-agent-socket",
        "unix:///run/spire/agent.sock",
        "--spire-server",
        "spire-server.spire:8081",
        "--spire-check-seconds",
        "5",
    )
    assert isinstance(config, build.Config) and config.spire is not None
    spire = config.spire
    assert (spire.agent_socket, spire.server, spire.interval) == (
        "/run/spire/agent.sock",
        "spire-server.spire:8081",
        5.0,
    )
    plain = signer_config()
    assert isinstance(plain, build.Config) and plain.spire is None


def test_ca_prepare_upstream_spire_records_the_request_for_the_leader(
    capsys: pytest.CaptureFixture[str],
) -> None:
    kube = SecretKube(None)
    cas = CAStore(cast(SignerKube, kube), "podcert-system", "podcert-ca", lambda: NOW)
    assert cas.load() is not None
    args = PARSER.parse_args(["signer", "ca", "prepare", "--upstream", "spire"])
    assert upstreamcli.problem(args) is None
    assert upstreamcli.run(args, cas) == 0
    assert cas.renewal_requested == NOW
    assert "renewal requested at 2026-12-05T12:00:00Z" in capsys.readouterr().out


def test_ca_prepare_of_a_root_of_our_own_is_refused_while_spire_signs() -> None:
    from signer.authority import downstream
    from tests.unit.test_signer_offline import ROOT

    kube = SecretKube(None)
    cas = CAStore(cast(SignerKube, kube), "podcert-system", "podcert-ca", lambda: NOW)
    assert cas.load() is not None
    plain = PARSER.parse_args(["signer", "ca", "prepare"])
    assert upstreamcli.run(plain, cas) is None  # not SPIRE's: the schedule's own step
    cas.rewrite(downstream.with_authorities([ROOT]))
    with pytest.raises(CommandError, match="--upstream spire"):
        upstreamcli.run(plain, cas)
    forced = PARSER.parse_args(["signer", "ca", "prepare", "--force"])
    assert upstreamcli.run(forced, cas) is None
