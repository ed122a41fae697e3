"""The Helm chart installed for real, as a user installs a release: the chart package and the
image archive `podcert devcluster release` builds (the `released` fixture), the archive imported
into the real node's containerd, as `ctr images import` takes it from a release's download, and
the pods running it by its manifest digest. `helm install podcert <package>` with default values
is refused, naming the value to set (networkPolicy.webhookFrom: without the API server's
addresses its fail-closed webhook is unreachable on an enforcing CNI), and leaves no release.
With networkPolicy.enabled=false (what that message says for a CNI that enforces no
NetworkPolicy, as the devcluster's bridge CNI enforces none), with the devcluster's admin
kubeconfig, it runs the signer on the real node from its image as shipped (imported into the
node's containerd); its 2 replicas become Ready, and the real kubelet
projects a pod's credential that the chart's signer issued. `helm test` runs the chart's test
pod, which gets a credential the same way and checks its chain and SPIFFE ID; a second release
is refused (one per cluster), naming the one installed. `helm upgrade` with another policy (a
shorter maxLifetimeSeconds) rolls the pods (the chart puts the policy's checksum on their
template; the signer reads its policy at start) and the new ones issue under it. `helm
uninstall` leaves none of the objects the release applied, and with its namespace goes what the
signer made there (the CA Secret, the Lease). Kept by design: the ClusterTrustBundle the signer
published, made at run time and not part of the release, which pods that project it keep
reading.

test_in_cluster applies the same objects (same names, podcert-system), so each module starts
from none of them and leaves none behind: the two share a session, and the real node in turn."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import functools
import json
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from devcluster import imagebuild, incluster, processes, release
from devcluster.identities import Paths
from devcluster.testing import DevCluster, Kubelet, eventually
from podcert import __version__
from podcert.client.rest import ApiError, Rest, path_of
from tests.integration.kubelet_helpers import CERTIFICATES
from tests.integration.test_chart import CHECKSUM, helm, render, run
from tests.integration.test_in_cluster import (
    NAMESPACE,
    credential_pod,
    issued_to,
    leader,
    ready,
    signer_pods,
)
from tests.integration.test_manifests import object_path

__all__ = ["helm"]  # the fixture, shared with test_chart

RELEASE = "podcert"
# Where helm keeps the release record: any namespace but the chart's own (README).
RELEASE_NAMESPACE = "default"
TRUST_BUNDLE = "podcert.dev:workload:roots"  # signer/authority/trustbundles.py bundle_name
SHORTER = 3600  # the upgrade's policy.maxLifetimeSeconds (shipped: 86400)
# The chart's `helm test` pod (templates/tests/credential.yaml), in the release's namespace.
TEST_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "podcert-test-credential", "namespace": RELEASE_NAMESPACE},
}
# The devcluster's bridge CNI enforces no NetworkPolicy: the chart's message says to turn it off.
NO_NETWORK_POLICY = ("--set=networkPolicy.enabled=false",)

pytestmark = pytest.mark.timeout(900)  # the first test also builds or loads the image


@pytest.fixture(scope="module")
def cluster_helm(helm: list[str], devcluster: DevCluster) -> list[str]:
    """helm as an operator runs it against the devcluster: its admin kubeconfig."""
    kubeconfig = Paths(devcluster.root.resolve()).admin_kubeconfig
    return [*helm, f"--kubeconfig={kubeconfig}", f"--namespace={RELEASE_NAMESPACE}"]


def found(rest: Rest, method: str, doc: dict[str, Any]) -> bool:
    """`method` (GET, DELETE) on a manifest's object; False when there is none."""
    try:
        rest.request(method, object_path(doc))
    except ApiError as err:
        if err.status != 404:
            raise
        return False
    return True


def present(rest: Rest, docs: list[dict[str, Any]]) -> list[str]:
    """Which of these objects exist (a terminating namespace does)."""
    return [f"{d['kind']}/{d['metadata']['name']}" for d in docs if found(rest, "GET", d)]


def clear(rest: Rest, docs: list[dict[str, Any]]) -> None:
    """Delete whichever of these objects exist (namespaces last), and wait until none does."""
    for doc in reversed(docs):
        found(rest, "DELETE", doc)
    eventually(lambda: not present(rest, docs), timeout=120, interval=0.5, what="none left")


