"""A running devcluster upgraded in place, as kubeadm does it, through the CLI
an operator uses. A 1.36 cluster with a 1.36 hollow node goes to 1.37 (`devcluster upgrade`):
the API server answers with the new release on the same etcd data (etcd itself keeps running),
what was stored before is still there and readable through v1, the skewed node stays Ready and
keeps renewing its lease against the new API server, and `devcluster kubelet --upgrade` moves it
to 1.37 with its pod kept. The refusals that need a running cluster (a downgrade, a kubelet newer
than the API server, an unknown node) are one line and exit 2, and change nothing.

One cluster for the module; the node is hollow (the upgrade does not depend on the node kind).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devcluster import build, cluster, kube, nodes, nodestate, planestate
from devcluster.identities import Paths
from devcluster.testing import DevCluster, eventually
from podcert.api import keys
from podcert.api.versions import group_version
from podcert.cli import main
from podcert.client.rest import JSON, Rest, path_of
from tests.integration.helpers import pcr_spec

OLD, NEW = "1.36", "1.37"
NODE = "skewed"
BETA, GA = group_version("v1beta1"), group_version("v1")


@pytest.fixture(scope="module")
def old_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    root = tmp_path_factory.mktemp("skew-upgrade") / "cluster"
    state = cluster.up(root, kube_version=OLD)
    handle = DevCluster(root, state)
    try:
        yield handle
    finally:
        handle.admin.close()
        cluster.down(root)


def devcluster(root: Path, *argv: str) -> int:
    return main(["devcluster", *argv, f"--dir={root}"])


def lease_renewed_after(api: client.ApiClient, node: str, since: dt.datetime) -> bool:
    lease = client.CoordinationV1Api(api).read_namespaced_lease(node, "kube-node-lease")
    renew = lease.spec.renew_time if lease.spec else None
    return renew is not None and renew > since


def ready(api: client.ApiClient, node: str) -> bool:
    found = client.CoreV1Api(api).read_node(node)
    conditions = (found.status.conditions if found.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def pod_running(api: client.ApiClient, namespace: str, name: str) -> Any:
    pod = client.CoreV1Api(api).read_namespaced_pod(name, namespace)
    return pod if pod.status.phase == "Running" else None


def test_version_changes_the_skew_policy_refuses_get_one_line_and_exit_2(
    old_cluster: DevCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    root = old_cluster.root
    assert devcluster(root, "kubelet", NODE, "--hollow", f"--kube-version={OLD}") == 0
    capsys.readouterr()
    before = planestate.read_state(Paths(root.resolve()))
    node_before = nodestate.read_state(root, NODE)
    cases = [
        (
            ("upgrade", "--kube-version=1.35"),
            "devcluster upgrade: cannot downgrade the control plane from 1.36 to 1.35 "
            "(Kubernetes does not support downgrades)",
        ),
        (
            ("kubelet", "ahead", "--hollow", f"--kube-version={NEW}"),
            "devcluster kubelet: node ahead's kubelet 1.37 would be newer than the API server "
            "(1.36): upgrade the control plane first",
        ),
        (
            ("kubelet", "ghost", "--upgrade"),
            f"devcluster kubelet: no kubelet was started for node ghost (started: {NODE})",
        ),
        (
            ("kubelet", NODE, "--upgrade", "--kube-version=1.35"),
            f"devcluster kubelet: cannot downgrade node {NODE}'s kubelet from 1.36 to 1.35 "
            "(Kubernetes does not support downgrades)",
        ),
        (
            ("kubelet", NODE, "--hollow", "--kube-version=1.35"),
            f"devcluster kubelet: node {NODE} already runs kubelet 1.36; upgrade it (kubelet "
            f"{NODE} --upgrade --kube-version 1.35) rather than start another",
        ),
    ]
    for argv, line in cases:
        code = devcluster(root, *argv)
        out = capsys.readouterr()
        assert (code, out.err.splitlines(), out.out) == (2, [line], ""), argv
    assert planestate.read_state(Paths(root.resolve())) == before
    assert nodestate.read_state(root, NODE) == node_before
    assert nodes.started(root) == [NODE]


def test_an_upgrade_in_place_keeps_the_data_and_the_skewed_node_until_it_is_upgraded(
    old_cluster: DevCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    root, api = old_cluster.root, old_cluster.admin
    core = client.CoreV1Api(api)
    if nodestate.read_state(root, NODE) is None:  # run alone, without the refusals' test
        assert devcluster(root, "kubelet", NODE, "--hollow", f"--kube-version={OLD}") == 0
    ns = old_cluster.namespace("upgrade")
    config = core.create_namespaced_config_map(
        ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="kept"), data={"k": "v"})
    )
    pod = kube.create_pod(api, ns, "app", node=NODE)
    eventually(lambda: pod_running(api, ns, "app"), timeout=60, what="the pod Running on 1.36")
    # A request stored by 1.36 (v1beta1, the only version it serves), to be read through v1.
    spec = pcr_spec(old_cluster, pod, "example.com/kept", keys.generate("ECDSAP256"))
    body = {"apiVersion": BETA, "kind": "PodCertificateRequest", "metadata": {"name": "kept"}}
    stored: JSON = Rest(api).request(
        "POST", path_of(BETA, "podcertificaterequests", ns), body={**body, "spec": spec}
    )
    before = planestate.read_state(Paths(root.resolve()))
    assert before is not None
    capsys.readouterr()

    assert devcluster(root, "upgrade", f"--kube-version={NEW}") == 0
    upgraded = dt.datetime.now(dt.UTC)
    after = planestate.read_state(Paths(root.resolve()))
    assert after is not None
    assert Rest(api).request("GET", "/version")["gitVersion"] == build.release(NEW)
    assert after.etcd_pid == before.etcd_pid, "etcd keeps running on its data"
    assert after.apiserver_pid != before.apiserver_pid
    assert (after.apiserver_port, after.etcd_port) == (before.apiserver_port, before.etcd_port)
    capsys.readouterr()
    assert devcluster(root, "status") == 0
    status = capsys.readouterr().out
    assert f"running: Kubernetes {NEW} at {after.server}" in status
    assert "upgrade unfinished" not in status
    assert f"node {NODE}: hollow kubelet {OLD} pid" in status

    # What 1.36 stored, still there.
    found = core.read_namespaced_config_map("kept", ns)
    assert (found.metadata.uid, found.data) == (config.metadata.uid, {"k": "v"})
    assert core.read_namespaced_pod("app", ns).metadata.uid == pod.metadata.uid
    pcr = Rest(api).request("GET", path_of(GA, "podcertificaterequests", ns, "kept"))
    assert pcr["metadata"]["uid"] == stored["metadata"]["uid"]
    assert pcr["spec"]["stubPKCS10Request"] == spec["stubPKCS10Request"]

    # The 1.36 kubelet keeps its node Ready against the 1.37 API server.
    eventually(
        lambda: lease_renewed_after(api, NODE, upgraded),
        timeout=60,
        what="the 1.36 kubelet to renew its lease with the 1.37 API server",
    )
    assert ready(api, NODE)
    assert nodes.kubelet_release(root, NODE) == build.release(OLD)

    # Then the node: the same pod, running under a 1.37 kubelet.
    assert devcluster(root, "kubelet", NODE, "--upgrade") == 0
    assert nodes.kubelet_release(root, NODE) == build.release(NEW)
    assert ready(api, NODE)
    moved = eventually(
        lambda: pod_running(api, ns, "app"), timeout=60, what="the pod Running on 1.37"
    )
    assert moved.metadata.uid == pod.metadata.uid
    capsys.readouterr()
    assert devcluster(root, "status") == 0
    assert f"node {NODE}: hollow kubelet {NEW} pid" in capsys.readouterr().out
    # Asked again, both are done already: nothing to do, exit 0.
    assert devcluster(root, "upgrade", f"--kube-version={NEW}") == 0
    assert devcluster(root, "kubelet", NODE, "--upgrade") == 0
    assert planestate.read_state(Paths(root.resolve())) == after
