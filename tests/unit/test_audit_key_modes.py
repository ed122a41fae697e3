"""`podcert audit` reports a file holding a pod's private key that its group or others may read
(`key-readable`): the real kubelet writes key files with the volume's defaultMode, 0644 unless
the pod sets one. Trust bundles and certificate chains are public and never judged by mode.

The pure step is fed `VolumeFiles` with modes; the reading is checked on volumes written by the
shim's atomic writer with exact modes, and on plain files.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from audit import Snapshot, audit_findings
from audit.model import VolumeFiles
from audit.snapshot import read_root
from bundles.formats import dump_private_key
from kubelet_shim.atomic import AtomicDirStorage
from kubelet_shim.storage import FileSpec
from podcert.api import volumes
from podcert.cli import main
from signer import certs, model
from signer.authority import ca

T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
NOW = T0 + dt.timedelta(hours=1)
UID = "uid-web"
SIGNER = "example.com/podcert"


@dataclasses.dataclass(frozen=True)
class Material:
    key: bytes  # PKCS#8 PEM
    chain: bytes  # leaf, then the issuing CA
    root: bytes

    @property
    def bundle(self) -> bytes:
        return self.key + self.chain


@pytest.fixture(scope="module")
def material() -> Material:
    authority = ca.new_ca("podcert", T0 - dt.timedelta(days=1))
    key = ec.generate_private_key(ec.SECP256R1())
    plan = model.LeafPlan(
        public_key=key.public_key(),
        spiffe_id="spiffe://td.example/ns/shop/sa/web",
        dns_names=(),
        not_before=T0,
        not_after=T0 + dt.timedelta(hours=24),
        begin_refresh_at=T0 + dt.timedelta(hours=12),
    )
    chain = certs.sign_leaf(plan, ca.issuing_ca(authority), certs.random_serial())
    root = authority.root.public_bytes(serialization.Encoding.PEM)
    return Material(dump_private_key(key), chain.encode(), root)


def findings_for(volume: VolumeFiles) -> list[Any]:
    report = audit_findings(Snapshot(volumes=(volume,)), NOW)
    return [f for f in report.findings if f.kind == "key-readable"]


# Each case: the files in the volume (name -> which material, mode or None when not read), and
# the files expected in findings.
CASES = [
    pytest.param({"credentialbundle.pem": ("bundle", 0o600)}, [], id="a bundle at 0600 is private"),
    pytest.param({"credentialbundle.pem": ("bundle", 0o400)}, [], id="a bundle at 0400 is private"),
    pytest.param(
        {"credentialbundle.pem": ("bundle", 0o640)},
        ["credentialbundle.pem"],
        id="a bundle at 0640 is readable by its group",
    ),
    pytest.param(
        {"credentialbundle.pem": ("bundle", 0o644)},
        ["credentialbundle.pem"],
        id="a bundle at the kubelet's default 0644 is readable by everyone",
    ),
    pytest.param(
        {"credentialbundle.pem": ("bundle", 0o604)},
        ["credentialbundle.pem"],
        id="a bundle at 0604 is readable by others",
    ),
    pytest.param(
        {"credentialbundle.pem": ("bundle", 0o600), "trust-bundle.pem": ("root", 0o644)},
        [],
        id="a trust bundle at 0644 beside a private key is fine",
    ),
    pytest.param({"tls.crt": ("chain", 0o644)}, [], id="a chain-only projection at 0644 is fine"),
    pytest.param(
        {"tls.key": ("key", 0o644), "tls.crt": ("chain", 0o644)},
        ["tls.key"],
        id="a key file at 0644 is found and its chain beside it is not",
    ),
    pytest.param(
        {"tls.key": ("key", 0o600), "tls.crt": ("chain", 0o644)},
        [],
        id="a key file at 0600 with its chain at 0644 is fine",
    ),
    pytest.param(
        {"credentialbundle.pem": ("bundle", 0o644), "tls.key": ("key", 0o600)},
        ["credentialbundle.pem"],
        id="each key-bearing file is judged on its own",
    ),
    pytest.param(
        {"credentialbundle.pem": ("bundle", None)},
        [],
        id="a key whose mode was not read is not judged",
    ),
]


@pytest.mark.parametrize(("layout", "expected"), CASES)
def test_key_bearing_files_readable_beyond_their_owner_are_found(
    material: Material, layout: dict[str, tuple[str, int | None]], expected: list[str]
) -> None:
    files = {name: getattr(material, what) for name, (what, _) in layout.items()}
    modes = {name: mode for name, (_, mode) in layout.items() if mode is not None}

    found = findings_for(VolumeFiles(UID, "identity", files, modes))

    assert [f.message.split(" ", 1)[0] for f in found] == expected
    for finding in found:
        mode = modes[finding.message.split(" ", 1)[0]]
        assert f"(mode {mode:04o})" in finding.message


@pytest.mark.parametrize(
    ("mode", "who"),
    [
        pytest.param(0o640, "readable by its group (", id="group only"),
        pytest.param(0o604, "readable by all other users (", id="others only"),
        pytest.param(0o644, "readable by its group and all other users (", id="group and others"),
    ],
)
def test_the_finding_says_who_may_read_the_key(material: Material, mode: int, who: str) -> None:
    (finding,) = findings_for(
        VolumeFiles(
            UID,
            "identity",
            {"credentialbundle.pem": material.bundle},
            {"credentialbundle.pem": mode},
        )
    )

    assert who in finding.message
    assert finding.subject == f"pod {UID} identity/credentialbundle.pem"


def test_the_finding_names_file_and_mode_never_the_key(material: Material) -> None:
    volume = VolumeFiles(
        UID, "identity", {"credentialbundle.pem": material.bundle}, {"credentialbundle.pem": 0o644}
    )

    report = audit_findings(Snapshot(volumes=(volume,)), NOW)

    text = json.dumps(report.as_json()) + report.summary()
    assert "1 key-readable" in report.summary()
    body = b"".join(material.key.splitlines()[1:-1]).decode()
    for fragment in ("PRIVATE KEY", body[:24], body[-24:]):
        assert fragment not in text


# --- reading modes from a node root ---------------------------------------------------------------


def test_the_reading_carries_the_modes_of_key_files_written_by_an_atomic_writer(
    material: Material, tmp_path: Path
) -> None:
    files = {
        "credentialbundle.pem": FileSpec(material.bundle, 0o640),
        "trust-bundle.pem": FileSpec(material.root, 0o644),
    }
    AtomicDirStorage(tmp_path).write_volume(UID, "identity", files, None)

    (volume,) = read_root(tmp_path)

    # Only the key-bearing file is stat'ed; the trust bundle's mode is never asked for.
    assert volume.modes == {"credentialbundle.pem": 0o640}
    assert [f.message.split(" ", 1)[0] for f in findings_for(volume)] == ["credentialbundle.pem"]


def test_the_reading_follows_a_plain_volumes_visible_files_to_their_modes(
    material: Material, tmp_path: Path
) -> None:
    volume_dir = volumes.volume_dir(tmp_path, UID, "identity")
    (volume_dir / "keys").mkdir(parents=True)
    key = volume_dir / "keys" / "tls.key"
    key.write_bytes(material.key)
    key.chmod(0o644)
    (volume_dir / "tls.crt").write_bytes(material.chain)

    (volume,) = read_root(tmp_path)

    assert volume.modes == {"keys/tls.key": 0o644}
    assert [f.message.split(" ", 1)[0] for f in findings_for(volume)] == ["keys/tls.key"]


# --- joined with the pod, and from the command line -----------------------------------------------


def pod_with(**source: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "shop", "name": "web", "uid": UID},
        "spec": {
            "nodeName": "node-a",
            "volumes": [
                {
                    "name": "identity",
                    "projected": {
                        "sources": [
                            {
                                "podCertificate": {
                                    "signerName": SIGNER,
                                    "keyType": "ECDSAP256",
                                    **source,
                                }
                            }
                        ]
                    },
                }
            ],
        },
    }


def test_a_readable_key_file_is_reported_on_its_pods_projection_even_beside_a_bundle(
    material: Material, tmp_path: Path
) -> None:
    # One projection writes the bundle and a key file; only the key file was opened up.
    files = {
        "credentialbundle.pem": FileSpec(material.bundle, 0o600),
        "tls.key": FileSpec(material.key, 0o644),
    }
    AtomicDirStorage(tmp_path).write_volume(UID, "identity", files, None)
    pod = pod_with(credentialBundlePath="credentialbundle.pem", keyPath="tls.key")

    report = audit_findings(Snapshot(pods=(pod,), volumes=read_root(tmp_path)), NOW)

    (projection,) = report.projections
    assert [(f.kind, f.subject) for f in projection.findings] == [
        ("key-readable", "shop/web identity/credentialbundle.pem")
    ]
    assert projection.findings[0].message.startswith("tls.key holds the private key")
    assert report.findings == projection.findings


def test_the_command_exits_1_on_a_readable_key(
    material: Material, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = {"credentialbundle.pem": FileSpec(material.bundle, 0o644)}
    AtomicDirStorage(tmp_path).write_volume(UID, "identity", files, None)

    code = main(["audit", f"--root={tmp_path}", "--now=2026-05-01T13:00:00Z", "-o", "json"])

    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [(f["kind"], f["subject"]) for f in report["findings"]] == [
        ("key-readable", f"pod {UID} identity/credentialbundle.pem")
    ]
