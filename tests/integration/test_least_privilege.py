"""Least privilege for the two identities RBAC alone cannot narrow, on the real API
server, with the shipped RBAC and admission policies.

- The shim's clean-up ServiceAccount (manifests/shim: its token is on every node) may delete only
  the pending requests of the node its token is bound to (cleanup-policy.yaml): not another
  node's, not a settled one, nothing with a token bound to no pod or node.
- The signer's ServiceAccount may write only ClusterTrustBundles linked to its own signer names
  and the federated one (manifests/signer/trust-bundle-policy.yaml, which devcluster.processes
  installs for every test signer): it may not delete another signer's bundle, nor create,
  replace or delete one linked to no signer.

Each write those rules forbid is refused, and the legitimate writes still go through: a real shim
deleting its own node's pending request of a deleted pod, a real signer publishing its bundle,
following a CA rotation, removing its stale bundle, and publishing a federated trust domain's.
1.35 and 1.36 (v1beta1, the other key forms) are checked on clusters of their own.

Pods are bound to Node objects no kubelet serves: nothing runs them.
"""

from __future__ import annotations

import base64
import datetime as dt
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from kubernetes import client

from devcluster import build, cluster, kube, processes
from devcluster.supervise import free_port
from devcluster.testing import DevCluster, eventually
from kubelet_shim.kube import ShimKube
from podcert.api import keys
from podcert.api.versions import group_version
from podcert.client.discovery import certificates_versions, key_form
from podcert.client.rest import JSON, ApiError, Rest, load_client, path_of
from signer.authority.trustbundles import MANAGED_BY, bundle_name
from tests.integration.conftest import StartSigner
from tests.integration.helpers import pcr_spec
from tests.integration.kubelet_helpers import ca, trust_bundle_roots
from tests.integration.shim_helpers import certificate_volume, shim
from tests.integration.test_manifests import MANIFESTS, documents

SHIM_NAMESPACE = "podcert-shim"  # manifests/shim, as shipped
CLEANUP_SA = "podcert-shim-cleanup"
NODE_A = "lp-node-a"
NODE_B = "lp-node-b"
UNSERVED = "lp.podcert.dev/nobody-answers"  # no signer answers: its requests stay pending

SIGNER = "lp.podcert.dev/workload"
SIGNER_NAMESPACE = "podcert-lp"
TRUST_DOMAIN = "lp.test"
OTHER_SIGNER = "lp-other.podcert.dev/workload"  # another signer's, not ours to touch
UNSIGNED = "lp-corp-roots"  # an operator's bundle linked to no signer


def shipped(*paths: str) -> list[dict[str, Any]]:
    return documents([MANIFESTS / p for p in paths])


def pem_root() -> str:
    return trustme.CA().cert_pem.bytes().decode()


# --- requests, as a node makes them on any minor ----------------------------------------------


def request_path(rest: Rest, namespace: str, name: str = "") -> str:
    version, _ = certificates_versions(rest)
    return path_of(group_version(version), "podcertificaterequests", namespace, name)


def victim(dc: DevCluster, namespace: str, name: str, node: str) -> Any:
    """A pod on `node` that projects a credential of UNSERVED (its node may ask for one)."""
    return dc.pod(namespace, name, node=node, volumes=[kube.pod_certificate_volume(UNSERVED)])


def pending_request(dc: DevCluster, pod: Any, signer: str = UNSERVED) -> JSON:
    """A request for `pod`, made by its node with the key form its server takes."""
    admin = Rest(dc.admin)
    version, _ = certificates_versions(admin)
    key = keys.generate("ECDSAP256")
    spec = pcr_spec(dc, pod, signer, key, key_form(admin, version))
    body = {
        "apiVersion": group_version(version),
        "kind": "PodCertificateRequest",
        "metadata": {"generateName": "lp-"},
        "spec": spec,
    }
    node_rest = Rest(dc.node(pod.spec.node_name))
    return node_rest.request("POST", request_path(admin, pod.metadata.namespace), body=body)


