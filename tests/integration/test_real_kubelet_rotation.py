"""Rotations on files the real kubelet writes. A CA rotation driven as an operator does
(`podcert signer ca prepare | activate | retire`) reaching the kubelet's trust file, a preview
root reaching the pods selecting `preview` before `promote` brings it to the rest, and the
example mTLS pair running on the kubelet's files through a leaf rotation and a CA rotation.

Both run on one real node (containerd) whose kubelet resyncs pods every 10 s instead of the
default minute. The kubelet drops its ClusterTrustBundle cache as soon as a bundle changes, but
rewrites a running pod's projected files only when it next syncs the pod: every syncFrequency
(default 1 min) plus up to half again of jitter. At the default, prepare took 63-85 s and retire
60-78 s from the command's launch to the file here (three runs), which the suite's time budget
cannot hold twice per test; 10 s (kubemark's own setting) changes how soon, not what, reaches
the file.

How the kubelet comes to ask again after `activate`: it refreshes at the status's beginRefreshAt
plus 0-5 min of its own jitter, and the API server refuses a beginRefreshAt earlier than
notBefore + 10 min (with notBefore within 5 min of its clock), so no signer setting brings a
refresh inside a test. A kubelet restart does: it keeps no state and asks anew for every
projection at once (test_real_kubelet.py counts it), which is what these tests use.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography import x509

from bundles import formats
from bundles.foldersource import FolderSource
from devcluster import images, nodes, processes
from devcluster.kube import pod_certificate_volume
from devcluster.stack import Stack
from devcluster.testing import DevCluster, Kubelet, eventually
from podcert.client.rest import JSON, Rest, path_of
from tests.integration.conftest import StartSigner
from tests.integration.fault_helpers import sample
from tests.integration.kubelet_helpers import (
    BUNDLE,
    KEEP_RUNNING,
    TRUST,
    ca,
    certificates_in,
    first_seen,
    read,
    spiffe_volume,
    trust_bundle_roots,
)

SYNC_FREQUENCY = dt.timedelta(seconds=10)
GENERATIONS = "podcert_signer_ca_generations"
# A step that has not reached the file after several resyncs is a failure, not a slow machine.
STEP_TIMEOUT = 90.0


@pytest.fixture(scope="module")
def kubelet(devcluster: DevCluster) -> Iterator[Kubelet]:
    """A real node (containerd + runc) whose kubelet resyncs pods every 10 s, for this module."""
    reason = nodes.real_node_unavailable()
    if reason:
        pytest.fail(f"cannot run a real node on this machine: {reason}")
    node = devcluster.kubelet("node-rotation", sync_frequency=SYNC_FREQUENCY)
    try:
        yield node
    finally:
        node.stop()


def _policy(signer_name: str, prefix: str) -> str:
    return f"""
signers:
  - name: {signer_name}
    allow:
      - namespaces: ["{prefix}-*"]
        serviceAccounts: ["*"]
