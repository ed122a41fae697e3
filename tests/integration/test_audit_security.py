"""Attacks on the audit log, replayed against the real API server and the real signer.

Each test is an attack that used to pass as "healthy" (or a fault that used to fail open); each
now ends in a finding and exit 1 (or no issuance). The node's half is played by the test: requests
are made as the node (NodeRestriction applies) and what a node would write into a pod's volume is
written with the shim's atomic writer.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from devcluster import processes
from devcluster.identities import Paths
from devcluster.testing import DevCluster, eventually
from kubelet_shim.atomic import AtomicDirStorage
from kubelet_shim.storage import FileSpec
from podcert.api.requests import outcome
from podcert.cli import main
from podcert.client.rest import Rest, path_of
from signer.auditlog import writer
from tests.integration.conftest import StartSigner
from tests.integration.fault_helpers import fill, small_filesystem
from tests.integration.helpers import PCRS, condition, make_pod, request_as_node, settled

SIGNER = "forge.podcert.dev/test"
NAMESPACE = "podcert-forge"
FULL_SIGNER = "full.podcert.dev/test"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("audit-security")


@pytest.fixture(scope="module")
def signer(start_signer: StartSigner, work: Path) -> processes.Signer:
    # A checkpoint after every entry: each issuance is its own signed prefix to cut back to.
    return start_signer(
        SIGNER,
        namespace=NAMESPACE,
        workdir=work,
        audit_log=work / "audit.jsonl",
        audit_checkpoint_every=1,
    )


@pytest.fixture(scope="module")
def pods(devcluster: DevCluster, signer: processes.Signer, work: Path) -> dict[str, Any]:
    """Three pods with issued credentials on the node; returns name -> (pod, key, issued pcr)."""
    ns = devcluster.namespace("forge")
    storage = AtomicDirStorage(work / "node")
    out: dict[str, Any] = {}
    for name in ("web-0", "web-1", "web-2"):
        pod = make_pod(devcluster, ns, name, SIGNER)
        key, pcr = request_as_node(devcluster, pod, SIGNER)
        done = settled(devcluster, pcr)
        assert condition(done).type == "Issued"
        storage.write_volume(pod.metadata.uid, "identity", _files(key, done), None)
        out[name] = (pod, key, done)
    rest = Rest(devcluster.admin)

    def published() -> bool:
        items = rest.request("GET", path_of("certificates.k8s.io/v1", "clustertrustbundles"))
        return any(i["spec"].get("signerName") == SIGNER for i in items["items"])

    eventually(published, timeout=15, what=f"a ClusterTrustBundle for {SIGNER}")
    return out


def _files(key: Any, pcr: dict[str, Any]) -> dict[str, FileSpec]:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    bundle = pem + pcr["status"]["certificateChain"].encode()
    return {"credentialbundle.pem": FileSpec(bundle, 0o600)}  # a readable key is a finding


def audit(devcluster: DevCluster, *args: str) -> tuple[int, dict[str, Any]]:
    """`podcert audit -o json` with the cluster's kubeconfig (and so its trust bundles)."""
    code, out = audit_raw(
        f"--kubeconfig={Paths(devcluster.root.resolve()).admin_kubeconfig}", *args
    )
    return code, json.loads(out)


def audit_raw(*args: str) -> tuple[int, str]:
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(["audit", "-o", "json", *args])
    return code, buffer.getvalue()


def messages(report: dict[str, Any], kind: str) -> list[str]:
    return [f["message"] for f in report["findings"] if f["kind"] == kind]


# --- forging: what an attacker with write access to the log file does --------------------------


def rechain(lines: list[bytes], sign: tuple[ec.EllipticCurvePrivateKey, list[str]] | None) -> bytes:
    """Renumber, recompute every prev, and (with `sign`) re-sign every checkpoint."""
    out: list[bytes] = []
    prev, number = writer.GENESIS, 0
    for seq, line in enumerate(lines, start=1):
        obj = json.loads(line)
        obj["seq"], obj["prev"] = seq, prev
        if obj["kind"] == "checkpoint" and sign is not None:
            number += 1
            key, x5c = sign
            claims = {"head": prev, "lines": seq - 1, "n": number, "iat": int(_now().timestamp())}
            obj["jwt"] = jwt.encode(claims, key, algorithm="ES256", headers={"x5c": x5c})
        out.append(json.dumps(obj, separators=(",", ":")).encode())
        prev = hashlib.sha256(out[-1]).hexdigest()
    return b"".join(line + b"\n" for line in out)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _invented(lines: list[bytes], pods: dict[str, Any]) -> list[bytes]:
    """The log with one more issuance: an admin identity nobody was given."""
    first = json.loads(next(line for line in lines if b'"kind":"entry"' in line))
    first.update(
        namespace="kube-system",
        name="req-admin",
        uid="00000000-0000-0000-0000-00000000ad31",
        pod="admin",
        service_account="admin",
        spiffe_id=first["spiffe_id"].split("/ns/")[0] + "/ns/kube-system/sa/admin",
        serial="abcdef",
    )
    return [*lines, json.dumps(first, separators=(",", ":")).encode()]


