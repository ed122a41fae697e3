"""podcert's signer meets the real kubelet. A pod with a podCertificate volume lands on
a real node (containerd, real containers) or a hollow one (kubemark: the real kubelet code with a
fake runtime); the kubelet makes the request, the signer issues, the kubelet writes the files.

Here: the credential and the trust bundle it projects, the kubelet's own gauge of its
projections (the alert rules' `kubelet_podcertificate_states`), who may read the key inside the
pod, what a denial does to the pod, a pod's deletion, a kubelet restart, and the SPIFFE
Filesystem Delivery layout read by `bundles.FolderSource`. Rotations on the kubelet's files:
test_real_kubelet_rotation.py."""

from __future__ import annotations

import datetime as dt
import json
import ssl
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import Encoding
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from bundles import folder, formats
from bundles.authz import Verdict, allow_ids, allow_workloads
from bundles.foldersource import FolderSource
from bundles.source import SourceError
from devcluster import images, processes
from devcluster.kube import pod_certificate_volume
from devcluster.testing import DevCluster, Kubelet, eventually
from kubelet_shim.metrics import KUBELET_GAUGE, PROJECTION_LABELS
from kubelet_shim.projection import ProjectionState
from podcert.api.requests import parse_request
from podcert.client.rest import JSON
from signer.model import POLICY_DENIED, UNSUPPORTED_KEY_TYPE
from tests.integration.helpers import condition
from tests.integration.kubelet_helpers import (
    BUNDLE,
    KEEP_RUNNING,
    TRUST,
    certificates_in,
    first_seen,
    folder_source,
    pod_events,
    read,
    requests_for,
    spiffe_volume,
    spki,
    trust_bundle_roots,
)
from tests.unit.test_bundles_source import Link

SIGNER = "test.podcert.dev/kubelet"
TRUST_DOMAIN = "kubelet.test"
POLICY = f"""
signers:
  - name: {SIGNER}
    trustDomain: {TRUST_DOMAIN}
    keyTypes: [ECDSAP256, ECDSAP384, ED25519, RSA3072]
    allow:
      - namespaces: ["kl-*"]
        serviceAccounts: ["*"]
"""
OWN_BUNDLE = f"{TRUST_DOMAIN}.trust-bundle.pem"
MOUNT = "/var/run/identity"
# The container prints the bundle's mode (the real kubelet writes it with the volume's
# defaultMode) and then the bundle itself.
READ_CREDENTIAL = ["sh", "-c", f"stat -L -c 'mode=%a' {MOUNT}/{BUNDLE} && cat {MOUNT}/{BUNDLE}"]


