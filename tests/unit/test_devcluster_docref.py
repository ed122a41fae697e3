"""The generated reference covers what the code has: every command and flag of the real parser
tree, every policy key the reader accepts, every metric, alert, reason and shim Event."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from devcluster import docref
from podcert.cli import SUBCOMMANDS, build_parser
from signer import policy
from signer.federation import domains


def _every_parser(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The tree walked here independently of docref.subcommands (through `choices`)."""
    out = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                out += _every_parser(sub)
    return out


PARSER = build_parser(every=True)
COMMANDS = docref.commands_markdown(PARSER)


@pytest.mark.parametrize("parser", _every_parser(PARSER), ids=lambda p: p.prog)
def test_every_command_has_a_section_with_every_option(parser: argparse.ArgumentParser) -> None:
    section = ("\n" + COMMANDS).split(f"\n## {parser.prog}\n", 1)[1].split("\n## ", 1)[0]
    for action in parser._actions:
        for flag in action.option_strings:
            assert re.search(rf"^- `(.*[ ,])?{re.escape(flag)}[ ,`]", section, re.M), (
                f"{parser.prog} {flag}"
            )


def test_the_tree_reaches_every_top_level_command_and_nested_ones() -> None:
    progs = {p.prog for p in _every_parser(PARSER)}
    assert {f"podcert {name}" for name in SUBCOMMANDS} <= progs
    assert {"podcert signer ca", "podcert shim rotate", "podcert devcluster up"} <= progs


def test_a_flag_added_to_a_parser_shows_in_the_reference() -> None:
    parser = build_parser(every=True)
    signer = next(p for p in _every_parser(parser) if p.prog == "podcert signer")
    signer.add_argument("--brand-new-flag", help="what it does")
    assert "- `--brand-new-flag BRAND_NEW_FLAG`: what it does" in docref.commands_markdown(parser)


def test_every_key_the_policy_reader_accepts_is_documented_with_its_bounds() -> None:
    fields = {key for key, _, _ in docref.shape_fields(policy.__doc__ or "")}
    nested = {
        "signers[]": policy.SIGNER_KEYS,
        "signers[].dnsNames": policy.DNS_KEYS,
        "signers[].allow[]": policy.RULE_KEYS,
        "signers[].rateLimit": policy.RATE_LIMIT_KEYS,
        "signers[].rateLimit.perNode": policy.PER_NODE_KEYS,
    }
    for parent, keys in nested.items():
        assert {f"{parent}.{k}" for k in keys} <= fields, parent
    bounded = {f"signers[].{k}" for k in docref.schema_constraints(policy.entry_schema())}
    assert bounded <= fields
    page = docref.policy_markdown()
    assert "| `signers[].maxLifetimeSeconds` | `86400` | integer ≥ 3600 ≤ 7862400 |" in page


def test_the_federation_section_is_documented() -> None:
    fields = {key for key, _, _ in docref.shape_fields(domains.__doc__ or "")}
    assert "federation.trustDomains[].bundleEndpointURL" in fields
    assert "`federation.trustDomains[].bootstrapBundle`" in docref.policy_markdown()


def test_a_shape_block_nests_list_items_and_joins_continued_comments() -> None:
    doc = """Shape::

        top:
          - name: x        # one
                           #   two
            inner:
              deep: 1      # three

    Prose.
    """
    assert docref.shape_fields(doc) == [
        ("top", "", ""),
        ("top[].name", "x", "one two"),
        ("top[].inner", "", ""),
        ("top[].inner.deep", "1", "three"),
    ]


def test_every_metric_of_both_registries_is_listed_with_its_labels() -> None:
    page = docref.metrics_markdown()
    for name in ("podcert_signer_requests_total", "podcert_shim_projections", "podcert_build_info"):
        assert f"| `{name}` |" in page
    row = next(line for line in page.splitlines() if "`podcert_signer_requests_total`" in line)
    assert "`outcome`, `reason`, `signer_name`" in row


def test_every_alert_has_a_section_with_its_runbook_link(tmp_path: Path) -> None:
    page = docref.alerts_markdown()
    for rule in docref.alerts():
        assert f"## {rule['alert']}\n" in page
        assert f"[{rule['alert']}](../runbooks/{rule['alert']}.md)" in page


def test_the_runbook_url_is_the_sites_page_of_the_alert() -> None:
    assert docref.runbook_url("PodcertNoLeader") == (
        "https://podcert.github.io/podcert/runbooks/PodcertNoLeader.html"
    )


def test_every_exit_code_is_listed_with_its_meaning() -> None:
    from podcert import errors

    page = docref.exit_codes_markdown()
    for name in ("EXIT_OK", "EXIT_FINDINGS", "EXIT_USAGE", "EXIT_CLUSTER_UNREADABLE"):
        assert f"| {getattr(errors, name)} | `{name}` |" in page