def deny(dc: DevCluster, pcr: JSON) -> None:
    """Settle the request as Denied (the admin may write any signer's status)."""
    rest = Rest(dc.admin)
    path = request_path(rest, pcr["metadata"]["namespace"], pcr["metadata"]["name"])
    current = rest.request("GET", path)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    current["status"] = {
        "conditions": [
            {
                "type": "Denied",
                "status": "True",
                "reason": "LeastPrivilegeTest",
                "message": "settled by the test",
                "lastTransitionTime": now,
            }
        ]
    }
    rest.request("PUT", path + "/status", body=current)


def exists(rest: Rest, path: str) -> bool:
    return rest.get(path) is not None


def refusal(rest: Rest, method: str, path: str, **kwargs: Any) -> ApiError | None:
    """The API server's refusal of the call, or None when it was done."""
    try:
        rest.request(method, path, **kwargs)
    except ApiError as err:
        return err
    return None


def delete_options(pcr: JSON) -> dict[str, Any]:
    """What the shim sends (kubelet_shim.kube.ShimKube.delete_pcr): its UID as precondition."""
    return {
        "apiVersion": "v1",
        "kind": "DeleteOptions",
        "preconditions": {"uid": pcr["metadata"]["uid"]},
    }


# --- the shim's clean-up identity ---------------------------------------------------------------


class Cleanup:
    """manifests/shim's RBAC and clean-up policy as shipped, and tokens of its ServiceAccount:
    bound to a shim pod on NODE_A (the DaemonSet's), bound to Node NODE_B (a shim run as a
    process), and bound to nothing."""

    def __init__(self, dc: DevCluster) -> None:
        self.dc = dc
        self.policy = shipped("shim/cleanup-policy.yaml")
        kube.ensure_namespace(dc.admin, SHIM_NAMESPACE)
        kube.apply(dc.admin, shipped("shim/rbac.yaml") + self.policy)
        for node in (NODE_A, NODE_B):
            kube.ensure_node(dc.admin, node)
        pod = dc.pod(
            SHIM_NAMESPACE,
            f"shim-{secrets.token_hex(3)}",
            node=NODE_A,
            service_account=CLEANUP_SA,
        )
        node_b = client.CoreV1Api(dc.admin).read_node(NODE_B)
        self.kubeconfigs = {
            "pod on a": kube.service_account_kubeconfig(
                dc.root, SHIM_NAMESPACE, CLEANUP_SA, bound_to=pod
            ),
            "node b": kube.service_account_kubeconfig(
                dc.root, SHIM_NAMESPACE, CLEANUP_SA, bound_to=node_b
            ),
            "unbound": kube.service_account_kubeconfig(dc.root, SHIM_NAMESPACE, CLEANUP_SA),
        }
        self.namespace = dc.namespace("lp")
        # The policy reaches the API server's admission within moments: wait until a dry run
        # of the cross-node deletion is refused before any test counts on it.
        probe = pending_request(dc, victim(dc, self.namespace, "probe", NODE_B))
        path = request_path(Rest(dc.admin), self.namespace, probe["metadata"]["name"])
        eventually(
            lambda: refusal(self.rest("pod on a"), "DELETE", path, query={"dryRun": "All"}),
            timeout=15,
            what="the clean-up policy to refuse a dry run",
        )

    def rest(self, token: str) -> Rest:
        return Rest(load_client(self.kubeconfigs[token]))

    def close(self) -> None:
        kube.delete(self.dc.admin, self.policy)


@pytest.fixture(scope="module")
def cleanup(devcluster: DevCluster) -> Iterator[Cleanup]:
    found = Cleanup(devcluster)
    try:
        yield found
    finally:
        found.close()


def delete_as(cleanup: Cleanup, token: str, pcr: JSON) -> ApiError | None:
    rest = Rest(cleanup.dc.admin)
    path = request_path(rest, pcr["metadata"]["namespace"], pcr["metadata"]["name"])
    return refusal(cleanup.rest(token), "DELETE", path, body=delete_options(pcr))