"""


def _start_signer(
    start_signer: StartSigner, workdir: Path, signer_name: str, namespace: str, prefix: str
) -> processes.Signer:
    policy = workdir / f"{namespace}-policy.yaml"
    policy.write_text(_policy(signer_name, prefix))
    return start_signer(signer_name, namespace=namespace, workdir=workdir, policy=policy)


def _activate(devcluster: DevCluster, signer: processes.Signer, signer_ns: str) -> None:
    """`ca activate`, then wait until the signer has loaded it (its metrics show the old CA
    retired and none prepared): a request the kubelet makes from then on gets the new CA."""

    def loaded() -> bool:
        text = signer.metrics()
        return sample(text, GENERATIONS, state="retired") == 1 and not sample(
            text, GENERATIONS, state="prepared"
        )

    ca(devcluster, signer_ns, "activate")
    eventually(loaded, timeout=30, what="the signer to sign with the activated CA")


def _identity_pod(
    devcluster: DevCluster, kubelet: Kubelet, namespace: str, name: str, signer_name: str
) -> str:
    pod = devcluster.pod(
        namespace,
        name,
        node=kubelet.name,
        service_account=name,
        labels={"app": name},
        volumes=[pod_certificate_volume(signer_name, trust_bundle_signer=True)],
        image=images.BUSYBOX_IMAGE,
        command=KEEP_RUNNING,
    )
    uid: str = pod.metadata.uid
    eventually(lambda: read(kubelet, uid, BUNDLE), timeout=60, what=f"{name}'s credential")
    return uid


def _leaf(kubelet: Kubelet, uid: str) -> x509.Certificate | None:
    data = read(kubelet, uid, BUNDLE)
    return formats.load_credential(data).leaf if data else None


def _chains_to(kubelet: Kubelet, uid: str, root: x509.Certificate) -> bool:
    data = read(kubelet, uid, BUNDLE)
    if data is None:
        return False
    try:
        formats.verify_chain(
            formats.load_credential(data), formats.TrustBundle((root,)), dt.datetime.now(dt.UTC)
        )
    except formats.ChainError:
        return False
    return True


def test_ca_prepare_activate_retire_reach_the_kubelets_trust_file(
    devcluster: DevCluster,
    start_signer: StartSigner,
    kubelet: Kubelet,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """Real node, kubelet resync 10 s. prepare: the new root joins the trust file (the old one
    stays). activate: after the kubelet asks again (a restart), its new credential chains to the
    new CA, and both roots are still trusted. retire: the old root leaves the trust file. Each
    step's time is printed and recorded from the command's launch: to the ClusterTrustBundle (the
    command and the signer), and to the file (then the kubelet's resync)."""
    signer_name, signer_ns = "test.podcert.dev/kubelet-ca", "podcert-kubelet-ca"
    signer = _start_signer(start_signer, tmp_path, signer_name, signer_ns, "klca")
    ns = devcluster.namespace("klca")
    uid = _identity_pod(devcluster, kubelet, ns, "app", signer_name)
    (old_root,) = eventually(
        lambda: certificates_in(kubelet, uid, TRUST) or None, timeout=30, what=TRUST
    )
    assert trust_bundle_roots(devcluster, signer_name) == [old_root]
    assert _chains_to(kubelet, uid, old_root)

    def published() -> set[x509.Certificate]:
        return set(trust_bundle_roots(devcluster, signer_name))

    def in_file() -> set[x509.Certificate]:
        return set(certificates_in(kubelet, uid, TRUST))

    # prepare: the new root is published, and reaches the file beside the old one.
    start = time.monotonic()
    ca(devcluster, signer_ns, "prepare")
    prepare = first_seen(
        {
            "bundle": lambda: len(published()) == 2,
            "file": lambda: len(in_file()) == 2,
        },
        since=start,
        timeout=STEP_TIMEOUT,
    )
    (new_root,) = published() - {old_root}
    assert in_file() == {old_root, new_root}

    # activate: the kubelet's next request is signed by the new CA; the old root stays trusted.
    start = time.monotonic()
    _activate(devcluster, signer, signer_ns)
    kubelet.restart()
    activate = first_seen(
        {"new leaf": lambda: _chains_to(kubelet, uid, new_root)}, since=start, timeout=60
    )
    assert not _chains_to(kubelet, uid, old_root)
    assert in_file() == {old_root, new_root}

    # retire: the old root leaves the bundle, then the file.
    start = time.monotonic()
    ca(devcluster, signer_ns, "retire", "--force")  # its leaves were re-issued just above
    retire = first_seen(
        {
            "bundle": lambda: published() == {new_root},
            "file": lambda: in_file() == {new_root},
        },
        since=start,
        timeout=STEP_TIMEOUT,
    )
    assert _chains_to(kubelet, uid, new_root)

    figures = {
        "prepare_to_bundle_s": prepare["bundle"],
        "prepare_to_trust_file_s": prepare["file"],
        "activate_and_restart_to_new_leaf_s": activate["new leaf"],
        "retire_to_bundle_s": retire["bundle"],
        "retire_to_trust_file_s": retire["file"],
    }
    for name, seconds in figures.items():
        record_property(name, round(seconds, 2))
    print(
        f"\nCA rotation on the real kubelet (syncFrequency {SYNC_FREQUENCY.seconds}s), seconds "
        "from the command's launch: "
        + ", ".join(f"{name} {seconds:.2f}" for name, seconds in figures.items())
    )


@dataclasses.dataclass
class KubeletStack(Stack):
    """The example pair of the end-to-end test (same launcher, same failure count), reading the
    files a kubelet projects instead of the shim's."""

    kubelet: Kubelet | None = None

    def volume(self, pod: JSON) -> Path:
        assert self.kubelet is not None
        return self.kubelet.volume_dir(pod["metadata"]["uid"])


def test_the_mtls_pair_on_the_kubelets_files_survives_leaf_and_ca_rotation(
    devcluster: DevCluster, start_signer: StartSigner, kubelet: Kubelet, tmp_path: Path
) -> None:
    """Real node, kubelet resync 10 s. The example server and client run on the host, pointed
    at the volume folders the kubelet writes for pods `api` and `web`, under steady load through
    a leaf rotation (a kubelet restart re-keys both), a CA rotation (prepare, activate and re-key,
    retire) and a last re-key on the new CA alone: not one failed request, and the server sees
    each of the client's new certificates without a restart of either."""
    signer_name, signer_ns = "test.podcert.dev/kubelet-mtls", "podcert-kubelet-mtls"
    signer = _start_signer(start_signer, tmp_path, signer_name, signer_ns, "klm")
    ns = devcluster.namespace("klm")
    stack = KubeletStack(devcluster.root, tmp_path, signer_name, kubelet.name, ns, kubelet=kubelet)
    rest = Rest(devcluster.admin)
    pods = {}
    for name in ("api", "web"):
        _identity_pod(devcluster, kubelet, ns, name, signer_name)
        pods[name] = rest.request("GET", path_of("v1", "pods", ns, name))
    uids = {name: pod["metadata"]["uid"] for name, pod in pods.items()}
    (old_root,) = trust_bundle_roots(devcluster, signer_name)
    client_serials = {stack.wait_identity(pods["web"]).serial_number}

    def rekey_both(root: x509.Certificate | None = None) -> None:
        """Restart the kubelet; wait until both pods hold a new leaf (chaining to `root` if
        given) and the server has served the client's new one."""
        old = {name: _leaf(kubelet, uid) for name, uid in uids.items()}

        def renewed(name: str) -> bool:
            leaf = _leaf(kubelet, uids[name])
            if leaf is None or leaf == old[name]:
                return False
            return root is None or _chains_to(kubelet, uids[name], root)

        kubelet.restart()
        eventually(lambda: all(renewed(n) for n in uids), timeout=60, what="both pods re-keyed")
        client = _leaf(kubelet, uids["web"])
        assert client is not None
        client_serials.add(client.serial_number)
        stack.wait_server_sees(client, 15)

    def published(count: int) -> set[x509.Certificate] | None:
        roots = set(trust_bundle_roots(devcluster, signer_name))
        return roots if len(roots) == count else None

    def trusted_in_both(roots: set[x509.Certificate]) -> bool:
        return all(set(certificates_in(kubelet, uid, TRUST)) == roots for uid in uids.values())

    try:
        stack.start_pair(pods, rate=50)
        rekey_both()  # a leaf rotation
        ca(devcluster, signer_ns, "prepare")
        both = eventually(lambda: published(2), timeout=30, what="the new root published")
        (new_root,) = both - {old_root}
        eventually(lambda: trusted_in_both(both), timeout=STEP_TIMEOUT, what="both roots in")
        _activate(devcluster, signer, signer_ns)
        rekey_both(new_root)
        ca(devcluster, signer_ns, "retire", "--force")
        eventually(lambda: trusted_in_both({new_root}), timeout=STEP_TIMEOUT, what="old root out")
        rekey_both(new_root)  # once more, on the new CA alone
    finally:
        summary = stack.stop_pair()

    client, server = summary["client"], summary["server"]
    assert client["failed"] == 0, client["errors"]
    assert client["ok"] > 100
    # The server served every client certificate the rotations produced (a new serial each
    # time): the client opens new connections once its own leaf changes.
    assert {int(s, 16) for s in server["client_serials"]} >= client_serials
    assert len(client_serials) == 4  # the first certificate and three re-keys
    # The client sees a new server certificate only on a connection opened after the server
    # loaded it: a re-key writes both pods' files at once, and when the client reloads first
    # its new connection meets the server's previous leaf and is kept alive (CI saw 3 of 4).
    # So: the server's rotations were seen, not necessarily every one.
    assert len(client["server_serials"]) >= 2


def test_a_preview_root_reaches_the_pod_selecting_preview_first_and_every_pod_once_promoted(
    devcluster: DevCluster, start_signer: StartSigner, kubelet: Kubelet, tmp_path: Path
) -> None:
    """Real node, kubelet resync 10 s. Two pods mount the SPIFFE Filesystem Delivery folder,
    one selecting the signer's `live` bundles, one its `preview` ones (the standard's labels).
    `ca prepare --preview`: the new root reaches the preview pod's trust file and stays out of
    the live bundle; `ca promote`: it reaches the live pod's file too. A folder source on each
    keeps taking the kubelet's files throughout."""
    signer_name, signer_ns = "test.podcert.dev/kubelet-preview", "podcert-kubelet-preview"
    _start_signer(start_signer, tmp_path, signer_name, signer_ns, "klpv")
    ns = devcluster.namespace("klpv")
    td = "cluster.local"  # the signer's default trust domain
    folders = {}
    for channel in ("live", "preview"):
        pod = devcluster.pod(
            ns,
            channel,
            node=kubelet.name,
            service_account=channel,
            volumes=[spiffe_volume(signer_name, td, channel=channel)],
            image=images.BUSYBOX_IMAGE,
            command=KEEP_RUNNING,
        )
        folders[channel] = kubelet.volume_dir(pod.metadata.uid, "spiffe")

    def roots(channel: str) -> set[x509.Certificate]:
        try:
            data = (folders[channel] / f"{td}.trust-bundle.pem").read_bytes()
        except OSError:
            return set()
        return set(x509.load_pem_x509_certificates(data)) if data.strip() else set()

    (old_root,) = eventually(lambda: roots("live") or None, timeout=60, what="the live roots")
    eventually(lambda: roots("preview") == {old_root}, timeout=60, what="the preview roots")
    sources = {c: FolderSource(d) for c, d in folders.items()}

    ca(devcluster, signer_ns, "prepare", "--preview")
    grown = eventually(
        lambda: roots("preview") if len(roots("preview")) == 2 else None,
        timeout=STEP_TIMEOUT,
        what="the preview root in the preview pod's file",
    )
    (new_root,) = grown - {old_root}
    live_bundle = Rest(devcluster.admin).request(
        "GET",
        path_of(
            "certificates.k8s.io/v1",
            "clustertrustbundles",
            name=f"{signer_name.replace('/', ':')}:roots",
        ),
    )
    assert new_root not in x509.load_pem_x509_certificates(
        live_bundle["spec"]["trustBundle"].encode()
    )
    assert roots("live") == {old_root}
    assert sources["preview"].refresh()
    assert new_root in sources["preview"].trust_bundle.roots

    ca(devcluster, signer_ns, "promote")
    eventually(
        lambda: roots("live") == grown,
        timeout=STEP_TIMEOUT,
        what="the promoted root in the live pod's file",
    )
    assert sources["live"].refresh()
    assert set(sources["live"].trust_bundle.roots) == grown
