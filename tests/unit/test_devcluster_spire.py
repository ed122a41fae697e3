"""devcluster.spire: which SPIRE release the tool module pins, and the configuration it runs
(docs/SPIRE.md shows the same text)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devcluster.build import INTEROP_ROOT, BuildError
from devcluster.spire import Federate, agent_config, server_config, spire_version


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
