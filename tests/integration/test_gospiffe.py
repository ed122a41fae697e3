"""podcert's X509-SVIDs judged by go-spiffe, the reference SPIFFE library.

Credentials projected by the shim and by the kubelet (kubemark's hollow kubelet: the real
kubelet code, writing real files) are loaded with go-spiffe's x509svid and x509bundle, verified
with `x509svid.Verify`, and used for mutual TLS with the Python example pair in both directions
(go-spiffe client -> Python server, Python client -> go-spiffe server), each side authorizing the
other with go-spiffe's `AuthorizeID` / `AuthorizeMemberOf` or `bundles.authz`. Then again after
a leaf rotation and at each step of a CA rotation (prepare -> activate -> retire). Whatever
go-spiffe refuses is a bug in podcert.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import build, kube, processes
from devcluster.identities import Paths
from devcluster.testing import DevCluster, Kubelet, eventually
from tests.integration.conftest import StartShim, StartSigner
from tests.integration.interop_helpers import (
    Files,
    GoSpiffe,
    GoSpiffeRefused,
    Operator,
    python_client,
    python_server,
)

SIGNER = "gospiffe.podcert.dev/workload"
TRUST_DOMAIN = "gospiffe.test"
SIGNER_NAMESPACE = "podcert-gospiffe"
KEY_TYPES = ["ECDSAP256", "ED25519", "RSA3072"]
POLICY = f"""
signers:
  - name: {SIGNER}
    trustDomain: {TRUST_DOMAIN}
    keyTypes: [{", ".join(KEY_TYPES)}]
    allow:
      - namespaces: ["gs-*"]
        serviceAccounts: ["*"]
