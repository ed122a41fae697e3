"""Issue 7: every manifest passes server-side dry-run on the real API server, the signer's pod
template passes the `restricted` Pod Security level, and its RBAC is exactly what it needs.

The dry-run creates each object under a fresh name, so that one already in the cluster (applied
by another test) is still validated: a 409 would say nothing about the manifest (issue 15)."""

from __future__ import annotations

import copy as copy_module
import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import kube
from devcluster.testing import DevCluster
from podcert.rest import ApiError, Rest, path_of

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
SIGNER_SA = "system:serviceaccount:podcert-system:podcert-signer"

_PATHS = {
    "Namespace": ("v1", "namespaces"),
    "Pod": ("v1", "pods"),
    "ServiceAccount": ("v1", "serviceaccounts"),
    "ConfigMap": ("v1", "configmaps"),
    "Service": ("v1", "services"),
    "Deployment": ("apps/v1", "deployments"),
    "DaemonSet": ("apps/v1", "daemonsets"),
    "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets"),
    "NetworkPolicy": ("networking.k8s.io/v1", "networkpolicies"),
    "ClusterRole": ("rbac.authorization.k8s.io/v1", "clusterroles"),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "clusterrolebindings"),
    "Role": ("rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", "rolebindings"),
    "ValidatingWebhookConfiguration": (
        "admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
    ),
    "ValidatingAdmissionPolicy": (
        "admissionregistration.k8s.io/v1",
        "validatingadmissionpolicies",
    ),
    "ValidatingAdmissionPolicyBinding": (
        "admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
    ),
}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def kustomize_files(folder: Path) -> list[Path]:
    """The files a kustomization lists, depth first (plain resource lists only)."""
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    out: list[Path] = []
    for entry in spec.get("resources", []):
        target = folder / entry
        out += kustomize_files(target) if target.is_dir() else [target]
    return out


def documents(paths: list[Path]) -> list[dict[str, Any]]:
    return [d for p in paths for d in yaml.safe_load_all(p.read_text()) if d]


def bases() -> list[Path]:
    return sorted(p.parent for p in MANIFESTS.rglob("kustomization.yaml"))


def dry_run(rest: Rest, doc: dict[str, Any]) -> dict[str, Any]:
    gv, plural = _PATHS[doc["kind"]]
    ns = None if doc["kind"] in CLUSTER_SCOPED else doc["metadata"].get("namespace", "default")
    return rest.request("POST", path_of(gv, plural, ns), query={"dryRun": "All"}, body=doc)


def renamed(doc: dict[str, Any], suffix: str) -> dict[str, Any]:
    """`doc` under a name no object in the cluster has (every field but the name as written)."""
    copy = copy_module.deepcopy(doc)
    copy["metadata"]["name"] = f"{doc['metadata']['name']}-{suffix}"
    return copy


@pytest.mark.parametrize("base", bases(), ids=lambda p: str(p.relative_to(MANIFESTS)))
def test_every_manifest_passes_server_side_dry_run(devcluster: DevCluster, base: Path) -> None:
    docs = documents(kustomize_files(base))
    assert docs, f"{base} lists no resources"
    rest = Rest(devcluster.admin)
    # Namespaces for real (a dry-run namespace does not exist for the objects inside it).
    for doc in docs:
        if doc["kind"] == "Namespace":
            kube.ensure_namespace(devcluster.admin, doc["metadata"]["name"])
    suffix = f"dry{secrets.token_hex(3)}"
    validated = []
    for doc in docs:
        try:
            out = dry_run(rest, renamed(doc, suffix))
        except ApiError as err:  # a 409 too: the fresh name cannot exist, so it is a finding
            raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']}: {err}") from None
        validated.append((out["kind"], out["metadata"]["name"]))
    assert validated == [(d["kind"], f"{d['metadata']['name']}-{suffix}") for d in docs]


def test_the_signer_base_restricts_the_webhook_port_with_a_valid_network_policy(
    devcluster: DevCluster,
) -> None:
    """Issue 18: the NetworkPolicy is part of the signer base (so the dry-run above covers it),
    and the API server accepts it, named ports included."""
    [policy] = [
        d for d in documents(kustomize_files(MANIFESTS / "signer")) if d["kind"] == "NetworkPolicy"
    ]
    kube.ensure_namespace(devcluster.admin, "podcert-system")
    rest = Rest(devcluster.admin)
    gv, plural = _PATHS["NetworkPolicy"]
    out = rest.request(
        "POST", path_of(gv, plural, "podcert-system"), query={"dryRun": "All"}, body=policy
    )
    ingress = out["spec"]["ingress"]
    assert [rule["ports"][0]["port"] for rule in ingress] == ["webhook", "metrics"]
    assert ingress[0]["from"][0]["ipBlock"]["cidr"]


