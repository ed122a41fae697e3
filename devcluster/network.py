"""Services for the real node's pods, as a cluster gives them, so a pod reaches another by its
Service's name (the example mTLS pair does): kube-proxy in iptables
mode takes a Service's cluster IP to its endpoints, and a cluster DNS (CoreDNS) answers
`<service>.<namespace>.svc.cluster.local`. Both are built from Go modules
(`build.ensure_network`) and run on the host beside the real node, each with an identity of its
own: kube-proxy as `system:kube-proxy`, which the bootstrap ClusterRoleBinding
`system:node-proxier` grants what it needs, and CoreDNS as `system:coredns` with a ClusterRole
of what its kubernetes plugin watches (services, endpointslices, namespaces).

CoreDNS listens on the host's address at a free port, and the `kube-dns` Service (10.0.0.10, the
kubelet's clusterDNS) has no selector: its EndpointSlice names that address and port, and
kube-proxy takes pods' queries there as it takes any Service's traffic.

The `kubernetes` Service stays outside: the API server listens on loopback, and an EndpointSlice
may not name a loopback address, so `devcluster.incluster`'s DNAT still gives pods 10.0.0.1:443.

Stray traffic: a Service address with no rule (not synced yet, or no such Service) would follow
the host's default route off the machine. While this runs the Service range is routed to an
empty bridge instead, where it ends (as kube-proxy's IPVS mode holds cluster IPs on a dummy
interface); rules DNAT before that route applies, so Services work from pods and the host alike.

Recorded under the node's folder (`network.json`); `stop`, which `nodes.stop` calls, stops both,
removes kube-proxy's rules (`kube-proxy --cleanup`), the bridge and the objects made here.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import secrets
import socket
import struct
import subprocess
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from devcluster import build, host, kube
from devcluster.flags import CLUSTER_DOMAIN, DNS_SERVICE_IP, SERVICE_CIDR, feature_gates
from devcluster.identities import Paths, write_client_identity
from devcluster.nodeconfig import POD_SUBNET
from devcluster.nodestate import node_dir
from devcluster.planestate import State
from devcluster.supervise import (
    ClusterError,
    NodeError,
    Progress,
    exited,
    free_port,
    log_tail,
    wait_until,
)
from devcluster.supervise import stop as stop_process
from podcert.client.rest import ApiError, Rest, path_of

SINK = "podcert-svc"  # the empty bridge the Service range is routed to
STATE = "network.json"
_BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
_DNS_PORT = 53

COREDNS_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": "system:coredns"},
    "rules": [
        {"apiGroups": [""], "resources": ["services", "namespaces"], "verbs": ["list", "watch"]},
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["list", "watch"],
        },
    ],
}
_RBAC = "rbac.authorization.k8s.io"
COREDNS_BINDING = {
    "apiVersion": f"{_RBAC}/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "system:coredns"},
    "roleRef": {"apiGroup": _RBAC, "kind": "ClusterRole", "name": "system:coredns"},
    "subjects": [{"apiGroup": _RBAC, "kind": "User", "name": "system:coredns"}],
}


@dataclass(frozen=True)
class NetworkState:
    kube_proxy_pid: int
    kube_proxy_binary: str
    kube_proxy_config: str
    coredns_pid: int
    coredns_binary: str
    dns_address: str  # where CoreDNS listens (the host's address)
    bridge_nf_was: str = ""  # bridge-nf-call-iptables before, when this set it


def _state_file(root: Path, node: str) -> Path:
    return node_dir(root, node) / STATE


def read_state(root: Path, node: str) -> NetworkState | None:
    try:
        return NetworkState(**json.loads(_state_file(root, node).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _save(root: Path, node: str, state: NetworkState) -> None:
    _state_file(root, node).write_text(json.dumps(asdict(state)))


# --- the cluster's side: kube-dns and CoreDNS's RBAC -------------------------------------------


def dns_objects(node: str, address: str, port: int) -> list[dict[str, Any]]:
    """The `kube-dns` Service at DNS_SERVICE_IP with no selector, and the EndpointSlice that
    sends it to CoreDNS on the host."""
    ports = [("dns", "UDP"), ("dns-tcp", "TCP")]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system"},
        "spec": {
            "clusterIP": DNS_SERVICE_IP,
            "ports": [
                {"name": n, "protocol": p, "port": _DNS_PORT, "targetPort": port} for n, p in ports
            ],
        },
    }
    endpoints = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kube-dns-host",
            "namespace": "kube-system",
            "labels": {
                "kubernetes.io/service-name": "kube-dns",
                "endpointslice.kubernetes.io/managed-by": "devcluster.podcert.dev",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}, "nodeName": node}],
        "ports": [{"name": n, "protocol": p, "port": port} for n, p in ports],
    }
    return [service, endpoints]


def _path(doc: dict[str, Any], *, named: bool = True) -> str:
    group_version, plural = {
        "Service": ("v1", "services"),
        "EndpointSlice": ("discovery.k8s.io/v1", "endpointslices"),
        "ClusterRole": ("rbac.authorization.k8s.io/v1", "clusterroles"),
        "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "clusterrolebindings"),
    }[doc["kind"]]
    meta = doc["metadata"]
    return path_of(group_version, plural, meta.get("namespace"), meta["name"] if named else "")


def _apply(rest: Rest, docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        rest.request(
            "PATCH",
            _path(doc),
            query={"fieldManager": "podcert-devcluster", "force": "true"},
            body=doc,
            content_type="application/apply-patch+yaml",
        )


def _delete(rest: Rest, docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        with contextlib.suppress(ApiError):
            rest.request("DELETE", _path(doc))


# --- the host's side ------------------------------------------------------------------------------


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], capture_output=True, check=False)


def _sink_service_range() -> None:
    """Route the Service range into an empty bridge (see the module docstring)."""
    _ip("link", "delete", SINK)  # a killed run's
    for args in (
        ("link", "add", SINK, "type", "bridge"),
        ("link", "set", SINK, "up"),
        ("route", "add", SERVICE_CIDR, "dev", SINK),
    ):
        done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise NodeError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


def _bridge_netfilter() -> str:
    """Make bridged traffic pass iptables, which a Service's reply between two pods of one
    bridge needs (to be un-NATed); returns the old value when it was off, else ""."""
    try:
        old = _BRIDGE_NF.read_text().strip()
    except OSError:
        raise NodeError(
            "br_netfilter is not loaded (no /proc/sys/net/bridge): pods on one bridge could not "
            "reach each other through a Service"
        ) from None
    if old == "1":
        return ""
    _BRIDGE_NF.write_text("1")
    return old


def corefile(address: str, port: int, ready_port: int, kubeconfig: Path) -> str:
    """Only the cluster domain: other names are refused (nothing is forwarded, there is no
    network to forward to). `ready` answers 200 once the kubernetes plugin has synced."""
    return f"""{CLUSTER_DOMAIN}:{port} {{
    bind {address}
    errors
    ready 127.0.0.1:{ready_port}
    kubernetes {CLUSTER_DOMAIN} {{
        kubeconfig {kubeconfig}
    }}
    cache 30
}}
"""


def kube_proxy_config(kubeconfig: Path, node: str, kube_version: str) -> dict[str, Any]:
    """iptables mode, touching nothing of the host it need not: no conntrack table sizes or
    timeouts, no route_localnet (localhost node ports off), no OOM score (the VM refuses it)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node,
        "mode": "iptables",
        "clusterCIDR": POD_SUBNET,
        "detectLocalMode": "ClusterCIDR",
        "healthzBindAddress": f"127.0.0.1:{free_port()}",
        "metricsBindAddress": f"127.0.0.1:{free_port()}",
        "nodePortAddresses": ["primary"],
        "oomScoreAdj": 0,
        "iptables": {"localhostNodePorts": False},
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "featureGates": feature_gates(kube_version),
    }


