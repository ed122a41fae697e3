"""The devcluster is a real API server that enforces what podcert relies on."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes import client
from kubernetes.client.rest import ApiException

from devcluster import cluster, identities, planestate
from devcluster.kube import pod_certificate_volume
from devcluster.testing import DevCluster, eventually
from podcert.api import keys

SIGNER = "example.com/devcluster-test"


def pcr_body(pod: Any, node: Any, sa: Any, csr_der: bytes, signer: str = SIGNER) -> dict[str, Any]:
    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "PodCertificateRequest",
        "metadata": {"generateName": f"{pod.metadata.name}-"},
        "spec": {
            "signerName": signer,
            "podName": pod.metadata.name,
            "podUID": pod.metadata.uid,
            "serviceAccountName": sa.metadata.name,
            "serviceAccountUID": sa.metadata.uid,
            "nodeName": node.metadata.name,
            "nodeUID": node.metadata.uid,
            "maxExpirationSeconds": 86400,
            "stubPKCS10Request": base64.b64encode(csr_der).decode(),
        },
    }


def create_pcr(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> Any:
    return client.CertificatesV1Api(api).create_namespaced_pod_certificate_request(namespace, body)


@pytest.fixture
def pod_on_node_a(devcluster: DevCluster) -> tuple[str, Any, Any, Any]:
    ns = devcluster.namespace("dc")
    pod = devcluster.pod(ns, "web", node="node-a", volumes=[pod_certificate_volume(SIGNER)])
    core = client.CoreV1Api(devcluster.admin)
    return ns, pod, core.read_node("node-a"), core.read_namespaced_service_account("default", ns)


def test_node_may_request_for_its_own_pod(devcluster: DevCluster, pod_on_node_a: Any) -> None:
    ns, pod, node, sa = pod_on_node_a
    key = keys.generate("ECDSAP256")
    created = create_pcr(devcluster.node("node-a"), ns, pcr_body(pod, node, sa, keys.stub_csr(key)))
    assert created.spec.pod_uid == pod.metadata.uid
    assert created.spec.node_name == "node-a"


def test_node_may_not_request_for_a_pod_on_another_node(
    devcluster: DevCluster, pod_on_node_a: Any
) -> None:
    ns, pod, node, sa = pod_on_node_a
    body = pcr_body(pod, node, sa, keys.stub_csr(keys.generate("ECDSAP256")))
    with pytest.raises(ApiException) as refused:
        create_pcr(devcluster.node("node-b"), ns, body)
    assert refused.value.status == 403


def test_stub_csr_signed_by_another_key_is_refused(
    devcluster: DevCluster, pod_on_node_a: Any
) -> None:
    ns, pod, node, sa = pod_on_node_a
    honest = x509.load_der_x509_csr(keys.stub_csr(keys.generate("ECDSAP256")))
    # Same to-be-signed bytes, signature swapped for one made by a different key.
    other = keys.generate("ECDSAP256")
    assert isinstance(other, ec.EllipticCurvePrivateKey)
    forged_sig = other.sign(honest.tbs_certrequest_bytes, ec.ECDSA(hashes.SHA256()))
    forged = _replace_signature(honest.public_bytes(serialization.Encoding.DER), forged_sig)
    with pytest.raises(ApiException) as refused:
        create_pcr(devcluster.node("node-a"), ns, pcr_body(pod, node, sa, forged))
    assert refused.value.status == 422
    assert "stubPKCS10Request" in str(refused.value.body)


def _replace_signature(csr_der: bytes, signature: bytes) -> bytes:
    """Re-encode a CSR SEQUENCE { tbs, algorithm, BIT STRING sig } with another signature."""

    def read(data: bytes, at: int) -> tuple[int, int, int]:  # (tag, content start, content end)
        tag, length = data[at], data[at + 1]
        at += 2
        if length & 0x80:
            count = length & 0x7F
            length = int.from_bytes(data[at : at + count], "big")
            at += count
        return tag, at, at + length

    def tlv(tag: int, content: bytes) -> bytes:
        n = len(content)
        if n < 0x80:
            return bytes([tag, n]) + content
        size = n.to_bytes((n.bit_length() + 7) // 8, "big")
        return bytes([tag, 0x80 | len(size)]) + size + content

    _, start, end = read(csr_der, 0)
    _, tbs_start, tbs_end = read(csr_der, start)
    tbs = csr_der[start:tbs_end]
    _, _, alg_end = read(csr_der, tbs_end)
    algorithm = csr_der[tbs_end:alg_end]
    del tbs_start, end
    return tlv(0x30, tbs + algorithm + tlv(0x03, b"\x00" + signature))


def _leaf_for(
    csr_der: bytes, now: dt.datetime
) -> tuple[str, dt.datetime, dt.datetime, dt.datetime]:
    """A throwaway CA (for this test only) and a 2 h leaf for the CSR's key."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "status-test-ca")])
    not_before = now.replace(microsecond=0) - dt.timedelta(seconds=30)
    not_after = not_before + dt.timedelta(hours=2)
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(ca_name)
        .public_key(x509.load_der_x509_csr(csr_der).public_key())  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier("spiffe://t/ns/x/sa/y")]),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = leaf.public_bytes(serialization.Encoding.PEM).decode()
    return pem, not_before, not_after, not_before + dt.timedelta(hours=1)