@contextlib.contextmanager
def chart_node(
    devcluster: DevCluster,
    kubelet: Kubelet,
    docs: list[dict[str, Any]],
    load_images: Callable[[], None],
) -> Iterator[Rest]:
    """The real node holding the chart's images (`load_images`), pods scheduled onto it alone
    and reaching the API server, and none of `docs` before or after.

    An earlier module's leftovers (a dry-run's namespace, an RBAC check's ClusterRole) would
    make `helm install` refuse to take them over, and the trust-bundle policy installed for
    earlier signers run as the chart's ServiceAccount would judge the chart's signer by their
    signer names too: start as a fresh cluster would."""
    rest = Rest(devcluster.admin)
    leftovers = processes.signer_trust_bundle_policy(NAMESPACE, [], NAMESPACE)
    clear(rest, [*leftovers, *docs])
    load_images()
    incluster.schedulable(rest, kubelet.name)
    with (
        incluster.only_node(rest, kubelet.name),
        incluster.api_server_for_pods(devcluster.state),
    ):
        try:
            yield rest
        finally:
            clear(rest, docs)


@pytest.fixture(scope="module")
def package(released: release.Artefacts) -> str:
    """The chart package of the release (`podcert-<chart version>.tgz`)."""
    return str(released.chart)


@pytest.fixture(scope="module")
def installed(
    devcluster: DevCluster,
    real_kubelet: Kubelet,
    helm: list[str],
    cluster_helm: list[str],
    released: release.Artefacts,
    package: str,
) -> Iterator[Rest]:
    docs = render(helm)
    load = functools.partial(incluster.load_image, real_kubelet.state, released.image)
    with chart_node(devcluster, real_kubelet, docs, load) as rest:
        refused = run(cluster_helm, "install", RELEASE, package, check=False)
        assert refused.returncode != 0
        assert "networkPolicy.webhookFrom is not set" in refused.stderr
        assert run(cluster_helm, "status", RELEASE, check=False).returncode != 0
        run(cluster_helm, "install", RELEASE, package, *NO_NETWORK_POLICY)
        try:
            yield rest
        finally:
            run(cluster_helm, "uninstall", RELEASE, check=False)  # done unless a test failed


def ready_replicas(rest: Rest, count: int = 2, checksum: str | None = None) -> list[Any]:
    """`count` signer pods, every one Ready (and with this policy checksum, when given)."""

    def probe() -> list[dict[str, Any]] | None:
        pods = signer_pods(rest)
        if len(pods) != count or not all(ready(p) for p in pods):
            return None
        if checksum and any(policy_checksum(p) != checksum for p in pods):
            return None
        return pods

    found: list[dict[str, Any]] = eventually(
        probe, timeout=240, interval=0.5, what=f"{count} ready signer replicas"
    )
    return found


def policy_checksum(pod: dict[str, Any]) -> str:
    return str((pod["metadata"].get("annotations") or {}).get(CHECKSUM))


def helm_release(cluster_helm: list[str]) -> dict[str, Any]:
    status: dict[str, Any] = yaml.safe_load(
        run(cluster_helm, "status", RELEASE, "--output=json").stdout
    )
    return status


def issuing_ca(rest: Rest) -> x509.Certificate:
    """The issuing CA the chart's signer keeps in its namespace's Secret."""
    secret = rest.request("GET", path_of("v1", "secrets", NAMESPACE, "podcert-ca"))
    return x509.load_pem_x509_certificates(base64.b64decode(secret["data"]["tls.crt"]))[0]


def credential(rest: Rest, devcluster: DevCluster, kubelet: Kubelet, name: str) -> x509.Certificate:
    """The leaf the real kubelet writes for a new pod, checked to come from the chart's CA."""
    namespace, uid = credential_pod(devcluster, name)
    leaf = issued_to(kubelet, uid, namespace)[0]
    leaf.verify_directly_issued_by(issuing_ca(rest))
    return leaf


def lifetime(leaf: x509.Certificate) -> dt.timedelta:
    return leaf.not_valid_after_utc - leaf.not_valid_before_utc


def image_config_digest(archive: Path) -> str:
    """The config digest of the image an OCI archive holds, by way of the manifest its index
    names (the digest the release's SBOMs name the image by)."""
    digest = release.manifest_digest(archive)
    with tarfile.open(archive) as tar:
        member = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
        assert member is not None
        manifest = json.load(member)
    return str(manifest["config"]["digest"])