def _log_lines(work: Path) -> list[bytes]:
    return (work / "audit.jsonl").read_bytes().splitlines()


def test_the_real_log_is_healthy_and_anchored(
    devcluster: DevCluster, work: Path, pods: dict[str, Any], signer: processes.Signer
) -> None:
    number = _metric(signer, "podcert_signer_audit_checkpoint")
    code, report = audit(
        devcluster,
        f"--audit-log={work / 'audit.jsonl'}",
        f"--root={work / 'node'}",
        f"--signer-name={SIGNER}",
        f"--min-checkpoint={number:.0f}",
    )
    assert code == 0, report["findings"]
    (log,) = report["auditLogs"]
    assert log["anchored"] and log["lastCheckpoint"] == number >= 4  # opening + one per entry


def test_a_checkpoint_signed_with_a_pods_own_key_is_refused(
    devcluster: DevCluster, work: Path, pods: dict[str, Any]
) -> None:
    # The pod's key and chain, as read from its volume: trusted under the real roots for TLS.
    _, key, pcr = pods["web-0"]
    chain = x509.load_pem_x509_certificates(pcr["status"]["certificateChain"].encode())
    x5c = [base64.b64encode(c.public_bytes(serialization.Encoding.DER)).decode() for c in chain]
    forged = work / "forged-with-pod-key.jsonl"
    forged.write_bytes(rechain(_invented(_log_lines(work), pods), (key, x5c)))

    code, report = audit(devcluster, f"--audit-log={forged}", f"--signer-name={SIGNER}")

    assert code == 1
    (log,) = report["auditLogs"]
    assert not log["anchored"]
    assert any("is not signed by an audit certificate" in m for m in messages(report, "audit-log"))


def test_a_rewrite_without_checkpoints_and_with_fresh_times_is_refused(
    devcluster: DevCluster, work: Path, pods: dict[str, Any]
) -> None:
    fresh = _now().isoformat().replace("+00:00", "Z")
    entries = [
        json.dumps({**json.loads(line), "time": fresh}, separators=(",", ":")).encode()
        for line in _invented(_log_lines(work), pods)
        if b'"kind":"entry"' in line
    ]
    forged = work / "forged-no-checkpoints.jsonl"
    forged.write_bytes(rechain(entries, None))

    # Audited 10 minutes on, as an operator would later: the cluster's issuance times then lie
    # beyond the checkpoint lag, whatever times the forger wrote.
    later = (_now() + dt.timedelta(minutes=10)).isoformat().replace("+00:00", "Z")
    code, report = audit(
        devcluster, f"--audit-log={forged}", f"--signer-name={SIGNER}", f"--now={later}"
    )

    assert code == 1
    found = messages(report, "audit-log")
    assert any("no checkpoint signed by the signer's audit certificate" in m for m in found)
    assert any("newest signed checkpoint is from never" in m for m in found)


def test_without_trust_roots_the_log_is_not_vouched_for(work: Path, pods: dict[str, Any]) -> None:
    code, out = audit_raw(f"--audit-log={work / 'audit.jsonl'}")
    report = json.loads(out)
    assert code == 1
    assert any("no trust roots were given" in m for m in messages(report, "audit-log"))

    # A self-signed checkpoint, or an empty file, is no better.
    empty = work / "empty.jsonl"
    empty.write_bytes(b"")
    assert audit_raw(f"--audit-log={empty}")[0] == 1

    # The operator may ask for the chain alone, and is told what that proves.
    code, out = audit_raw(f"--audit-log={work / 'audit.jsonl'}", "--chain-only")
    report = json.loads(out)
    assert code == 0, report["findings"]
    assert any("not vouched for" in note for note in report["notes"])


def test_an_empty_log_with_the_cluster_is_refused(devcluster: DevCluster, work: Path) -> None:
    empty = work / "empty-with-cluster.jsonl"
    empty.write_bytes(b"")
    code, report = audit(devcluster, f"--audit-log={empty}", f"--signer-name={SIGNER}")
    assert code == 1
    assert messages(report, "audit-log")


def test_a_log_cut_back_to_an_earlier_checkpoint_is_caught(
    devcluster: DevCluster, work: Path, pods: dict[str, Any], signer: processes.Signer
) -> None:
    lines = _log_lines(work)
    # Cut right after the second checkpoint: a consistent prefix every signature still holds.
    checkpoints = [i for i, line in enumerate(lines) if b'"kind":"checkpoint"' in line]
    cut = work / "cut.jsonl"
    cut.write_bytes(b"".join(line + b"\n" for line in lines[: checkpoints[1] + 1]))

    code, report = audit(devcluster, f"--audit-log={cut}", f"--signer-name={SIGNER}")

    assert code == 1
    (log,) = report["auditLogs"]
    assert log["anchored"] and log["firstBrokenLine"] is None  # the prefix itself is intact
    missing = messages(report, "not-in-audit-log")
    assert len(missing) >= 2, report["findings"]  # web-1 and web-2 were issued after the cut

    # The signer's own counter says how far the log must reach.
    number = _metric(signer, "podcert_signer_audit_checkpoint")
    code, report = audit(
        devcluster, f"--audit-log={cut}", f"--min-checkpoint={number:.0f}", "--namespace=none"
    )
    assert code == 1
    assert any("signer had written number" in m for m in messages(report, "audit-log"))


