"""A shim whose node certificate is renewed in place, as the kubelet renews
its own (`kubelet-client-current.pem`, a link to the newest dated file holding certificate and
key, named by the kubeconfig as both), keeps projecting new pods' credentials after the old
certificate has expired: the client reads the files again and presents the renewed pair on new
connections, where it used to answer every new pod with `cannot create request: 401
Unauthorized` while /healthz stayed green."""

from __future__ import annotations

import datetime as dt
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bundles import formats
from devcluster import identities, kube, processes
from devcluster.identities import Paths
from devcluster.testing import DevCluster, eventually
from podcert.client.kubeconfig import from_kubeconfig
from podcert.client.rest import ApiError, Rest, path_of
from tests.integration.conftest import StartShim, StartSigner
from tests.integration.shim_helpers import certificate_volume

SIGNER = "rotation.podcert.dev/node"
NAMESPACE = "podcert-node-rotation"
NODE = "rotating-node"
OLD_LIFETIME = dt.timedelta(seconds=25)  # the API server refuses it after that


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("node-rotation")


@pytest.fixture(scope="module")
def signer(start_signer: StartSigner, work: Path) -> processes.Signer:
    return start_signer(SIGNER, namespace=NAMESPACE, workdir=work)


def refused(pair_kubeconfig: Path) -> bool:
    """Whether the API server now refuses the pair that kubeconfig carries (a new connection)."""
    rest = Rest(from_kubeconfig(pair_kubeconfig), timeout=5.0)
    try:
        rest.get(path_of("v1", "nodes", name=NODE))
    except ApiError as err:
        return err.status == 401
    finally:
        rest.close()
    return False


def credential_of(shim: processes.Shim, pod_uid: str) -> formats.Credential | None:
    try:
        data = (shim.volume_dir(pod_uid) / "credentialbundle.pem").read_bytes()
    except FileNotFoundError:
        return None
    return formats.load_credential(data)


def healthz(shim: processes.Shim) -> int:
    url = f"http://127.0.0.1:{shim.metrics_port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as err:
        return err.code


@pytest.fixture(scope="module")
def rotating(
    devcluster: DevCluster, work: Path, signer: processes.Signer, start_shim: StartShim
) -> Iterator[tuple[processes.Shim, Path]]:
    """A shim as NODE whose kubeconfig names its certificate files; the certificate in them
    expires OLD_LIFETIME after the start. Yields the shim and a kubeconfig carrying only the
    old pair (as data), to ask the API server whether it still takes it."""
    paths = Paths(devcluster.root.resolve())
    kube.ensure_node(devcluster.admin, NODE)
    now = dt.datetime.now(dt.UTC)
    old = identities.node_client_pair(
        paths, NODE, now - dt.timedelta(minutes=1), now + OLD_LIFETIME
    )
    config = identities.node_client_files(paths, NODE, devcluster.state.server, old)
    old_only = work / "old-pair.kubeconfig"
    old_only.write_text(
        identities.kubeconfig(
            devcluster.state.server,
            identities.load_ca(paths).cert_pem,
            f"system:node:{NODE}",
            identities.cert_creds(old),
        )
    )
    old_only.chmod(0o600)
    yield start_shim(NODE, workdir=work, kubeconfig=config), old_only


def test_a_renewed_node_certificate_keeps_new_pods_projected_after_the_old_one_expired(
    devcluster: DevCluster, rotating: tuple[processes.Shim, Path]
) -> None:
    shim, old_only = rotating
    ns = devcluster.namespace("rotation")
    before = devcluster.pod(ns, "before", node=NODE, volumes=[certificate_volume(SIGNER)])
    assert eventually(lambda: credential_of(shim, before.metadata.uid), timeout=10)

    # The kubelet's renewal: a new dated file, the link swapped. The old pair is left to expire.
    paths = Paths(devcluster.root.resolve())
    now = dt.datetime.now(dt.UTC)
    renewed = identities.node_client_pair(
        paths, NODE, now - dt.timedelta(minutes=1), now + dt.timedelta(days=1)
    )
    identities.node_client_files(paths, NODE, devcluster.state.server, renewed)
    timeout = OLD_LIFETIME.total_seconds() + 15
    eventually(lambda: refused(old_only), timeout=timeout, interval=0.5, what="the old pair 401")

    after = devcluster.pod(ns, "after", node=NODE, volumes=[certificate_volume(SIGNER)])
    credential = eventually(
        lambda: credential_of(shim, after.metadata.uid),
        timeout=15,
        what=f"the new pod's credential (shim log: {shim.log})",
    )
    assert credential.leaf.not_valid_after_utc > dt.datetime.now(dt.UTC)
    assert healthz(shim) == 200

    log = shim.log.read_text()
    assert "401" not in log, "no call was refused: the renewed pair was presented in time"
    lines = [line for line in log.splitlines() if "client certificate from" in line]
    assert len(lines) == 1 and "replaced" in lines[0], lines
    assert "PRIVATE KEY" not in log
