"""What each Kubernetes minor is started with, the node configuration, and the images made here."""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from devcluster import build, flags, hollow, host, identities, images, nodeconfig

GATES = (
    "--feature-gates="
    "ClusterTrustBundle=true,ClusterTrustBundleProjection=true,PodCertificateRequest=true"
)


@pytest.mark.parametrize(
    ("version", "gates"),
    [
        pytest.param("1.35", [GATES], id="1.35 switches the beta pod certificate features on"),
        pytest.param("1.36", [GATES], id="1.36 switches the beta pod certificate features on"),
        pytest.param("1.37", [], id="1.37 needs no gate: all GA"),
    ],
)
def test_each_minor_gets_the_gates_it_needs_on_every_component(
    version: str, gates: list[str]
) -> None:
    paths = identities.Paths(Path("/dc"))
    api = flags.apiserver_args(Path("kube-apiserver"), paths, 1, 2, version)
    kcm = flags.controller_manager_args(Path("kcm"), paths, 3, version)
    assert [a for a in api if a.startswith("--feature-gates")] == gates
    assert [a for a in kcm if a.startswith("--feature-gates")] == gates
    assert "--runtime-config=certificates.k8s.io/v1beta1=true" in api


def test_the_controller_manager_runs_all_but_the_node_lifecycle_controller() -> None:
    kcm = flags.controller_manager_args(Path("kcm"), identities.Paths(Path("/dc")), 3)
    assert "--controllers=*,-node-lifecycle-controller" in kcm


def test_the_api_server_serves_pprof_only_when_a_benchmark_asks() -> None:
    paths = identities.Paths(Path("/dc"))
    assert "--profiling=false" in flags.apiserver_args(Path("kube-apiserver"), paths, 1, 2)
    profiled = flags.apiserver_args(Path("kube-apiserver"), paths, 1, 2, profiling=True)
    assert "--profiling=true" in profiled
    assert "--profiling=false" not in profiled


def test_each_minor_is_built_from_its_own_release() -> None:
    assert build.kubernetes_component("kubelet", "1.35").version == "v1.35.4"
    assert build.kubernetes_component("kube-apiserver", "1.36").replace_version == "v0.36.3"
    with pytest.raises(build.BuildError, match=r"1\.34 is not offered"):
        build.kubernetes_component("kubelet", "1.34")


def test_the_hollow_kubelet_is_kubemark_with_a_feature_gates_flag() -> None:
    hollow = build.kubernetes_component(build.HOLLOW_KUBELET, "1.35")
    assert hollow.package == "podcert.local/build/kubemark"
    assert '"k8s.io/kubernetes/cmd/kubemark/app"' in hollow.main_go
    assert "DefaultMutableFeatureGate.AddFlag" in hollow.main_go
    assert not build.kubernetes_component(build.REAL_KUBELET, "1.35").main_go


def test_a_real_node_kubelet_config_carries_the_vm_settings(tmp_path: Path) -> None:
    config = nodeconfig.kubelet_config(
        kube_version="1.36",
        folder=tmp_path,
        socket=tmp_path / "c.sock",
        cgroup="/podcert-devcluster-n",
        address="192.0.2.2",
        port=10250,
        ca_file=tmp_path / "ca.crt",
    )
    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["containerRuntimeEndpoint"] == f"unix://{tmp_path / 'c.sock'}"
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["featureGates"] == {
        "ClusterTrustBundle": True,
        "ClusterTrustBundleProjection": True,
        "PodCertificateRequest": True,
    }


def test_containerd_restricts_oom_score_adj_and_keeps_its_state_in_its_folder(
    tmp_path: Path,
) -> None:
    socket = Path("/run/podcert-containerd-0123456789ab/containerd.sock")
    text = nodeconfig.containerd_config(tmp_path, tmp_path / "cni", socket)
    assert "restrict_oom_score_adj = true" in text
    assert "SystemdCgroup = false" in text
    assert f'address = "{socket}"' in text
    assert f'root = "{tmp_path / "root"}"' in text
    assert f'sandbox_image = "{images.PAUSE_IMAGE}"' in text


