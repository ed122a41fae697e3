"""Every repository path docs/ARCHITECTURE.md names exists, so its map cannot point at a file
that was renamed or removed.

Which backticked spans are paths (outside fenced code blocks; a `path::name` or `path (Name)`
form is judged, and checked, by its path alone):
- only letters, digits, `_`, `-`, `.` and `/`, with at least one `/`: identifiers, dotted module
  names (`podcert.reconcile.runtime.Runtime`), commands with spaces, calls with parentheses and
  patterns (`bench/soak*.py`, `releases/<version>/`, `[TD/]NS/SA`) are not paths;
- not starting with `/` or `-`: a URL path (`/healthz`) or a flag;
- and a file (its last part has a suffix: `signer/issue/decide.py`), a folder (it ends in `/`:
  `manifests/monitoring/`), or starting at a top-level entry of the repository
  (`charts/podcert`). What is left names another project's thing, as Go's `encoding/pem`.
A bare file name (`pyproject.toml`, `build.py`) is not checked: the row says where it is.
A path ending in `/` must be a folder; any other must exist.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"

_FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
_SPAN = re.compile(r"`([^`\n]+)`")
_PATH_CHARS = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_./-]*")


def named_paths(markdown: str, top_level: Collection[str]) -> list[str]:
    """The repository paths `markdown` names in backticks, each once, in order of appearance."""
    found: dict[str, None] = {}
    for span in _SPAN.findall(_FENCE.sub("", markdown)):
        path = span.split("::", 1)[0]
        if "/" not in path or not _PATH_CHARS.fullmatch(path):
            continue
        last = path.rstrip("/").rsplit("/", 1)[-1]
        if path.endswith("/") or "." in last or path.split("/", 1)[0] in top_level:
            found[path] = None
    return list(found)


def _top_level() -> set[str]:
    return {entry.name for entry in ROOT.iterdir()}


def _missing(path: str) -> bool:
    target = ROOT / path
    return not (target.is_dir() if path.endswith("/") else target.exists())


@pytest.mark.parametrize(
    ("markdown", "paths"),
    [
        pytest.param("`signer/issue/decide.py` (pure)", ["signer/issue/decide.py"], id="a file"),
        pytest.param("`manifests/monitoring/`", ["manifests/monitoring/"], id="a folder"),
        pytest.param("`charts/podcert`", ["charts/podcert"], id="a top-level folder's child"),
        pytest.param(
            "`tests/unit/test_x.py::test_y`", ["tests/unit/test_x.py"], id="path::name by its path"
        ),
        pytest.param(
            "`signer/kube.py` (`keyed_pcr`)", ["signer/kube.py"], id="path (Name) by its path"
        ),
        pytest.param("`a/b.py`, then `a/b.py` again", ["a/b.py"], id="each path once"),
        pytest.param("Go's `encoding/pem`", [], id="another project's name"),
        pytest.param("`releases/<version>/` `bench/soak*.py`", [], id="placeholders and globs"),
        pytest.param("`[TD/]NS/SA`", [], id="a bracketed pattern"),
        pytest.param(
            "`podcert.reconcile.runtime.Runtime` `Review.converted_from`", [], id="dotted names"
        ),
        pytest.param("`--max-connections` `/healthz` `make lint`", [], id="flag, URL, command"),
        pytest.param("`pyproject.toml` `build.py`", [], id="bare file names"),
        pytest.param("```\n`signer/nowhere.py`\n```\n", [], id="inside a fenced block"),
    ],
)
def test_which_backticked_spans_count_as_repository_paths(markdown: str, paths: list[str]) -> None:
    assert named_paths(markdown, top_level={"charts", "signer", "tests"}) == paths


def test_the_rule_finds_the_architecture_docs_files_and_folders() -> None:
    # A rule that matched nothing would pass every doc.
    paths = named_paths(DOC.read_text(), _top_level())
    assert len(paths) > 50
    assert any(p.endswith("/") for p in paths)
    assert any(p.endswith(".py") for p in paths)


def test_every_path_the_architecture_doc_names_exists() -> None:
    missing = [p for p in named_paths(DOC.read_text(), _top_level()) if _missing(p)]
    assert not missing, f"docs/ARCHITECTURE.md names paths that do not exist: {missing}"
