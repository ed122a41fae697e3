"""The command lines of the control plane's processes, and what each Kubernetes minor needs
switched on for pod certificates."""

from __future__ import annotations

from pathlib import Path

from devcluster.build import DEFAULT_KUBE_VERSION
from devcluster.identities import Paths

SERVICE_CIDR = "10.0.0.0/24"
# The cluster DNS's Service address (the kubelet's clusterDNS) and domain, when a real node runs
# with Services (`devcluster.network`).
DNS_SERVICE_IP = "10.0.0.10"
CLUSTER_DOMAIN = "cluster.local"
ISSUER = "https://kubernetes.default.svc"

# certificates.k8s.io/v1beta1 (ClusterTrustBundle, PodCertificateRequest) is off by default in
# every minor; 1.35 and 1.36 serve only it, 1.37 serves it beside v1 for code that speaks it.
RUNTIME_CONFIG = "certificates.k8s.io/v1beta1=true"
# pkg/features/kube_features.go: all three are beta and off by default in 1.35 and 1.36, GA (on)
# in 1.37. PodCertificateRequest also gates the podCertificate projection (kubelet, pod
# validation) and the controller-manager's request cleaner; ClusterTrustBundleProjection needs
# ClusterTrustBundle.
POD_CERTIFICATE_GATES = (
    "ClusterTrustBundle",
    "ClusterTrustBundleProjection",
    "PodCertificateRequest",
)
FEATURE_GATES = {
    "1.35": POD_CERTIFICATE_GATES,
    "1.36": POD_CERTIFICATE_GATES,
    "1.37": (),
}


def feature_gates(kube_version: str) -> dict[str, bool]:
    """The gates a minor needs switched on for pod certificates (the same for every component)."""
    return dict.fromkeys(FEATURE_GATES[kube_version], True)


def feature_gate_flags(kube_version: str) -> list[str]:
    gates = feature_gates(kube_version)
    if not gates:
        return []
    return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in gates.items())]


def etcd_args(binary: Path, paths: Paths, client_port: int, peer_port: int) -> list[str]:
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        str(binary),
        "--name=devcluster",
        f"--data-dir={paths.root / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=devcluster={peer}",
        # A throwaway test store: durability across power loss buys nothing here.
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def apiserver_args(
    binary: Path,
    paths: Paths,
    etcd_port: int,
    port: int,
    kube_version: str = DEFAULT_KUBE_VERSION,
    *,
    profiling: bool = False,
) -> list[str]:
    p = paths.pki
    return [
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        # Loopback cannot back the kubernetes Service endpoints; nothing here needs them.
        "--endpoint-reconciler-type=none",
        # The API server calls webhooks (and aggregated APIs) at their Service's endpoints, not
        # its cluster IP (an in-cluster signer's webhook is one): most tests run no kube-proxy
        # (`devcluster.network`), and a cluster IP with no rule would be routed off the machine.
        "--enable-aggregator-routing=true",
        f"--secure-port={port}",
        f"--cert-dir={p}",
        f"--tls-cert-file={p / 'apiserver.crt'}",
        f"--tls-private-key-file={p / 'apiserver.key'}",
        f"--client-ca-file={p / 'ca.crt'}",
        f"--service-account-issuer={ISSUER}",
        f"--service-account-key-file={p / 'sa.pub'}",
        f"--service-account-signing-key-file={p / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        f"--runtime-config={RUNTIME_CONFIG}",
        *feature_gate_flags(kube_version),
        # Logs and exec: kubelets listen on loopback, and the node's hostname resolves nowhere.
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
        "--allow-privileged=true",
        f"--profiling={str(profiling).lower()}",
        "--v=1",
    ]


# Nodes without a kubelet (most tests make Node objects and bind pods to them by hand) would be
# marked unreachable, tainted, and their pods evicted after 5 minutes: the node lifecycle
# controller stays off. Every other controller runs, as in a real cluster.
CONTROLLERS = "*,-node-lifecycle-controller"


def controller_manager_args(
    binary: Path, paths: Paths, port: int, kube_version: str = DEFAULT_KUBE_VERSION
) -> list[str]:
    p = paths.pki
    return [
        str(binary),
        f"--kubeconfig={paths.component_kubeconfig('kube-controller-manager')}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={p / 'kube-controller-manager'}",
        "--leader-elect=false",
        f"--controllers={CONTROLLERS}",
        # Each controller acts as its own ServiceAccount with the bootstrap RBAC, as in kubeadm.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={p / 'sa.key'}",
        f"--root-ca-file={p / 'ca.crt'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        *feature_gate_flags(kube_version),
        "--profiling=false",
        "--v=1",
    ]


def scheduler_args(
    binary: Path, paths: Paths, port: int, kube_version: str = DEFAULT_KUBE_VERSION
) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={paths.component_kubeconfig('kube-scheduler')}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={paths.pki / 'kube-scheduler'}",
        "--leader-elect=false",
        *feature_gate_flags(kube_version),
        "--profiling=false",
        "--v=1",
    ]
