"""`podcert status`, `explain pod`, `version` and `inspect` against the real API server and real
signers: one that issues and denies, one that has stopped (its lease released).

The node's half is played by the test (requests made as the node, NodeRestriction applies). Each
command's table is recorded as the test's `sample` property (`--junitxml` keeps them): what a
person sees, from a real run (`-o junit_family=xunit1 --junitxml=FILE`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from devcluster.identities import Paths
from devcluster.testing import DevCluster, eventually
from podcert import __version__
from podcert.cli import main
from podcert.client.rest import Rest, path_of
from podcert.errors import EXIT_FINDINGS, EXIT_OK
from signer.leader import SIGNER_NAMES_ANNOTATION, VERSION_ANNOTATION
from tests.integration.conftest import StartSigner
from tests.integration.helpers import condition, make_pod, request_as_node, settled

SIGNER = "report.podcert.dev/main"
DOWN = "report.podcert.dev/down"
TRUST_DOMAIN = "td.report"
NS = "podcert-rep"
DOWN_NS = "podcert-rep-down"
POLICY = """
signers:
  - name: {signer}
    trustDomain: {trust_domain}
    keyTypes: [ECDSAP256]
    allow:
      - namespaces: ["rep-*"]
        serviceAccounts: ["*"]
"""

Run = Callable[..., tuple[int, str]]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("report")
    for name, signer in (("policy.yaml", SIGNER), ("down.yaml", DOWN)):
        (work / name).write_text(POLICY.format(signer=signer, trust_domain=TRUST_DOMAIN))
    return work


def _lease(devcluster: DevCluster, namespace: str) -> dict[str, Any] | None:
    path = path_of("coordination.k8s.io/v1", "leases", namespace, "podcert-signer")
    return Rest(devcluster.admin).get(path)


def _holder(devcluster: DevCluster, namespace: str) -> str | None:
    lease = _lease(devcluster, namespace) or {}
    return (lease.get("spec") or {}).get("holderIdentity") or None


@pytest.fixture(scope="module")
def signer(devcluster: DevCluster, start_signer: StartSigner, work: Path) -> Any:
    proc = start_signer(SIGNER, namespace=NS, workdir=work, policy=work / "policy.yaml")
    eventually(lambda: _holder(devcluster, NS), timeout=20, what="the signer's lease")
    return proc


@pytest.fixture(scope="module")
def stopped(devcluster: DevCluster, start_signer: StartSigner, work: Path) -> None:
    """A signer for DOWN that led once, then stopped cleanly (it released its lease)."""
    proc = start_signer(DOWN, namespace=DOWN_NS, workdir=work, policy=work / "down.yaml")
    eventually(lambda: _holder(devcluster, DOWN_NS), timeout=20, what="the down signer's lease")
    proc.stop()
    eventually(
        lambda: _lease(devcluster, DOWN_NS) is not None and _holder(devcluster, DOWN_NS) is None,
        timeout=20,
        what="the stopped signer's lease released",
    )


@pytest.fixture
def run(
    devcluster: DevCluster,
    capsys: pytest.CaptureFixture[str],
    record_property: Callable[[str, object], None],
) -> Run:
    """`podcert <argv> --kubeconfig=<admin>`: (exit code, stdout); a table is recorded."""
    kubeconfig = Paths(devcluster.root.resolve()).admin_kubeconfig

    def run(*argv: str, cluster: bool = True) -> tuple[int, str]:
        capsys.readouterr()
        code = main([*argv, *([f"--kubeconfig={kubeconfig}"] if cluster else [])])
        out = capsys.readouterr().out
        if "-o" not in argv:
            record_property("sample", f"$ podcert {' '.join(argv)}   (exit {code})\n{out}")
        return code, out

    return run


@pytest.fixture(scope="module")
def issued(devcluster: DevCluster, signer: Any, work: Path) -> tuple[str, Path]:
    """A pod with an issued credential, its bundle written as the kubelet writes it."""
    ns = devcluster.namespace("rep")
    pod = make_pod(devcluster, ns, "web", SIGNER)
    key, pcr = request_as_node(devcluster, pod, SIGNER)
    done = settled(devcluster, pcr)
    assert condition(done).type == "Issued"
    pkcs8 = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    bundle = work / "credentialbundle.pem"
    bundle.write_bytes(pkcs8 + done["status"]["certificateChain"].encode())
    return ns, bundle


@pytest.fixture(scope="module")
def denied(devcluster: DevCluster, signer: Any) -> str:
    """A pod in a namespace the policy does not allow: its request is denied PolicyDenied."""
    ns = devcluster.namespace("elsewhere")
    pod = make_pod(devcluster, ns, "api", SIGNER)
    _, pcr = request_as_node(devcluster, pod, SIGNER)
    assert condition(settled(devcluster, pcr)).reason == "PolicyDenied"
    return ns


def test_status_names_the_leader_the_ca_the_bundles_and_the_denials(
    devcluster: DevCluster, issued: tuple[str, Path], denied: str, run: Run
) -> None:
    code, table = run("status", "-n", NS)

    assert code == EXIT_OK, table
    assert f"Signer names:  {SIGNER}  (from the lease)" in table
    assert f"Leader:        {_holder(devcluster, NS)} (lease {NS}/podcert-signer" in table
    assert f"podcert {__version__}" in table
    assert "active" in table and "next step: none due now" in table
    assert f"{SIGNER.replace('/', ':')}:" in table  # its ClusterTrustBundle
    assert "PolicyDenied  1" in table
    assert table.rstrip().endswith("Healthy.")

    code, out = run("status", "-n", NS, "-o", "json")
    doc = json.loads(out)
    assert (doc["apiVersion"], doc["kind"]) == ("podcert.dev/v1alpha1", "Status")
    assert doc["leader"]["live"] is True
    assert doc["ca"]["generations"][0]["state"] == "active"
    assert doc["trustBundles"][0]["matchesCA"] is True
    assert doc["requests"]["denialsByReason"] == {"PolicyDenied": 1}
    assert doc["requests"]["issued"] >= 1


def test_explain_pod_says_why_a_denied_pod_has_no_certificate(
    devcluster: DevCluster, denied: str, run: Run
) -> None:
    code, table = run("explain", "pod", f"{denied}/api", "--signer-namespace", NS)

    assert code == EXIT_FINDINGS
    assert "=> DENIED: the signer denied req-" in table
    assert "PolicyDenied" in table
    assert "event: Warning PolicyDenied:" in table  # the signer's Event on the request
    assert "next step: no rule of the signer's policy allows this namespace" in table

    code, out = run("explain", "pod", "api", "-n", denied, "--signer-namespace", NS, "-o", "yaml")
    assert code == EXIT_FINDINGS
    assert "kind: PodExplanation\n" in out
    assert "verdict: denied\n" in out


def test_explain_pod_says_no_signer_answers_when_its_signer_is_down(
    devcluster: DevCluster, stopped: None, run: Run
) -> None:
    ns = devcluster.namespace("rep-down")
    pod = make_pod(devcluster, ns, "batch", DOWN)
    request_as_node(devcluster, pod, DOWN)

    code, table = run("explain", "pod", f"{ns}/batch", "--signer-namespace", DOWN_NS)

    assert code == EXIT_FINDINGS
    assert "=> NO-SIGNER: req-" in table
    assert f"the lease {DOWN_NS}/podcert-signer is released (its signer stopped)" in table
    assert "next step: start the signer" in table

    code, table = run("status", "-n", DOWN_NS)
    assert code == EXIT_FINDINGS
    assert "Leader:        none: the lease" in table
    assert "NOT healthy: no signer leads" in table


def test_inspect_reads_an_issued_credential_and_names_its_root(
    devcluster: DevCluster, issued: tuple[str, Path], work: Path, run: Run
) -> None:
    ns, bundle = issued
    ctbs = Rest(devcluster.admin).request(
        "GET", path_of("certificates.k8s.io/v1", "clustertrustbundles")
    )
    # Other tests' bundles share the cluster, some with no signer; the live one is `<signer>:roots`.
    roots = next(
        i
        for i in ctbs["items"]
        if i["spec"].get("signerName") == SIGNER and i["metadata"]["name"].endswith(":roots")
    )
    trust = work / f"{TRUST_DOMAIN}.trust-bundle.pem"
    trust.write_text(roots["spec"]["trustBundle"])

    code, table = run("inspect", str(bundle), "--trust-bundle", str(trust), cluster=False)

    assert code == EXIT_OK, table
    assert f"SPIFFE ID:     spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/default" in table
    assert "Key type:      ECDSAP256" in table
    assert "Validity:      valid" in table
    assert "Refresh hint:  not in the file" in table
    assert "Anchored by:   " in table and "none of the given roots" not in table
    assert "PRIVATE KEY" not in table


def test_version_reads_the_server_and_the_leaders_version(
    devcluster: DevCluster, signer: Any, run: Run
) -> None:
    code, table = run("version", "-n", NS)

    assert code == EXIT_OK
    assert "Server:            Kubernetes v1.37" in table
    assert "v1 (podcertificaterequests, clustertrustbundles)" in table
    assert f"Signer:            podcert {__version__} ({_holder(devcluster, NS)}, leading" in table
    lease = _lease(devcluster, NS) or {}
    annotations = lease["metadata"]["annotations"]
    assert annotations[VERSION_ANNOTATION] == __version__
    assert annotations[SIGNER_NAMES_ANNOTATION] == SIGNER
