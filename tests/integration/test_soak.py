"""The chaos soak, short. Every kind of fault lands once (a whole CA rotation among
them, on a node run by the real kubelet where the machine allows it) while example mTLS pairs
talk; the soak then proves nothing was lost. The 30-minute figures are in BENCHMARKS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.soak_faults import FAULTS
from devcluster import host


# Set-up, 1.5 minutes of faults, then the last CA rotation to its end: a real kubelet picks up a
# new root at its next pod sync, twice (resync every 10 s here; the 30-minute soak keeps the
# kubelet's own minute).
@pytest.mark.timeout(1200)
def test_a_short_soak_loses_nothing_through_every_kind_of_fault(tmp_path: Path) -> None:
    report_file = tmp_path / "soak.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.soak",
            "--minutes=1.5",
            "--pods=40",
            "--kubelet-pods=8",
            "--accounts=6",
            "--pairs=2",
            "--fault-every=5:8",
            "--seed=1",
            "--kubelet-sync-seconds=10",
            f"--dir={tmp_path / 'work'}",
            f"--json={report_file}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = proc.communicate(timeout=1100)
    finally:
        if proc.poll() is None:  # cut short: SIGTERM lets the soak take its cluster down
            proc.terminate()
            proc.communicate(timeout=180)
    assert report_file.exists(), output[-6000:]
    report = json.loads(report_file.read_text())
    failed = {k: v for k, v in report["proofs"].items() if not v["ok"]}
    assert proc.returncode == 0 and not failed, json.dumps(failed, indent=1)[:4000]

    # Every kind of fault was applied, and the CA rotation ran to its end.
    assert set(report["faults"]) == set(FAULTS), report["faults"]
    assert not [e for e in report["log"] if "could not be applied" in e["detail"]]
    assert len(report["ca_rotations"]) >= 1
    # The leader's SIGKILL moved the lease to another replica (a restarted one is a new pod).
    assert len(report["leaders"]) >= 2, report["leaders"]
    # Through all of it the pairs talked, and saw their peers' certificates change.
    for pair in report["proofs"]["mtls"]["pairs"]:
        assert pair["ok"] > 0 and pair["credential_failures"] == 0, pair
        assert pair["server_certificates_seen"] >= 2, pair
    if host.unavailable() is None:
        assert report["kubelet"] == "real"
