"""Issue 13: podcert's signer meets the real kubelet. A pod with a podCertificate volume lands on
a real node (containerd, real containers) or a hollow one (kubemark: the real kubelet code with a
fake runtime); the kubelet makes the request, the signer issues, the kubelet writes the files."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from kubernetes import client

from bundles import formats
from devcluster import images, processes
from devcluster.kube import pod_certificate_volume
from devcluster.testing import DevCluster, Kubelet, eventually
from podcert.rest import Rest, path_of

SIGNER = "test.podcert.dev/kubelet"
TRUST_DOMAIN = "kubelet.test"
POLICY = f"""
signers:
  - name: {SIGNER}
    trustDomain: {TRUST_DOMAIN}
    keyTypes: [ECDSAP256, ECDSAP384, ED25519, RSA3072]
    allow:
      - namespaces: ["kl-*"]
        serviceAccounts: ["*"]
"""
MOUNT = "/var/run/identity"
BUNDLE = "credentialbundle.pem"
TRUST = "trust-bundle.pem"
# The container prints the bundle's mode (the real kubelet writes it with the volume's
# defaultMode) and then the bundle itself.
READ_CREDENTIAL = ["sh", "-c", f"stat -L -c 'mode=%a' {MOUNT}/{BUNDLE} && cat {MOUNT}/{BUNDLE}"]


@pytest.fixture(scope="module")
def signer(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    work = tmp_path_factory.mktemp("kubelet-signer")
    (work / "policy.yaml").write_text(POLICY)
    proc = processes.signer(
        devcluster.root,
        work,
        [SIGNER],
        namespace="podcert-kubelet",
        extra=[f"--policy={work / 'policy.yaml'}"],
    ).start()
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _key_type(public: Any) -> str:
    if isinstance(public, ed25519.Ed25519PublicKey):
        return "ED25519"
    if isinstance(public, ec.EllipticCurvePublicKey):
        return {"secp256r1": "ECDSAP256", "secp384r1": "ECDSAP384", "secp521r1": "ECDSAP521"}[
            public.curve.name
        ]
    assert isinstance(public, rsa.RSAPublicKey)
    return f"RSA{public.key_size}"


def _read(kubelet: Kubelet, pod_uid: str, name: str) -> bytes | None:
    try:
        data = (kubelet.volume_dir(pod_uid) / name).read_bytes()
    except OSError:
        return None
    return data or None


def _pod_requests(devcluster: DevCluster, namespace: str, pod_uid: str) -> list[Any]:
    found = Rest(devcluster.admin).request(
        "GET", path_of("certificates.k8s.io/v1", "podcertificaterequests", namespace)
    )
    return [i for i in found["items"] if i["spec"]["podUID"] == pod_uid]


KINDS = [
    pytest.param("real_kubelet", "ECDSAP384", id="real node (containerd), ECDSAP384"),
    pytest.param("hollow_kubelet", "ED25519", id="hollow node (kubemark), ED25519"),
    pytest.param("hollow_kubelet", "RSA3072", id="hollow node (kubemark), RSA3072"),
]


@pytest.mark.parametrize(("node", "key_type"), KINDS)
def test_the_kubelet_projects_a_credential_the_signer_issued(
    devcluster: DevCluster,
    signer: Any,
    request: pytest.FixtureRequest,
    node: str,
    key_type: str,
) -> None:
    kubelet: Kubelet = request.getfixturevalue(node)
    ns = devcluster.namespace("kl")
    pod = devcluster.pod(
        ns,
        "app",
        node=kubelet.name,
        volumes=[pod_certificate_volume(SIGNER, key_type=key_type, trust_bundle_signer=True)],
        image=images.BUSYBOX_IMAGE,
        command=READ_CREDENTIAL,
        restart_policy="Never",
    )
    uid = pod.metadata.uid

    bundle = eventually(
        lambda: _read(kubelet, uid, BUNDLE), timeout=60, what=f"{BUNDLE} on {kubelet.name}"
    )
    trust = eventually(lambda: _read(kubelet, uid, TRUST), timeout=10, what=TRUST)
    credential = formats.load_credential(bundle)
    roots = formats.load_trust_bundle(trust)
    formats.verify_chain(credential, roots, dt.datetime.now(dt.UTC))
    assert str(credential.spiffe_id) == f"spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/default"
    assert _key_type(credential.leaf.public_key()) == key_type
    assert _key_type(credential.key.public_key()) == key_type

    # The kubelet asked once, as the node, and the signer's answer is what it wrote.
    (pcr,) = _pod_requests(devcluster, ns, uid)
    assert pcr["spec"]["nodeName"] == kubelet.name
    assert pcr["status"]["certificateChain"].encode().strip() in bundle

    if kubelet.hollow:
        return
    # Inside the pod: the container read its credential, which the kubelet left readable by
    # every user in the container (no defaultMode set): the weakness issue 13 names.
    core = client.CoreV1Api(devcluster.admin)
    eventually(
        lambda: core.read_namespaced_pod(pod.metadata.name, ns).status.phase == "Succeeded",
        timeout=60,
        what="the container to run and exit",
    )
    logs = core.read_namespaced_pod_log(pod.metadata.name, ns)
    first, _, rest = logs.partition("\n")
    assert first == "mode=644"
    assert rest.encode().strip() == bundle.strip()
