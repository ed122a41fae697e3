"""Downgrades: release 0.1.0's own code (its kept wheel, releases/0.1.0/) reads, and carries on,
what today's code persisted: the CA Secret, the audit log, a shim volume. Today writes 0.1.0's
formats (format 1) with the format marked where 0.1.0 ignores it, so rolling back to 0.1.0, or a
0.1.0 replica leading between two of today's, keeps working.

0.1.0 runs in a child interpreter with only the wheel's files ahead of this tree on its path; each
step below prints what it saw as JSON, or fails with its traceback.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from kubelet_shim.atomic import AtomicDirStorage
from kubelet_shim.storage import FileSpec
from podcert.auditlog import verify
from signer.auditlog.writer import AuditLog
from signer.authority import schedule
from signer.authority.castore import FORMAT_KEY, CAStore
from signer.kube import SignerKube
from tests.ca_secrets import SecretKube
from tests.unit.test_persisted import (
    LATER,
    audit_signer,
    entry,
    release_roots,
    release_secret,
)
from tests.unit.test_signer_offline import NOW, TD, _sign_csr, pem_of
from tests.unit.test_signer_offline import ROOT as UPSTREAM_ROOT

ROOT = Path(__file__).resolve().parents[2]
WHEEL = ROOT / "releases" / "0.1.0" / "podcert-0.1.0-py3-none-any.whl"

# Runs inside 0.1.0: `secret FILE` loads and rotates the Secret in FILE (JSON, base64 per key)
# and writes it back; `load FILE` loads it and says what it read, its error and the step due;
# `log FILE` verifies and continues the audit log; `read-volume ROOT` and
# `write-volume ROOT` read and write one shim volume.
RELEASE_SIDE = """
import base64, datetime as dt, json, sys
from pathlib import Path
import signer
assert Path(signer.__file__).parent.parent == Path.cwd(), signer.__file__
from kubelet_shim.atomic import AtomicDirStorage
from kubelet_shim.storage import FileSpec
from signer import auditlog, rotation
from signer.castore import CAStore

NOW = dt.datetime.fromisoformat(sys.argv[3])

class Kube:
    def __init__(self, data): self.data, self.version = data, 1
    def read_secret(self, ns, name): return dict(self.data), str(self.version)
    def replace_secret(self, ns, name, data, version, labels):
        self.data, self.version = dict(data), self.version + 1
        return str(self.version)

what, path = sys.argv[1], Path(sys.argv[2])
if what == "secret":
    kube = Kube({k: base64.b64decode(v) for k, v in json.loads(path.read_text()).items()})
    store = CAStore(kube, "podcert-system", "podcert-ca", lambda: NOW, create=False)
    gens = store.load()
    assert gens is not None, store.error
    prepared = next(g for g in gens if g.state == "prepared")
    after = store.step(rotation.Activate(prepared.id))
    path.write_text(json.dumps({k: base64.b64encode(v).decode() for k, v in kube.data.items()}))
    print(json.dumps({"read": [g.state for g in gens], "wrote": [g.state for g in after]}))
elif what == "load":
    kube = Kube({k: base64.b64decode(v) for k, v in json.loads(path.read_text()).items()})
    store = CAStore(kube, "podcert-system", "podcert-ca", lambda: NOW, create=False)
    gens = store.load()
    due = store.due() if gens is not None else None
    print(json.dumps({"read": [g.state for g in gens] if gens is not None else None,
                      "error": store.error, "due": type(due).__name__ if due else None}))
elif what == "log":
    lines = path.read_bytes().splitlines()
    roots = rotation.trusted_roots(rotation.from_secret(
        {k: base64.b64decode(v) for k, v in json.loads(Path(sys.argv[4]).read_text()).items()},
        NOW))
    result = auditlog.verify(lines, roots, NOW)
    with auditlog.AuditLog(path) as log:
        log.append(auditlog.Entry(time=NOW, namespace="shop", name="old-pcr", uid="u", pod="old",
            node="node-a", service_account="web", decision="denied", reason="PodNotFound",
            signer_name="example.com/podcert"))
        checkpoints = log.checkpoints
    print(json.dumps({"problems": result.problems, "anchored": result.anchored,
                      "entries": result.entries, "checkpoints": checkpoints}))
elif what == "read-volume":
    content = AtomicDirStorage(path).read_volume("uid-1", "creds")
    print(json.dumps({k: v.decode() for k, v in (content or {}).items()}))
elif what == "write-volume":
    files = json.loads(sys.argv[4])
    AtomicDirStorage(path).write_volume(
        "uid-1", "creds", {k: FileSpec(v.encode(), 0o600) for k, v in files.items()}, None)
    print("{}")
"""


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """0.1.0's wheel unpacked: the packages as that release installs them."""
    target = tmp_path_factory.mktemp("podcert-0.1.0")
    with zipfile.ZipFile(WHEEL) as wheel:
        wheel.extractall(target)
    (target / "release_side.py").write_text(RELEASE_SIDE)
    return target