def test_the_signer_pod_passes_the_restricted_pod_security_level(devcluster: DevCluster) -> None:
    (deployment,) = [d for d in documents([MANIFESTS / "signer" / "deployment.yaml"])]
    kube.ensure_namespace(devcluster.admin, "podcert-system")
    template = deployment["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pss-check", "namespace": "podcert-system", **template["metadata"]},
        "spec": template["spec"],
    }
    rest = Rest(devcluster.admin)
    rest.request(
        "PATCH",
        path_of("v1", "namespaces", None, "podcert-system"),
        body={"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
        content_type="application/merge-patch+json",
    )
    kube.ensure_service_account(devcluster.admin, "podcert-system", "podcert-signer")
    # Admitted under `restricted`; a privileged variant of the same pod is not.
    dry_run(rest, pod)
    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    with pytest.raises(ApiError, match="restricted"):
        dry_run(rest, pod)


def can(rest: Rest, verb: str, group: str, resource: str, **attrs: str) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": SIGNER_SA,
            "groups": ["system:serviceaccounts", "system:serviceaccounts:podcert-system"],
            "resourceAttributes": {"verb": verb, "group": group, "resource": resource, **attrs},
        },
    }
    out = rest.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=review)
    return bool(out["status"].get("allowed"))


ALLOWED = [
    ("sign", "certificates.k8s.io", "signers", {"name": "podcert.dev/workload"}),
    ("attest", "certificates.k8s.io", "signers", {"name": "podcert.dev/workload"}),
    # Federation: federated trust domains' roots, in bundles linked to a signer name of their own.
    ("attest", "certificates.k8s.io", "signers", {"name": "podcert.dev/federated"}),
    ("watch", "certificates.k8s.io", "podcertificaterequests", {}),
    (
        "update",
        "certificates.k8s.io",
        "podcertificaterequests",
        {"subresource": "status", "namespace": "shop"},
    ),
    ("create", "certificates.k8s.io", "clustertrustbundles", {}),
    ("get", "", "pods", {"namespace": "shop"}),
    ("get", "", "nodes", {}),
    ("get", "", "serviceaccounts", {"namespace": "shop"}),
    ("create", "", "events", {"namespace": "shop"}),
    ("get", "", "secrets", {"namespace": "podcert-system", "name": "podcert-ca"}),
    (
        "update",
        "coordination.k8s.io",
        "leases",
        {"namespace": "podcert-system", "name": "podcert-signer"},
    ),
]
DENIED = [
    ("sign", "certificates.k8s.io", "signers", {"name": "other.example.com/signer"}),
    ("sign", "certificates.k8s.io", "signers", {"name": "podcert.dev/federated"}),
    ("sign", "certificates.k8s.io", "signers", {"name": "kubernetes.io/kube-apiserver-client"}),
    ("get", "", "secrets", {"namespace": "podcert-system", "name": "someone-elses"}),
    ("get", "", "secrets", {"namespace": "shop", "name": "podcert-ca"}),
    ("list", "", "secrets", {"namespace": "shop"}),
    ("create", "", "pods", {"namespace": "shop"}),
    ("update", "certificates.k8s.io", "podcertificaterequests", {"namespace": "shop"}),
    ("delete", "", "nodes", {}),
]


def test_signer_rbac_is_exactly_what_it_needs(devcluster: DevCluster) -> None:
    kube.ensure_namespace(devcluster.admin, "podcert-system")
    kube.apply(devcluster.admin, documents([MANIFESTS / "signer" / "rbac.yaml"]))
    rest = Rest(devcluster.admin)
    missing = [a for a in ALLOWED if not can(rest, a[0], a[1], a[2], **a[3])]
    excess = [a for a in DENIED if can(rest, a[0], a[1], a[2], **a[3])]
    assert missing == [], f"the signer lacks {missing}"
    assert excess == [], f"the signer may do more than it needs: {excess}"
