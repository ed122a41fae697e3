"""Sphinx configuration of podcert's documentation site (`make docs`).

The pages are Markdown (MyST). The build runs with warnings as errors and nitpicky references
(`make docs`: `sphinx-build -W --keep-going -n -E`), so a broken page link, a missing heading
anchor (`[x](page.md#anchor)`), a page in no toctree or a docstring that does not parse fails
the test command. The reference pages are filled in from the code at build time by
`devcluster.docsite` (commands, policy, metrics, alerts, reasons and Events), and the `bundles`
API from its docstrings by autodoc.

Published at SITE_URL: an alert's runbook_url is SITE_URL + "runbooks/<Alert>.html"
(`devcluster.docsite.runbook_url`; tests/unit/test_monitoring.py holds the two equal).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devcluster.docsite import SITE_URL  # noqa: E402  (the checkout, put on the path above)
from podcert import __version__  # noqa: E402

project = "podcert"
author = "the podcert authors"
copyright = "the podcert authors"
release = __version__
version = __version__
html_baseurl = SITE_URL

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "devcluster.docsite",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Every heading up to level 3 gets an anchor, so `[x](page.md#anchor)` is checked like a page.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]
myst_all_links_external = False

# The `bundles` API from its docstrings: written as plain prose with `code` spans.
default_role = "code"
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_inherit_docstrings = False  # a library's own words on a method we override are not ours

html_theme = "furo"
html_title = f"podcert {__version__}"
html_show_sourcelink = False
html_copy_source = False

# Types from outside podcert (the standard library, cryptography) have no page here: the site is
# built offline, without intersphinx. `bundles`' own names must resolve, but for its private
# type aliases, which the signatures show by name.
nitpick_ignore_regex = [
    ("py:class", r"(?!bundles\.).*\..*"),
    ("py:class", r"Path|StrPath|Clock|Wake|Authorizer|RefusalHook|_\w+|bundles\.spiffe\.Workload"),
]
# A Pygments lexer that retries a block in relaxed mode (the HCL of SPIRE's configuration)
# still highlights it: not an error of the page.
suppress_warnings = ["misc.highlighting_failure"]
