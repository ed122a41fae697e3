"""signer.upstreamcli: the offline upstream's flags of `podcert signer ca`, each misuse refused in
one line naming the flag before anything reads the cluster."""

from __future__ import annotations

import pytest

from podcert.cli import build_parser
from signer import upstreamcli

PARSER = build_parser(every=True)


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