@pytest.mark.parametrize(
    ("token", "node", "settle", "refused_with"),
    [
        pytest.param(
            "pod on a",
            NODE_B,
            False,
            f"of node {NODE_A} may delete only that node's requests",
            id="a node's token may not delete another node's pending request",
        ),
        pytest.param(
            "node b",
            NODE_A,
            False,
            f"of node {NODE_B} may delete only that node's requests",
            id="a token bound to a Node object may not delete another node's request",
        ),
        pytest.param(
            "unbound",
            NODE_A,
            False,
            "must use a token bound to its pod or node",
            id="a token bound to no pod or node may delete no request",
        ),
        pytest.param(
            "pod on a",
            NODE_A,
            True,
            "may delete only pending requests",
            id="a node's token may not delete its own node's settled request",
        ),
    ],
)
def test_the_cleanup_identity_is_refused_every_deletion_but_its_own_nodes_pending_requests(
    cleanup: Cleanup, token: str, node: str, settle: bool, refused_with: str
) -> None:
    dc = cleanup.dc
    pod = victim(dc, cleanup.namespace, f"victim-{secrets.token_hex(3)}", node)
    pcr = pending_request(dc, pod)
    if settle:
        deny(dc, pcr)
    err = delete_as(cleanup, token, pcr)
    assert err is not None, "the clean-up identity deleted the request"
    assert err.status == 403, err
    assert refused_with in err.message
    path = request_path(Rest(dc.admin), cleanup.namespace, pcr["metadata"]["name"])
    assert exists(Rest(dc.admin), path)


@pytest.mark.parametrize(
    ("token", "node"),
    [
        pytest.param("pod on a", NODE_A, id="the token of a shim pod deletes its node's request"),
        pytest.param("node b", NODE_B, id="a Node-bound token deletes that node's request"),
    ],
)
def test_the_cleanup_identity_deletes_its_own_nodes_pending_request(
    cleanup: Cleanup, token: str, node: str
) -> None:
    """Through the shim's own call (ShimKube.delete_pcr, UID precondition and all)."""
    dc = cleanup.dc
    pod = victim(dc, cleanup.namespace, f"gone-{secrets.token_hex(3)}", node)
    pcr = pending_request(dc, pod)
    api = ShimKube(Rest(dc.node(node)), node, cleanup.rest(token))
    api.discover()
    meta = pcr["metadata"]
    assert api.delete_pcr(meta["namespace"], meta["name"], meta["uid"]) is True
    assert not exists(Rest(dc.admin), request_path(Rest(dc.admin), meta["namespace"], meta["name"]))


def test_a_shim_with_its_pods_token_deletes_the_pending_request_of_a_deleted_pod(
    cleanup: Cleanup, tmp_path: Path
) -> None:
    """The real shim, its clean-up identity the token of a shim pod on its node (the
    DaemonSet's), the policy in force. The pod is deleted orphaning its dependents, so the
    garbage collector leaves the request alone: only the shim can remove it."""
    dc = cleanup.dc
    proc = shim(
        dc,
        tmp_path,
        NODE_A,
        root=tmp_path / "root",
        cleanup_kubeconfig=cleanup.kubeconfigs["pod on a"],
    )
    proc.start()
    try:
        proc.wait_ready()
        pod = dc.pod(
            cleanup.namespace, "doomed", node=NODE_A, volumes=[certificate_volume(UNSERVED)]
        )
        admin = Rest(dc.admin)

        def requests() -> list[JSON]:
            items = admin.request("GET", request_path(admin, cleanup.namespace))["items"]
            return [i for i in items if i["spec"]["podUID"] == pod.metadata.uid]

        made = eventually(lambda: requests() or None, timeout=10, what="the shim's request")
        assert len(made) == 1
        client.CoreV1Api(dc.admin).delete_namespaced_pod(
            "doomed", cleanup.namespace, grace_period_seconds=0, propagation_policy="Orphan"
        )
        eventually(lambda: not requests(), timeout=30, what="the shim to delete the request")
        # The shim logs the deletion once the API server has answered it, which can be after
        # this test already sees the request gone: wait for the line, do not expect it yet.
        eventually(
            lambda: "deleted the pending request of a deleted pod" in proc.output(),
            timeout=10,
            what="the shim's line for the deletion",
        )
        assert "may not delete request" not in proc.output()
    finally:
        proc.stop()


# --- the signer's ClusterTrustBundle writes -----------------------------------------------------

CTBS = "clustertrustbundles"


def ctb_path(rest: Rest, name: str = "") -> str:
    _, version = certificates_versions(rest, trust_bundles=True)
    return path_of(group_version(version or "v1"), CTBS, None, name)


