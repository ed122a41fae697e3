"""`podcert audit` against the real API server, the real signer and its audit log.

The node's half is played by the test: requests are made as the node (NodeRestriction applies),
and what the node would write into the pods' volumes is written with the shim's atomic writer.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from devcluster.identities import Paths
from devcluster.testing import DevCluster, eventually
from kubelet_shim.atomic import AtomicDirStorage
from kubelet_shim.storage import FileSpec
from podcert.cli import main
from podcert.client.rest import Rest, path_of
from tests.integration.conftest import StartSigner
from tests.integration.helpers import condition, make_pod, request_as_node, settled

SIGNER = "audit.podcert.dev/test"
NOBODY = "nobody.podcert.dev/unserved"
NAMESPACE = "podcert-audit"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("audit")


@pytest.fixture(scope="module")
def signer(start_signer: StartSigner, work: Path) -> Any:
    # A checkpoint after every line: the log is anchored as soon as it has an entry.
    return start_signer(
        SIGNER,
        namespace=NAMESPACE,
        workdir=work,
        audit_log=work / "audit.jsonl",
        audit_checkpoint_every=1,
    )


@pytest.fixture(scope="module")
def healthy(devcluster: DevCluster, signer: Any, work: Path) -> str:
    """Two pods with issued credentials on the node, and the signer's trust bundle published."""
    ns = devcluster.namespace("audit")
    storage = AtomicDirStorage(work / "node")
    for name in ("web-0", "web-1"):
        pod = make_pod(devcluster, ns, name, SIGNER)
        key, pcr = request_as_node(devcluster, pod, SIGNER)
        done = settled(devcluster, pcr)
        assert condition(done).type == "Issued"
        bundle = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        files = {
            "credentialbundle.pem": FileSpec(
                bundle + done["status"]["certificateChain"].encode(), 0o600
            )
        }
        storage.write_volume(pod.metadata.uid, "identity", files, None)

    rest = Rest(devcluster.admin)
    ctbs = path_of("certificates.k8s.io/v1", "clustertrustbundles")

    def published() -> bool:
        items = rest.request("GET", ctbs)["items"]
        return any(item["spec"].get("signerName") == SIGNER for item in items)

    eventually(published, timeout=15, what=f"a ClusterTrustBundle for {SIGNER}")
    return ns


def audit(
    devcluster: DevCluster, work: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, dict[str, Any]]:
    """`podcert audit -o json` over the cluster, the node root and the signer's log."""
    capsys.readouterr()
    code = main(
        [
            "audit",
            f"--kubeconfig={Paths(devcluster.root.resolve()).admin_kubeconfig}",
            f"--root={work / 'node'}",
            f"--audit-log={work / 'audit.jsonl'}",
            "-o",
            "json",
            *extra,
        ]
    )
    return code, json.loads(capsys.readouterr().out)


def test_a_healthy_cluster_node_and_log_audit_clean(
    devcluster: DevCluster, work: Path, healthy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = audit(devcluster, work, capsys, f"--namespace={healthy}")

    assert code == 0, report["findings"]
    projections = {p["pod"]: p for p in report["projections"]}
    assert set(projections) == {"web-0", "web-1"}
    for name, projection in projections.items():
        assert projection["state"] == "fresh"
        assert projection["spiffeID"].endswith(f"/ns/{healthy}/sa/default"), name
        assert projection["refreshHint"] == "request"  # joined to its request
        assert projection["path"] == "credentialbundle.pem"  # and to its file on the node
        assert projection["rotations"] == 1
    assert report["auditLogs"][0]["anchored"] is True
    assert report["auditLogs"][0]["firstBrokenLine"] is None
    assert any(SIGNER.replace("/", ":") in s for r in report["roots"] for s in r["sources"])


def test_a_request_for_a_signer_nobody_serves_is_stuck(
    devcluster: DevCluster, work: Path, healthy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = devcluster.namespace("audit-stuck")
    pod = make_pod(devcluster, ns, "orphan", NOBODY)
    request_as_node(devcluster, pod, NOBODY)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=10)

    code, report = audit(
        devcluster,
        work,
        capsys,
        f"--namespace={healthy}",
        f"--namespace={ns}",
        f"--now={later.strftime('%Y-%m-%dT%H:%M:%SZ')}",
    )

    assert code == 1
    (finding,) = report["findings"]
    assert finding["kind"] == "stuck"
    assert finding["subject"].startswith(f"{ns}/orphan ")
    assert NOBODY in finding["message"]
    states = {p["pod"]: p["state"] for p in report["projections"]}
    assert states == {"web-0": "fresh", "web-1": "fresh", "orphan": "stuck"}
