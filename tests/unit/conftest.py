"""Fixtures several unit suites share. The audit's suites (`test_audit_*`) each run in a world of
their own: a cluster, node files and an audit log (`tests.audit_world`); the audit log's suites
(`test_auditlog_*`) sign with a throwaway PKI, and forge with another (`tests.auditlog_world`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from signer.authority import ca
from tests.audit_world import World, new_signer_ca, open_world
from tests.auditlog_world import Pki, make_pki


@pytest.fixture(scope="module")
def signer_ca() -> ca.CABundle:
    """One signer CA per test module: making a CA costs more than most tests."""
    return new_signer_ca()


@pytest.fixture
def world(tmp_path: Path, signer_ca: ca.CABundle) -> Iterator[World]:
    """A cluster, node files and an audit log in `tmp_path`, signed by `signer_ca`."""
    with open_world(tmp_path, signer_ca) as opened:
        yield opened


@pytest.fixture(scope="module")
def pki() -> Pki:
    """The audit log's signing PKI, one per test module."""
    return make_pki("podcert")


@pytest.fixture(scope="module")
def rogue() -> Pki:
    """A PKI nobody trusts: what a forger signs with."""
    return make_pki("rogue")