def bundle(rest: Rest, name: str, signer_name: str | None, **labels: str) -> JSON:
    _, version = certificates_versions(rest, trust_bundles=True)
    spec: dict[str, Any] = {"trustBundle": pem_root()}
    if signer_name:
        spec["signerName"] = signer_name
    return {
        "apiVersion": group_version(version or "v1"),
        "kind": "ClusterTrustBundle",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }


def put(rest: Rest, doc: JSON) -> JSON:
    """Create or replace the bundle (as the admin: who may write any)."""
    path = ctb_path(rest, doc["metadata"]["name"])
    current = rest.get(path)
    if current is None:
        return rest.request("POST", ctb_path(rest), body=doc)
    doc = {
        **doc,
        "metadata": {**doc["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]},
    }
    return rest.request("PUT", path, body=doc)


class SignerIdentity:
    """The signer's ServiceAccount of `namespace` with its shipped RBAC and trust-bundle policy
    (as devcluster.processes installs them), with others' bundles to attack."""

    def __init__(self, dc: DevCluster, namespace: str, signer_names: list[str]) -> None:
        self.dc = dc
        kubeconfig = processes.install_signer_identity(dc.root, namespace, signer_names, namespace)
        self.rest = Rest(load_client(kubeconfig))
        admin = Rest(dc.admin)
        self.other = put(admin, bundle(admin, bundle_name(OTHER_SIGNER), OTHER_SIGNER))
        self.unsigned = put(admin, bundle(admin, UNSIGNED, None))
        path = ctb_path(admin, bundle_name(OTHER_SIGNER))
        eventually(
            lambda: refusal(self.rest, "DELETE", path, query={"dryRun": "All"}),
            timeout=15,
            what="the trust-bundle policy to refuse a dry run",
        )

    def replaced(self, doc: JSON) -> JSON:
        """`doc` with another root, as a write over the stored one."""
        current = Rest(self.dc.admin).request("GET", ctb_path(self.rest, doc["metadata"]["name"]))
        return {**current, "spec": {**current["spec"], "trustBundle": pem_root()}}


def signer_attacks(identity: SignerIdentity) -> list[tuple[str, ApiError | None]]:
    """Each write of the finding, as the signer's ServiceAccount: what the API server said."""
    rest = identity.rest
    other, unsigned = bundle_name(OTHER_SIGNER), UNSIGNED
    return [
        ("delete another signer's bundle", refusal(rest, "DELETE", ctb_path(rest, other))),
        (
            "replace an unsigned bundle",
            refusal(
                rest, "PUT", ctb_path(rest, unsigned), body=identity.replaced(identity.unsigned)
            ),
        ),
        ("delete an unsigned bundle", refusal(rest, "DELETE", ctb_path(rest, unsigned))),
        (
            "create an unsigned bundle",
            refusal(rest, "POST", ctb_path(rest), body=bundle(rest, "lp-planted", None)),
        ),
    ]


def assert_refused_by_policy(attacks: list[tuple[str, ApiError | None]]) -> None:
    done = [what for what, err in attacks if err is None]
    assert done == [], f"the signer's ServiceAccount could {done}"
    for what, err in attacks:
        assert err is not None and err.status == 403, (what, err)
        assert "the signer may" in err.message and "linked to its signer names" in err.message, (
            what,
            err.message,
        )


@pytest.fixture(scope="module")
def signer_identity(devcluster: DevCluster) -> SignerIdentity:
    return SignerIdentity(devcluster, SIGNER_NAMESPACE, [SIGNER])


def test_the_signer_identity_may_not_touch_another_signers_or_an_unsigned_bundle(
    devcluster: DevCluster, signer_identity: SignerIdentity
) -> None:
    assert_refused_by_policy(signer_attacks(signer_identity))
    admin = Rest(devcluster.admin)
    assert (
        admin.request("GET", ctb_path(admin, bundle_name(OTHER_SIGNER)))["spec"]
        == (signer_identity.other["spec"])
    )
    assert (
        admin.request("GET", ctb_path(admin, UNSIGNED))["spec"]
        == (signer_identity.unsigned["spec"])
    )
    assert admin.get(ctb_path(admin, "lp-planted")) is None


def test_a_signer_publishes_follows_a_rotation_and_removes_its_stale_bundle(
    devcluster: DevCluster, signer_identity: SignerIdentity, start_signer: StartSigner
) -> None:
    """Create, update and delete, each of a bundle linked to its name, as the real signer."""
    admin = Rest(devcluster.admin)
    stale = bundle_name(SIGNER).replace(":roots", ":lp-stale")
    put(admin, bundle(admin, stale, SIGNER, **MANAGED_BY))
    start_signer(SIGNER, namespace=SIGNER_NAMESPACE, trust_domain=TRUST_DOMAIN)
    eventually(lambda: len(trust_bundle_roots(devcluster, SIGNER)) == 1, timeout=30)
    assert admin.get(ctb_path(admin, stale)) is None, "the stale bundle stays"
    ca(devcluster, SIGNER_NAMESPACE, "prepare")
    eventually(
        lambda: len(trust_bundle_roots(devcluster, SIGNER)) == 2,
        timeout=30,
        what="the prepared root in the signer's bundle",
    )


def test_a_signer_publishes_a_federated_trust_domains_bundle(
    devcluster: DevCluster, start_signer: StartSigner, tmp_path: Path
) -> None:
    """One signer federates with another through its bundle endpoint and publishes that trust
    domain's roots under the federated signer name rbac.yaml grants."""
    port = free_port()
    served = "lp-served.podcert.dev/workload"
    start_signer(
        served,
        namespace="podcert-lp-served",
        trust_domain="lp-served.test",
        bundle_endpoint_port=port,
        bundle_endpoint_host="127.0.0.1",
    )
    secret = client.CoreV1Api(devcluster.admin).read_namespaced_secret(
        "podcert-ca", "podcert-lp-served"
    )
    bootstrap = tmp_path / "served.pem"
    bootstrap.write_bytes(base64.b64decode(secret.data["ca.crt"]))
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "signers": [
                    {
                        "name": "lp-fed.podcert.dev/workload",
                        "trustDomain": "lp-fed.test",
                        "allow": [{"namespaces": ["*"], "serviceAccounts": ["*"]}],
                    }
                ],
                "federation": {
                    "signerName": processes.FEDERATED_SIGNER,
                    "trustDomains": [
                        {
                            "trustDomain": "lp-served.test",
                            "bundleEndpointURL": f"https://127.0.0.1:{port}/",
                            "bundleEndpointProfile": "https_spiffe",
                            "endpointSPIFFEID": "spiffe://lp-served.test/podcert/bundle-endpoint",
                            "bootstrapBundle": str(bootstrap),
                        }
                    ],
                },
            }
        )
    )
    start_signer("lp-fed.podcert.dev/workload", namespace="podcert-lp-fed", policy=policy)
    admin = Rest(devcluster.admin)
    name = f"{processes.FEDERATED_SIGNER.replace('/', ':')}:lp-served.test"
    found = eventually(lambda: admin.get(ctb_path(admin, name)), timeout=60, what=name)
    assert found["spec"]["signerName"] == processes.FEDERATED_SIGNER