def as_release(release: Path, *args: str) -> Any:
    """Run one step with 0.1.0's code; what it printed, decoded."""
    done = subprocess.run(
        [sys.executable, "-P", str(release / "release_side.py"), *args],
        cwd=release,
        env={**os.environ, "PYTHONPATH": str(release)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def write_secret(path: Path, data: Mapping[str, bytes]) -> None:
    path.write_text(json.dumps({k: base64.b64encode(v).decode() for k, v in data.items()}))


def read_secret(path: Path) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in json.loads(path.read_text()).items()}


def todays_secret() -> dict[str, bytes]:
    """A CA Secret as today's code creates it, then after one rotation step."""
    kube = SecretKube(None)
    store = CAStore(cast(SignerKube, kube), "podcert-system", "podcert-ca", lambda: LATER)
    assert store.load() is not None
    store.step(schedule.Prepare())
    assert kube.data is not None
    return kube.data


def test_0_1_0_reads_and_rotates_a_ca_secret_todays_code_wrote_and_today_reads_it_back(
    release: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.json"
    write_secret(secret, todays_secret())

    seen = as_release(release, "secret", str(secret), LATER.isoformat())

    assert seen == {"read": ["active", "prepared"], "wrote": ["retired", "active"]}
    after = read_secret(secret)
    assert FORMAT_KEY not in after  # 0.1.0 writes what it knows: format 1, unmarked
    kube = SecretKube(after)
    store = CAStore(cast(SignerKube, kube), "podcert-system", "podcert-ca", lambda: LATER)
    assert store.load() is not None and store.error is None
    assert [g.state for g in store.generations] == ["retired", "active"]


def imported_secret() -> tuple[dict[str, bytes], str, dt.datetime]:
    """Today's Secret once an offline root signed the active intermediate directly (as for one
    trust domain across clusters, docs/two-clusters.md), podcert's own first root removed; the
    generation's id and half its life, when 0.1.0's schedule would prepare a successor."""
    kube = SecretKube(None)
    store = CAStore(cast(SignerKube, kube), "podcert-system", "podcert-ca", lambda: NOW)
    assert store.load() is not None
    pending = store.prepare_offline(TD)
    chain = pem_of(_sign_csr(pending.csr), UPSTREAM_ROOT)
    store.import_chain(pending.id, chain)
    store.step(schedule.Activate(pending.id))
    store.step(schedule.Remove(next(g.id for g in store.generations if g.state == "retired")))
    assert kube.data is not None and [g.id for g in store.generations] == [pending.id]
    return kube.data, pending.id, NOW + dt.timedelta(days=16)


def test_0_1_0_refuses_a_ca_secret_holding_an_upstream_signed_generation(
    release: Path, tmp_path: Path
) -> None:
    data, gid, half = imported_secret()
    secret = tmp_path / "secret.json"
    write_secret(secret, data)

    seen = as_release(release, "load", str(secret), half.isoformat())

    assert seen["read"] is None
    assert (
        seen["error"]
        == f"CA Secret podcert-system/podcert-ca: generation {gid}: tls.key: missing or empty"
    )


def test_without_the_key_of_its_own_name_0_1_0_would_rotate_out_of_the_upstreams_trust(
    release: Path, tmp_path: Path
) -> None:
    """Why the upstream-signed key has a name of its own: under `<id>.tls.key` 0.1.0 reads the
    generation as one of its own and, at half its life, prepares a root of its own."""
    data, gid, half = imported_secret()
    data[f"{gid}.tls.key"] = data.pop(f"{gid}.{schedule.UPSTREAM_TLS_KEY}")
    secret = tmp_path / "secret.json"
    write_secret(secret, data)

    seen = as_release(release, "load", str(secret), half.isoformat())

    assert seen == {"read": ["active"], "error": None, "due": "Prepare"}
    # Today reads either name, and writes the upstream's.
    store = CAStore(
        cast(SignerKube, SecretKube(data)), "podcert-system", "podcert-ca", lambda: half
    )
    assert store.load() is not None and store.due() is None


def test_0_1_0_verifies_and_continues_an_audit_log_todays_code_wrote(
    release: Path, tmp_path: Path
) -> None:
    path = tmp_path / "audit.jsonl"
    key, chain = audit_signer()
    with AuditLog(path) as log:
        log.checkpoint(key, chain, LATER, force=True)
        log.append(entry(1))
        log.append(entry(2))
        log.checkpoint(key, chain, LATER + dt.timedelta(seconds=3))
    secret = tmp_path / "secret.json"
    write_secret(secret, release_secret())

    seen = as_release(
        release, "log", str(path), (LATER + dt.timedelta(seconds=5)).isoformat(), str(secret)
    )

    assert seen == {"problems": [], "anchored": True, "entries": 2, "checkpoints": 2}
    result = verify(path.read_bytes().splitlines(), release_roots(), LATER + dt.timedelta(hours=1))
    assert result.problems == []
    assert result.entries == 3  # 0.1.0's own line chained on today's


CREDENTIAL = {"credentialbundle.pem": "-----BEGIN PRIVATE KEY-----\nfixture\n", "ca.pem": "roots"}


def test_a_shim_volume_0_1_0_wrote_is_read_by_today_and_todays_by_0_1_0(
    release: Path, tmp_path: Path
) -> None:
    as_release(release, "write-volume", str(tmp_path), LATER.isoformat(), json.dumps(CREDENTIAL))
    storage = AtomicDirStorage(tmp_path)

    storage.recover_volume("uid-1", "creds")
    content = storage.read_volume("uid-1", "creds")

    assert {k: v.decode() for k, v in (content or {}).items()} == CREDENTIAL
    renewed = {**CREDENTIAL, "ca.pem": "new roots"}
    storage.write_volume(
        "uid-1", "creds", {k: FileSpec(v.encode(), 0o600) for k, v in renewed.items()}, None
    )
    assert as_release(release, "read-volume", str(tmp_path), LATER.isoformat()) == renewed
