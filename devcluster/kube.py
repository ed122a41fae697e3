"""Real identities and objects on a running devcluster: nodes, service accounts, namespaces, pods.

A Node made here has no kubelet behind it (a pod bound to it stays Pending), which is all
NodeRestriction needs; `devcluster.nodes` starts real kubelets for tests that want pods to run.
The controller-manager creates each namespace's `default` ServiceAccount, but a test may race it,
so pods here ensure their ServiceAccount themselves.
"""

from __future__ import annotations

import datetime as dt
import functools
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client import ApiException

from devcluster import pki
from devcluster.identities import Paths, cert_creds, kubeconfig, load_ca
from devcluster.planestate import read_state
from podcert.client.kubeconfig import ClientSettings
from podcert.client.kubeconfig import load as load_settings


class ApiClient(client.ApiClient):
    """kubernetes' typed client for a kubeconfig (devcluster's own code and the tests use its
    generated APIs), that `podcert.client.rest.Rest` also takes: its `client_settings` are podcert's
    own, loaded from the same file. podcert itself never imports `kubernetes`."""

    def __init__(self, kubeconfig_path: Path) -> None:
        configuration = client.Configuration()
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig_path),
            client_configuration=configuration,
            persist_config=False,
        )
        super().__init__(configuration)
        self.kubeconfig = kubeconfig_path

    @functools.cached_property
    def client_settings(self) -> ClientSettings:
        return load_settings(self.kubeconfig)


def api_client(kubeconfig_path: Path) -> ApiClient:
    return ApiClient(kubeconfig_path)


def admin_client(root: Path) -> ApiClient:
    return api_client(Paths(root.resolve()).admin_kubeconfig)


def _server(paths: Paths) -> str:
    state = read_state(paths)
    if state is None:
        raise RuntimeError(f"no devcluster is running under {paths.root}")
    return state.server


def ensure_node(api: client.ApiClient, node: str) -> Any:
    core = client.CoreV1Api(api)
    try:
        return core.read_node(node)
    except ApiException as err:
        if err.status != 404:
            raise
    body = client.V1Node(metadata=client.V1ObjectMeta(name=node, labels={"podcert.dev/dev": "1"}))
    try:
        return core.create_node(body)
    except ApiException as err:
        if err.status != 409:
            raise
        return core.read_node(node)


def node_kubeconfig(root: Path, node: str, *, create_node: bool = True) -> Path:
    """Write a kubeconfig that authenticates as `node` (CN=system:node:<node>, O=system:nodes),
    creating Node `node` first unless a kubelet is to register it itself."""
    paths = Paths(root.resolve())
    if create_node:
        with admin_client(paths.root) as api:
            ensure_node(api, node)
    pair = pki.issue(
        load_ca(paths),
        f"system:node:{node}",
        dt.datetime.now(dt.UTC),
        organizations=("system:nodes",),
    )
    out = paths.node_kubeconfig(node)
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = kubeconfig(
        _server(paths), load_ca(paths).cert_pem, f"system:node:{node}", cert_creds(pair)
    )
    pki.write_private(out, text.encode())
    return out


def ensure_namespace(api: client.ApiClient, name: str) -> None:
    try:
        client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
        )
    except ApiException as err:
        if err.status != 409:
            raise


def ensure_service_account(api: client.ApiClient, namespace: str, name: str) -> Any:
    core = client.CoreV1Api(api)
    try:
        return core.create_namespaced_service_account(
            namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
        )
    except ApiException as err:
        if err.status != 409:
            raise
        return core.read_namespaced_service_account(name, namespace)


def service_account_kubeconfig(
    root: Path,
    namespace: str,
    name: str,
    seconds: int = 24 * 3600,
    *,
    bound_to: Any = None,
) -> Path:
    """A kubeconfig holding a bound token for the ServiceAccount (TokenRequest API). `bound_to`
    (a Pod or Node object read with this client) binds the token to that object as the kubelet
    binds a pod's: it stops working when the object goes, and names the node (the pod's) in the
    user's extra `authentication.kubernetes.io/node-name`."""
    paths = Paths(root.resolve())
    bound, which = None, ""
    if bound_to is not None:
        kind = bound_to.kind or ("Pod" if bound_to.metadata.namespace else "Node")
        bound = client.V1BoundObjectReference(
            api_version="v1", kind=kind, name=bound_to.metadata.name, uid=bound_to.metadata.uid
        )
        which = f".{kind.lower()}.{bound_to.metadata.name}"
    with admin_client(paths.root) as api:
        ensure_service_account(api, namespace, name)
        token = client.CoreV1Api(api).create_namespaced_service_account_token(
            name,
            namespace,
            client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(
                    audiences=[], expiration_seconds=seconds, bound_object_ref=bound
                )
            ),
        )
    out = paths.root / "serviceaccounts" / f"{namespace}.{name}{which}.kubeconfig"
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    user = f"system:serviceaccount:{namespace}:{name}"
    if token.status is None or not token.status.token:
        raise RuntimeError(f"TokenRequest for {namespace}/{name} returned no token")
    text = kubeconfig(_server(paths), load_ca(paths).cert_pem, user, {"token": token.status.token})
    pki.write_private(out, text.encode())
    return out


