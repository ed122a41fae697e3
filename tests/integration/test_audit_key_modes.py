"""`podcert audit --root` over a real shim's root reports a key file opened up to
its group or to everyone (`key-readable`), naming the file and its mode and never its content;
what the shim itself writes (keys 0600, trust bundle and chain 0644) audits clean.

The shim is stopped before the files are changed, so nothing it does can race the audit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import processes
from devcluster.testing import DevCluster, eventually
from podcert.cli import main
from tests.integration.conftest import StartShim, StartSigner
from tests.integration.shim_helpers import (
    certificate_volume,
    delete_trust_bundle,
    put_trust_bundle,
    signer_roots,
)

SIGNER = "keymode.podcert.dev/audit"
SIGNER_NAMESPACE = "podcert-keymode"
NODE = "shim-node-keymode"
ROOTS_BUNDLE = "keymode.podcert.dev:audit:roots"


@pytest.fixture(scope="module")
def signer(start_signer: StartSigner) -> processes.Signer:
    return start_signer(SIGNER, namespace=SIGNER_NAMESPACE)


@pytest.fixture(scope="module")
def roots(devcluster: DevCluster, signer: processes.Signer) -> Iterator[None]:
    put_trust_bundle(
        devcluster, ROOTS_BUNDLE, signer_roots(devcluster, SIGNER_NAMESPACE), signer_name=SIGNER
    )
    yield
    delete_trust_bundle(devcluster, ROOTS_BUNDLE)


@pytest.fixture(scope="module")
def written(
    devcluster: DevCluster, start_shim: StartShim, roots: None
) -> tuple[processes.Shim, str]:
    """A pod served by the shim: a credential bundle with the signer's roots beside it, and a
    key + chain pair; the shim stopped once every file is on disk. Returns (shim, pod UID)."""
    shim = start_shim(NODE)
    pod = devcluster.pod(
        devcluster.namespace("keymode"),
        "web",
        node=NODE,
        volumes=[
            certificate_volume(SIGNER, trust={"signerName": SIGNER, "labelSelector": {}}),
            certificate_volume(SIGNER, name="split", split=True),
        ],
    )
    uid = pod.metadata.uid
    for path in (
        shim.volume_dir(uid) / "credentialbundle.pem",
        shim.volume_dir(uid) / "trust.pem",
        shim.volume_dir(uid, "split") / "tls.key",
    ):
        eventually(path.exists, timeout=10, what=str(path))
    shim.stop()
    return shim, uid


def audit(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any], str]:
    capsys.readouterr()
    code = main(["audit", f"--root={root}", "-o", "json"])
    out = capsys.readouterr().out
    return code, json.loads(out), out


def test_what_the_shim_writes_audits_clean(
    written: tuple[processes.Shim, str], capsys: pytest.CaptureFixture[str]
) -> None:
    shim, _ = written

    code, report, _ = audit(shim.root, capsys)

    assert code == 0, report["findings"]
    assert len(report["projections"]) == 2


def test_a_key_file_chmod_to_0644_is_found_by_file_and_mode(
    written: tuple[processes.Shim, str], capsys: pytest.CaptureFixture[str]
) -> None:
    shim, uid = written
    bundle = shim.volume_dir(uid) / "credentialbundle.pem"
    key = shim.volume_dir(uid, "split") / "tls.key"
    # chmod follows the visible link into the live version: the file the pod opens.
    bundle.chmod(0o644)
    key.chmod(0o640)
    (shim.volume_dir(uid) / "trust.pem").chmod(0o644)  # public: never a finding

    code, report, out = audit(shim.root, capsys)

    assert code == 1
    found = sorted((f["kind"], f["subject"], f["message"]) for f in report["findings"])
    assert [(kind, subject) for kind, subject, _ in found] == [
        ("key-readable", f"pod {uid} identity/credentialbundle.pem"),
        ("key-readable", f"pod {uid} split/tls.crt"),
    ]
    assert found[0][2].startswith(
        "credentialbundle.pem holds the private key and is readable by its group and all other "
        "users (mode 0644)"
    )
    assert found[1][2].startswith(
        "tls.key holds the private key and is readable by its group (mode 0640)"
    )
    secret = b"".join(bundle.read_bytes().split(b"-----")[2].split())[:32].decode()
    assert "PRIVATE KEY-----" not in out
    assert secret not in out
