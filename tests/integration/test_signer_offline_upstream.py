"""An offline upstream CA, as an operator runs it: `ca prepare --upstream offline` writes a CSR,
the openssl CLI (a CA nobody here wrote) signs it under its own intermediate and root, `ca import`
takes the chain back, and after `ca activate` the signer's leaves chain to the upstream's root
while the ClusterTrustBundle holds that root in place of podcert's own."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from devcluster.identities import Paths
from devcluster.testing import DevCluster, eventually
from podcert.client.rest import JSON, Rest, path_of
from signer.authority.trustbundles import bundle_name
from tests.integration.conftest import StartSigner
from tests.integration.helpers import condition, make_pod, request_as_node, settled

SIGNER = "offline.podcert.dev/main"
NAMESPACE = "podcert-offline"
NODE = "offline-node"
TRUST_DOMAIN = "cluster.local"  # the signer's default

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")


@pytest.fixture(scope="module")
def signer(start_signer: StartSigner, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return start_signer(SIGNER, namespace=NAMESPACE, workdir=tmp_path_factory.mktemp("offline"))


def ca_command(devcluster: DevCluster, action: str, *flags: str) -> str:
    done = subprocess.run(
        [
            sys.executable, "-m", "podcert", "signer", "ca", action,
            f"--kubeconfig={Paths(devcluster.root.resolve()).admin_kubeconfig}",
            f"--namespace={NAMESPACE}", *flags,
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def corporate_ca(work: Path) -> None:
    """A root and an issuing CA under it, as an organisation's PKI would have them."""
    (work / "mid.cnf").write_text(
        "basicConstraints=critical,CA:TRUE,pathlen:1\nkeyUsage=critical,keyCertSign,cRLSign\n"
    )
    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", work / "root.key",
        "-out", work / "root.pem", "-days", "3650", "-subj", "/O=Corp/CN=Corp Offline Root",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", work / "mid.key", "-out", work / "mid.csr", "-subj", "/O=Corp/CN=Corp Issuing",
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", work / "mid.csr", "-CA", work / "root.pem",
        "-CAkey", work / "root.key", "-CAcreateserial", "-days", "1825",
        "-extfile", work / "mid.cnf", "-out", work / "mid.pem",
    )  # fmt: skip


def roots_in(pem: str) -> set[bytes]:
    if "BEGIN CERTIFICATE" not in pem:
        return set()
    return {
        c.public_bytes(serialization.Encoding.DER)
        for c in x509.load_pem_x509_certificates(pem.encode())
    }


def live_bundle(devcluster: DevCluster) -> str:
    items: list[JSON] = Rest(devcluster.admin).request(
        "GET",
        path_of("certificates.k8s.io/v1", "clustertrustbundles"),
        query={"fieldSelector": f"spec.signerName={SIGNER}"},
    )["items"]
    live = [i for i in items if i["metadata"]["name"] == bundle_name(SIGNER)]
    return str(live[0]["spec"]["trustBundle"]) if live else ""


def test_a_chain_signed_by_openssl_is_imported_and_leaves_chain_to_the_upstream_root(
    devcluster: DevCluster, signer: Any, tmp_path: Path
) -> None:
    corporate_ca(tmp_path)
    said = ca_command(
        devcluster, "prepare", "--upstream", "offline",
        f"--trust-domain={TRUST_DOMAIN}", f"--csr-out={tmp_path / 'podcert.csr'}",
    )  # fmt: skip
    gen = said.split()[0]
    assert "awaiting signed chain" in ca_command(devcluster, "status")

    # The operator signs the CSR as their runbook says (docs/upstream-ca.md).
    (tmp_path / "podcert.cnf").write_text(
        "basicConstraints=critical,CA:TRUE,pathlen:0\n"
        "keyUsage=critical,keyCertSign,cRLSign\n"
        f"subjectAltName=URI:spiffe://{TRUST_DOMAIN}\n"
    )
    openssl(
        "x509", "-req", "-in", tmp_path / "podcert.csr", "-CA", tmp_path / "mid.pem",
        "-CAkey", tmp_path / "mid.key", "-CAcreateserial", "-days", "30",
        "-extfile", tmp_path / "podcert.cnf", "-out", tmp_path / "podcert.pem",
    )  # fmt: skip
    chain = tmp_path / "chain.pem"
    chain.write_bytes(
        b"".join((tmp_path / f).read_bytes() for f in ("podcert.pem", "mid.pem", "root.pem"))
    )

    ca_command(devcluster, "import", "--id", gen, "--chain", str(chain))
    ca_command(devcluster, "activate", "--id", gen)
    ca_command(devcluster, "retire", "--force")  # podcert's own root leaves the bundles

    upstream_root = x509.load_pem_x509_certificate((tmp_path / "root.pem").read_bytes())
    mid = x509.load_pem_x509_certificate((tmp_path / "mid.pem").read_bytes())
    ours = x509.load_pem_x509_certificate((tmp_path / "podcert.pem").read_bytes())
    root_der = upstream_root.public_bytes(serialization.Encoding.DER)

    ns = devcluster.namespace("offline")
    pod = make_pod(devcluster, ns, "app", SIGNER, node=NODE)

    def issued_under_the_upstream() -> list[x509.Certificate] | None:
        done = settled(devcluster, request_as_node(devcluster, pod, SIGNER)[1])
        assert condition(done).type == "Issued"
        got = x509.load_pem_x509_certificates(done["status"]["certificateChain"].encode())
        return got if got[1:] == [ours, mid] else None

    leaf_chain = eventually(issued_under_the_upstream, timeout=30, interval=0.5, what="a leaf")
    assert leaf_chain is not None
    leaf_chain[0].verify_directly_issued_by(ours)
    ours.verify_directly_issued_by(mid)
    mid.verify_directly_issued_by(upstream_root)
    # openssl agrees: the leaf verifies to the upstream root through the chain the status sent.
    (tmp_path / "leaf.pem").write_bytes(leaf_chain[0].public_bytes(serialization.Encoding.PEM))
    (tmp_path / "untrusted.pem").write_bytes(
        b"".join(c.public_bytes(serialization.Encoding.PEM) for c in leaf_chain[1:])
    )
    openssl(
        "verify", "-CAfile", tmp_path / "root.pem", "-untrusted", tmp_path / "untrusted.pem",
        tmp_path / "leaf.pem",
    )  # fmt: skip

    eventually(
        lambda: roots_in(live_bundle(devcluster)) == {root_der} or None,
        timeout=30,
        interval=0.5,
        what="the live ClusterTrustBundle holding the upstream root alone",
    )