# --- the same on the older minors ----------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.35", "1.36"])
def test_both_policies_hold_on_an_older_minor(version: str, tmp_path: Path) -> None:
    """v1beta1 requests and bundles, the key with its proof on 1.35: the same CEL, the same
    userInfo extra."""
    root = tmp_path / "cluster"
    state = cluster.up(root, kube_version=version)
    try:
        dc = DevCluster(root, state)
        assert Rest(dc.admin).request("GET", "/version")["gitVersion"] == build.release(version)
        cleanup = Cleanup(dc)
        ns = cleanup.namespace
        theirs = pending_request(dc, victim(dc, ns, "theirs", NODE_B))
        ours = pending_request(dc, victim(dc, ns, "ours", NODE_A))
        err = delete_as(cleanup, "pod on a", theirs)
        assert err is not None and err.status == 403 and "only that node's" in err.message
        err = delete_as(cleanup, "unbound", ours)
        assert err is not None and err.status == 403 and "bound to its pod" in err.message
        assert delete_as(cleanup, "pod on a", ours) is None
        identity = SignerIdentity(dc, "podcert-lp", [SIGNER])
        assert_refused_by_policy(signer_attacks(identity))
        mine = bundle(identity.rest, bundle_name(SIGNER), SIGNER)
        assert refusal(identity.rest, "POST", ctb_path(identity.rest), body=mine) is None
        dc.admin.close()  # type: ignore[no-untyped-call]
    finally:
        cluster.down(root)