def user_kubeconfig(root: Path, user: str, groups: tuple[str, ...] = ()) -> Path:
    """A kubeconfig for an ordinary (non-node) user authenticated by client certificate."""
    paths = Paths(root.resolve())
    pair = pki.issue(load_ca(paths), user, dt.datetime.now(dt.UTC), organizations=groups)
    out = paths.root / "users" / f"{user.replace(':', '_')}.kubeconfig"
    out.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    text = kubeconfig(_server(paths), load_ca(paths).cert_pem, user, cert_creds(pair))
    pki.write_private(out, text.encode())
    return out


def _pod(body: dict[str, Any]) -> client.V1Pod:
    pod = client.V1Pod.from_dict(body)
    assert pod is not None
    return pod


def create_pod(
    api: client.ApiClient,
    namespace: str,
    name: str,
    *,
    node: str,
    service_account: str = "default",
    labels: dict[str, str] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    image: str = "registry.invalid/app:1",
    command: list[str] | None = None,
    restart_policy: str = "Always",
) -> Any:
    """A pod already bound to `node` (Pending unless a kubelet runs for `node`). On a real node
    use `images.BUSYBOX_IMAGE` with a `command`: no registry is reachable here."""
    ensure_service_account(api, namespace, service_account)
    mounts = [{"name": v["name"], "mountPath": f"/var/run/{v['name']}"} for v in volumes or []]
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": service_account,
            "automountServiceAccountToken": False,
            "restartPolicy": restart_policy,
            "containers": [
                {
                    "name": "app",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "volumeMounts": mounts,
                    **({"command": command} if command else {}),
                }
            ],
            "volumes": volumes or [],
        },
    }
    return client.CoreV1Api(api).create_namespaced_pod(namespace, _pod(body))


def pod_certificate_volume(
    signer_name: str,
    *,
    name: str = "identity",
    key_type: str = "ECDSAP256",
    max_expiration_seconds: int | None = None,
    trust_bundle_signer: bool = False,
    user_annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A projected volume with a podCertificate source (NodeRestriction in 1.37 refuses a node's
    request for a pod that mounts none for that signer), optionally with the signer's roots."""
    cert: dict[str, Any] = {
        "signerName": signer_name,
        "keyType": key_type,
        "credentialBundlePath": "credentialbundle.pem",
    }
    if max_expiration_seconds is not None:
        cert["maxExpirationSeconds"] = max_expiration_seconds
    if user_annotations:
        cert["userAnnotations"] = user_annotations
    sources: list[dict[str, Any]] = [{"podCertificate": cert}]
    if trust_bundle_signer:
        sources.append(
            {
                "clusterTrustBundle": {
                    "signerName": signer_name,
                    "labelSelector": {},
                    "path": "trust-bundle.pem",
                }
            }
        )
    return {"name": name, "projected": {"sources": sources}}


_PLURALS = {
    "Namespace": ("v1", "namespaces", False),
    "ServiceAccount": ("v1", "serviceaccounts", True),
    "Secret": ("v1", "secrets", True),
    "ConfigMap": ("v1", "configmaps", True),
    "Service": ("v1", "services", True),
    "ClusterRole": ("rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", "rolebindings", True),
    "ValidatingWebhookConfiguration": (
        "admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
        False,
    ),
    "ValidatingAdmissionPolicy": (
        "admissionregistration.k8s.io/v1",
        "validatingadmissionpolicies",
        False,
    ),
    "ValidatingAdmissionPolicyBinding": (
        "admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
        False,
    ),
}


def delete(api: ApiClient, docs: list[dict[str, Any]]) -> None:
    """Delete each object (missing ones are fine)."""
    from podcert.client.rest import ApiError, Rest, path_of

    rest = Rest(api)
    for doc in docs:
        gv, plural, namespaced = _PLURALS[doc["kind"]]
        ns = doc["metadata"].get("namespace") if namespaced else None
        try:
            rest.request("DELETE", path_of(gv, plural, ns, doc["metadata"]["name"]))
        except ApiError as err:
            if err.status != 404:
                raise


def apply(api: ApiClient, docs: list[dict[str, Any]]) -> None:
    """Create each object, replacing it when it exists (enough for tests and the demo)."""
    from podcert.client.rest import ApiError, Rest, path_of

    rest = Rest(api)
    for doc in docs:
        gv, plural, namespaced = _PLURALS[doc["kind"]]
        ns = doc["metadata"].get("namespace") if namespaced else None
        try:
            rest.request("POST", path_of(gv, plural, ns), body=doc)
        except ApiError as err:
            if err.status != 409:
                raise
            current = rest.request("GET", path_of(gv, plural, ns, doc["metadata"]["name"]))
            doc = {
                **doc,
                "metadata": {
                    **doc["metadata"],
                    "resourceVersion": current["metadata"]["resourceVersion"],
                },
            }
            rest.request("PUT", path_of(gv, plural, ns, doc["metadata"]["name"]), body=doc)
