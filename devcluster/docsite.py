"""The Sphinx extension behind docs/ (docs/conf.py loads it): what the site adds to MyST.

- A page line `<!-- podcert-reference: NAME -->` becomes the generated reference NAME
  (`GENERATORS`, made by `devcluster.docref` and `devcluster.docevents`) while the page is
  read, so the reference is made from the code on every build and never stored.
- A link to a repository file outside docs/ (`[values](../charts/podcert/values.yaml)`) becomes
  its GitHub URL (GITHUB_BLOB), the same link the page has on GitHub; a link to a path that does
  not exist is a warning, so the build (warnings are errors) fails on it.
- A docstring written in the house style (prose with `- ` lists, no blank line before them) is
  read by autodoc as reStructuredText lists (`docstring_lines`).
- `<!-- podcert-docsite: other top-level pages -->` inside a toctree lists every top-level page
  no toctree of the index names (a new guide of another change lands in Guides, not in a
  "not included in any toctree" warning).

Pure but for `setup` and the event handlers that apply these to what Sphinx reads.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from sphinx.util import logging

from devcluster import docref
from devcluster.docevents import reasons_markdown
from devcluster.docref import ROOT, SITE_URL, runbook_url

__all__ = ["GITHUB_BLOB", "SITE_URL", "fill", "rewrite_links", "runbook_url", "setup"]

DOCS: Final = ROOT / "docs"
_log: Final = logging.getLogger(__name__)
GITHUB_BLOB: Final = "https://github.com/podcert/podcert/blob/main/"
"""Where a repository file outside docs/ is linked (GitHub shows a folder at this URL too)."""

_MARKER: Final = re.compile(r"^<!-- podcert-reference: (?P<name>[\w-]+) -->$", re.M)
_OTHERS: Final = "<!-- podcert-docsite: other top-level pages -->"
# An inline Markdown link's target: `](target)` or `](target "title")`, not an image's.
_LINK: Final = re.compile(r"(?<!!)\]\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")
_FENCE: Final = re.compile(r"^(?P<fence>\s*(`{3,}|~{3,}))")


def _commands() -> str:
    from podcert.cli import build_parser

    return docref.commands_markdown(build_parser(every=True))


GENERATORS: Final[Mapping[str, Callable[[], str]]] = {
    "commands": _commands,
    "policy": docref.policy_markdown,
    "metrics": docref.metrics_markdown,
    "alerts": docref.alerts_markdown,
    "reasons": reasons_markdown,
    "exit-codes": docref.exit_codes_markdown,
}
"""What a page may ask for with `<!-- podcert-reference: NAME -->`."""


class DocsiteError(ValueError):
    """A page asks for what cannot be made: an unknown generator, a link to a missing file."""


def rewrite_links(text: str, page: Path, root: Path = ROOT, docs: Path = DOCS) -> str:
    """`text` (the Markdown of `page`) with each relative link to a path outside `docs` turned
    into its GitHub URL; links inside `docs`, absolute URLs and anchors are MyST's to check.
    Fenced code is left alone. Raises DocsiteError naming the page and the link when the path
    does not exist in the repository."""
    out: list[str] = []
    fence: str | None = None
    for line in text.splitlines(keepends=True):
        opened = _FENCE.match(line)
        if opened and (fence is None or opened["fence"].strip().startswith(fence)):
            fence = None if fence is not None else opened["fence"].strip()
            out.append(line)
            continue
        out.append(line if fence is not None else _LINK.sub(_rewriter(page, root, docs), line))
    return "".join(out)


def _rewriter(page: Path, root: Path, docs: Path) -> Callable[[re.Match[str]], str]:
    def rewrite(match: re.Match[str]) -> str:
        target = match["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target, re.I):
            return match[0]
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve()
        if resolved.is_relative_to(docs.resolve()):
            return match[0]
        if not resolved.is_relative_to(root.resolve()) or not resolved.exists():
            raise DocsiteError(f"{page}: link {target!r}: no such file in the repository")
        url = GITHUB_BLOB + resolved.relative_to(root.resolve()).as_posix()
        if resolved.is_dir():
            url = url.replace("/blob/", "/tree/", 1)
        return f"]({url}{'#' + anchor if anchor else ''}{match['title'] or ''})"

    return rewrite


def fill(text: str, generators: Mapping[str, Callable[[], str]] = GENERATORS) -> str:
    """`text` with every reference marker replaced by its generated Markdown."""

    def generate(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in generators:
            raise DocsiteError(f"no reference named {name!r}: one of {sorted(generators)}")
        return generators[name]()

    return _MARKER.sub(generate, text)


def other_pages(index: str, docs: Path = DOCS) -> list[str]:
    """The top-level pages (docnames) `index` does not name: every `*.md` beside it but the
    index itself."""
    named = set(re.findall(r"^([\w./-]+)\s*$", index, re.M))
    pages = sorted(p.stem for p in docs.glob("*.md") if p.stem != "index")
    return [p for p in pages if p not in named]


def docstring_lines(lines: list[str]) -> list[str]:
    """A docstring in the house style (prose, then `- ` bullets right under the line that
    introduces them, continued by indented lines) as reStructuredText wants it: a blank line
    before each list and after it, so that docutils reads a list, not a quote or a definition."""
    out: list[str] = []
    in_list = False
    for line in lines:
        bullet = line.lstrip().startswith("- ") and not line.startswith("  ")
        if bullet and not in_list and out and out[-1].strip():
            out.append("")
        if in_list and not bullet and line.strip() and not line.startswith(" "):
            out.append("")  # the list ended without a blank line: prose goes on
        if bullet:
            in_list = True
        elif not line.strip() or not line.startswith(" "):
            in_list = False
        out.append(line)
    return out


def _process_docstring(
    app: Any, what: str, name: str, obj: object, options: Any, lines: list[str]
) -> None:
    lines[:] = docstring_lines(lines)


def _source_read(app: Any, docname: str, source: list[str]) -> None:
    page = Path(app.srcdir) / f"{docname}.md"
    try:
        text = fill(source[0])
        if docname == "index":
            text = text.replace(_OTHERS, "\n".join(other_pages(text, Path(app.srcdir))))
        source[0] = rewrite_links(text, page, ROOT, Path(app.srcdir))
    except DocsiteError as err:  # a warning: the build fails on it, the other pages still read
        _log.warning(str(err), location=docname)


def _include_read(app: Any, relative_path: Path, parent_docname: str, content: list[str]) -> None:
    page = Path(app.srcdir) / f"{parent_docname}.md"
    try:
        content[0] = rewrite_links(content[0], page, ROOT, Path(app.srcdir))
    except DocsiteError as err:
        _log.warning(str(err), location=parent_docname)


def setup(app: Any) -> dict[str, Any]:
    """Sphinx's entry point (docs/conf.py lists this module in `extensions`)."""
    app.setup_extension("sphinx.ext.autodoc")  # whose docstrings `docstring_lines` reads
    app.connect("source-read", _source_read)
    app.connect("include-read", _include_read)
    app.connect("autodoc-process-docstring", _process_docstring)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":  # pragma: no cover  (a generated page, without building the site)
    import sys

    print(GENERATORS[sys.argv[1]]() if len(sys.argv) > 1 else " ".join(sorted(GENERATORS)))
