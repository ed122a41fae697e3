"""Every manifest passes server-side dry-run on the real API server, the signer's pod
template passes the `restricted` Pod Security level, and its RBAC is exactly what it needs.
Each base is read as `kubectl apply -k` applies it (`kustomize`: resources, ConfigMaps
generated from files and JSON 6902 `add` patches, the things our kustomizations use; checked
against kustomize v5.7.1's own output when written, the patches against kustomize v5.5.0's).
manifests/monitoring's prometheus-operator kinds have no CRDs here: their content is checked
by tests/unit/test_monitoring.py, their wiring below.

The dry-run creates each object under a fresh name, so that one already in the cluster (applied
by another test) is still validated: a 409 would say nothing about the manifest."""

from __future__ import annotations

import copy as copy_module
import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import kube
from devcluster.testing import DevCluster
from podcert.client.rest import ApiError, Rest, path_of

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
# prometheus-operator's kinds (manifests/monitoring): the devcluster has not their CRDs.
OPERATOR_KINDS = {
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def object_path(doc: dict[str, Any]) -> str:
    """The API path of a manifest's object."""
    gv, plural = _PATHS[doc["kind"]]
    namespace = None if doc["kind"] in CLUSTER_SCOPED else doc["metadata"]["namespace"]
    return path_of(gv, plural, namespace, doc["metadata"]["name"])


# What our kustomizations may say: resources, and ConfigMaps generated from files under fixed names.
# `kustomize` below reads exactly that; anything else would make its reading wrong.
KUSTOMIZATION = {
    "apiVersion",
    "kind",
    "resources",
    "configMapGenerator",
    "generatorOptions",
    "patches",
}
GENERATOR = {"name", "namespace", "files", "options"}
GENERATOR_OPTIONS = {"labels", "disableNameSuffixHash"}
# Patches: a file of JSON 6902 `add` operations on the objects of one kind and name.
PATCH = {"path", "target"}
TARGET = {"kind", "name"}


def kustomize(folder: Path) -> list[dict[str, Any]]:
    """The objects `kubectl apply -k folder` applies: the resources, depth first, then the
    generated ConfigMaps."""
    spec = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert set(spec) <= KUSTOMIZATION, f"{folder}: {sorted(spec)}"
    docs: list[dict[str, Any]] = []
    for entry in spec.get("resources", []):
        target = folder / entry
        docs += kustomize(target) if target.is_dir() else documents([target])
    shared = spec.get("generatorOptions", {})
    docs += [generated(folder, entry, shared) for entry in spec.get("configMapGenerator", [])]
    for patch in spec.get("patches", []):
        assert set(patch) == PATCH and set(patch["target"]) == TARGET, f"{folder}: {patch}"
        targets = [
            d
            for d in docs
            if (d["kind"], d["metadata"]["name"])
            == (patch["target"]["kind"], patch["target"]["name"])
        ]
        assert targets, f"{folder}: {patch['target']} matches nothing"
        for operation in yaml.safe_load((folder / patch["path"]).read_text()):
            for doc in targets:
                json_patch_add(doc, operation)
    return docs


def json_patch_add(doc: dict[str, Any], operation: dict[str, Any]) -> None:
    """RFC 6902 `add` (the only operation our patches use): into an object, or a list at an
    index or at its end (`-`)."""
    assert set(operation) == {"op", "path", "value"} and operation["op"] == "add", operation
    *parents, last = [
        p.replace("~1", "/").replace("~0", "~") for p in operation["path"].split("/")[1:]
    ]
    where: Any = doc
    for part in parents:
        where = where[int(part)] if isinstance(where, list) else where[part]
    value = copy_module.deepcopy(operation["value"])
    if isinstance(where, list):
        where.insert(len(where) if last == "-" else int(last), value)
    else:
        where[last] = value


def generated(folder: Path, entry: dict[str, Any], shared: dict[str, Any]) -> dict[str, Any]:
    """One configMapGenerator entry's ConfigMap: a key per file (`key=path` or the file's name),
    the generator's labels. Only with the name suffix hash off: its value is not computed here."""
    options = {**shared, **entry.get("options", {})}
    assert set(entry) <= GENERATOR and set(options) <= GENERATOR_OPTIONS, f"{folder}: {entry}"
    assert options.get("disableNameSuffixHash") is True, f"{folder}: {entry['name']} hashed"
    data = {}
    for item in entry["files"]:
        key, _, path = item.rpartition("=")
        data[key or Path(path).name] = (folder / path).read_text()
    meta = {"name": entry["name"], "namespace": entry.get("namespace")}
    meta |= {"labels": {**shared.get("labels", {}), **entry.get("options", {}).get("labels", {})}}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {k: v for k, v in meta.items() if v},
        "data": data,
    }


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
    """Every object the API server serves a kind for; prometheus-operator's kinds (no CRDs
    here) are checked by tests/unit/test_monitoring.py and below."""
    docs = [d for d in kustomize(base) if (d["apiVersion"], d["kind"]) not in OPERATOR_KINDS]
    assert docs, f"{base} lists no resources"
    rest = Rest(devcluster.admin)
    # Namespaces for real (a dry-run namespace does not exist for the objects inside it), and
    # the ones a base puts objects in without making them (monitoring's: the signer's).
    namespaces = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    namespaces |= {d["metadata"]["namespace"] for d in docs if "namespace" in d["metadata"]}
    for namespace in sorted(namespaces):
        kube.ensure_namespace(devcluster.admin, namespace)
    suffix = f"dry{secrets.token_hex(3)}"
    validated = []
    for doc in docs:
        try:
            out = dry_run(rest, renamed(doc, suffix))
        except ApiError as err:  # a 409 too: the fresh name cannot exist, so it is a finding
            raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']}: {err}") from None
        validated.append((out["kind"], out["metadata"]["name"]))
    assert validated == [(d["kind"], f"{d['metadata']['name']}-{suffix}") for d in docs]


