"""The Helm chart (charts/podcert) renders the kustomize bases' objects, field for field:
the signer base with default values (and the base's webhook peers, which the chart has no
default for and refuses to render without), and the shim, the example pair and the webhook-free
admission policy each behind one value; only the chart's checksum of the policy on the signer's
pod template, its recommended labels and its `helm test` pod are its own. `helm lint` passes it (its
values schema refuses bad values), and what it renders passes server-side dry-run on the real
API server, with default and with changed values. test_helm_install installs it for real. helm
is built from the Go module (devcluster/tools.py), as the control plane is."""

from __future__ import annotations

import copy
import json
import secrets
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import build, kube, tools
from devcluster.identities import Paths
from devcluster.testing import DevCluster
from podcert import __version__
from podcert.cli import build_parser
from podcert.client.rest import ApiError, Rest
from signer.authority import pkcs11uri
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


def base_webhook_peers() -> list[dict[str, Any]]:
    """The kustomize base's webhook peers (its placeholder), which the chart has no default for."""
    [policy] = documents([MANIFESTS / "signer" / "networkpolicy.yaml"])
    peers: list[dict[str, Any]] = policy["spec"]["ingress"][0]["from"]
    return peers


# What every render sets unless told otherwise: the chart refuses to render without it.
WEBHOOK_FROM = "networkPolicy.webhookFrom"


def sets(values: dict[str, Any]) -> list[str]:
    """--set-json flags: nested keys with dots, JSON values; the base's webhook peers unless
    `values` names them (None: left unset)."""
    values = {WEBHOOK_FROM: base_webhook_peers(), **values}
    return [f"--set-json={k}={json.dumps(v)}" for k, v in values.items() if v is not None]


