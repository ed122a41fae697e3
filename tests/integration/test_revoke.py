"""`podcert signer ca revoke GEN` against the real API server, a real signer and a real shim
node: the revoked generation stops signing at once, every pod on the shim node holding one of
its leaves is re-keyed to the fresh generation, and the revoked root leaves the CA Secret's
trusted roots once none is left; `podcert shim rotate` re-keys the shim's pods and says so."""

from __future__ import annotations

import base64
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from devcluster import processes
from devcluster.testing import DevCluster, eventually
from podcert.client.rest import Rest, path_of
from signer.authority import revoke
from tests.integration.conftest import StartSigner
from tests.integration.kubelet_helpers import ca
from tests.integration.shim_helpers import (
    Shim,
    certificate_volume,
    cleanup_identity,
    delete_trust_bundle,
    put_trust_bundle,
    shim,
    signer_roots,
)

SIGNER = "revoke.podcert.dev/test"
SIGNER_NAMESPACE = "podcert-revoke"
NODE = "shim-node-revoke"
ROOTS_BUNDLE = "revoke.podcert.dev:test:roots"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("revoke")


@pytest.fixture(scope="module")
def signer(start_signer: StartSigner, work: Path) -> processes.Signer:
    return start_signer(SIGNER, namespace=SIGNER_NAMESPACE, workdir=work)


@pytest.fixture(scope="module")
def shim_node(devcluster: DevCluster, work: Path, signer: processes.Signer) -> Iterator[Shim]:
    put_trust_bundle(
        devcluster, ROOTS_BUNDLE, signer_roots(devcluster, SIGNER_NAMESPACE), signer_name=SIGNER
    )
    cleanup = cleanup_identity(devcluster, SIGNER_NAMESPACE)
    proc = shim(devcluster, work, NODE, root=work / "root", cleanup_kubeconfig=cleanup)
    proc.start()
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()
        delete_trust_bundle(devcluster, ROOTS_BUNDLE)


def leaf_chain(path: Path) -> list[x509.Certificate] | None:
    try:
        return x509.load_pem_x509_certificates(path.read_bytes())
    except (OSError, ValueError):
        return None


def ca_secret(devcluster: DevCluster) -> dict[str, bytes]:
    found = Rest(devcluster.admin).request(
        "GET", path_of("v1", "secrets", SIGNER_NAMESPACE, "podcert-ca")
    )
    return {k: base64.b64decode(v) for k, v in found["data"].items()}


def test_revoking_the_signing_ca_rekeys_every_shim_pod_then_untrusts_its_root(
    devcluster: DevCluster, shim_node: Shim
) -> None:
    ns = devcluster.namespace("revoke")
    pods = [
        devcluster.pod(ns, f"web-{i}", node=NODE, volumes=[certificate_volume(SIGNER)])
        for i in range(3)
    ]
    paths = [shim_node.volume_dir(p.metadata.uid) / "credentialbundle.pem" for p in pods]
    before = [eventually(functools.partial(leaf_chain, p), timeout=10) for p in paths]
    status = ca(devcluster, SIGNER_NAMESPACE, "status")
    gid = next(line.split()[0] for line in status.splitlines() if " active " in line)
    old_root = x509.load_pem_x509_certificates(ca_secret(devcluster)["ca.crt"])

    out = ca(devcluster, SIGNER_NAMESPACE, "revoke", gid, "--timeout=120")
    print(out)

    assert f"revoked {gid}" in out
    assert f"no live leaf chains to {gid}: its root left every trust bundle" in out
    [record] = revoke.from_secret(ca_secret(devcluster))
    assert record.id == gid and record.untrusted
    for path, old in zip(paths, before, strict=True):
        chain = leaf_chain(path)
        assert chain is not None and chain[0] != old[0]
        assert not revoke.chains_to(chain, record)
    trusted = x509.load_pem_x509_certificates(ca_secret(devcluster)["ca.crt"])
    assert not set(old_root) & set(trusted)
    assert "revoked: " + gid in ca(devcluster, SIGNER_NAMESPACE, "status")