def resolve(name: str, server: tuple[str, int], timeout: float = 1.0) -> list[str] | None:
    """The IPv4 addresses a DNS server answers for `name` (one UDP query, recursion not asked):
    [] for an error or no address, None when no answer came in time."""
    ident = secrets.randbelow(1 << 16)
    labels = name.rstrip(".").split(".")
    question = b"".join(bytes([len(x)]) + x.encode() for x in labels) + b"\0" + b"\0\1\0\1"
    query = struct.pack("!6H", ident, 0, 1, 0, 0, 0) + question  # A, IN
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.sendto(query, server)
            reply = sock.recv(4096)
        except OSError:
            return None
    try:
        return _addresses(reply, ident, 12 + len(question))
    except (IndexError, struct.error):  # cut short
        return []


def _addresses(reply: bytes, ident: int, offset: int) -> list[str]:
    """The A records of a reply to query `ident`, whose answers start at `offset`."""
    answer_id, flags, _, count, _, _ = struct.unpack("!6H", reply[:12])
    if answer_id != ident or flags & 0xF:  # another query's, or an error code
        return []
    found = []
    for _ in range(count):
        while reply[offset] and reply[offset] < 0xC0:  # the owner name: labels, then 0 ...
            offset += 1 + reply[offset]
        offset += 2 if reply[offset] >= 0xC0 else 1  # ... or a pointer
        kind, _, _, length = struct.unpack("!HHIH", reply[offset : offset + 10])
        offset += 10
        if kind == 1 and length == 4:
            found.append(socket.inet_ntoa(reply[offset : offset + 4]))
        offset += length
    return found


