"""Shared steps for integration tests: pods with podCertificate volumes, requests made as the node
(or as an admin who bypasses NodeRestriction), and waiting for the signer's outcome."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from devcluster import kube
from devcluster.kube import pod_certificate_volume
from devcluster.testing import DevCluster, eventually
from podcert.api import keys
from podcert.api.requests import STUB_CSR, Condition, KeyForm, key_fields, outcome, parse_request
from podcert.client.rest import JSON, Rest, path_of

PCRS = "certificates.k8s.io/v1"


def make_pod(
    devcluster: DevCluster,
    namespace: str,
    name: str,
    signer: str,
    *,
    node: str = "node-a",
    service_account: str = "default",
    labels: dict[str, str] | None = None,
    key_type: str = "ECDSAP256",
    trust_bundle_signer: bool = False,
) -> Any:
    """A pod on `node` whose projected volume asks `signer` for a credential (and, with
    `trust_bundle_signer`, for its roots too)."""
    volume = pod_certificate_volume(
        signer, key_type=key_type, trust_bundle_signer=trust_bundle_signer
    )
    return devcluster.pod(
        namespace,
        name,
        node=node,
        service_account=service_account,
        labels=labels,
        volumes=[volume],
    )


def pcr_spec(
    devcluster: DevCluster,
    pod: Any,
    signer: str,
    key: keys.PrivateKey,
    form: KeyForm = STUB_CSR,
    **overrides: Any,
) -> dict[str, Any]:
    """The spec a node would send for `pod`, its key in `form`; `overrides` replace fields."""
    core = client.CoreV1Api(devcluster.admin)
    node = core.read_node(pod.spec.node_name)
    sa = core.read_namespaced_service_account(pod.spec.service_account_name, pod.metadata.namespace)
    spec = {
        "signerName": signer,
        "podName": pod.metadata.name,
        "podUID": pod.metadata.uid,
        "serviceAccountName": sa.metadata.name,
        "serviceAccountUID": sa.metadata.uid,
        "nodeName": node.metadata.name,
        "nodeUID": node.metadata.uid,
        "maxExpirationSeconds": 86400,
        **key_fields(form, key, pod.metadata.uid),
    }
    spec.update(overrides)
    return spec


def create_pcr(
    api: client.ApiClient,
    namespace: str,
    spec: dict[str, Any],
    name: str = "",
    version: str = PCRS,
) -> JSON:
    """POST a request through `version` of certificates.k8s.io (v1beta1 for an older node)."""
    meta: dict[str, Any] = {"name": name} if name else {"generateName": "req-"}
    body = {"apiVersion": version, "kind": "PodCertificateRequest", "metadata": meta, "spec": spec}
    return Rest(api).request(
        "POST", path_of(version, "podcertificaterequests", namespace), body=body
    )


def request_as_node(
    devcluster: DevCluster, pod: Any, signer: str, key_type: str = "ECDSAP256", **overrides: Any
) -> tuple[keys.PrivateKey, JSON]:
    key = keys.generate(key_type)  # type: ignore[arg-type]
    spec = pcr_spec(devcluster, pod, signer, key, **overrides)
    pcr = create_pcr(devcluster.node(pod.spec.node_name), pod.metadata.namespace, spec)
    return key, pcr


def settled(
    devcluster: DevCluster,
    pcr: JSON,
    timeout: float = 10.0,
    *,
    version: str = PCRS,
    explain: Callable[[], str] | None = None,
) -> JSON:
    """The request once it has a terminal condition, as `version` shows it; on a timeout the
    failure carries `explain()` (a signer's log tail) when given."""
    rest = Rest(devcluster.admin)
    meta = pcr["metadata"]
    path = path_of(version, "podcertificaterequests", meta["namespace"], meta["name"])

    def probe() -> JSON | None:
        current = rest.request("GET", path)
        return current if outcome(current) else None

    try:
        return eventually(probe, timeout=timeout, what=f"outcome of {meta['name']}")
    except AssertionError as err:
        if explain is None:
            raise
        raise AssertionError(f"{err}\n{explain()}") from None


def condition(pcr: JSON) -> Condition:
    """A settled request's one condition, typed (`podcert.api.requests.Condition`)."""
    conditions = parse_request(pcr).status.conditions
    assert len(conditions) == 1, conditions
    return conditions[0]


def terminal(pcr: JSON) -> tuple[str, str, str]:
    """(type, reason, message) of a settled request's one condition."""
    found = condition(pcr)
    return found.type, found.reason, found.message


def events_for(devcluster: DevCluster, pcr: JSON, timeout: float = 5.0) -> list[JSON]:
    rest = Rest(devcluster.admin)
    ns, name = pcr["metadata"]["namespace"], pcr["metadata"]["name"]

    def probe() -> list[JSON] | None:
        items = rest.request(
            "GET",
            path_of("v1", "events", ns),
            query={"fieldSelector": f"involvedObject.name={name}"},
        )["items"]
        return items or None

    return eventually(probe, timeout=timeout, what=f"an event on {name}")


SHIPPED_WEBHOOK = (
    Path(__file__).resolve().parents[2] / "manifests" / "signer" / "admission-webhook.yaml"
)


def register_webhook(
    devcluster: DevCluster,
    namespace: str,
    port: int,
    signer: str,
    *,
    name: str | None = None,
    api_versions: list[str] | None = None,
) -> None:
    """The shipped webhook registration for `signer` only, pointed at a signer serving its
    webhook on loopback `port` with the CA of the Secret `podcert-ca` in `namespace`; renamed
    and its rule's apiVersions replaced when given."""
    secret = Rest(devcluster.admin).request(
        "GET", path_of("v1", "secrets", namespace, "podcert-ca")
    )
    config = yaml.safe_load(SHIPPED_WEBHOOK.read_text())
    if name is not None:
        config["metadata"]["name"] = name
    hook = config["webhooks"][0]
    if api_versions is not None:
        hook["rules"][0]["apiVersions"] = api_versions
    hook["matchConditions"][0]["expression"] = f"object.spec.signerName in ['{signer}']"
    hook["clientConfig"] = {
        "url": f"https://localhost:{port}/validate-podcertificaterequests",
        "caBundle": secret["data"]["ca.crt"],
    }
    kube.apply(devcluster.admin, [config])