"""


@pytest.fixture(scope="module")
def gospiffe() -> GoSpiffe:
    return GoSpiffe(build.ensure_interop("gospiffe"))


@pytest.fixture(scope="module")
def signer(start_signer: StartSigner, tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("gospiffe-signer")
    (work / "policy.yaml").write_text(POLICY)
    return start_signer(SIGNER, namespace=SIGNER_NAMESPACE, policy=work / "policy.yaml")


@pytest.fixture(scope="module")
def shim(start_shim: StartShim, signer: Any) -> processes.Shim:
    return start_shim("gs-node")


def spiffe_id(namespace: str, service_account: str) -> str:
    return f"spiffe://{TRUST_DOMAIN}/ns/{namespace}/sa/{service_account}"


def make_pods(
    devcluster: DevCluster, node: str, key_type: str, volume_dir: Any
) -> tuple[str, dict[str, Files]]:
    """Pods `api` (service account api) and `web` (web) on `node`; their files, once written."""
    ns = devcluster.namespace("gs")
    files = {}
    for name in ("api", "web"):
        pod = devcluster.pod(
            ns,
            name,
            node=node,
            service_account=name,
            volumes=[
                kube.pod_certificate_volume(SIGNER, key_type=key_type, trust_bundle_signer=True)
            ],
        )
        files[name] = Files(volume_dir(pod.metadata.uid))
    for name, found in files.items():
        eventually(found.ready, timeout=60, what=f"{name}'s credential on {node}")
    return ns, files


def check_both_directions(
    gospiffe: GoSpiffe, ns: str, files: dict[str, Files], log: Path, *, by_trust_domain: bool
) -> None:
    """go-spiffe client -> Python server, and Python client -> go-spiffe server; `api` serves
    and `web` calls. go-spiffe authorizes its peer by ID, or with `by_trust_domain` by trust
    domain; the Python side always by ID."""
    api, web = spiffe_id(ns, "api"), spiffe_id(ns, "web")
    go_peer = {"server_trust_domain": TRUST_DOMAIN} if by_trust_domain else {"server_id": api}
    with python_server(files["api"], log, allow_id=web) as url:
        answer = gospiffe.client(files["web"], url, **go_peer)
    assert answer["ok"] == 3
    assert answer["server_id"] == api
    assert {a["caller"] for a in answer["answers"]} == {web}

    go_peer = {"client_trust_domain": TRUST_DOMAIN} if by_trust_domain else {"client_id": web}
    with gospiffe.serve(files["api"], **go_peer) as server:
        summary = python_client(files["web"], server.url, server_id=api)
        served = server.stop()
    assert summary["exit"] == 0 and summary["failed"] == 0, summary
    assert summary["ok"] > 0
    assert served["callers"] == [web]


# --- the shim -----------------------------------------------------------------------------------


@pytest.mark.parametrize("key_type", KEY_TYPES)
def test_go_spiffe_verifies_and_talks_mtls_on_shim_credentials(
    devcluster: DevCluster,
    gospiffe: GoSpiffe,
    shim: processes.Shim,
    tmp_path: Path,
    key_type: str,
) -> None:
    ns, files = make_pods(devcluster, "gs-node", key_type, shim.volume_dir)
    for name, found in files.items():
        verified = gospiffe.verify(found)
        assert verified["spiffe_id"] == spiffe_id(ns, name)
        assert verified["chain"] == 2  # leaf and intermediate; the root is in the trust bundle
    check_both_directions(
        gospiffe, ns, files, tmp_path / "server.log", by_trust_domain=key_type == "ED25519"
    )


def test_go_spiffe_refuses_a_peer_it_was_not_told_to_trust(
    devcluster: DevCluster, gospiffe: GoSpiffe, shim: processes.Shim, tmp_path: Path
) -> None:
    """The authorizers do say no: a control for the tests above."""
    ns, files = make_pods(devcluster, "gs-node", "ECDSAP256", shim.volume_dir)
    with python_server(files["api"], tmp_path / "server.log", allow_id=spiffe_id(ns, "web")) as url:
        with pytest.raises(GoSpiffeRefused, match="unexpected ID"):
            gospiffe.client(files["web"], url, server_id=spiffe_id(ns, "other"))
        with pytest.raises(GoSpiffeRefused, match="unexpected trust domain"):
            gospiffe.client(files["web"], url, server_trust_domain="elsewhere.test")
    with gospiffe.serve(files["api"], client_id=spiffe_id(ns, "other")) as server:
        summary = python_client(files["web"], server.url, server_id=spiffe_id(ns, "api"))
    assert summary["exit"] == 1
    assert summary["ok"] == 0


def test_go_spiffe_across_leaf_and_ca_rotations(
    devcluster: DevCluster, gospiffe: GoSpiffe, shim: processes.Shim, tmp_path: Path
) -> None:
    """The same two pods through a forced leaf rotation and a whole CA rotation; both servers
    keep running (each re-reads its files), go-spiffe checks every step."""
    ns, files = make_pods(devcluster, "gs-node", "ECDSAP256", shim.volume_dir)
    operator = Operator(Paths(devcluster.root.resolve()).admin_kubeconfig)

    def rotate_leaves() -> None:
        before = {n: gospiffe.verify(f)["serial"] for n, f in files.items()}
        for name in files:
            operator.rotate(ns, name)
        for name, found in files.items():
            eventually(
                lambda f=found, n=name: gospiffe.verify(f)["serial"] != before[n],
                timeout=30,
                what=f"{name}'s new leaf",
            )

    def check(step: str) -> str:
        """The root go-spiffe chained the leaves to, after checking both directions."""
        roots = set()
        for name, found in files.items():
            verified = gospiffe.verify(found)
            assert verified["spiffe_id"] == spiffe_id(ns, name), step
            roots.update(verified["verified_to"])
        check_both_directions(
            gospiffe, ns, files, tmp_path / f"server-{step}.log", by_trust_domain=False
        )
        (root,) = roots
        return str(root)

    first_root = check("issued")
    rotate_leaves()
    assert check("leaf rotated") == first_root

    operator.ca(SIGNER_NAMESPACE, "prepare")
    eventually(lambda: all(f.roots() == 2 for f in files.values()), timeout=30, what="two roots")
    assert check("prepared") == first_root  # old leaves, two roots
    operator.ca(SIGNER_NAMESPACE, "activate")
    rotate_leaves()  # leaves from the new CA, verified against both roots
    new_root = check("activated")
    assert new_root != first_root
    operator.ca(SIGNER_NAMESPACE, "retire", "--force")
    eventually(lambda: all(f.roots() == 1 for f in files.values()), timeout=30, what="one root")
    assert check("retired") == new_root


# --- the kubelet ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kubelet(hollow_kubelet: Kubelet, signer: Any) -> Iterator[Kubelet]:
    yield hollow_kubelet


@pytest.mark.parametrize("key_type", KEY_TYPES)
def test_go_spiffe_verifies_and_talks_mtls_on_kubelet_credentials(
    devcluster: DevCluster, gospiffe: GoSpiffe, kubelet: Kubelet, tmp_path: Path, key_type: str
) -> None:
    ns, files = make_pods(devcluster, kubelet.name, key_type, kubelet.volume_dir)
    for name, found in files.items():
        verified = gospiffe.verify(found)
        assert verified["spiffe_id"] == spiffe_id(ns, name)
    check_both_directions(
        gospiffe, ns, files, tmp_path / "server.log", by_trust_domain=key_type == "RSA3072"
    )
