"""devcluster.spire: which SPIRE release the tool module pins, and the configuration it runs
(docs/SPIRE.md shows the same text)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devcluster.build import INTEROP_ROOT, BuildError
from devcluster.spire import Federate, agent_config, server_config, spire_version
from devcluster.spire_catalog import KEPT, trim_catalog


def test_the_tool_module_pins_spire_1_13_3_server_and_agent() -> None:
    go_mod = (INTEROP_ROOT / "spire" / "go.mod").read_text()
    assert spire_version(go_mod) == "v1.13.3"
    assert "github.com/spiffe/spire/cmd/spire-server" in go_mod
    assert "github.com/spiffe/spire/cmd/spire-agent" in go_mod
    with pytest.raises(BuildError):
        spire_version("module x\n\ngo 1.24\n")


def test_the_server_federates_over_https_spiffe_and_serves_its_bundle() -> None:
    text = server_config(
        "spire.test",
        Path("/d"),
        Path("/s/server.sock"),
        8081,
        8443,
        [Federate("podcert.test", "https://127.0.0.1:9443/", "spiffe://podcert.test/podcert/x")],
    )
    assert 'trust_domain = "spire.test"' in text
    assert 'bundle_endpoint {\n            address = "127.0.0.1"\n            port = 8443' in text
    assert 'federates_with "podcert.test" {' in text
    assert 'endpoint_spiffe_id = "spiffe://podcert.test/podcert/x"' in text
    assert 'NodeAttestor "join_token"' in text


def test_the_agent_attests_with_a_join_token_and_workloads_with_unix() -> None:
    text = agent_config("spire.test", Path("/d"), Path("/s/agent.sock"), 8081, Path("/b.pem"), "t")
    assert 'join_token = "t"' in text and 'trust_bundle_path = "/b.pem"' in text
    assert 'WorkloadAttestor "unix"' in text


# A catalog file as SPIRE v1.13.3 writes it (pkg/server/catalog/keymanager.go).
KEY_MANAGERS = """package catalog

import (
\t"github.com/spiffe/spire/pkg/common/catalog"

\t"github.com/spiffe/spire/pkg/server/plugin/keymanager"
\t"github.com/spiffe/spire/pkg/server/plugin/keymanager/awskms"
\t"github.com/spiffe/spire/pkg/server/plugin/keymanager/disk"
\tkms "github.com/spiffe/spire/pkg/server/plugin/keymanager/gcpkms"
\t"github.com/spiffe/spire/pkg/server/plugin/keymanager/memory"
)

type keyManagerRepository struct {
\tkeymanager.Repository
}

func (repo *keyManagerRepository) BuiltIns() []catalog.BuiltIn {
\treturn []catalog.BuiltIn{
\t\tawskms.BuiltIn(),
\t\tdisk.BuiltIn(),
\t\tkms.BuiltIn(),
\t\tmemory.BuiltIn(),
\t}
}
"""


def test_a_trimmed_catalog_lists_only_the_kept_plugins_and_imports_only_what_it_uses() -> None:
    trimmed = trim_catalog(KEY_MANAGERS, frozenset({"memory"}), "keymanager.go")
    assert "\t\tmemory.BuiltIn(),\n\t}" in trimmed
    assert "awskms" not in trimmed and "kms" not in trimmed and "disk" not in trimmed
    # The plugin type's own package is still used (keymanager.Repository), so it stays.
    assert '"github.com/spiffe/spire/pkg/server/plugin/keymanager"\n' in trimmed
    assert '"github.com/spiffe/spire/pkg/common/catalog"' in trimmed
    emptied = trim_catalog(KEY_MANAGERS, frozenset(), "keymanager.go")
    assert "return []catalog.BuiltIn{}" in emptied and "memory" not in emptied


def test_a_catalog_that_lacks_a_kept_plugin_or_the_expected_form_fails_the_build() -> None:
    with pytest.raises(BuildError, match=r"keymanager\.go lists no vault plugin"):
        trim_catalog(KEY_MANAGERS, frozenset({"vault"}), "keymanager.go")
    with pytest.raises(BuildError, match="no BuiltIns"):
        trim_catalog("package catalog\n", frozenset(), "notifier.go")


def test_every_plugin_the_configurations_name_is_kept() -> None:
    """The plugins `server_config` and `agent_config` configure are the ones the build keeps
    (SPIRE's sql DataStore is no catalog entry)."""
    configs = {
        "server": server_config("a.test", Path("/d"), Path("/s"), 1, 2, []),
        "agent": agent_config("a.test", Path("/d"), Path("/s"), 1, Path("/b"), "t"),
    }
    for side, text in configs.items():
        for kind, name in re.findall(r'^\s*(\w+) "(\w+)" \{', text, re.M):
            if kind in ("DataStore", "profile", "federates_with", "bundle_endpoint_profile"):
                continue
            kept = KEPT[f"pkg/{side}/catalog/{kind.lower()}.go"]
            assert name.replace("_", "") in kept, (side, kind, name)
