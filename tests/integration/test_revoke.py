"""`podcert signer ca revoke` against the real API server, a real signer, a real shim node and
kubemark's hollow kubelet (the kubelet's own pod certificate manager: it makes a request per
pod, as a real kubelet does, and writes the files; no container runs):

- the revoked generation stops signing at once; every pod on the shim node holding one of its
  leaves is re-keyed to the fresh generation (one whose requests are gone too, judged for the
  signer names the leader serves), and the revoked root leaves the CA Secret and the
  signer's trust bundles once none is left;
- pods on a kubelet node (a Deployment's, so they come back) are evicted through the Eviction
  API: a PodDisruptionBudget refuses (429) and is asked again, and never more pods are down than
  it allows;
- `--now` says before it acts that mutual TLS between pods not yet replaced fails, and takes the
  root out of the bundles at once, replacements or not;
- `--wait-refresh` evicts nothing: it waits for the kubelet's own re-key (a kubelet restart re-keys
  every pod: it stands in for the refresh, which the API puts at least 10 minutes after issue),
  while `podcert status` shows the pods still holding the revoked generation;
- as `kubectl drain`, a kubelet pod no controller owns is not evicted (it would be deleted for
  good) without `--force`: it is left to its refresh."""

from __future__ import annotations

import base64
import functools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from devcluster import kube, processes
from devcluster.identities import Paths
from devcluster.testing import DevCluster, Kubelet, eventually
from podcert.client.rest import JSON, Rest, path_of
from signer import revokeplan
from signer.authority import revoke
from tests.integration.conftest import StartSigner
from tests.integration.kubelet_helpers import ca, trust_bundle_roots
from tests.integration.shim_helpers import Shim, certificate_volume, running_shim

SIGNER = "revoke.podcert.dev/test"
SIGNER_NAMESPACE = "podcert-revoke"
NODE = "shim-node-revoke"
PCRS = "certificates.k8s.io/v1"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("revoke")


@pytest.fixture(scope="module")
def signer(start_signer: StartSigner, work: Path) -> processes.Signer:
    return start_signer(SIGNER, namespace=SIGNER_NAMESPACE, workdir=work)


@pytest.fixture(scope="module")
def shim_node(devcluster: DevCluster, work: Path, signer: processes.Signer) -> Iterator[Shim]:
    with running_shim(devcluster, work, NODE, SIGNER_NAMESPACE, work / "root") as proc:
        yield proc


@pytest.fixture
def ns(devcluster: DevCluster) -> Iterator[str]:
    """A namespace of the test's own, deleted after it with its pods."""
    name = devcluster.namespace("revoke")
    yield name
    rest = Rest(devcluster.admin)
    rest.request("DELETE", path_of("v1", "namespaces", None, name))
    # Gone before the next test: a later revoke would otherwise evict its pods (behind a budget).
    # At once: no kubelet confirms a shim node's pod deletion.
    rest.request("DELETE", path_of("v1", "pods", name), query={"gracePeriodSeconds": "0"})
    eventually(
        lambda: rest.get(path_of("v1", "namespaces", None, name)) is None,
        timeout=90,
        what=f"namespace {name} deleted",
    )


def leaf_chain(path: Path) -> list[x509.Certificate] | None:
    try:
        return x509.load_pem_x509_certificates(path.read_bytes())
    except (OSError, ValueError):
        return None


def ca_secret(devcluster: DevCluster) -> dict[str, bytes]:
    found = Rest(devcluster.admin).request(
        "GET", path_of("v1", "secrets", SIGNER_NAMESPACE, "podcert-ca")
    )
    return {k: base64.b64decode(v) for k, v in found["data"].items()}


def active_generation(devcluster: DevCluster) -> str:
    status = ca(devcluster, SIGNER_NAMESPACE, "status")
    return next(line.split()[0] for line in status.splitlines() if " active " in line)


def record_of(devcluster: DevCluster, gid: str) -> revoke.Revocation:
    return next(r for r in revoke.from_secret(ca_secret(devcluster)) if r.id == gid)


def root_published(devcluster: DevCluster, record: revoke.Revocation) -> bool:
    """Whether a trust bundle the signer publishes still holds the revoked root."""
    return any(
        revoke.fingerprint(r) == record.root_sha256 for r in trust_bundle_roots(devcluster, SIGNER)
    )