def _grant(devcluster: DevCluster, user: str, rules: list[dict[str, Any]], name: str) -> None:
    rbac = client.RbacAuthorizationV1Api(devcluster.admin)
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": rules})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
        }
    )


def test_writing_a_certificate_needs_sign_on_the_signer_name(
    devcluster: DevCluster, pod_on_node_a: Any
) -> None:
    ns, pod, node, sa = pod_on_node_a
    csr = keys.stub_csr(keys.generate("ECDSAP256"))
    pcr = create_pcr(devcluster.node("node-a"), ns, pcr_body(pod, node, sa, csr))

    status_rule = {
        "apiGroups": ["certificates.k8s.io"],
        "resources": ["podcertificaterequests", "podcertificaterequests/status"],
        "verbs": ["get", "update", "patch"],
    }
    _grant(devcluster, "status-writer", [status_rule], "dc-status-writer")
    _grant(devcluster, "real-signer", [status_rule], "dc-real-signer-status")
    _grant(
        devcluster,
        "real-signer",
        [
            {
                "apiGroups": ["certificates.k8s.io"],
                "resources": ["signers"],
                "resourceNames": [SIGNER],
                "verbs": ["sign"],
            }
        ],
        "dc-real-signer-sign",
    )

    pem, not_before, not_after, refresh = _leaf_for(csr, dt.datetime.now(dt.UTC))
    status = {
        "status": {
            "certificateChain": pem,
            "notBefore": not_before.isoformat().replace("+00:00", "Z"),
            "notAfter": not_after.isoformat().replace("+00:00", "Z"),
            "beginRefreshAt": refresh.isoformat().replace("+00:00", "Z"),
            "conditions": [
                {
                    "type": "Issued",
                    "status": "True",
                    "reason": "Issued",
                    "message": "issued by the test",
                    "lastTransitionTime": not_before.isoformat().replace("+00:00", "Z"),
                    "observedGeneration": pcr.metadata.generation,
                }
            ],
        }
    }
    name = pcr.metadata.name

    without_sign = client.CertificatesV1Api(devcluster.user("status-writer"))
    with pytest.raises(ApiException) as forbidden:
        without_sign.patch_namespaced_pod_certificate_request_status(name, ns, status)
    # The API server answers 422 Invalid with a FieldValueForbidden cause on spec.signerName.
    assert forbidden.value.status == 422, forbidden.value.body
    causes = json.loads(forbidden.value.body)["details"]["causes"]
    assert causes[0]["reason"] == "FieldValueForbidden"
    assert causes[0]["field"] == "spec.signerName"
    assert '"sign"' in causes[0]["message"]

    signer = client.CertificatesV1Api(devcluster.user("real-signer"))
    issued = signer.patch_namespaced_pod_certificate_request_status(name, ns, status)
    assert issued.status.certificate_chain == pem


def test_up_then_down_leaves_no_process(devcluster: DevCluster, tmp_path: Path) -> None:
    # A second, independent cluster: the session's own keeps serving the other tests.
    state = cluster.up(tmp_path / "second")
    pids = (state.etcd_pid, state.apiserver_pid, state.controller_manager_pid, state.scheduler_pid)
    assert all(pids)
    assert all(Path(f"/proc/{pid}").exists() for pid in pids)
    cluster.down(tmp_path / "second")
    for pid in pids:
        assert not _running(pid), f"pid {pid} still runs after down"
    assert planestate.running(identities.Paths(tmp_path / "second")) is None
    del devcluster


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def test_the_controller_manager_gives_each_namespace_its_service_account_and_root_ca(
    devcluster: DevCluster,
) -> None:
    name = f"cm-{os.getpid()}-{int(dt.datetime.now().timestamp() * 1000) % 100000}"
    core = client.CoreV1Api(devcluster.admin)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    sa = eventually(
        lambda: _found(lambda: core.read_namespaced_service_account("default", name)),
        timeout=30,
        what="the default ServiceAccount",
    )
    assert sa.metadata.name == "default"
    root_ca = eventually(
        lambda: _found(lambda: core.read_namespaced_config_map("kube-root-ca.crt", name)),
        timeout=30,
        what="the kube-root-ca.crt ConfigMap",
    )
    ca = (identities.Paths(devcluster.root.resolve()).pki / "ca.crt").read_text()
    assert root_ca.data["ca.crt"].strip() == ca.strip()


def test_the_garbage_collector_deletes_what_a_deleted_pod_owned(devcluster: DevCluster) -> None:
    ns = devcluster.namespace("gc")
    pod = devcluster.pod(ns, "owner", node="node-a")
    core = client.CoreV1Api(devcluster.admin)
    owned = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(
            name="owned",
            owner_references=[
                client.V1OwnerReference(
                    api_version="v1", kind="Pod", name="owner", uid=pod.metadata.uid
                )
            ],
        )
    )
    core.create_namespaced_config_map(ns, owned)
    core.delete_namespaced_pod("owner", ns, grace_period_seconds=0)
    eventually(
        lambda: _found(lambda: core.read_namespaced_config_map("owned", ns)) is None,
        timeout=60,
        what="the owned ConfigMap to be collected",
    )


def _found(read: Callable[[], Any]) -> Any:
    """The object `read` returns, or None when the API server answers 404."""
    try:
        return read()
    except ApiException as err:
        if err.status == 404:
            return None
        raise