# --- start, stop ----------------------------------------------------------------------------------


def start(
    root: Path,
    node: str,
    plane: State,
    cgroup: str,
    progress: Progress,
    deadline: float,
) -> NetworkState:
    """Start CoreDNS and kube-proxy for the real node `node` (its kubelet registered already),
    and return once a query to the cluster DNS's Service address is answered through
    kube-proxy's rules."""
    paths = Paths(root.resolve())
    binaries = build.ensure_network(plane.kube_version, progress)
    folder = node_dir(root, node) / "network"
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    proxy_kubeconfig = write_client_identity(
        paths, "kube-proxy", "system:kube-proxy", (), plane.server, now
    )
    dns_kubeconfig = write_client_identity(
        paths, "coredns", "system:coredns", (), plane.server, now
    )
    config = folder / "kube-proxy.yaml"
    config.write_text(yaml.safe_dump(kube_proxy_config(proxy_kubeconfig, node, plane.kube_version)))
    address, port = host.node_ip(), free_port()
    (folder / "Corefile").write_text(corefile(address, port, free_port(), dns_kubeconfig))
    # Recorded before the first change to the cluster or the host, so that `stop` undoes it all.
    state = NetworkState(
        0, str(binaries.kube_proxy), str(config), 0, str(binaries.coredns), address
    )
    _save(root, node, state)
    with kube.admin_client(paths.root) as api:
        _apply(Rest(api), [COREDNS_ROLE, COREDNS_BINDING, *dns_objects(node, address, port)])
    state = replace(state, bridge_nf_was=_bridge_netfilter())
    _save(root, node, state)
    _sink_service_range()
    host.make_cgroup(f"{cgroup}/network")
    progress(f"starting CoreDNS {build.COREDNS_VERSION} at {address}:{port} ({DNS_SERVICE_IP})")
    dns_log = folder / "coredns.log"
    dns = host.spawn(
        [str(binaries.coredns), "-conf", str(folder / "Corefile")],
        dns_log,
        cgroup=f"{cgroup}/network",
    )
    state = replace(state, coredns_pid=dns.pid)
    _save(root, node, state)
    progress(f"starting kube-proxy {plane.kube_version} (iptables mode) for {node}")
    proxy_log = folder / "kube-proxy.log"
    proxy = host.spawn(
        [str(binaries.kube_proxy), f"--config={config}", "--v=1"],
        proxy_log,
        cgroup=f"{cgroup}/network",
    )
    state = replace(state, kube_proxy_pid=proxy.pid)
    _save(root, node, state)
    name = f"kubernetes.default.svc.{CLUSTER_DOMAIN}"

    def failed() -> str | None:
        return exited(dns, dns_log)() or exited(proxy, proxy_log)()

    try:
        wait_until(
            lambda: resolve(name, (DNS_SERVICE_IP, _DNS_PORT)) == ["10.0.0.1"],
            deadline,
            f"{name} at {DNS_SERVICE_IP} (CoreDNS through kube-proxy's rules)",
            interval=0.2,
            failed=failed,
        )
    except ClusterError as err:
        logs = f"kube-proxy log:\n{log_tail(proxy_log, 15)}\nCoreDNS log:\n{log_tail(dns_log, 15)}"
        raise NodeError(f"{err}\n{logs}") from None
    return state


def stop(root: Path, node: str) -> None:
    """Stop what `start` started for `node` and remove what it made; a no-op when it did not."""
    state = read_state(root, node)
    if state is None:
        return
    stop_process(state.kube_proxy_pid, state.kube_proxy_binary, 10.0)
    stop_process(state.coredns_pid, state.coredns_binary, 10.0)
    if state.kube_proxy_binary and Path(state.kube_proxy_binary).is_file():
        # Every chain and rule it made, in iptables and ip6tables.
        subprocess.run(
            [state.kube_proxy_binary, "--cleanup", f"--config={state.kube_proxy_config}"],
            capture_output=True,
            check=False,
            timeout=60,
        )
    _ip("link", "delete", SINK)
    if state.bridge_nf_was:
        with contextlib.suppress(OSError):
            _BRIDGE_NF.write_text(state.bridge_nf_was)
    docs = [COREDNS_ROLE, COREDNS_BINDING, *dns_objects(node, state.dns_address, 0)]
    # A control plane already gone keeps nothing of them.
    with contextlib.suppress(Exception), kube.admin_client(root) as api:
        _delete(Rest(api), docs)
    _state_file(root, node).unlink(missing_ok=True)
