"""bundles.folder: the Filesystem Delivery layout's names, where the folder is, and what its
credential and trust bundle files may hold. Pure: no files, an injected `exists`."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from bundles import folder
from bundles.formats import dump_certificates, dump_credential, load_credential
from tests.unit.test_bundles_formats import Authority, pkcs8

FIRST, SECOND = folder.DEFAULT_FOLDERS


@pytest.mark.parametrize(
    ("environ", "present", "expected"),
    [
        pytest.param(
            {folder.ENV_VAR: "/creds"}, {FIRST}, Path("/creds"), id="the variable wins, even absent"
        ),
        pytest.param({folder.ENV_VAR: ""}, {SECOND}, SECOND, id="an empty variable is unset"),
        pytest.param({}, {FIRST, SECOND}, FIRST, id="/run/secrets first"),
        pytest.param({}, {SECOND}, SECOND, id="then /var/run/secrets"),
        pytest.param({}, set(), None, id="no folder: no SPIFFE credentials issued"),
        pytest.param({folder.ENV_VAR: "/a\0b"}, set(), None, id="a path with NUL is no path"),
    ],
)
def test_the_folder_is_located_as_the_standard_says(
    environ: dict[str, str], present: set[Path], expected: Path | None
) -> None:
    def exists(path: Path) -> bool:
        # A default folder counts only when it holds a credential bundle.
        return path.name == folder.CREDENTIAL_BUNDLE and path.parent in present

    assert folder.locate(environ, exists) == expected


def test_the_default_folders_are_injectable(tmp_path: Path) -> None:
    (tmp_path / folder.CREDENTIAL_BUNDLE).write_bytes(b"x")
    assert folder.locate({}, Path.is_file, [tmp_path / "none", tmp_path]) == tmp_path


@pytest.mark.parametrize(
    ("name", "trust_domain"),
    [
        pytest.param("cluster.local.trust-bundle.pem", "cluster.local", id="a trust domain"),
        pytest.param("spire.test.trust-bundle.pem", "spire.test", id="a federated one"),
        pytest.param("credential-bundle.pem", None, id="the credential bundle"),
        pytest.param("trust-bundle.pem", None, id="podcert's old name"),
        pytest.param(".trust-bundle.pem", None, id="no trust domain"),
        pytest.param("..data", None, id="the atomic writer's link"),
        pytest.param("Upper.Case.trust-bundle.pem", None, id="not a valid trust domain"),
        pytest.param("a b.trust-bundle.pem", None, id="a space"),
    ],
)
def test_file_names_map_to_trust_domains(name: str, trust_domain: str | None) -> None:
    assert folder.trust_domain_of(name) == trust_domain


def test_a_trust_bundle_name_is_made_from_a_valid_trust_domain_only() -> None:
    assert folder.trust_bundle_name("spiffe://td.test") == "td.test.trust-bundle.pem"
    with pytest.raises(ValueError, match="trust domain"):
        folder.trust_bundle_name("../etc")


@pytest.fixture(scope="module")
def bundle() -> bytes:
    return dump_credential(Authority().issue("spiffe://td.test/ns/a/sa/b"))


def test_a_standard_credential_bundle_has_no_problem(bundle: bytes) -> None:
    assert folder.credential_bundle_problem(bundle) is None
    assert folder.credential_bundle_problem(bundle.replace(b"\n", b"\r\n")) is None


def test_certificates_before_the_key_break_the_layout(bundle: bytes) -> None:
    credential = load_credential(bundle)
    swapped = dump_certificates(credential.chain) + pkcs8(credential.key)
    load_credential(swapped)  # the general reader takes it...
    problem = folder.credential_bundle_problem(swapped)  # ...the standard does not
    assert problem is not None
    assert "PRIVATE KEY block first" in problem
    assert "BEGIN" not in problem  # names the block, never shows it


@pytest.mark.parametrize(
    ("edit", "where"),
    [
        pytest.param(lambda b: b"junk\n" + b, "before or between", id="text before"),
        pytest.param(
            lambda b: b.replace(b"-----\n-----BEGIN", b"-----\nnote\n-----BEGIN", 1),
            "before or between",
            id="text between blocks",
        ),
        pytest.param(lambda b: b + b"trailer\n", "after the last block", id="text after"),
    ],
)
def test_text_outside_the_blocks_breaks_the_layout(bundle: bytes, edit: object, where: str) -> None:
    assert callable(edit)
    problem = folder.credential_bundle_problem(edit(bundle))
    assert problem is not None
    assert where in problem


def test_a_trust_bundle_with_text_outside_its_blocks_is_named() -> None:
    root = Authority().pem
    assert folder.trust_bundle_problem(root + b"\n" + root, "x.trust-bundle.pem") is None
    problem = folder.trust_bundle_problem(b"# roots\n" + root, "x.trust-bundle.pem")
    assert problem is not None
    assert problem.startswith("x.trust-bundle.pem")


NOW = dt.datetime(2026, 12, 5, 12, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("checked_at", "interval", "due"),
    [
        pytest.param(None, dt.timedelta(seconds=30), True, id="never read"),
        pytest.param(NOW - dt.timedelta(seconds=29), dt.timedelta(seconds=30), False, id="fresh"),
        pytest.param(NOW - dt.timedelta(seconds=30), dt.timedelta(seconds=30), True, id="due"),
        pytest.param(
            NOW - dt.timedelta(minutes=5), dt.timedelta(hours=1), True, id="capped at five min"
        ),
    ],
)
def test_a_reload_is_due_within_the_standards_five_minutes(
    checked_at: dt.datetime | None, interval: dt.timedelta, due: bool
) -> None:
    assert folder.stale(checked_at, NOW, interval) is due


@pytest.mark.parametrize("seconds", [0, -1, 301])
def test_a_watch_interval_beyond_five_minutes_is_refused(seconds: float) -> None:
    with pytest.raises(ValueError, match="interval"):
        folder.check_interval(seconds)
    assert folder.check_interval(300) == 300
