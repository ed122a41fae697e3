"""The example pair, on credentials the shim projects from the signer, under
steady load through 3 forced leaf rotations of both pods and one full CA rotation: zero failed
requests, and the server sees the client's new serial after each rotation. Then `podcert audit`
over the cluster, the node's files and the signer's audit log is clean."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster.stack import Stack, wait_for
from devcluster.testing import DevCluster


@pytest.fixture
def stack(devcluster: DevCluster, tmp_path: Path) -> Iterator[Stack]:
    # Its own signer name and node: nothing else in the session touches them.
    s = Stack(devcluster.root, tmp_path, signer_name="e2e.podcert.dev/workload", node="e2e-node")
    try:
        yield s
    finally:
        s.stop()


def test_pair_survives_leaf_and_ca_rotations_with_zero_failures(
    stack: Stack, tmp_path: Path
) -> None:
    audit_log = tmp_path / "audit.jsonl"
    stack.start_signer(f"--audit-log={audit_log}", "--audit-checkpoint-every=5")
    stack.start_shim()
    pods = stack.create_pods()
    first = {n: stack.wait_identity(p) for n, p in pods.items()}
    stack.start_pair(pods, rate=50)
    seen_client_serials = {first["web"].serial_number}

    def rotate_both() -> None:
        for name, pod in pods.items():
            _, new = stack.rekey(name, pod)
            if name == "web":
                seen_client_serials.add(new.serial_number)
                # The server sees the client's new certificate, without a restart of either.
                stack.wait_server_sees(new, 10)

    for _ in range(3):
        rotate_both()

    # A full CA rotation: the new root reaches both trust files, leaves are re-issued from the
    # new CA, and the old root leaves the trust files.
    stack.ca("prepare")
    wait_for(lambda: all(stack.trust_roots(p) == 2 for p in pods.values()), 10, "two roots")
    stack.ca("activate")
    rotate_both()
    stack.ca("retire", "--force")
    wait_for(lambda: all(stack.trust_roots(p) == 1 for p in pods.values()), 10, "one root")
    rotate_both()  # and once more on the new CA alone

    summary = stack.stop_pair()
    client, server = summary["client"], summary["server"]
    assert client["failed"] == 0, client["errors"]
    assert client["ok"] > 100
    # The server saw every client certificate the rotations produced (new serial each time).
    assert {int(s, 16) for s in server["client_serials"]} >= seen_client_serials
    assert len(seen_client_serials) == 6
    # ... and the client saw the server's new certificates.
    assert len(client["server_serials"]) >= 5

    ns = stack.namespace
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "podcert",
            "audit",
            f"--kubeconfig={stack.admin_kubeconfig}",
            f"--root={stack.work / 'node'}",
            f"--audit-log={audit_log}",
            f"--namespace={ns}",
            "--signer-name",
            stack.signer_name,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = json.loads(done.stdout)
    assert done.returncode == 0, json.dumps(report.get("findings"), indent=1)[:3000]