def test_an_image_archive_names_its_image_and_its_layer_digests_match() -> None:
    layer = images.root_layer(b"\x7fELF-not-really", ["sh", "cat", "busybox"])
    archive = images.oci_archive(images.Image("podcert.local/x:1", ("/bin/sh",)), layer)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        index = json.loads(_read(tar, "index.json"))
        (entry,) = index["manifests"]
        assert entry["annotations"]["io.containerd.image.name"] == "podcert.local/x:1"
        manifest = json.loads(_read(tar, "blobs/sha256/" + entry["digest"].split(":")[1]))
        config = json.loads(_read(tar, "blobs/sha256/" + manifest["config"]["digest"][7:]))
        assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(layer).hexdigest()]
        for blob in (entry, manifest["config"], *manifest["layers"]):
            data = _read(tar, "blobs/sha256/" + blob["digest"][7:])
            assert hashlib.sha256(data).hexdigest() == blob["digest"][7:]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        assert tar.getmember("bin/sh").linkname == "busybox"
        assert "bin/busybox" in tar.getnames()


def test_image_archives_are_reproducible() -> None:
    layer = images.root_layer(b"binary", ["sh"])
    image = images.Image("podcert.local/x:1", ("/bin/sh",))
    assert images.oci_archive(image, layer) == images.oci_archive(image, layer)


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    member = tar.extractfile(name)
    assert member is not None
    return member.read()


def test_a_real_node_takes_more_than_110_pods_only_when_asked(tmp_path: Path) -> None:
    common: dict[str, Any] = {
        "kube_version": "1.37",
        "folder": tmp_path,
        "socket": tmp_path / "c.sock",
        "cgroup": "/podcert-devcluster-n",
        "address": "192.0.2.2",
        "port": 10250,
        "ca_file": tmp_path / "ca.crt",
    }
    assert "maxPods" not in nodeconfig.kubelet_config(**common)
    assert nodeconfig.kubelet_config(**common, max_pods=250)["maxPods"] == 250


def test_a_real_node_resyncs_pods_at_the_kubelets_default_unless_told(tmp_path: Path) -> None:
    common: dict[str, Any] = {
        "kube_version": "1.37",
        "folder": tmp_path,
        "socket": tmp_path / "c.sock",
        "cgroup": "/podcert-devcluster-n",
        "address": "192.0.2.2",
        "port": 10250,
        "ca_file": tmp_path / "ca.crt",
    }
    assert "syncFrequency" not in nodeconfig.kubelet_config(**common)
    quick = nodeconfig.kubelet_config(**common, sync_frequency=dt.timedelta(seconds=10))
    assert quick["syncFrequency"] == "10s"
    with pytest.raises(ValueError, match="at least 1 s"):
        nodeconfig.kubelet_config(**common, sync_frequency=dt.timedelta(milliseconds=500))


@pytest.mark.parametrize(
    ("max_pods", "expected"),
    [
        pytest.param(None, [], id="kubemark's own limit of 110 pods unless asked"),
        pytest.param(250, ["--max-pods=250"], id="a raised limit is passed on"),
    ],
)
def test_a_hollow_kubelet_talks_to_the_api_server_as_a_real_kubelet_does(
    max_pods: int | None, expected: list[str]
) -> None:
    args = hollow.kubemark_args(
        Path("kubemark"), "n", Path("n.kubeconfig"), 10250, "1.37", max_pods
    )
    # kubemark's client defaults are 10 QPS / burst 20; a real kubelet's are 50 / 100.
    assert "--kube-api-qps=50" in args
    assert "--kube-api-burst=100" in args
    assert [a for a in args if a.startswith("--max-pods")] == expected


def test_only_a_real_nodes_own_mounts_count_as_its_leftovers() -> None:
    rootfs = "/t/dc/nodes/node-k/containerd/state/io.containerd.runtime.v2.task/k8s.io/a/rootfs"
    points = [
        "/",
        "/run/podcert-node-0123456789ab/kubelet/pods/u/volumes/kubernetes.io~projected/identity",
        rootfs,
        "/run/podcert-nodes-not-ours",
        "/var/lib/containers/storage/overlay/ab/merged",  # podman's, not a node's
        "/run/netns/cni-1234",
    ]
    assert host.node_mounts(points) == [points[1], rootfs]
