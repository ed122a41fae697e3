"""`podcert demo` runs the whole story on its own devcluster and exits 0; one of its nodes is run
by the real kubelet (a real one wherever the machine can)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from devcluster import host


def test_the_demo_tells_the_whole_story_and_exits_zero(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "podcert", "demo", f"--dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-2000:]
    assert "api: spiffe://cluster.local/ns/shop/sa/api" in out
    assert "retired: the old root is gone from every trust file" in out
    assert ", 0 failed;" in out
    assert "Denied (ServiceAccountMismatch)" in out
    assert "healthy" in out
    assert "no process left behind" in out
    # The kubelet's node: its own key and request, the same signer, cleaned up on deletion.
    assert "report: spiffe://cluster.local/ns/shop/sa/report" in out
    assert "requested by node-k" in out
    assert "pod deleted: the kubelet removed its key and certificate from the node" in out
    if host.unavailable() is None:
        assert "run by the real kubelet, containerd + runc" in out
        assert "inside the container on node-k: credentialbundle.pem mode=600" in out
