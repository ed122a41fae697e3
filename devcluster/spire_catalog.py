"""SPIRE's built-in plugin catalogs, cut to the plugins the devcluster configures.

spire-server and spire-agent register every built-in plugin in one list per plugin type
(`pkg/server/catalog/*.go`, `pkg/agent/catalog/*.go`), so building them compiles the AWS, Azure
and GCP SDKs, client-go and sigstore for plugins the devcluster never loads: 2,342 packages
against 1,076 with only the plugins below, and the cold build is CPU-bound on 2 cores.
`trim_catalogs` rewrites those lists in a copy of SPIRE's source; nothing else of SPIRE changes,
so the server, the agent, their APIs, the bundle endpoint and the Workload API are the release's
own. A configured plugin missing from the catalog is refused by SPIRE at start (a clear error in
the tests, never a silent change), and a release whose catalogs no longer look as expected fails
the build naming the file, so a SPIRE upgrade cannot trim the wrong thing.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from devcluster.build import BuildError

# The plugins kept, by catalog file (the package names its BuiltIn() lists use): exactly what
# `spire.server_config` and `spire.agent_config` configure, plus the two in-tree disk plugins and
# the server's default credential composer, which pull in nothing.
KEPT: dict[str, frozenset[str]] = {
    "pkg/server/catalog/bundlepublisher.go": frozenset(),
    "pkg/server/catalog/credentialcomposer.go": frozenset({"uniqueid"}),
    "pkg/server/catalog/keymanager.go": frozenset({"memory", "disk"}),
    "pkg/server/catalog/nodeattestor.go": frozenset({"jointoken"}),
    "pkg/server/catalog/notifier.go": frozenset(),
    "pkg/server/catalog/upstreamauthority.go": frozenset({"disk"}),
    "pkg/agent/catalog/keymanager.go": frozenset({"memory", "disk"}),
    "pkg/agent/catalog/nodeattestor.go": frozenset({"jointoken"}),
    "pkg/agent/catalog/svidstore.go": frozenset(),
    "pkg/agent/catalog/workloadattestor.go": frozenset({"unix"}),
}

_BUILTINS = re.compile(
    r"BuiltIns\(\) \[\]catalog\.BuiltIn \{\s*return \[\]catalog\.BuiltIn\{(?P<list>[^}]*)\}"
)
_ENTRY = re.compile(r"(\w+)\.BuiltIn\(\)")
_IMPORTS = re.compile(r"^import \((?P<block>.*?)^\)", re.S | re.M)
_IMPORT_LINE = re.compile(r'^\s*(?:(?P<alias>\w+)\s+)?"(?P<path>[^"]+)"\s*$')


def trim_catalog(source: str, kept: frozenset[str], name: str) -> str:
    """One catalog file with only the `kept` plugins in its BuiltIns() list, and without the
    imports of the plugins dropped (Go refuses an unused import)."""
    listed = _BUILTINS.search(source)
    imports = _IMPORTS.search(source)
    if listed is None or imports is None:
        raise BuildError(f"SPIRE's {name} has no BuiltIns() list of the expected form")
    found = _ENTRY.findall(listed["list"])
    if missing := sorted(kept - set(found)):
        raise BuildError(f"SPIRE's {name} lists no {', '.join(missing)} plugin (it lists {found})")
    entries = "".join(f"\n\t\t{alias}.BuiltIn()," for alias in found if alias in kept)
    source = (
        source[: listed.start("list")]
        + (entries + "\n\t" if entries else "")
        + source[listed.end("list") :]
    )
    imports = _IMPORTS.search(source)
    assert imports is not None  # the list sits after the import block, which is untouched
    body = source[imports.end() :]
    lines = [line for line in imports["block"].splitlines(keepends=True) if _still_used(line, body)]
    return source[: imports.start("block")] + "".join(lines) + source[imports.end("block") :]


def _still_used(import_line: str, body: str) -> bool:
    match = _IMPORT_LINE.match(import_line)
    if match is None or "/plugin/" not in match["path"]:
        return True
    alias = match["alias"] or match["path"].rsplit("/", 1)[1]
    return re.search(rf"\b{re.escape(alias)}\.", body) is not None


def trim_catalogs(source_root: Path) -> None:
    """Rewrite every catalog file of a writable copy of SPIRE's source in place."""
    for relative, kept in KEPT.items():
        path = source_root / relative
        if not path.is_file():
            raise BuildError(f"SPIRE's source has no {relative}")
        path.write_text(trim_catalog(path.read_text(), kept, relative))


def recipe_digest() -> str:
    """Part of the binaries' cache key: another plugin list builds them anew."""
    text = repr(sorted((name, sorted(kept)) for name, kept in KEPT.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:8]