def template(helm: list[str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    version = build.KUBERNETES_VERSIONS[build.DEFAULT_KUBE_VERSION]
    return run(
        helm, "template", "podcert", str(CHART), f"--kube-version={version}", *args, check=check
    )


def render(helm: list[str], **values: Any) -> list[dict[str, Any]]:
    """`helm template` of the chart with these values (`sets`), the `helm test` pod left out."""
    out = template(helm, "--skip-tests", *sets(values)).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


# The recommended labels the chart puts on every object and pod template: which release, chart
# and version made it are Helm's to know, and the bases carry the name label only where a
# selector needs it (compared in the selectors, which carry nothing else).
RECOMMENDED = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
}


def unlabelled(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` without the recommended labels, on it and on its pod template."""
    doc = copy.deepcopy(doc)
    for meta in (doc["metadata"], doc.get("spec", {}).get("template", {}).get("metadata")):
        if meta is not None and "labels" in meta:
            meta["labels"] = {k: v for k, v in meta["labels"].items() if k not in RECOMMENDED}
            if not meta["labels"]:
                del meta["labels"]
    return doc


def comparable(docs: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Objects by kind, namespace and name, without the recommended labels; the policy
    ConfigMap's file as parsed YAML (its comments differ)."""
    out: dict[Key, dict[str, Any]] = {}
    for doc in map(unlabelled, docs):
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
        pytest.param(
            {"monitoring.podMonitor.enabled": True},
            documents([MANIFESTS / "monitoring" / "podmonitor.yaml"]),
            id="the signer's PodMonitor",
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


def test_the_hsm_overlay_is_the_chart_with_the_token(helm: list[str]) -> None:
    """hsm.enabled renders what manifests/hsm adds to the signer: the token's flags (a URI the
    signer parses), SoftHSM2's configuration and token directory, the PIN from its Secret."""
    docs = render(helm, **{"hsm.enabled": True})
    assert_same(docs, kustomize(MANIFESTS / "hsm"))
    pod = signer_template(docs)["spec"]
    [container] = pod["containers"]
    [uri] = [a.partition("=")[2] for a in container["args"] if a.startswith("--ca-key-uri=")]
    assert pkcs11uri.parse(uri).module_path == "/usr/lib/softhsm/libsofthsm2.so"
    assert "--ca-key-pin-file=/var/run/podcert/token-pin/pin" in container["args"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["token-pin"] == "/var/run/podcert/token-pin"
    assert volumes["token-pin"]["secret"]["secretName"] == "podcert-hsm-pin"
    [config] = [d for d in docs if d["metadata"]["name"] == "podcert-softhsm2"]
    conf = config["data"]["softhsm2.conf"]
    assert f"directories.tokendir = {mounts['softhsm2-tokens']}\n" in conf
    assert {"name": "SOFTHSM2_CONF", "value": f"{mounts['softhsm2-conf']}/softhsm2.conf"} in (
        container["env"]
    )
    claim = volumes["softhsm2-tokens"]["persistentVolumeClaim"]["claimName"]
    assert claim == "podcert-hsm-tokens"
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]


def test_another_tokens_library_gets_its_own_env_and_volumes_and_no_softhsm(
    helm: list[str],
) -> None:
    vendor = {
        "hsm.enabled": True,
        "hsm.keyUri": "pkcs11:token=prod;object=ca?module-path=/opt/vendor/lib/libpkcs11.so",
        "hsm.pinSecret": "vendor-pin",
        "hsm.softhsm.enabled": False,
        "hsm.env": [{"name": "VENDOR_CONF", "value": "/etc/vendor/client.conf"}],
        "hsm.volumes": [{"name": "vendor-conf", "configMap": {"name": "vendor-client"}}],
        "hsm.volumeMounts": [{"name": "vendor-conf", "mountPath": "/etc/vendor"}],
    }
    docs = render(helm, **vendor)
    assert not [d for d in docs if d["metadata"]["name"] == "podcert-softhsm2"]
    pod = signer_template(docs)["spec"]
    [container] = pod["containers"]
    assert f"--ca-key-uri={vendor['hsm.keyUri']}" in container["args"]
    assert [e["name"] for e in container["env"]] == ["POD_NAMESPACE", "VENDOR_CONF"]
    assert [v["name"] for v in pod["volumes"]][-2:] == ["token-pin", "vendor-conf"]
    assert pod["volumes"][-2]["secret"]["secretName"] == "vendor-pin"
    assert {"name": "vendor-conf", "mountPath": "/etc/vendor"} in container["volumeMounts"]
    assert "fsGroup" not in pod["securityContext"]
    without = signer_template(render(helm))["spec"]
    assert not [a for a in without["containers"][0]["args"] if a.startswith("--ca-key")]


def test_spire_as_the_upstream_runs_the_signer_under_spire_with_the_agents_socket(
    helm: list[str],
) -> None:
    """upstream.spire.enabled: the signer's flags, which its own parser takes, name the SPIRE
    server and a socket inside the volume mounted from the SPIFFE CSI driver (or the volume
    given)."""
    docs = render(helm, **{"upstream.spire.enabled": True, "upstream.spire.server": "spire:8081"})
    pod = signer_template(docs)["spec"]
    [container] = pod["containers"]
    args = build_parser(every=True).parse_args(container["args"])
    assert (args.signer_upstream, args.spire_server) == ("spire", "spire:8081")
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    socket = Path(args.spire_agent_socket)
    assert socket.parent == Path(mounts["spire-agent-socket"]["mountPath"])
    assert socket.name == "spire-agent.sock"
    assert mounts["spire-agent-socket"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["spire-agent-socket"]["csi"] == {"driver": "csi.spiffe.io", "readOnly": True}

    host = {"hostPath": {"path": "/run/spire/agent-sockets", "type": "Directory"}}
    own = signer_template(
        render(helm, **{"upstream.spire.enabled": True, "upstream.spire.socketVolume": host})
    )["spec"]
    assert {"name": "spire-agent-socket", **host} in own["volumes"]
    without = signer_template(render(helm))["spec"]
    assert not [a for a in without["containers"][0]["args"] if "spire" in a]
    assert "spire-agent-socket" not in {v["name"] for v in without["volumes"]}


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
        '--set-json=hsm.keyUri="file:///ca.key"',
        '--set-json=hsm.keyUri="pkcs11:token=t;object=ca?pin-value=1234"',
        "--set-json=hsm.softhsm.tokenClaim=true",
    ):
        done = run(helm, "lint", "--strict", str(CHART), bad, check=False)
        assert done.returncode != 0, f"helm lint accepted {bad}"


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(
            {
                "shim.enabled": True,
                "examples.enabled": True,
                "admission.policy": True,
                "hsm.enabled": True,
            },
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


# --- the chart's conventions: what only the chart has ----------------------------------------


def test_without_the_api_servers_addresses_the_chart_refuses_to_render_in_one_line(
    helm: list[str],
) -> None:
    """With no webhook peers the API server cannot reach the fail-closed webhook on an enforcing
    CNI, so every request for the signer would be refused: the chart says what to set instead."""
    done = template(helm, *sets({WEBHOOK_FROM: None}), check=False)
    assert done.returncode != 0
    [line] = [line for line in done.stderr.splitlines() if "networkPolicy.webhookFrom" in line]
    assert "give the API server's addresses" in line
    assert "networkPolicy.enabled=false" in line
    # The same with the NetworkPolicy on but the webhook off: the webhook port opens to no one.
    kinds = {
        d["kind"] for d in render(helm, **{WEBHOOK_FROM: None, "networkPolicy.enabled": False})
    }
    assert "NetworkPolicy" not in kinds and "ValidatingWebhookConfiguration" in kinds
    objects = comparable(
        render(helm, **{WEBHOOK_FROM: None, "admission.webhook": False, "admission.policy": True})
    )
    policy = objects[("NetworkPolicy", "podcert-system", "podcert-signer")]["spec"]
    assert [rule["ports"][0]["port"] for rule in policy["ingress"]] == ["metrics"]


def test_the_pod_monitor_carries_the_labels_prometheus_selects_by(helm: list[str]) -> None:
    docs = render(
        helm,
        **{
            "monitoring.podMonitor.enabled": True,
            "monitoring.podMonitor.labels": {"release": "kube-prometheus-stack"},
            "monitoring.podMonitor.interval": "15s",
        },
    )
    [monitor] = [d for d in docs if d["kind"] == "PodMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "metrics", "interval": "15s"}]


def test_the_api_servers_addresses_are_the_webhook_ports_only_peers(helm: list[str]) -> None:
    peers = [{"ipBlock": {"cidr": "10.0.0.10/32"}}, {"ipBlock": {"cidr": "10.0.0.11/32"}}]
    objects = comparable(render(helm, **{WEBHOOK_FROM: peers}))
    policy = objects[("NetworkPolicy", "podcert-system", "podcert-signer")]["spec"]
    assert policy["ingress"][0] == {
        "ports": [{"port": "webhook", "protocol": "TCP"}],
        "from": peers,
    }


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({}, id="default values"),
        pytest.param(
            {"shim.enabled": True, "examples.enabled": True, "admission.policy": True},
            id="every part on",
        ),
    ],
)
def test_every_object_and_pod_carries_the_recommended_labels(
    helm: list[str], values: dict[str, Any]
) -> None:
    out = template(helm, "--namespace=infra", *sets(values)).stdout
    docs = [doc for doc in yaml.safe_load_all(out) if doc]
    assert any(d["kind"] == "Pod" for d in docs)  # the helm test pod too
    for doc in docs:
        for meta in (doc["metadata"], doc.get("spec", {}).get("template", {}).get("metadata")):
            if meta is None:
                continue
            labels = meta.get("labels", {})
            component = labels.get("app.kubernetes.io/component")
            assert labels.keys() >= RECOMMENDED, f"{doc['kind']}/{doc['metadata']['name']}"
            assert labels["app.kubernetes.io/name"] == f"podcert-{component}"
            assert labels["app.kubernetes.io/instance"] == "podcert"
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert labels["app.kubernetes.io/part-of"] == "podcert"
            assert labels["app.kubernetes.io/version"] == __version__
            assert labels["helm.sh/chart"].startswith("podcert-")


def pod_spec(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [d for d in docs if (d["kind"], d["metadata"]["name"]) == (kind, name)]
    spec: dict[str, Any] = found["spec"]["template"]["spec"]
    return spec


SCHEDULING: dict[str, Any] = {
    "nodeSelector": {"node-role.kubernetes.io/infra": ""},
    "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    },
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "podcert-signer"}},
        }
    ],
    "priorityClassName": "infra-critical",
}
DEFAULT_ANTI_AFFINITY = yaml.safe_load((CHART / "values.yaml").read_text())["affinity"]
PODS: dict[str, Any] = {
    "podLabels": {"team": "pki"},
    "podAnnotations": {"example.com/scrape": "true"},
    "extraArgs": ["--workers=8"],
    "extraEnv": [{"name": "PYTHONFAULTHANDLER", "value": "1"}],
    "logLevel": "DEBUG",
    "serviceAccount": {"annotations": {"iam.example.com/role": "pki"}},
}


@pytest.mark.parametrize(
    ("prefix", "kind", "name", "account", "flag"),
    [
        pytest.param("", "Deployment", "podcert-signer", "podcert-signer", "signer", id="signer"),
        pytest.param(
            "shim.", "DaemonSet", "podcert-shim", "podcert-shim-cleanup", "shim", id="shim"
        ),
    ],
)
def test_the_standard_knobs_reach_the_pods_they_name(
    helm: list[str], prefix: str, kind: str, name: str, account: str, flag: str
) -> None:
    secrets_ = [{"name": "regcred"}]
    values = {f"{prefix}{k}": v for k, v in {**SCHEDULING, **PODS}.items()}
    docs = render(helm, **values, imagePullSecrets=secrets_, **{"shim.enabled": True})
    spec = pod_spec(docs, kind, name)
    # Helm merges a map into the default: the signer keeps its anti-affinity beside it.
    kept = {} if prefix else DEFAULT_ANTI_AFFINITY
    assert spec["affinity"] == SCHEDULING["affinity"] | kept
    for key in SCHEDULING.keys() - {"affinity"}:
        assert spec[key] == SCHEDULING[key], key
    assert spec["imagePullSecrets"] == secrets_
    [workload] = [d for d in docs if (d["kind"], d["metadata"]["name"]) == (kind, name)]
    template_meta = workload["spec"]["template"]["metadata"]
    assert template_meta["labels"]["team"] == "pki"
    assert template_meta["annotations"]["example.com/scrape"] == "true"
    assert workload["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": name}
    [container] = spec["containers"]
    assert container["args"][0] == flag
    assert container["args"][-2:] == ["--log-level=DEBUG", "--workers=8"]
    assert container["env"][-1] == {"name": "PYTHONFAULTHANDLER", "value": "1"}
    [sa] = [d for d in docs if (d["kind"], d["metadata"]["name"]) == ("ServiceAccount", account)]
    assert sa["metadata"]["annotations"] == {"iam.example.com/role": "pki"}
    # The other workload keeps its defaults.
    other = pod_spec(
        docs, *(("DaemonSet", "podcert-shim") if prefix == "" else ("Deployment", "podcert-signer"))
    )
    assert "nodeSelector" not in other and "imagePullSecrets" in other


def test_the_signer_is_cluster_critical_and_the_shim_node_critical_by_default(
    helm: list[str],
) -> None:
    docs = render(helm, **{"shim.enabled": True})
    assert pod_spec(docs, "Deployment", "podcert-signer")["priorityClassName"] == (
        "system-cluster-critical"
    )
    shim = pod_spec(docs, "DaemonSet", "podcert-shim")
    assert shim["priorityClassName"] == "system-node-critical"
    assert shim["tolerations"] == [{"operator": "Exists"}]
    assert "imagePullSecrets" not in shim
    args = shim["containers"][0]["args"]
    assert "--kubeconfig=/var/lib/kubelet/kubeconfig" in args
    assert not any(a.startswith("--log-level") for a in args)
    assert [v["name"] for v in shim["volumes"]] == ["kubelet"]  # the kubeconfig lies inside it


def test_a_kubeadm_nodes_kubeconfig_is_mounted_from_the_node(helm: list[str]) -> None:
    path = "/etc/kubernetes/kubelet.conf"
    shim = pod_spec(
        render(helm, **{"shim.enabled": True, "shim.kubeconfig": path}), "DaemonSet", "podcert-shim"
    )
    [container] = shim["containers"]
    assert f"--kubeconfig={path}" in container["args"]
    assert {"name": "kubeconfig", "mountPath": path, "readOnly": True} in container["volumeMounts"]
    assert {"name": "kubeconfig", "hostPath": {"path": path, "type": "File"}} in shim["volumes"]
    done = template(
        helm, *sets({"shim.enabled": True, "shim.kubeconfig": "kubelet.conf"}), check=False
    )
    assert done.returncode != 0


def test_the_helm_test_pod_checks_a_credential_of_the_first_signer_name(helm: list[str]) -> None:
    values = {
        "signerNames": ["example.com/workload", "example.com/batch"],
        "trustDomain": "example.org",
    }
    shown = ("--show-only=templates/tests/credential.yaml", "--namespace=platform")
    out = template(helm, *shown, *sets(values)).stdout
    [pod] = [d for d in yaml.safe_load_all(out) if d]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["metadata"]["namespace"] == "platform"  # the release's: where --logs looks
    [container] = pod["spec"]["containers"]
    assert container["command"] == ["python", "-c"]
    assert container["args"][1:] == [
        "spiffe://example.org/ns/platform/sa/default",
        "example.com/workload",
    ]
    compile(container["args"][0], "helm-test", "exec")  # the check itself is valid Python
    sources = pod["spec"]["volumes"][0]["projected"]["sources"]
    assert {
        s.get("podCertificate", s.get("clusterTrustBundle"))["signerName"] for s in sources
    } == {"example.com/workload"}
    off = template(
        helm,
        "--show-only=templates/tests/credential.yaml",
        *sets({"tests.enabled": False}),
        check=False,
    )
    assert off.returncode != 0  # nothing to show


@pytest.mark.parametrize(
    "value",
    [
        pytest.param('--set-json=global={"imageRegistry":"r.example.com"}', id="global"),
        pytest.param("--set-json=enabled=true", id="enabled"),
    ],
)
def test_a_parent_charts_global_and_enabled_are_accepted(helm: list[str], value: str) -> None:
    out = run(helm, "lint", "--strict", str(CHART), *sets({}), value).stdout
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"policy.maxLifetimeSeconds": 60}, id="a lifetime under an hour"),
        pytest.param({"policy.keyTypes": ["DSA"]}, id="an unknown key type"),
        pytest.param({"policy.keyTypes": []}, id="no key type"),
        pytest.param({"policy.allow": [{"namespaces": ["Prod"]}]}, id="a glob no name matches"),
        pytest.param({"policy.allow": [{"namespace": ["prod"]}]}, id="a misspelt rule key"),
        pytest.param({"policy.dnsNames.services": "yes"}, id="a string for a boolean"),
        pytest.param({"policy.rateLimit.perNode.burst": 0}, id="a burst of zero"),
        pytest.param({"policy.maxLifetime": 3600}, id="an unknown policy key"),
        pytest.param({"logLevel": "verbose"}, id="an unknown log level"),
        pytest.param({"shim.kubeconfig": "kubelet.conf"}, id="a relative kubeconfig"),
        pytest.param({"imagePullSecrets": ["regcred"]}, id="a pull secret as a bare name"),
        pytest.param({"upstream.spire.server": "spire-server"}, id="a SPIRE server without port"),
        pytest.param({"upstream.spire.socketName": "a/b.sock"}, id="a socket name with a slash"),
    ],
)
def test_the_schema_refuses_what_the_signer_would_refuse(
    helm: list[str], bad: dict[str, Any]
) -> None:
    done = run(helm, "lint", "--strict", str(CHART), *sets(bad), check=False)
    assert done.returncode != 0, f"helm lint accepted {bad}"


def test_notes_say_what_was_installed_how_to_check_it_and_warn_of_risky_values(
    devcluster: DevCluster, helm: list[str]
) -> None:
    """Rendered by a client-side dry run (`helm template` renders no NOTES), into a namespace
    of its own: Helm refuses a dry run over objects it does not own, as a real install."""
    kubeconfig = Paths(devcluster.root.resolve()).admin_kubeconfig
    namespace = f"notes-{secrets.token_hex(3)}"
    dry = [*helm, f"--kubeconfig={kubeconfig}", "install", "podcert", str(CHART), "--dry-run"]
    dry += [f"--set=namespace={namespace}"]
    notes = run(dry, *sets({})).stdout.partition("\nNOTES:\n")[2]
    assert "serves:\n  - podcert.dev/workload" in notes
    assert f"kubectl -n {namespace} logs -l app.kubernetes.io/name=podcert-signer" in notes
    assert "helm test podcert" in notes
    sample = notes[notes.index("  apiVersion: v1") : notes.index("If it stays")]
    pod = yaml.safe_load(textwrap.dedent(sample))
    source = pod["spec"]["volumes"][0]["projected"]["sources"][0]
    assert source["podCertificate"]["signerName"] == "podcert.dev/workload"
    # The shipped policy lets everyone get a certificate: said, and nothing else is.
    warnings = notes.partition("WARNINGS:\n")[2].splitlines()
    assert len(warnings) == 1 and "policy.allow" in warnings[0]
    risky = {
        "networkPolicy.enabled": False,
        "priorityClassName": "",
        "replicas": 1,
        "policy.maxLifetimeSeconds": 604800,
        "admission.webhook": False,
    }
    token = run(dry, *sets({"hsm.enabled": True})).stdout.partition("\nNOTES:\n")[2]
    assert "Secret podcert-hsm-pin" in token and "PersistentVolumeClaim podcert-hsm-tokens" in token
    assert "PKCS#11" not in notes
    warned = run(dry, *sets(risky)).stdout.partition("WARNINGS:\n")[2]
    for value in (
        "networkPolicy.enabled=false",
        "replicas < 2",
        "maxLifetimeSeconds=604800",
        "admission.webhook and admission.policy are both off",
    ):
        assert value in warned, value
