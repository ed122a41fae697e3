"""What a tenant writes on its pods and Services, against the real API.

Kubernetes bounds each label, not their number: pods with thousands of labels (and a full load of
annotations) must not grow the signer's memory, at a restart's relist or after, while
`dnsNames.services` still gives each pod the names of the Services that select it, a selector
key among those thousands included. Only a Service whose name leads to its pods gives its name:
ClusterIP (headless too), NodePort, LoadBalancer; never ExternalName, selector or not.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kubernetes import client

from devcluster import processes
from devcluster.kube import pod_certificate_volume
from devcluster.testing import DevCluster, eventually
from tests.integration.conftest import StartSigner
from tests.integration.helpers import condition, request_as_node, settled

SIGNER = "test.podcert.dev/labels"
NAMESPACE = "podcert-labels"
NODE = "node-labels"  # a Node object with no kubelet: the pods stay Pending, as the attack's did
POLICY = f"""
signers:
  - name: {SIGNER}
    trustDomain: labels.test
    dnsNames:
      services: true
      clusterDomain: cluster.local
    allow:
      - namespaces: ["lab-*"]
"""
PODS = 30
LABELS = 7000
DEEP_KEY = f"tenant.example/k{LABELS - 1:05d}"  # the last of a pod's thousands of labels
# Before the fix each such pod cost the signer about 2 MiB (its labels, shared nowhere); after
# it a pod costs what its small fields do, and the relist's pages are transient.
GROWTH_MIB = 15.0


def huge_labels(i: int) -> dict[str, str]:
    labels = {f"tenant.example/k{n:05d}": f"pod{i:03d}-" + "v" * 33 for n in range(LABELS)}
    labels[DEEP_KEY] = "deep"
    labels["app"] = "api"
    return labels


ANNOTATIONS = {f"tenant.example/a{n}": "a" * 60_000 for n in range(4)}  # 240 KB of the 256 KiB


def rss_mib(proc: processes.Process) -> float:
    assert proc.proc is not None and proc.proc.poll() is None, proc.output()[-2000:]
    status = Path(f"/proc/{proc.proc.pid}/status").read_text()
    found = re.search(r"^VmRSS:\s+(\d+) kB$", status, re.MULTILINE)
    assert found is not None
    return int(found.group(1)) / 1024


def dns_names(pcr: Any) -> set[str]:
    chain = x509.load_pem_x509_certificates(pcr["status"]["certificateChain"].encode())
    san = chain[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(san.get_values_for_type(x509.DNSName))


def names_of(ns: str, *services: str) -> set[str]:
    return {n for s in services for n in (f"{s}.{ns}.svc", f"{s}.{ns}.svc.cluster.local")}


@pytest.fixture(scope="module")
def start(start_signer: StartSigner, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A new signer, the module's one: the one started before it is stopped first, so that
    the new one leads and settles every request from its own lists."""
    work = tmp_path_factory.mktemp("labels")
    (work / "policy.yaml").write_text(POLICY)
    running: list[processes.Signer] = []

    def one() -> processes.Signer:
        while running:
            running.pop().stop()
        running.append(
            start_signer(SIGNER, namespace=NAMESPACE, workdir=work, policy=work / "policy.yaml")
        )
        return running[-1]

    return one


@pytest.fixture(scope="module")
def ns(devcluster: DevCluster) -> Any:
    name = devcluster.namespace("lab")
    yield name
    # The pods cost the API server and etcd; no later module's signer should list them.
    client.CoreV1Api(devcluster.admin).delete_namespace(name)


def service(core: client.CoreV1Api, ns: str, name: str, spec: dict[str, Any]) -> None:
    core.create_namespaced_service(ns, {"metadata": {"name": name}, "spec": spec})


def test_pods_with_thousands_of_labels_cost_the_signer_no_memory_and_keep_their_names(
    devcluster: DevCluster, start: Any, ns: str
) -> None:
    # The signer's footprint on this cluster before the tenant writes anything.
    before = start()
    baseline = rss_mib(before)
    before.stop()

    core = client.CoreV1Api(devcluster.admin)
    port = [{"port": 443}]
    service(core, ns, "deep", {"selector": {DEEP_KEY: "deep"}, "ports": port})
    service(core, ns, "node", {"type": "NodePort", "selector": {"app": "api"}, "ports": port})
    service(core, ns, "lb", {"type": "LoadBalancer", "selector": {"app": "api"}, "ports": port})
    service(core, ns, "headless", {"clusterIP": "None", "selector": {"app": "api"}, "ports": port})
    service(
        core,
        ns,
        "outside",
        {"type": "ExternalName", "externalName": "elsewhere.example", "selector": {"app": "api"}},
    )
    service(core, ns, "other", {"selector": {"app": "db"}, "ports": port})
    pods = [
        devcluster.pod(
            ns,
            f"big-{i}",
            node=NODE,
            labels=huge_labels(i),
            annotations=ANNOTATIONS,
            volumes=[pod_certificate_volume(SIGNER)],
        )
        for i in range(PODS)
    ]
    entitled = names_of(ns, "deep", "node", "lb", "headless")

    # A request waiting when the signer starts is settled from its caches (a backlog).
    _, waiting = request_as_node(devcluster, pods[0], SIGNER)
    after = start()  # lists every pod, as each restart of a crash-looping signer did
    grown = rss_mib(after) - baseline
    assert grown < GROWTH_MIB, (
        f"{PODS} pods with {LABELS} labels each grew the signer by {grown:.1f} MiB "
        f"({baseline:.1f} MiB before them)"
    )
    done = settled(devcluster, waiting, timeout=20)
    assert condition(done).type == "Issued", condition(done)
    assert dns_names(done) == entitled

    # A request made now: its pod is read live.
    _, live = request_as_node(devcluster, pods[-1], SIGNER)
    done = settled(devcluster, live, timeout=20)
    assert condition(done).type == "Issued", condition(done)
    assert dns_names(done) == entitled
    grown = rss_mib(after) - baseline
    assert grown < GROWTH_MIB, f"grew by {grown:.1f} MiB once the pods were read live"


def test_an_external_name_service_with_a_selector_gives_no_name(
    devcluster: DevCluster, start: Any, ns: str
) -> None:
    """A Service turned into an ExternalName stops giving its name, as one created so."""
    core = client.CoreV1Api(devcluster.admin)
    service(core, ns, "web", {"selector": {"app": "web"}, "ports": [{"port": 443}]})
    pod = devcluster.pod(
        ns, "web-0", node=NODE, labels={"app": "web"}, volumes=[pod_certificate_volume(SIGNER)]
    )
    # Started after the Service: its list has it before any request is settled. (A Service
    # created while a signer runs reaches it through its watch, with no bound on the lag.)
    signer = start()
    _, first = request_as_node(devcluster, pod, SIGNER)
    assert dns_names(settled(devcluster, first)) == names_of(ns, "web")

    core.patch_namespaced_service(
        "web",
        ns,
        {"spec": {"type": "ExternalName", "externalName": "elsewhere.example", "ports": None}},
    )

    # The Service cache is a watch: the next requests see the change once it has come through.
    def names_dropped() -> bool:
        _, again = request_as_node(devcluster, pod, SIGNER)
        return not dns_names(settled(devcluster, again))

    eventually(names_dropped, timeout=10, what="the ExternalName Service's name dropped")
    assert signer.running
