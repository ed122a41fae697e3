"""The Helm chart (charts/podcert) renders the kustomize bases' objects, field for field:
the signer base with default values, and the shim, the example pair and the webhook-free
admission policy each behind one value; only the chart's checksum of the policy on the signer's
pod template is its own (what rolls the pods on `helm upgrade`). `helm lint` passes it (its
values schema refuses bad values), and what it renders passes server-side dry-run on the real
API server, with default and with changed values. test_helm_install installs it for real. helm
is built from the Go module (devcluster/tools.py), as the control plane is."""

from __future__ import annotations

import copy
import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import build, kube, tools
from devcluster.testing import DevCluster
from podcert.client.rest import ApiError, Rest
from signer.policy import load_policy
from tests.integration.test_manifests import MANIFESTS, documents, dry_run, renamed
from tests.integration.test_manifests import kustomize as kustomize  # test_in_cluster's import

CHART = Path(__file__).resolve().parents[2] / "charts" / "podcert"
Key = tuple[str, str, str]


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """The helm command, with its own config/cache/data folders (never the user's)."""
    binary = tools.ensure_helm(lambda line: print(line, flush=True))
    home = tmp_path_factory.mktemp("helm")
    env = {f"HELM_{kind}_HOME": str(home / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")}
    yield ["env", *(f"{k}={v}" for k, v in env.items()), str(binary)]


def run(helm: list[str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*helm, *args], capture_output=True, text=True, check=False, timeout=120)
    if check:
        assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
    return done


def render(helm: list[str], **values: Any) -> list[dict[str, Any]]:
    """`helm template` of the chart with these values (nested keys with dots, JSON values)."""
    sets = [f"--set-json={key}={json.dumps(value)}" for key, value in values.items()]
    version = build.KUBERNETES_VERSIONS[build.DEFAULT_KUBE_VERSION]
    out = run(helm, "template", "podcert", str(CHART), f"--kube-version={version}", *sets).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def comparable(docs: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Objects by kind, namespace and name; the policy ConfigMap's file as parsed YAML (its
    comments differ)."""
    out: dict[Key, dict[str, Any]] = {}
    for doc in docs:
        meta = doc["metadata"]
        key = (doc["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in out, f"{key} twice"
        if doc["kind"] == "ConfigMap" and "policy.yaml" in doc.get("data", {}):
            doc = {
                **doc,
                "data": {**doc["data"], "policy.yaml": yaml.safe_load(doc["data"]["policy.yaml"])},
            }
        out[key] = doc
    return out


def differences(got: Any, want: Any, path: str = "") -> list[str]:
    """Where two parsed objects differ, as paths: what a reader needs to fix the chart."""
    if isinstance(got, dict) and isinstance(want, dict):
        return [
            line
            for key in sorted(got.keys() | want.keys(), key=str)
            for line in differences(got.get(key), want.get(key), f"{path}.{key}")
        ]
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        return [
            line
            for i, (a, b) in enumerate(zip(got, want, strict=True))
            for line in differences(a, b, f"{path}[{i}]")
        ]
    return [] if got == want else [f"{path}: chart {got!r}, kustomize {want!r}"]


# Helm's alone: the signer's pod template carries a checksum of the rendered policy, so that
# `helm upgrade` with another policy rolls the pods (the signer reads its policy at start).
# After `kubectl apply -k` with another policy, `kubectl rollout restart` does that.
CHECKSUM = "checksum/policy"


def signer_template(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The signer Deployment's pod template."""
    [deployment] = [
        d for d in docs if (d["kind"], d["metadata"]["name"]) == ("Deployment", "podcert-signer")
    ]
    template: dict[str, Any] = deployment["spec"]["template"]
    return template


def policy_checksum(docs: list[dict[str, Any]]) -> str:
    annotations = signer_template(docs)["metadata"]["annotations"]
    assert set(annotations) == {CHECKSUM}, annotations
    checksum: str = annotations[CHECKSUM]
    return checksum


def without_checksum(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chart's objects, the checksum left out of the signer's pod template."""
    out = copy.deepcopy(docs)
    policy_checksum(out)
    del signer_template(out)["metadata"]["annotations"]
    return out


def assert_same(chart: list[dict[str, Any]], bases: list[dict[str, Any]]) -> None:
    rendered, expected = comparable(without_checksum(chart)), comparable(bases)
    assert sorted(rendered) == sorted(expected)
    found = [
        f"{key}{line}" for key in expected for line in differences(rendered[key], expected[key])
    ]
    assert found == []


def test_default_values_render_the_signer_base(helm: list[str]) -> None:
    assert_same(render(helm), kustomize(MANIFESTS / "signer"))


@pytest.mark.parametrize(
    ("values", "extra"),
    [
        pytest.param({"shim.enabled": True}, kustomize(MANIFESTS / "shim"), id="shim"),
        pytest.param(
            {"examples.enabled": True},
            documents([MANIFESTS / "examples" / "mtls" / "pair.yaml"]),
            id="example pair",
        ),
        pytest.param(
            {"admission.policy": True},
            documents([MANIFESTS / "signer" / "admission-policy.yaml"]),
            id="webhook-free admission policy",
        ),
    ],
)
def test_each_optional_part_renders_its_kustomize_objects(
    helm: list[str], values: dict[str, Any], extra: list[dict[str, Any]]
) -> None:
    assert_same(render(helm, **values), kustomize(MANIFESTS / "signer") + extra)


def test_the_example_overlay_is_the_chart_with_the_pair(helm: list[str]) -> None:
    assert_same(
        render(helm, **{"examples.enabled": True}), kustomize(MANIFESTS / "examples" / "mtls")
    )


CUSTOM: dict[str, Any] = {
    "signerNames": ["example.com/workload", "example.com/batch"],
    "trustDomain": "example.org",
    "replicas": 3,
    "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
    "policy": {
        "maxLifetimeSeconds": 3600,
        "keyTypes": ["ED25519"],
        "allow": [{"namespaces": ["prod"], "serviceAccounts": ["*"]}],
    },
    "federation": {
        "trustDomains": [
            {
                "trustDomain": "spire.test",
                "bundleEndpointURL": "https://spire.test:8443/",
                "endpointSPIFFEID": "spiffe://spire.test/spire/server",
                "bootstrapBundle": "/etc/podcert/spire.test.pem",
            }
        ]
    },
    "federationBundles": {"spire.test.pem": "-----BEGIN CERTIFICATE-----\nMIIB\n"},
    "image.tag": "0.2.0",
    "admission.policy": True,
    "examples.enabled": True,
}


def signer_accepts(docs: list[dict[str, Any]], names: list[str], trust_domain: str) -> None:
    """The rendered policy file passes the signer's own start-up validation."""
    [policy] = [d for d in docs if d["kind"] == "ConfigMap" and "policy.yaml" in d["data"]]
    load_policy(policy["data"]["policy.yaml"], "policy.yaml", names, trust_domain)


def test_values_reach_every_object_that_names_them(helm: list[str]) -> None:
    docs = render(helm, **CUSTOM)
    signer_accepts(docs, CUSTOM["signerNames"], "example.org")
    signer_accepts(render(helm), ["podcert.dev/workload"], "cluster.local")
    objects = comparable(docs)
    deployment = objects[("Deployment", "podcert-system", "podcert-signer")]
    assert deployment["spec"]["replicas"] == 3
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/podcert/podcert:0.2.0"
    assert container["resources"] == CUSTOM["resources"]
    assert [a for a in container["args"] if a.startswith(("--signer-name", "--trust-domain"))] == [
        "--signer-name=example.com/workload",
        "--signer-name=example.com/batch",
        "--trust-domain=example.org",
    ]
    policy = objects[("ConfigMap", "podcert-system", "podcert-signer-policy")]
    # Helm merges a map value into the defaults: the keys given replace theirs, dnsNames and
    # rateLimit stay as shipped.
    shipped = yaml.safe_load((CHART / "values.yaml").read_text())["policy"]
    assert policy["data"]["policy.yaml"] == {
        "signers": [
            {"name": name, "trustDomain": "example.org", **shipped, **CUSTOM["policy"]}
            for name in CUSTOM["signerNames"]
        ],
        "federation": CUSTOM["federation"],
    }
    assert policy["data"]["spire.test.pem"] == CUSTOM["federationBundles"]["spire.test.pem"]
    sign, attest = (
        rule
        for rule in objects[("ClusterRole", "", "podcert-signer")]["rules"]
        if rule["resources"] == ["signers"]
    )
    assert sign["resourceNames"] == CUSTOM["signerNames"]
    assert attest == {
        "apiGroups": ["certificates.k8s.io"],
        "resources": ["signers"],
        "resourceNames": ["example.com/federated"],
        "verbs": ["attest"],
    }
    served = "object.spec.signerName in ['example.com/workload', 'example.com/batch']"
    webhook = objects[("ValidatingWebhookConfiguration", "", "podcert-signer")]
    assert webhook["webhooks"][0]["matchConditions"][0]["expression"] == served
    vap = objects[("ValidatingAdmissionPolicy", "", "podcert-node-only")]
    assert vap["spec"]["matchConditions"][0]["expression"] == served
    api = objects[("Deployment", "shop", "api")]["spec"]["template"]["spec"]
    assert api["volumes"][0]["projected"]["sources"][0]["podCertificate"]["signerName"] == (
        "example.com/workload"
    )
    web = objects[("Deployment", "shop", "web")]["spec"]["template"]["spec"]["containers"][0]
    assert "--server-id=spiffe://example.org/ns/shop/sa/api" in web["args"]


def test_the_signer_pods_roll_when_the_policy_changes_and_only_then(helm: list[str]) -> None:
    shipped = policy_checksum(render(helm))
    assert policy_checksum(render(helm, replicas=3)) == shipped
    assert policy_checksum(render(helm, **{"policy.maxLifetimeSeconds": 3600})) != shipped
    assert policy_checksum(render(helm, trustDomain="example.org")) != shipped


def test_helm_lint_passes_and_the_schema_refuses_bad_values(helm: list[str]) -> None:
    out = run(helm, "lint", "--strict", str(CHART)).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    for bad in (
        '--set-json=replicas="two"',
        "--set-json=signerNames=[]",
        '--set-json=signerNames=["no-slash"]',
        '--set-json=trustDomain="spiffe://example.org"',
        "--set-json=admission.webbook=true",
    ):
        done = run(helm, "lint", "--strict", str(CHART), bad, check=False)
        assert done.returncode != 0, f"helm lint accepted {bad}"


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(
            {"shim.enabled": True, "examples.enabled": True, "admission.policy": True},
            id="default values, every part on",
        ),
        pytest.param(CUSTOM, id="changed values"),
    ],
)
def test_what_the_chart_renders_passes_server_side_dry_run(
    devcluster: DevCluster, helm: list[str], values: dict[str, Any]
) -> None:
    docs = render(helm, **values)
    rest = Rest(devcluster.admin)
    for doc in docs:
        if doc["kind"] == "Namespace":
            kube.ensure_namespace(devcluster.admin, doc["metadata"]["name"])
    suffix = f"helm{secrets.token_hex(3)}"
    failures = []
    for doc in docs:
        try:
            dry_run(rest, renamed(doc, suffix))
        except ApiError as err:
            failures.append(f"{doc['kind']}/{doc['metadata']['name']}: {err}")
    assert failures == []
    assert len(docs) >= 20


def test_the_least_privilege_policies_and_the_network_policy_follow_the_values(
    helm: list[str],
) -> None:
    """The signer's trust-bundle policy names the served signer names and the
    federation's, and the signer's ServiceAccount in the chart's namespace; the shim's clean-up
    policy its ServiceAccount in the shim's namespace; the metrics port opens to
    networkPolicy.metricsFrom only."""
    scraper = [{"namespaceSelector": {"matchLabels": {"team": "observability"}}}]
    objects = comparable(
        render(
            helm,
            namespace="pki",
            signerNames=["example.com/workload", "example.com/batch"],
            federation={"signerName": "example.com/partners"},
            **{
                "shim.enabled": True,
                "shim.namespace": "node-agents",
                "networkPolicy.metricsFrom": scraper,
            },
        )
    )
    signer = objects[("ValidatingAdmissionPolicy", "", "podcert-signer-trust-bundles")]["spec"]
    assert signer["matchConditions"][0]["expression"] == (
        "request.userInfo.username == 'system:serviceaccount:pki:podcert-signer'"
    )
    assert signer["variables"] == [
        {
            "name": "signerNames",
            "expression": "['example.com/workload', 'example.com/batch', 'example.com/partners']",
        }
    ]
    shim = objects[("ValidatingAdmissionPolicy", "", "podcert-shim-cleanup")]["spec"]
    assert shim["matchConditions"][0]["expression"] == (
        "request.userInfo.username == 'system:serviceaccount:node-agents:podcert-shim-cleanup'"
    )
    policy = objects[("NetworkPolicy", "pki", "podcert-signer")]["spec"]
    assert [rule["from"] for rule in policy["ingress"]][1] == scraper