@pytest.fixture(scope="module")
def signer(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    work = tmp_path_factory.mktemp("kubelet-signer")
    (work / "policy.yaml").write_text(POLICY)
    proc = processes.signer(
        devcluster.root,
        work,
        [SIGNER],
        namespace="podcert-kubelet",
        extra=[f"--policy={work / 'policy.yaml'}"],
    ).start()
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def _key_type(public: Any) -> str:
    if isinstance(public, ed25519.Ed25519PublicKey):
        return "ED25519"
    if isinstance(public, ec.EllipticCurvePublicKey):
        return {"secp256r1": "ECDSAP256", "secp384r1": "ECDSAP384", "secp521r1": "ECDSAP521"}[
            public.curve.name
        ]
    assert isinstance(public, rsa.RSAPublicKey)
    return f"RSA{public.key_size}"


KINDS = [
    pytest.param("real_kubelet", "ECDSAP384", id="real node (containerd), ECDSAP384"),
    pytest.param("hollow_kubelet", "ED25519", id="hollow node (kubemark), ED25519"),
    pytest.param("hollow_kubelet", "RSA3072", id="hollow node (kubemark), RSA3072"),
]


@pytest.mark.parametrize(("node", "key_type"), KINDS)
def test_the_kubelet_projects_a_credential_the_signer_issued(
    devcluster: DevCluster,
    signer: Any,
    request: pytest.FixtureRequest,
    node: str,
    key_type: str,
) -> None:
    kubelet: Kubelet = request.getfixturevalue(node)
    ns = devcluster.namespace("kl")
    pod = devcluster.pod(
        ns,
        "app",
        node=kubelet.name,
        volumes=[pod_certificate_volume(SIGNER, key_type=key_type, trust_bundle_signer=True)],
        image=images.BUSYBOX_IMAGE,
        command=READ_CREDENTIAL,
        restart_policy="Never",
    )
    uid = pod.metadata.uid

    bundle = eventually(
        lambda: read(kubelet, uid, BUNDLE), timeout=60, what=f"{BUNDLE} on {kubelet.name}"
    )
    trust = eventually(lambda: read(kubelet, uid, TRUST), timeout=10, what=TRUST)
    credential = formats.load_credential(bundle)
    roots = formats.load_trust_bundle(trust)
    formats.verify_chain(credential, roots, dt.datetime.now(dt.UTC))
    assert str(credential.spiffe_id) == f"spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/default"
    assert _key_type(credential.leaf.public_key()) == key_type
    assert _key_type(credential.key.public_key()) == key_type

    # The kubelet asked once, as the node, and the signer's answer is what it wrote.
    (pcr,) = requests_for(devcluster, ns, uid)
    assert pcr["spec"]["nodeName"] == kubelet.name
    assert pcr["status"]["certificateChain"].encode().strip() in bundle

    # Its own gauge counts the projection fresh, under the labels and states the alert rules and
    # the shim's gauge use: a kubelet that renamed either would leave its nodes unwatched.
    gauge = kubelet_gauge(devcluster, kubelet)
    fresh = {"signer_name": SIGNER, "state": ProjectionState.FRESH.value}
    assert sum(value for labels, value in gauge if labels == fresh) >= 1  # earlier pods count too
    assert {tuple(sorted(labels)) for labels, _ in gauge} == {tuple(sorted(PROJECTION_LABELS))}
    assert {labels["state"] for labels, _ in gauge} <= {s.value for s in ProjectionState}

    if kubelet.hollow:
        return
    # Inside the pod: the container read its credential, which the kubelet left readable by
    # every user in the container (no defaultMode set): a weakness of the kubelet's.
    core = client.CoreV1Api(devcluster.admin)
    eventually(
        lambda: core.read_namespaced_pod(pod.metadata.name, ns).status.phase == "Succeeded",
        timeout=60,
        what="the container to run and exit",
    )
    logs = core.read_namespaced_pod_log(pod.metadata.name, ns)
    first, _, rest = logs.partition("\n")
    assert first == "mode=644"
    assert rest.encode().strip() == bundle.strip()


def test_the_trust_file_holds_exactly_the_roots_of_the_signers_cluster_trust_bundles(
    devcluster: DevCluster, signer: Any, real_kubelet: Kubelet
) -> None:
    """Real node. The clusterTrustBundle source (the signer's name, an empty label selector)
    projects every root podcert publishes for the signer, each once, and nothing else."""
    ns = devcluster.namespace("kl")
    pod = devcluster.pod(
        ns,
        "trust",
        node=real_kubelet.name,
        volumes=[pod_certificate_volume(SIGNER, trust_bundle_signer=True)],
        image=images.BUSYBOX_IMAGE,
        command=KEEP_RUNNING,
    )
    uid = pod.metadata.uid
    in_file = eventually(
        lambda: certificates_in(real_kubelet, uid, TRUST) or None, timeout=60, what=TRUST
    )
    published = trust_bundle_roots(devcluster, SIGNER)

    assert published, f"podcert published no ClusterTrustBundle for {SIGNER}"
    assert len(set(in_file)) == len(in_file), "the kubelet wrote a root twice"
    assert set(in_file) == set(published)  # x509.Certificate equality is DER equality
    formats.load_trust_bundle(read(real_kubelet, uid, TRUST) or b"")  # CA certificates only


def test_with_default_mode_0600_the_container_sees_its_key_private(
    devcluster: DevCluster, signer: Any, real_kubelet: Kubelet
) -> None:
    """Real node. The counterpart of the world-readable bundle above: with the volume's
    defaultMode 0600 the container sees the credential bundle as 600 (others locked out), and
    still reads it."""
    ns = devcluster.namespace("kl")
    volume = pod_certificate_volume(SIGNER, trust_bundle_signer=True)
    volume["projected"]["defaultMode"] = 0o600
    pod = devcluster.pod(
        ns,
        "private",
        node=real_kubelet.name,
        volumes=[volume],
        image=images.BUSYBOX_IMAGE,
        command=READ_CREDENTIAL,
        restart_policy="Never",
    )
    core = client.CoreV1Api(devcluster.admin)
    eventually(
        lambda: core.read_namespaced_pod(pod.metadata.name, ns).status.phase == "Succeeded",
        timeout=60,
        what="the container to read its credential and exit",
    )
    first, _, rest = core.read_namespaced_pod_log(pod.metadata.name, ns).partition("\n")
    assert first == "mode=600"
    assert b"PRIVATE KEY" in rest.encode()


def _kubelet_denied_message(pcr: JSON) -> str:
    """The Event message the kubelet 1.37.2 writes for a Denied request, verbatim.

    pkg/kubelet/podcertificate calls `recorder.Eventf(pod, Warning, "Denied", cond.Reason,
    eventMessage)`: the condition's reason is taken as the format string and the real message
    becomes an unused argument, which Go's fmt renders as `%!(EXTRA string=...)`. The message
    inside is formatted with %q (Go quoting: JSON's escapes for the ASCII text we write)."""
    meta, cond = pcr["metadata"], condition(pcr)
    inner = (
        f"PodCertificateRequest {meta['namespace']}/{meta['name']} was denied, "
        f"reason={json.dumps(cond.reason)}, message={json.dumps(cond.message)}"
    )
    return f"{cond.reason}%!(EXTRA string={inner})"


def kubelet_gauge(devcluster: DevCluster, kubelet: Kubelet) -> list[tuple[dict[str, str], float]]:
    """The kubelet's `kubelet_podcertificate_states` samples from its /metrics: a real node's
    through the API server's node proxy (as a Prometheus scraping kubelets does), a hollow one's
    on its port (kubemark serves it without TLS, which the proxy cannot speak)."""
    if kubelet.hollow:
        url = f"http://127.0.0.1:{kubelet.state.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
    else:
        proxy = client.CoreV1Api(devcluster.admin).connect_get_node_proxy_with_path
        text = proxy(kubelet.name, "metrics")
    return [
        (dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        if family.name == KUBELET_GAUGE
        for sample in family.samples
    ]


DENIALS = [
    pytest.param("kd", "ECDSAP256", POLICY_DENIED, id="namespace no allow rule matches"),
    pytest.param("kl", "ECDSAP521", UNSUPPORTED_KEY_TYPE, id="key type the policy refuses"),
]


@pytest.mark.parametrize(("prefix", "key_type", "reason"), DENIALS)
def test_a_denied_request_is_an_event_on_the_pod_and_the_pod_never_starts(
    devcluster: DevCluster,
    signer: Any,
    real_kubelet: Kubelet,
    prefix: str,
    key_type: str,
    reason: str,
) -> None:
    """Real node (the hollow kubelet records no Events: kubemark gives it a fake recorder).
    podcert denies with its typed reason; the kubelet turns that into a Warning Event on the pod,
    treats it as terminal (one request, never retried), keeps failing the volume's mount, and
    never creates the pod's sandbox or container."""
    ns = devcluster.namespace(prefix)
    pod = devcluster.pod(
        ns,
        "denied",
        node=real_kubelet.name,
        volumes=[pod_certificate_volume(SIGNER, key_type=key_type, trust_bundle_signer=True)],
        image=images.BUSYBOX_IMAGE,
        command=KEEP_RUNNING,
    )
    uid = pod.metadata.uid

    def denied() -> JSON | None:
        found = requests_for(devcluster, ns, uid)
        settled = parse_request(found[0]).status if found else None
        return found[0] if settled is not None and settled.outcome == "Denied" else None

    pcr = eventually(denied, timeout=30, what="the request to be Denied")
    cond = condition(pcr)
    assert cond.reason == reason

    def kubelet_event(event_reason: str, count: int = 1) -> JSON | None:
        return next(
            (
                e
                for e in pod_events(devcluster, ns, uid)
                if e["reason"] == event_reason
                and e["source"].get("component") == "kubelet"
                and e.get("count", 1) >= count
            ),
            None,
        )

    event = eventually(lambda: kubelet_event("Denied"), timeout=30, what="the kubelet's Event")
    assert event["type"] == "Warning"
    assert event["source"]["host"] == real_kubelet.name
    assert event["message"] == _kubelet_denied_message(pcr)
    # The kubelet retries the mount with back-off (0.5 s, 1 s, 2 s, ...) and fails each time:
    # by the third failure it has had every chance to start the pod, and has not.
    mount = eventually(
        lambda: kubelet_event("FailedMount", count=3), timeout=30, what="three failed mounts"
    )
    assert mount["message"] == (
        'MountVolume.SetUp failed for volume "identity" : PodCertificateRequest was '
        f"permanently denied: reason={json.dumps(cond.reason)} "
        f"message={json.dumps(cond.message)}"
    )

    # The kubelet's status manager posts the pod's status on its own schedule, after the mount
    # failures' Events: wait for the container's status, then judge it.
    def reported() -> Any:
        status = client.CoreV1Api(devcluster.admin).read_namespaced_pod("denied", ns).status
        return status if status.container_statuses else None

    status = eventually(reported, timeout=30, what="the kubelet to report the container")
    assert status.phase == "Pending"
    (container,) = status.container_statuses
    assert container.state.waiting.reason == "ContainerCreating"
    assert container.container_id is None and container.restart_count == 0
    assert real_kubelet.containers(uid) == []  # not even the sandbox
    assert len(requests_for(devcluster, ns, uid)) == 1  # Denied is terminal: no second request


def test_deleting_a_pod_removes_its_files_and_its_requests(
    devcluster: DevCluster, signer: Any, real_kubelet: Kubelet
) -> None:
    """Real node. The kubelet tears the projected volume down with the pod; the pod's requests
    go with it through their ownerReference (kube-controller-manager's garbage collector: the
    PodCertificateRequest cleaner only deletes requests older than 15 minutes, and these are
    seconds old)."""
    ns = devcluster.namespace("kl")
    pod = devcluster.pod(
        ns,
        "deleted",
        node=real_kubelet.name,
        volumes=[pod_certificate_volume(SIGNER, trust_bundle_signer=True)],
        image=images.BUSYBOX_IMAGE,
        command=KEEP_RUNNING,
    )
    uid = pod.metadata.uid
    core = client.CoreV1Api(devcluster.admin)
    eventually(lambda: read(real_kubelet, uid, BUNDLE), timeout=60, what=BUNDLE)
    eventually(
        lambda: core.read_namespaced_pod("deleted", ns).status.phase == "Running",
        timeout=60,
        what="the pod to run",
    )
    (pcr,) = requests_for(devcluster, ns, uid)
    assert pcr["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "deleted", "uid": uid}
    ]

    start = time.monotonic()
    core.delete_namespaced_pod("deleted", ns)  # the default grace period, as a user deletes

    def pod_gone() -> bool:
        try:
            core.read_namespaced_pod("deleted", ns)
        except client.ApiException as err:
            return err.status == 404
        return False

    seen = first_seen(
        {
            "volume removed": lambda: not real_kubelet.volume_dir(uid).exists(),
            "pod gone": pod_gone,
            "requests gone": lambda: not requests_for(devcluster, ns, uid),
            "pod folder removed": lambda: not (real_kubelet.root / "pods" / uid).exists(),
        },
        since=start,
        timeout=60,
    )
    print(
        f"\npod deletion on the real kubelet: {', '.join(f'{k} {v:.2f}s' for k, v in seen.items())}"
    )


RESTART_PODS = 4


def test_a_kubelet_restart_requests_every_projection_anew_and_leaves_the_old_requests(
    devcluster: DevCluster,
    signer: Any,
    real_kubelet: Kubelet,
    record_property: Callable[[str, object], None],
) -> None:
    """Real node (a hollow kubelet comes back with a new, empty root: not a restart in place).
    The kubelet keeps no state across a restart: it makes a new key and a new request for every
    projection at once, and the old requests stay (owned by pods that still exist). The
    containers keep running; the files it writes afterwards are valid credentials."""
    ns = devcluster.namespace("kl")
    names = [f"r{i}" for i in range(RESTART_PODS)]
    uids = {
        name: devcluster.pod(
            ns,
            name,
            node=real_kubelet.name,
            volumes=[pod_certificate_volume(SIGNER, trust_bundle_signer=True)],
            image=images.BUSYBOX_IMAGE,
            command=KEEP_RUNNING,
        ).metadata.uid
        for name in names
    }
    core = client.CoreV1Api(devcluster.admin)

    def running() -> dict[str, Any] | None:
        statuses = {n: core.read_namespaced_pod(n, ns).status for n in names}
        ok = all(s.phase == "Running" for s in statuses.values())
        return (
            {n: s.container_statuses[0].container_id for n, s in statuses.items()} if ok else None
        )

    containers = eventually(running, timeout=60, what=f"{RESTART_PODS} pods running")
    before = {
        n: eventually(lambda n=n: read(real_kubelet, uids[n], BUNDLE), timeout=30, what=BUNDLE)
        for n in names
    }
    requests_before = {n: requests_for(devcluster, ns, uids[n]) for n in names}
    assert all(len(found) == 1 for found in requests_before.values())

    real_kubelet.restart()

    def rewritten() -> dict[str, bytes] | None:
        files = {n: read(real_kubelet, uids[n], BUNDLE) for n in names}
        fresh = {n: f for n, f in files.items() if f is not None and f != before[n]}
        return fresh if len(fresh) == len(names) else None

    after = eventually(rewritten, timeout=60, what="every pod's credential rewritten")
    requests_after = {n: requests_for(devcluster, ns, uids[n]) for n in names}
    made = {n: len(found) - len(requests_before[n]) for n, found in requests_after.items()}
    record_property("kubelet_restart_pods", RESTART_PODS)
    record_property("kubelet_restart_new_requests", sum(made.values()))
    print(f"\nkubelet restart with {RESTART_PODS} pods: {sum(made.values())} new requests {made}")
    assert made == dict.fromkeys(names, 1)  # one new request per projection
    for name in names:
        (old,) = requests_before[name]
        (new,) = [p for p in requests_after[name] if p["metadata"]["uid"] != old["metadata"]["uid"]]
        assert old in requests_after[name]  # left behind as it was: Issued, its pod still there
        # The file is the new request's answer, for a new key, and a valid credential.
        credential = formats.load_credential(after[name])
        assert new["status"]["certificateChain"].encode().strip() in after[name]
        assert spki(credential.leaf) != spki(formats.load_credential(before[name]).leaf)
        roots = formats.load_trust_bundle(read(real_kubelet, uids[name], TRUST) or b"")
        formats.verify_chain(credential, roots, dt.datetime.now(dt.UTC))
    assert running() == containers  # the same containers, never restarted


# --- the SPIFFE Filesystem Delivery layout ------------------------------------------------------


def test_the_real_kubelet_projects_the_spiffe_credential_folder_and_a_folder_source_uses_it(
    devcluster: DevCluster,
    signer: Any,
    real_kubelet: Kubelet,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Real node. Two pods mount the standard's folder: `credential-bundle.pem`, our own trust
    domain's `live` roots selected by the standard's labels as `kubelet.test.trust-bundle.pem`,
    and an optional source for a trust domain no bundle is published for. `FolderSource` finds
    the folder through SPIFFE_CREDENTIAL_FOLDER, takes the kubelet's files, and authorizes the
    other pod inside a real handshake (and refuses it under a rule that does not allow it)."""
    ns = devcluster.namespace("kl")
    pods = {
        sa: devcluster.pod(
            ns,
            sa,
            node=real_kubelet.name,
            service_account=sa,
            volumes=[spiffe_volume(SIGNER, TRUST_DOMAIN, federated=["gone.test"])],
            image=images.BUSYBOX_IMAGE,
            command=KEEP_RUNNING,
        )
        for sa in ("api", "web")
    }
    folders = {sa: real_kubelet.volume_dir(p.metadata.uid, "spiffe") for sa, p in pods.items()}
    client_source = eventually(
        lambda: folder_source(folders["web"]), timeout=60, what="web's credential folder"
    )
    monkeypatch.setenv(folder.ENV_VAR, str(folders["api"]))
    server_source = eventually(
        lambda: folder_source_here(), timeout=60, what="api's folder, by SPIFFE_CREDENTIAL_FOLDER"
    )
    assert server_source.folder == folders["api"]

    # The kubelet's files, named as the pod asked: the credential bundle key first, our own
    # trust domain's live roots (selected by the standard's labels: what podcert publishes),
    # and an empty file for the optional source nothing matches.
    names = sorted(p.name for p in folders["api"].iterdir() if not p.name.startswith(".."))
    assert names == ["credential-bundle.pem", "gone.test.trust-bundle.pem", OWN_BUNDLE]
    assert (folders["api"] / "gone.test.trust-bundle.pem").read_bytes() == b""
    bundle = (folders["api"] / "credential-bundle.pem").read_bytes()
    assert bundle.startswith(b"-----BEGIN PRIVATE KEY-----\n")
    assert set(server_source.trust_bundle.roots) == set(trust_bundle_roots(devcluster, SIGNER))
    assert server_source.trust_domains == (TRUST_DOMAIN,)  # the empty file: not federated
    assert str(server_source.credential.spiffe_id) == f"spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/api"

    allow_web = allow_workloads(ns, "web", trust_domain=TRUST_DOMAIN)
    allow_api = allow_ids([f"spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/api"])
    link = Link(server_source.server_context(allow_web), client_source.client_context(allow_api))
    assert link.client_leaf() == client_source.credential.leaf.public_bytes(Encoding.DER)

    refusals: list[Verdict] = []
    nobody = allow_workloads(ns, "nobody", trust_domain=TRUST_DOMAIN)
    with pytest.raises(ssl.SSLError):
        Link(
            server_source.server_context(nobody, on_refusal=refusals.append),
            client_source.client_context(allow_api),
        )
    assert [v.allowed for v in refusals] == [False]
    assert f"/ns/{ns}/sa/web" in refusals[0].reason


def folder_source_here() -> FolderSource | None:
    try:
        return FolderSource(defaults=[])  # SPIFFE_CREDENTIAL_FOLDER alone
    except SourceError:
        return None
