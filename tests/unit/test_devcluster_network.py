"""What the real node's Services are made of (`devcluster.network`): CoreDNS's build and
configuration, kube-proxy's, the kube-dns objects, and the small DNS client that waits for them."""

from __future__ import annotations

import re
import socket
import struct
import threading
from pathlib import Path

from devcluster import build, flags, network, nodeconfig


def test_coredns_is_built_with_only_the_plugins_its_corefile_uses() -> None:
    imported = re.findall(r'"github.com/coredns/coredns/plugin/(\w+)"', build.COREDNS_MAIN_GO)
    assert imported == list(build.COREDNS_PLUGINS)
    corefile = network.corefile("192.0.2.2", 5353, 8181, Path("/k"))
    directives = {line.split()[0] for line in corefile.splitlines()[1:] if line.startswith("    ")}
    directives -= {"}", "kubeconfig"}  # a closing brace, and the kubernetes block's own option
    assert directives == set(build.COREDNS_PLUGINS)
    assert corefile.startswith(f"{flags.CLUSTER_DOMAIN}:5353 {{")  # nothing else is answered


def test_kube_proxy_leaves_the_hosts_conntrack_and_localnet_settings_alone() -> None:
    config = network.kube_proxy_config(Path("/k"), "node-real", "1.37")
    assert config["mode"] == "iptables"
    assert config["clusterCIDR"] == nodeconfig.POD_SUBNET
    assert config["iptables"] == {"localhostNodePorts": False}  # no route_localnet
    assert config["conntrack"]["maxPerCore"] == 0  # 0: leave nf_conntrack_max as it is
    assert config["conntrack"]["tcpEstablishedTimeout"] == "0s"
    assert config["healthzBindAddress"].startswith("127.0.0.1:")


def test_kube_dns_is_a_selectorless_service_sent_to_the_host() -> None:
    service, endpoints = network.dns_objects("node-real", "192.0.2.2", 5353)
    assert service["spec"]["clusterIP"] == flags.DNS_SERVICE_IP
    assert "selector" not in service["spec"]
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {5353}
    assert endpoints["metadata"]["labels"]["kubernetes.io/service-name"] == "kube-dns"
    assert endpoints["endpoints"][0]["addresses"] == ["192.0.2.2"]


def test_the_kubelet_gets_the_cluster_dns_only_when_asked(tmp_path: Path) -> None:
    common = {
        "kube_version": "1.37",
        "folder": tmp_path,
        "socket": tmp_path / "c.sock",
        "cgroup": "/n",
        "address": "192.0.2.2",
        "port": 10250,
        "ca_file": tmp_path / "ca.crt",
    }
    assert "clusterDNS" not in nodeconfig.kubelet_config(**common)  # type: ignore[arg-type]
    config = nodeconfig.kubelet_config(**common, cluster_dns="10.0.0.10")  # type: ignore[arg-type]
    assert config["clusterDNS"] == ["10.0.0.10"]
    assert config["clusterDomain"] == "cluster.local"


def _answer(query: bytes, rcode: int, addresses: list[str]) -> bytes:
    """A reply as a DNS server writes one: the question echoed, answers named by a pointer."""
    ident = struct.unpack("!H", query[:2])[0]
    header = struct.pack("!6H", ident, 0x8180 | rcode, 1, len(addresses), 0, 0)
    records = b"".join(
        b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 30, 4) + socket.inet_aton(a) for a in addresses
    )
    return header + query[12:] + records


def _serve_once(rcode: int, addresses: list[str]) -> tuple[str, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))

    def reply() -> None:
        with sock:
            query, peer = sock.recvfrom(512)
            sock.sendto(_answer(query, rcode, addresses), peer)

    threading.Thread(target=reply, daemon=True).start()
    host, port = sock.getsockname()
    return host, port


def test_resolve_reads_the_a_records_of_an_answer() -> None:
    server = _serve_once(0, ["10.0.0.1", "10.0.0.2"])
    assert network.resolve("kubernetes.default.svc.cluster.local", server) == [
        "10.0.0.1",
        "10.0.0.2",
    ]


def test_resolve_tells_no_such_name_from_no_answer() -> None:
    assert network.resolve("nope.cluster.local", _serve_once(3, [])) == []  # NXDOMAIN
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        assert network.resolve("x.cluster.local", silent.getsockname(), timeout=0.2) is None
