"""What a workload on the devcluster's real node needs to run as a cluster's own pods do (issue
16): podcert's image in the node's containerd, and a way to the API server.

The devcluster's API server listens on loopback, which no EndpointSlice may name: kube-proxy
(`devcluster.network`, where a node runs with Services) cannot take the `kubernetes` Service
there. An in-cluster client (a pod's service account token and `KUBERNETES_SERVICE_HOST`, the
`kubernetes` Service's cluster IP, 10.0.0.1, which the API server's certificate names) is given
what kube-proxy would give it: pods route the Service range to the host
(`devcluster.nodeconfig`), and while `api_server_for_pods` is open a DNAT rule takes the bridge's
traffic for 10.0.0.1:443 to the API server's loopback port, with `route_localnet` so the kernel
routes pod traffic to 127.0.0.1 and back (as kube-proxy does for its localhost node ports). The
other way, the API server reaches a webhook Service at its endpoints
(`--enable-aggregator-routing`, `devcluster.flags`), pod addresses the host routes to the bridge:
most tests run no kube-proxy, and a cluster IP without its rules would leave the machine.
And since the node lifecycle controller is off (`devcluster.flags`), the `not-ready` taint a kubelet
registers with stays until `schedulable` lifts it once the node is Ready, as that controller would:
only then does the scheduler place a Deployment's pods there.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

from devcluster.nodeconfig import BRIDGE
from devcluster.nodestate import NodeState
from devcluster.planestate import State
from devcluster.supervise import NodeError
from podcert.client.rest import Rest, path_of

KUBERNETES_SERVICE = ("10.0.0.1", 443)  # the first address of flags.SERVICE_CIDR
TAG = "podcert-devcluster: kubernetes Service for pods"
_SYSCTL = Path("/proc/sys/net/ipv4/conf")


def load_image(node: NodeState, archive: Path) -> None:
    """Import an image archive (`podman save`) into the real node's containerd, where the
    kubelet finds it by name (an IfNotPresent pull then never reaches a registry)."""
    done = subprocess.run(
        [
            "ctr",
            f"--address={node.containerd_socket}",
            "--namespace=k8s.io",
            "images",
            "import",
            str(archive),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if done.returncode != 0:
        raise NodeError(f"ctr images import {archive.name} failed: {done.stderr.strip()}")


NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def schedulable(rest: Rest, node: str) -> None:
    """Lift the not-ready taints of a Ready node (the node lifecycle controller's work)."""
    current = rest.request("GET", path_of("v1", "nodes", None, node))
    conditions = (current.get("status") or {}).get("conditions") or []
    if not any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
        raise NodeError(f"node {node} is not Ready: its taints stay")
    taints = (current.get("spec") or {}).get("taints") or []
    kept = [t for t in taints if t["key"] not in NOT_READY_TAINTS]
    if kept != taints:
        rest.request(
            "PATCH",
            path_of("v1", "nodes", None, node),
            body={"spec": {"taints": kept or None}},
            content_type="application/merge-patch+json",
        )


def _iptables(action: str, target: str) -> list[str]:
    ip, port = KUBERNETES_SERVICE
    return [
        "iptables", "-t", "nat", action, "PREROUTING", "-i", BRIDGE, "-d", ip, "-p", "tcp",
        "--dport", str(port), "-m", "comment", "--comment", TAG,
        "-j", "DNAT", "--to-destination", target,
    ]  # fmt: skip


def _set(path: Path, value: str) -> str | None:
    """Write a sysctl; return its old value (None when it does not exist)."""
    try:
        old = path.read_text().strip()
    except OSError:
        return None
    path.write_text(value)
    return old


@contextlib.contextmanager
def api_server_for_pods(plane: State) -> Iterator[None]:
    """While open, pods on the real node reach the API server at the kubernetes Service's cluster
    IP. `route_localnet` is set on the bridge, and on `default` so that the bridge, made with the
    node's first pod, has it from its start; both are restored after."""
    target = f"127.0.0.1:{plane.apiserver_port}"
    olds = {name: _set(_SYSCTL / name / "route_localnet", "1") for name in ("default", BRIDGE)}
    added = subprocess.run(_iptables("-I", target), capture_output=True, text=True, check=False)
    if added.returncode != 0:
        raise NodeError(f"iptables refused the DNAT rule: {added.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(_iptables("-D", target), capture_output=True, check=False)
        for name, old in olds.items():
            if old is not None:
                with contextlib.suppress(OSError):
                    (_SYSCTL / name / "route_localnet").write_text(old)
        # A bridge made while this was open inherited 1 from `default`; the node removes its
        # bridge when it stops, and a later one starts from the restored default.


@contextlib.contextmanager
def only_node(rest: Rest, node: str) -> Iterator[None]:
    """While open, the scheduler places pods on `node` alone: every other Node is cordoned (and
    uncordoned after). A test session leaves Node objects behind whose kubelets have stopped, or
    never ran (made through the API); with the node lifecycle controller off nothing marks them
    not-ready, so a Deployment's pod could be bound to one and never run."""
    found = rest.request("GET", path_of("v1", "nodes"))
    others = [
        n["metadata"]["name"]
        for n in found.get("items") or []
        if n["metadata"]["name"] != node and not (n.get("spec") or {}).get("unschedulable")
    ]
    for name in others:
        _cordon(rest, name, True)
    try:
        yield
    finally:
        for name in others:
            with contextlib.suppress(Exception):
                _cordon(rest, name, False)


def _cordon(rest: Rest, name: str, unschedulable: bool) -> None:
    rest.request(
        "PATCH",
        path_of("v1", "nodes", None, name),
        body={"spec": {"unschedulable": unschedulable or None}},
        content_type="application/merge-patch+json",
    )