def test_helm_install_runs_two_ready_replicas_of_the_released_image(
    installed: Rest, cluster_helm: list[str], released: release.Artefacts
) -> None:
    assert helm_release(cluster_helm)["info"]["status"] == "deployed"
    [listed] = yaml.safe_load(run(cluster_helm, "list", "--output=json").stdout)
    assert (listed["chart"], listed["app_version"]) == (released.chart.stem, __version__)
    config = image_config_digest(released.image)
    pods = ready_replicas(installed)
    for pod in pods:
        spec = pod["spec"]
        assert spec["nodeName"] == "node-real"
        assert spec["serviceAccountName"] == "podcert-signer"
        [container] = spec["containers"]
        assert container["image"] == imagebuild.IMAGE
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        [status] = pod["status"]["containerStatuses"]
        # containerd names an image by its config's digest: the one the archive's manifest names.
        assert status["imageID"] == config, "not the release's image archive"
    names = {p["metadata"]["name"] for p in pods}
    assert eventually(lambda: leader(installed) in names, timeout=60, what="a leader")


def test_the_real_kubelet_projects_a_credential_from_the_chart_installed_signer(
    installed: Rest, devcluster: DevCluster, real_kubelet: Kubelet
) -> None:
    ready_replicas(installed)
    leaf = credential(installed, devcluster, real_kubelet, "from-helm")
    assert lifetime(leaf) > dt.timedelta(hours=23)  # the shipped policy: up to 24 h


def test_helm_test_gets_a_credential_and_checks_its_chain_and_spiffe_id(
    installed: Rest, cluster_helm: list[str]
) -> None:
    ready_replicas(installed)
    try:
        done = run(cluster_helm, "test", RELEASE, "--timeout=4m", "--logs", check=False)
    finally:
        # Helm keeps a test pod until the next `helm test` (and past `helm uninstall`).
        clear(installed, [TEST_POD])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Phase:          Succeeded" in done.stdout
    identity = f"spiffe://cluster.local/ns/{RELEASE_NAMESPACE}/sa/default"
    assert f"ok: {identity} from podcert.dev/workload, valid until" in done.stdout


def test_a_second_release_is_refused_naming_the_installed_one(
    installed: Rest, cluster_helm: list[str], package: str
) -> None:
    done = run(cluster_helm, "install", "another", package, *NO_NETWORK_POLICY, check=False)
    assert done.returncode != 0
    assert (
        "podcert is installed once per cluster and is already installed here (ClusterRole "
        f"podcert-signer belongs to release {RELEASE} in namespace {RELEASE_NAMESPACE})"
    ) in done.stderr
    assert run(cluster_helm, "status", "another", check=False).returncode != 0


def test_helm_upgrade_with_another_policy_rolls_the_signer_out(
    installed: Rest,
    devcluster: DevCluster,
    real_kubelet: Kubelet,
    cluster_helm: list[str],
    package: str,
) -> None:
    before = {p["metadata"]["name"] for p in ready_replicas(installed)}
    run(
        cluster_helm,
        "upgrade",
        RELEASE,
        package,
        *NO_NETWORK_POLICY,
        f"--set-json=policy.maxLifetimeSeconds={SHORTER}",
    )
    assert helm_release(cluster_helm)["version"] == 2
    [deployment] = [
        d
        for d in yaml.safe_load_all(run(cluster_helm, "get", "manifest", RELEASE).stdout)
        if d and d["kind"] == "Deployment"
    ]
    checksum = deployment["spec"]["template"]["metadata"]["annotations"][CHECKSUM]
    after = {p["metadata"]["name"] for p in ready_replicas(installed, checksum=checksum)}
    assert not after & before, "the old pods kept running"
    eventually(lambda: leader(installed) in after, timeout=90, interval=0.5, what="a new leader")
    leaf = credential(installed, devcluster, real_kubelet, "after-upgrade")
    assert lifetime(leaf) <= dt.timedelta(seconds=SHORTER + 300)  # notBefore is backdated


def test_helm_uninstall_leaves_nothing_of_the_release(
    installed: Rest, cluster_helm: list[str]
) -> None:
    applied = [
        d for d in yaml.safe_load_all(run(cluster_helm, "get", "manifest", RELEASE).stdout) if d
    ]
    assert len(applied) >= 12
    run(cluster_helm, "uninstall", RELEASE)
    # The namespace goes last (its pods, the CA Secret and the Lease with it).
    eventually(lambda: not present(installed, applied), timeout=120, interval=0.5, what="gone")
    assert run(cluster_helm, "status", RELEASE, check=False).returncode != 0
    records = installed.request(
        "GET",
        path_of("v1", "secrets", RELEASE_NAMESPACE),
        query={"labelSelector": f"owner=helm,name={RELEASE}"},
    )
    assert records["items"] == []
    # Kept by design: the signer's trust bundle (cluster-scoped, not the chart's), which running
    # pods project; a new install's signer writes its own roots into it.
    bundle = installed.request(
        "GET", path_of(CERTIFICATES, "clustertrustbundles", None, TRUST_BUNDLE)
    )
    assert bundle["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "podcert-signer"