def test_another_pods_credential_in_a_volume_is_found(
    devcluster: DevCluster, work: Path, pods: dict[str, Any]
) -> None:
    pod, _, _ = pods["web-2"]
    _, their_key, their_pcr = pods["web-1"]
    root = work / "node-copied"
    storage = AtomicDirStorage(root)
    storage.write_volume(pod.metadata.uid, "identity", _files(their_key, their_pcr), None)
    theirs, _, _ = pods["web-1"]
    storage.write_volume(theirs.metadata.uid, "identity", _files(their_key, their_pcr), None)

    code, report = audit(
        devcluster,
        f"--root={root}",
        f"--audit-log={work / 'audit.jsonl'}",
        f"--signer-name={SIGNER}",
    )

    assert code == 1
    web2 = next(p for p in report["projections"] if p["pod"] == "web-2")
    kinds = {f["kind"] for f in web2["findings"]}
    assert {"wrong-identity", "credential-shared"} <= kinds, web2["findings"]


# --- fail closed: a full file system stops issuance -------------------------------------------


def test_a_full_audit_log_stops_issuance_and_readiness_until_space_returns(
    devcluster: DevCluster, work: Path
) -> None:
    mount = work / "small-log"
    with small_filesystem(mount) as kind:
        proc = processes.signer(
            devcluster.root,
            work,
            [FULL_SIGNER],
            namespace="podcert-full",
            extra=[f"--audit-log={mount / 'audit.jsonl'}"],
        ).start()
        try:
            proc.wait_ready()
            ns = devcluster.namespace("full")
            filler = fill(mount)
            # The log's last page may still hold a line or two: keep asking until one is refused.
            pcr = None
            for attempt in range(20):
                pod = make_pod(devcluster, ns, f"cramped-{attempt}", FULL_SIGNER)
                _, pcr = request_as_node(devcluster, pod, FULL_SIGNER)
                refused = eventually(
                    lambda p=pcr: "refused" if not proc.ready() else _issued(devcluster, p),
                    timeout=15,
                    what="an issuance or a refusal",
                )
                if refused == "refused":
                    break
            assert pcr is not None and not proc.ready(), "the log never filled up"

            # Refused by the log, so nothing is issued: not ready, counted, retried.
            assert _metric(proc, "podcert_signer_audit_log_writable") == 0
            eventually(
                lambda: (
                    _metric(proc, 'podcert_signer_retries_total{reason="AuditLogUnwritable"}') >= 2
                ),
                timeout=15,
                what="two refused issuances",
            )
            assert _metric(proc, "podcert_signer_audit_log_errors_total") >= 2
            assert outcome(_get(devcluster, pcr)) is None
            assert "PRIVATE KEY" not in proc.output()

            filler.unlink()
            done = settled(devcluster, pcr, timeout=60)
            assert condition(done).type == "Issued"
            eventually(proc.ready, timeout=15, what="the signer to be ready again")
            assert _metric(proc, "podcert_signer_audit_log_writable") == 1
        finally:
            proc.stop()
        # Everything issued is in the log, and the log verifies.
        lines = (mount / "audit.jsonl").read_bytes().splitlines()
        leaf = x509.load_pem_x509_certificates(done["status"]["certificateChain"].encode())[0]
        issued = {e.serial for e in writer.iter_entries(lines) if e.decision == "issued"}
        assert f"{leaf.serial_number:x}" in issued
        assert writer.verify(lines, None, _now()).ok
    print(f"on a {kind}: issuance held while the log was full, resumed when space returned")


def _issued(devcluster: DevCluster, pcr: dict[str, Any]) -> str | None:
    return "issued" if outcome(_get(devcluster, pcr)) == "Issued" else None


def _get(devcluster: DevCluster, pcr: dict[str, Any]) -> dict[str, Any]:
    meta = pcr["metadata"]
    path = path_of(PCRS, "podcertificaterequests", meta["namespace"]) + "/" + meta["name"]
    found: dict[str, Any] = Rest(devcluster.admin).request("GET", path)
    return found


def _metric(proc: processes.Signer, name: str) -> float:
    """A sample's value; `name` may carry labels as Prometheus prints them."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", re.MULTILINE)
    if "{" in name:
        pattern = re.compile(rf"^{re.escape(name)} ([0-9.e+-]+)$", re.MULTILINE)
    found = pattern.findall(proc.metrics())
    return float(found[0]) if found else 0.0
