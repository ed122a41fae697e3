"""The skew matrix. API server 1.37 with kubelets 1.35, 1.36 and 1.37, and API
server 1.36 with a 1.35 kubelet: each node's pod gets its credential and its trust bundle from
podcert's signer, and keeps them through a leaf refresh.

Each kubelet sends its own minor's request form (1.35: pkixPublicKey + proofOfPossession through
v1beta1; 1.36: stubPKCS10Request through v1beta1; 1.37: v1), so every cell is checked at the
request too: the form that kubelet sent, Issued by podcert.

The nodes are hollow: kubemark runs the real kubelet's pod certificate manager and projected
volume writer (the atomic writer, into real files under its root) on a fake container runtime,
so the files read here are the ones a container would see. The real node would add containerd
and nothing on this path, at the cost of the machine's one real-node slot.

The refresh: a kubelet refreshes at the status's beginRefreshAt plus 0-5 min of its own jitter,
checked on a pass every 1-2 min, and the API server refuses a beginRefreshAt earlier than
notBefore + 10 min (notBefore at most 5 min back), so even the shortest lifetime (1 h) refreshes
5-12 min after issue. A kubelet restart asks again at once (it keeps keys in memory only): a new
key, a new request in its minor's form, a new leaf into the same pod's volume. That is the
refresh each cell goes through (as in test_real_kubelet_rotation.py).

One cluster per API server minor, each with one signer; the 1.37 cells run first.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from bundles import formats
from devcluster import build, cluster, kube, nodes, processes
from devcluster.testing import DevCluster, Kubelet, eventually
from podcert.api import requests
from podcert.api.versions import group_version
from podcert.client.rest import JSON, Rest, path_of

SIGNER = "matrix.podcert.dev/skew"
TRUST_DOMAIN = "matrix.test"
NAMESPACE = "podcert-matrix"
POLICY = f"""
signers:
  - name: {SIGNER}
    trustDomain: {TRUST_DOMAIN}
    keyTypes: [ECDSAP256]
    allow:
      - namespaces: ["*"]
        serviceAccounts: ["*"]
"""
BETA = group_version("v1beta1")
SHORTEST_LIFETIME = 3600  # seconds: the least maxExpirationSeconds the API takes
MATRIX = {"1.37": ("1.35", "1.36", "1.37"), "1.36": ("1.35",)}
CELLS = [
    pytest.param(api, kubelet, id=f"API server {api}, kubelet {kubelet}")
    for api, kubelets in MATRIX.items()
    for kubelet in kubelets
]
# The key form each kubelet minor sends (KEP-4317, "Version Skew").
FORMS = {
    "1.35": requests.PROOF_OF_POSSESSION,
    "1.36": requests.STUB_CSR,
    "1.37": requests.STUB_CSR,
}


@dataclass
class Plane:
    version: str
    cluster: DevCluster
    signer: processes.Signer


class Planes:
    """One control plane at a time, of the minor the current cell asks for, with podcert's
    signer on it; the previous one is taken down when another minor is asked for."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.current: Plane | None = None

    def get(self, version: str) -> Plane:
        if self.current is not None and self.current.version == version:
            return self.current
        self.close()
        work = self.work / version
        work.mkdir()
        root = work / "cluster"
        state = cluster.up(root, kube_version=version)
        handle = DevCluster(root, state)
        policy = work / "policy.yaml"
        policy.write_text(POLICY)
        signer = processes.signer(
            root, work, [SIGNER], namespace=NAMESPACE, extra=[f"--policy={policy}"]
        )
        self.current = Plane(version, handle, signer)
        signer.start().wait_ready(60)
        return self.current

    def close(self) -> None:
        if self.current is None:
            return
        plane, self.current = self.current, None
        try:
            plane.signer.stop()
            plane.cluster.admin.close()
        finally:
            cluster.down(plane.cluster.root)


@pytest.fixture(scope="module")
def planes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Planes]:
    found = Planes(tmp_path_factory.mktemp("skew-matrix"))
    try:
        yield found
    finally:
        found.close()


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes() or None
    except OSError:
        return None


