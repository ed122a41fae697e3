"""The site's machinery: a broken page link or heading anchor fails the build, links out of
docs/ become GitHub URLs (and fail when the file is missing), reference markers are filled, and
the real site builds with a page at every alert's runbook_url."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devcluster import docref, docsite

ROOT = Path(__file__).resolve().parents[2]
SPHINX = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-E", "-q", "-b", "html"]


def build(src: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SPHINX, str(src), str(out)], capture_output=True, text=True, timeout=240, check=False
    )


def small_site(tmp_path: Path, page: str) -> Path:
    """A two-page site with the real extensions and MyST settings, and `page` as `b.md`."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        "extensions = ['myst_parser', 'devcluster.docsite']\n"
        "myst_heading_anchors = 3\n"
        "source_suffix = {'.md': 'markdown'}\n"
    )
    (src / "index.md").write_text("# Home\n\n## A section\n\n```{toctree}\nb\n```\n")
    (src / "b.md").write_text(page)
    return src


@pytest.mark.parametrize(
    "page",
    [
        pytest.param("# B\n\n[home](index.md)\n\n[there](index.md#a-section)\n", id="good links"),
    ],
)
def test_a_site_whose_links_resolve_builds(tmp_path: Path, page: str) -> None:
    done = build(small_site(tmp_path, page), tmp_path / "out")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "page, said",
    [
        pytest.param("# B\n\n[gone](nowhere.md)\n", "nowhere.md", id="a missing page fails"),
        pytest.param(
            "# B\n\n[gone](index.md#no-such-heading)\n",
            "no-such-heading",
            id="a missing heading anchor fails",
        ),
        pytest.param("# B\n\n[gone](#not-here)\n", "not-here", id="a missing local anchor fails"),
    ],
)
def test_a_broken_link_fails_the_build(tmp_path: Path, page: str, said: str) -> None:
    done = build(small_site(tmp_path, page), tmp_path / "out")
    assert done.returncode != 0
    assert said in done.stderr


def test_a_link_to_a_missing_repository_file_fails_the_build(tmp_path: Path) -> None:
    src = small_site(tmp_path, "# B\n\n[x](../../no/such/file.yaml)\n")
    done = build(src, tmp_path / "out")
    assert done.returncode != 0
    assert "no such file in the repository" in done.stderr


def test_links_out_of_docs_become_github_urls_and_code_is_left_alone() -> None:
    page = ROOT / "docs" / "guides" / "x.md"
    text = (
        "[values](../../charts/podcert/values.yaml#L3) [chart](../../charts/podcert)\n"
        "[inside](../hsm.md) [web](https://example.com/) [anchor](#here)\n"
        "```sh\n[not a link](../../nowhere)\n```\n"
    )
    assert docsite.rewrite_links(text, page) == (
        f"[values]({docsite.GITHUB_BLOB}charts/podcert/values.yaml#L3) "
        "[chart](https://github.com/podcert/podcert/tree/main/charts/podcert)\n"
        "[inside](../hsm.md) [web](https://example.com/) [anchor](#here)\n"
        "```sh\n[not a link](../../nowhere)\n```\n"
    )


def test_a_link_to_a_missing_file_outside_docs_is_an_error_naming_it() -> None:
    with pytest.raises(docsite.DocsiteError, match=r"nope\.md"):
        docsite.rewrite_links("[x](../nope.md)\n", ROOT / "docs" / "a.md")


def test_a_marker_is_replaced_by_its_generator_and_an_unknown_one_refused() -> None:
    text = "# T\n\n<!-- podcert-reference: x -->\n"
    assert docsite.fill(text, {"x": lambda: "made"}) == "# T\n\nmade\n"
    with pytest.raises(docsite.DocsiteError, match="'y'"):
        docsite.fill("<!-- podcert-reference: y -->\n", {"x": lambda: ""})


def test_top_level_pages_the_index_does_not_name_are_found(tmp_path: Path) -> None:
    for name in ("index", "hsm", "two-clusters"):
        (tmp_path / f"{name}.md").write_text("# x\n")
    assert docsite.other_pages("```{toctree}\nhsm\n```\n", tmp_path) == ["two-clusters"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT / "docs", out)
    assert done.returncode == 0, done.stderr
    return out


def test_the_site_builds_with_a_page_at_every_alerts_runbook_url(site: Path) -> None:
    for rule in docref.alerts():
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(docref.SITE_URL)
        page = site / url.removeprefix(docref.SITE_URL)
        assert page.is_file(), url
        assert f"<h1>{rule['alert']}" in page.read_text()


def test_the_site_carries_the_generated_reference(site: Path) -> None:
    commands = (site / "reference" / "commands.html").read_text()
    assert 'id="podcert-signer-ca"' in commands
    assert "podcert_signer_requests_total" in (site / "reference" / "metrics.html").read_text()
    assert "TLSSource" in (site / "reference" / "bundles.html").read_text()


def test_every_relative_link_of_the_readme_names_a_file_that_exists() -> None:
    """The README is not a page of the site (GitHub and PyPI show it): its links into docs/ and
    the rest of the repository are checked here, every one as a repository file."""
    readme = ROOT / "README.md"
    outside = ROOT / ".no-docs"  # so that no link is left to MyST: each must name a file
    docsite.rewrite_links(readme.read_text(), readme, ROOT, outside)


def test_a_house_style_docstring_list_becomes_a_restructuredtext_list() -> None:
    lines = [
        "Server, `ServerTLS`:",
        "- `ssl_context()`: listen with it,",
        "  continued here.",
        "- `middleware`: the second.",
        "Prose again.",
        "",
        "Example::",
        "",
        "    - not a list: code",
    ]
    assert docsite.docstring_lines(lines) == [
        "Server, `ServerTLS`:",
        "",
        "- `ssl_context()`: listen with it,",
        "  continued here.",
        "- `middleware`: the second.",
        "",
        "Prose again.",
        "",
        "Example::",
        "",
        "    - not a list: code",
    ]
