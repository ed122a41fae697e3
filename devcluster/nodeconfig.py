"""The configuration files of a real node: containerd's, the bridge CNI's and the kubelet's."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from devcluster import images
from devcluster.flags import CLUSTER_DOMAIN, SERVICE_CIDR, feature_gates
from devcluster.host import CNI_BIN

BRIDGE = "podcert0"
POD_SUBNET = "10.89.0.0/24"


def containerd_config(folder: Path, cni_conf: Path, socket: Path) -> str:
    """containerd 1.6 (config version 2) with everything under `folder` (root, state, opt, runc's
    root), so stopping a node removes all it kept; runc on cgroupfs, as the host has no systemd."""
    return f"""version = 2
root = "{folder / "root"}"
state = "{folder / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{folder / "opt"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{images.PAUSE_IMAGE}"
  # This VM withholds CAP_SYS_RESOURCE: a sandbox's oom_score_adj of -998 fails otherwise.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{folder / "runc"}"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni_conf}"
"""


def cni_config(ipam_dir: Path) -> dict[str, Any]:
    """A host-only bridge: pods get an address and a route to the host for Service addresses;
    nothing is masqueraded off the host."""
    return {
        "cniVersion": "0.4.0",
        "name": "podcert-devcluster",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    # Service addresses go to the host (the gateway), where kube-proxy takes
                    # them when the node runs with Services (devcluster.network), and a DNAT
                    # the kubernetes Service's (devcluster.incluster). Nothing else leaves the
                    # bridge.
                    "routes": [{"dst": SERVICE_CIDR}],
                    "dataDir": str(ipam_dir),
                },
            }
        ],
    }


def kubelet_config(
    *,
    kube_version: str,
    folder: Path,
    socket: Path,
    cgroup: str,
    address: str,
    port: int,
    ca_file: Path,
    max_pods: int | None = None,
    sync_frequency: dt.timedelta | None = None,
    cluster_dns: str | None = None,
) -> dict[str, Any]:
    """The KubeletConfiguration for a real node on this VM: cgroup v1 through cgroupfs under
    `cgroup`, its files and ports its own, the host's iptables untouched, swap allowed, images never
    collected (they cannot be pulled again here).
    `max_pods` raises the kubelet's own limit of 110 pods (benchmarks load one node with more).
    `sync_frequency` shortens the kubelet's pod resync (default 1 min, plus up to half again of
    jitter), which paces how soon a changed ClusterTrustBundle reaches a running pod's files.
    `cluster_dns` is the cluster DNS's Service address pods get as their nameserver (with the
    search path of `cluster.local`); without it pods get the node's empty resolv.conf."""
    if sync_frequency is not None and sync_frequency < dt.timedelta(seconds=1):
        raise ValueError(f"sync_frequency must be at least 1 s, got {sync_frequency}")
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{socket}",
        "enforceNodeAllocatable": [],
        "makeIPTablesUtilChains": False,
        "resolvConf": str(folder / "resolv.conf"),
        "podLogsDir": str(folder / "pod-logs"),
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        # Only holders of a devcluster certificate (the API server's kubelet client) get in.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        # Images cannot be pulled again here: never collect them, never evict for disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "featureGates": feature_gates(kube_version),
        **({"maxPods": max_pods} if max_pods is not None else {}),
        **(
            {"clusterDNS": [cluster_dns], "clusterDomain": CLUSTER_DOMAIN}
            if cluster_dns is not None
            else {}
        ),
        **(
            {"syncFrequency": f"{int(sync_frequency.total_seconds())}s"}
            if sync_frequency is not None
            else {}
        ),
    }