def _credential(
    plane: Plane, kubelet: Kubelet, pod: Any, *, not_key: bytes = b""
) -> tuple[formats.Credential, formats.TrustBundle]:
    """The pod's credential and trust bundle as the kubelet wrote them, once its key is not
    `not_key` (the one before a refresh); failing, what became of the pod's requests."""
    folder = kubelet.volume_dir(pod.metadata.uid)

    def written() -> tuple[formats.Credential, formats.TrustBundle] | None:
        bundle, trust = _read(folder / "credentialbundle.pem"), _read(folder / "trust-bundle.pem")
        if bundle is None or trust is None:
            return None
        credential = formats.load_credential(bundle)
        if _spki(credential) == not_key:
            return None
        return credential, formats.load_trust_bundle(trust)

    try:
        return eventually(written, timeout=60, what=f"the credential in {folder}")
    except AssertionError as err:
        asked = [
            (r["metadata"]["name"], r.get("status", {}).get("conditions"))
            for r in _requests(plane, pod.metadata.namespace)
        ]
        raise AssertionError(f"{err}\nthe pod's requests: {asked}") from None


def _spki(credential: formats.Credential) -> bytes:
    return credential.leaf.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _published_roots(plane: Plane) -> formats.TrustBundle:
    items = Rest(plane.cluster.admin).request("GET", path_of(BETA, "clustertrustbundles"))["items"]
    pem = "".join(i["spec"]["trustBundle"] for i in items if i["spec"].get("signerName") == SIGNER)
    return formats.load_trust_bundle(pem.encode())


def _requests(plane: Plane, namespace: str) -> list[JSON]:
    """The pod's requests, through v1beta1 (served by both minors: the one view with every
    form's key fields)."""
    path = path_of(BETA, "podcertificaterequests", namespace)
    found: list[JSON] = Rest(plane.cluster.admin).request("GET", path)["items"]
    return sorted(found, key=lambda r: r["metadata"]["creationTimestamp"])


def _form(pcr: JSON) -> requests.KeyForm:
    spec = pcr["spec"]
    if spec.get("stubPKCS10Request"):
        return requests.STUB_CSR
    assert spec.get("pkixPublicKey") and spec.get("proofOfPossession"), spec
    return requests.PROOF_OF_POSSESSION


def _check(
    plane: Plane, pod: Any, credential: formats.Credential, trust: formats.TrustBundle
) -> None:
    """The credential is podcert's: it chains to the roots in the pod's trust file, which are
    the signer's published ones; the leaf names the pod's SPIFFE ID and lives the hour the
    volume asked (its maxExpirationSeconds went through that kubelet's request form)."""
    assert set(trust.roots) == set(_published_roots(plane).roots)
    formats.verify_chain(credential, trust, dt.datetime.now(dt.UTC))
    ns = pod.metadata.namespace
    assert str(credential.spiffe_id) == f"spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/default"
    lifetime = credential.leaf.not_valid_after_utc - credential.leaf.not_valid_before_utc
    assert lifetime == dt.timedelta(seconds=SHORTEST_LIFETIME), "the volume's lifetime, asked"


@pytest.mark.parametrize(("api", "kubelet_version"), CELLS)
def test_a_skewed_kubelets_pod_gets_and_keeps_the_signers_credential(
    planes: Planes, api: str, kubelet_version: str
) -> None:
    plane = planes.get(api)
    root = plane.cluster.root
    node = f"kubelet-{kubelet_version.replace('.', '-')}"
    kubelet = Kubelet(root, nodes.start(root, node, hollow=True, kube_version=kubelet_version))
    try:
        assert nodes.kubelet_release(root, node) == build.release(kubelet_version)
        ns = plane.cluster.namespace("matrix")
        volume = kube.pod_certificate_volume(
            SIGNER, max_expiration_seconds=SHORTEST_LIFETIME, trust_bundle_signer=True
        )
        pod = kube.create_pod(plane.cluster.admin, ns, "app", node=node, volumes=[volume])
        credential, trust = _credential(plane, kubelet, pod)
        _check(plane, pod, credential, trust)
        [first] = _requests(plane, ns)
        assert _form(first) == FORMS[kubelet_version]
        assert requests.outcome(first) == "Issued"

        # The refresh: the restarted kubelet asks again with a new key, in the same form.
        kubelet.restart()
        refreshed, trust = _credential(plane, kubelet, pod, not_key=_spki(credential))
        _check(plane, pod, refreshed, trust)
        assert refreshed.leaf.serial_number != credential.leaf.serial_number
        issued = _requests(plane, ns)
        assert len(issued) == 2, [r["metadata"]["name"] for r in issued]
        assert [(_form(r), requests.outcome(r)) for r in issued] == [
            (FORMS[kubelet_version], "Issued")
        ] * 2
    finally:
        kubelet.stop()