def test_the_monitoring_base_ships_alerts_scraping_and_the_dashboard_for_grafanas_sidecar() -> None:
    """manifests/monitoring as `kubectl apply -k` applies it: the PrometheusRule and the
    dashboard that tests/unit/test_monitoring.py parses, the dashboard in a ConfigMap labelled
    as Grafana's sidecar looks for (its dry-run is above), and a PodMonitor that selects the
    signer's pods on a port they have, in their namespace."""
    docs = {d["kind"]: d for d in kustomize(MANIFESTS / "monitoring")}
    assert sorted(docs) == ["ConfigMap", "PodMonitor", "PrometheusRule"]
    monitoring = MANIFESTS / "monitoring"
    assert [docs["PrometheusRule"]] == documents([monitoring / "prometheusrule.yaml"])
    board = docs["ConfigMap"]
    assert board["metadata"]["name"] == "podcert-dashboard"  # fixed: no hash suffix
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["data"] == {
        "podcert-dashboard.json": (monitoring / "podcert-dashboard.json").read_text()
    }
    [deployment] = [d for d in kustomize(MANIFESTS / "signer") if d["kind"] == "Deployment"]
    pods = deployment["spec"]["template"]
    monitor = docs["PodMonitor"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pods["metadata"]["labels"].items()
    ports = {p["name"] for c in pods["spec"]["containers"] for p in c.get("ports", [])}
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= ports
    namespaces = {d["metadata"]["namespace"] for d in docs.values()}
    assert namespaces == {deployment["metadata"]["namespace"]}


def test_the_signer_base_restricts_the_webhook_and_metrics_ports_with_a_valid_network_policy(
    devcluster: DevCluster,
) -> None:
    """Issues 18 and 24 (7): the NetworkPolicy is part of the signer base (so the dry-run above
    covers it), and the API server accepts it, named ports included: the webhook port from the
    API server's addresses only, the metrics port from the monitoring namespace only (the
    kubelet's probes come from the node, which NetworkPolicy leaves allowed), no port from
    anyone, and no other port at all (the bundle endpoint is off in this base)."""
    [policy] = [d for d in kustomize(MANIFESTS / "signer") if d["kind"] == "NetworkPolicy"]
    kube.ensure_namespace(devcluster.admin, "podcert-system")
    rest = Rest(devcluster.admin)
    gv, plural = _PATHS["NetworkPolicy"]
    out = rest.request(
        "POST", path_of(gv, plural, "podcert-system"), query={"dryRun": "All"}, body=policy
    )
    assert out["spec"]["policyTypes"] == ["Ingress"]
    ingress = out["spec"]["ingress"]
    assert [[p["port"] for p in rule["ports"]] for rule in ingress] == [["webhook"], ["metrics"]]
    open_to_all = [rule["ports"] for rule in ingress if not rule.get("from")]
    assert open_to_all == [], "a port any pod may reach"
    assert ingress[0]["from"][0]["ipBlock"]["cidr"]
    assert ingress[1]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]


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