# --- a Deployment on the hollow node ---------------------------------------------------------


def deployment(devcluster: DevCluster, ns: str, node: str, replicas: int) -> None:
    """Deployment `web` of `replicas` pods bound to `node`, each with a podCertificate volume."""
    volume = kube.pod_certificate_volume(SIGNER, max_expiration_seconds=3600)
    kube.ensure_service_account(devcluster.admin, ns, "web")
    template = {
        "metadata": {"labels": {"app": "web"}},
        "spec": {
            "nodeName": node,
            "serviceAccountName": "web",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "app",
                    "image": "registry.invalid/app:1",
                    "volumeMounts": [{"name": "identity", "mountPath": "/var/run/identity"}],
                }
            ],
            "volumes": [volume],
        },
    }
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": template,
        },
    }
    Rest(devcluster.admin).request("POST", path_of("apps/v1", "deployments", ns), body=body)


def disruption_budget(devcluster: DevCluster, ns: str, max_unavailable: int) -> None:
    body = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": "web"}}},
    }
    Rest(devcluster.admin).request(
        "POST", path_of("policy/v1", "poddisruptionbudgets", ns), body=body
    )


def live_pods(devcluster: DevCluster, ns: str) -> list[JSON]:
    items: list[JSON] = Rest(devcluster.admin).request("GET", path_of("v1", "pods", ns))["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def ready(pod: JSON) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def newest_chains(devcluster: DevCluster, ns: str) -> dict[str, tuple[x509.Certificate, ...]]:
    """Each pod UID's newest issued chain (what its kubelet last wrote)."""
    items = Rest(devcluster.admin).request(
        "GET", path_of("certificates.k8s.io/v1", "podcertificaterequests", ns)
    )["items"]
    newest: dict[str, revokeplan.Issued] = {}
    for issued in filter(None, map(revokeplan.issued_of, items)):
        if issued.pod_uid not in newest or issued.created >= newest[issued.pod_uid].created:
            newest[issued.pod_uid] = issued
    return {uid: i.chain for uid, i in newest.items()}


def all_issued(devcluster: DevCluster, ns: str, count: int) -> list[JSON] | None:
    """The namespace's `count` live pods once each is Ready with an issued leaf, else None."""
    pods = live_pods(devcluster, ns)
    chains = newest_chains(devcluster, ns)
    if len(pods) == count and all(ready(p) and p["metadata"]["uid"] in chains for p in pods):
        return pods
    return None


def budget_allows(devcluster: DevCluster, ns: str) -> bool:
    found = Rest(devcluster.admin).request(
        "GET", path_of("policy/v1", "poddisruptionbudgets", ns, "web")
    )
    return bool((found.get("status") or {}).get("disruptionsAllowed"))


class Running:
    """`podcert signer ca revoke` as its own process, its output read line by line."""

    def __init__(self, devcluster: DevCluster, *flags: str) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "podcert",
                "signer",
                f"--kubeconfig={Paths(devcluster.root.resolve()).admin_kubeconfig}",
                f"--namespace={SIGNER_NAMESPACE}",
                "ca",
                "revoke",
                *flags,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def said(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def wait(self, timeout: float) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) once the command exits (stdout is the reader's)."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        assert self.proc.stderr is not None
        return code, "\n".join(self.lines), self.proc.stderr.read()


def status_json(devcluster: DevCluster) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "podcert",
            "status",
            f"--kubeconfig={Paths(devcluster.root.resolve()).admin_kubeconfig}",
            f"--namespace={SIGNER_NAMESPACE}",
            f"--signer-name={SIGNER}",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


# --- the tests --------------------------------------------------------------------------------


def test_revoking_the_signing_ca_rekeys_every_shim_pod_then_untrusts_its_root(
    devcluster: DevCluster, shim_node: Shim, ns: str
) -> None:
    pods = [
        devcluster.pod(ns, f"web-{i}", node=NODE, volumes=[certificate_volume(SIGNER)])
        for i in range(3)
    ]
    paths = [shim_node.volume_dir(p.metadata.uid) / "credentialbundle.pem" for p in pods]
    before = [eventually(functools.partial(leaf_chain, p), timeout=10) for p in paths]
    gid = active_generation(devcluster)
    old_root = x509.load_pem_x509_certificates(ca_secret(devcluster)["ca.crt"])
    # As the controller-manager does 15 minutes on: web-0's requests are gone.
    rest = Rest(devcluster.admin)
    for item in rest.request("GET", path_of(PCRS, "podcertificaterequests", ns))["items"]:
        if item["spec"]["podUID"] == pods[0].metadata.uid:
            rest.request(
                "DELETE", path_of(PCRS, "podcertificaterequests", ns, item["metadata"]["name"])
            )

    out = ca(devcluster, SIGNER_NAMESPACE, "revoke", gid, "--timeout=120")
    print(out)

    assert f"revoked {gid}" in out
    assert f"judged for the signer names the leader serves: {SIGNER}" in out
    assert "3 live pod(s) still chain" in out, "web-0 counts, judged by its node's other pods"
    assert f"no live leaf chains to {gid}: its root left every trust bundle" in out
    record = record_of(devcluster, gid)
    assert record.untrusted
    for path, old in zip(paths, before, strict=True):
        chain = leaf_chain(path)
        assert chain is not None and chain[0] != old[0]
        assert not revoke.chains_to(chain, record)
    trusted = x509.load_pem_x509_certificates(ca_secret(devcluster)["ca.crt"])
    assert not set(old_root) & set(trusted)
    eventually(lambda: not root_published(devcluster, record), timeout=30, what="root unpublished")
    assert "revoked: " + gid in ca(devcluster, SIGNER_NAMESPACE, "status")


def test_kubelet_pods_are_evicted_within_their_disruption_budget_and_come_back_renewed(
    devcluster: DevCluster, signer: processes.Signer, hollow_kubelet: Kubelet, ns: str
) -> None:
    deployment(devcluster, ns, hollow_kubelet.name, replicas=3)
    disruption_budget(devcluster, ns, max_unavailable=1)
    pods = eventually(lambda: all_issued(devcluster, ns, 3), timeout=90, what="3 pods issued")
    eventually(lambda: budget_allows(devcluster, ns), timeout=60, what="the budget counted")
    old = {p["metadata"]["uid"] for p in pods}
    gid = active_generation(devcluster)
    least_ready, stop = [3], threading.Event()

    def watch() -> None:  # the fewest Ready pods of the Deployment while the command runs
        while not stop.wait(0.1):
            least_ready[0] = min(least_ready[0], sum(map(ready, live_pods(devcluster, ns))))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        out = ca(
            devcluster,
            SIGNER_NAMESPACE,
            "revoke",
            gid,
            "--wave-size=3",
            "--retry-seconds=1",
            "--timeout=110",
        )
    finally:
        stop.set()
        watcher.join()
    print(out)

    assert "wave 1: evicted" in out and "refusal(s) by a disruption budget, asked again" in out
    assert f"no live leaf chains to {gid}: its root left every trust bundle" in out
    assert least_ready[0] >= 2, "more pods were down than the budget allows"
    record = record_of(devcluster, gid)
    after = eventually(lambda: all_issued(devcluster, ns, 3), timeout=90, what="pods back")
    chains = newest_chains(devcluster, ns)
    assert not old & {p["metadata"]["uid"] for p in after}, "every old pod was evicted"
    assert not any(revoke.chains_to(chains[p["metadata"]["uid"]], record) for p in after)
    eventually(lambda: not root_published(devcluster, record), timeout=30, what="root unpublished")


def test_now_warns_first_and_untrusts_the_root_before_pods_are_replaced(
    devcluster: DevCluster, signer: processes.Signer, hollow_kubelet: Kubelet, ns: str
) -> None:
    deployment(devcluster, ns, hollow_kubelet.name, replicas=2)
    eventually(lambda: all_issued(devcluster, ns, 2), timeout=90, what="2 pods issued")
    gid = active_generation(devcluster)

    # --wait-refresh keeps the pods on their revoked leaves for the command's whole run.
    run = Running(devcluster, gid, "--now", "--wait-refresh", "--timeout=8")
    code, out, err = run.wait(timeout=60)
    print(out, err)

    lines = out.splitlines()
    warning = next(i for i, line in enumerate(lines) if line.startswith("--now:"))
    assert "mutual TLS between pods still holding its leaves fails" in lines[warning]
    assert warning < next(i for i, line in enumerate(lines) if line.startswith(f"revoked {gid}"))
    assert code == 1 and "its root already left every trust bundle (--now)" in err
    record = record_of(devcluster, gid)
    assert record.untrusted
    eventually(lambda: not root_published(devcluster, record), timeout=30, what="root unpublished")
    chains = newest_chains(devcluster, ns)
    assert all(revoke.chains_to(c, record) for c in chains.values()), "nothing was replaced"


def test_wait_refresh_evicts_nothing_and_waits_for_the_kubelets_own_rekey(
    devcluster: DevCluster, signer: processes.Signer, hollow_kubelet: Kubelet, ns: str
) -> None:
    deployment(devcluster, ns, hollow_kubelet.name, replicas=2)
    pods = eventually(lambda: all_issued(devcluster, ns, 2), timeout=90, what="2 pods issued")
    uids = {p["metadata"]["uid"] for p in pods}
    gid = active_generation(devcluster)

    # kubemark syncs a pod every 10 s: its kubelet writes the refreshed files within that.
    run = Running(devcluster, gid, "--wait-refresh", "--timeout=100", "--settle-seconds=20")
    try:
        eventually(
            lambda: run.said("left to their next refresh (--wait-refresh): waiting"),
            timeout=30,
            what="the command waiting",
        )
        [progress] = [r for r in status_json(devcluster)["revocations"] if r["id"] == gid]
        mine = [p for p in progress["pods"] if p["namespace"] == ns]
        assert progress["inProgress"] and progress["rootInTrustBundles"]
        assert sorted(p["replacedBy"] for p in mine) == ["kubelet", "kubelet"]
        assert progress["onKubeletNodes"] >= 2
        hollow_kubelet.restart()  # re-keys every pod on the node, as its refresh would
        code, out, err = run.wait(timeout=110)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    print(out, err)

    assert code == 0, err
    assert "wave" not in out
    assert "2 kubelet pod(s) refreshed in place: waiting 20s" in out
    assert f"no live leaf chains to {gid}: its root left every trust bundle" in out
    assert {p["metadata"]["uid"] for p in live_pods(devcluster, ns)} == uids, "nothing evicted"
    record = record_of(devcluster, gid)
    assert record.untrusted
    for uid in uids:  # what the pods present once the root is gone: their files
        chain = leaf_chain(hollow_kubelet.volume_dir(uid) / "credentialbundle.pem")
        assert chain is not None and not revoke.chains_to(chain, record)
    [done] = [r for r in status_json(devcluster)["revocations"] if r["id"] == gid]
    assert not [p for p in done["pods"] if p["namespace"] == ns]
    assert done["rootUntrustedByCA"] is True


def test_a_kubelet_pod_no_controller_owns_is_not_evicted_without_force(
    devcluster: DevCluster, signer: processes.Signer, hollow_kubelet: Kubelet, ns: str
) -> None:
    deployment(devcluster, ns, hollow_kubelet.name, replicas=1)
    bare = devcluster.pod(
        ns,
        "bare",
        node=hollow_kubelet.name,
        volumes=[kube.pod_certificate_volume(SIGNER, max_expiration_seconds=3600)],
    )
    eventually(lambda: all_issued(devcluster, ns, 2), timeout=90, what="2 pods issued")
    gid = active_generation(devcluster)

    run = Running(devcluster, gid, "--timeout=100", "--settle-seconds=20")
    try:
        eventually(lambda: run.said("wave 1: evicted"), timeout=60, what="the first wave")
        assert run.said("1 pod(s) on kubelet nodes have no controller")
        hollow_kubelet.restart()  # the bare pod's refresh, as in the test above
        code, out, err = run.wait(timeout=110)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    print(out, err)

    assert code == 0, err
    assert f"{ns}/bare" not in next(line for line in out.splitlines() if "wave 1" in line)
    pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in live_pods(devcluster, ns)}
    assert pods["bare"] == bare.metadata.uid, "the bare pod was not evicted"
    record = record_of(devcluster, gid)
    assert not revoke.chains_to(newest_chains(devcluster, ns)[bare.metadata.uid], record)
    chain = leaf_chain(hollow_kubelet.volume_dir(bare.metadata.uid) / "credentialbundle.pem")
    assert chain is not None and not revoke.chains_to(chain, record)
