"""The signer, as its ServiceAccount with least RBAC, against the real API."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from devcluster import processes
from devcluster.testing import DevCluster
from podcert.api import keys
from podcert.client.rest import Rest, path_of
from signer import model
from signer.auditlog import writer
from tests.integration.conftest import StartSigner
from tests.integration.helpers import (
    condition,
    create_pcr,
    events_for,
    make_pod,
    pcr_spec,
    request_as_node,
    settled,
)

SIGNER = "test.podcert.dev/main"
TRUST_DOMAIN = "td.test"
POLICY = f"""
signers:
  - name: {SIGNER}
    trustDomain: {TRUST_DOMAIN}
    maxLifetimeSeconds: 43200
    keyTypes: [ECDSAP256, ECDSAP384, ED25519, RSA3072]
    dnsNames:
      services: true
      clusterDomain: cluster.local
      allowRequested: true
    allow:
      - namespaces: ["sig-*"]
        serviceAccounts: ["*"]
"""


@pytest.fixture(scope="module")
def signer(start_signer: StartSigner, tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("signer")
    (work / "policy.yaml").write_text(POLICY)
    return start_signer(
        SIGNER,
        namespace="podcert-sig",
        workdir=work,
        policy=work / "policy.yaml",
        audit_log=work / "audit.jsonl",
        audit_checkpoint_every=50,
    )


@pytest.fixture
def ns(devcluster: DevCluster) -> str:
    return devcluster.namespace("sig")


def _roots(devcluster: DevCluster) -> list[x509.Certificate]:
    found = Rest(devcluster.admin).request(
        "GET", path_of("v1", "secrets", "podcert-sig", "podcert-ca")
    )
    import base64

    return list(x509.load_pem_x509_certificates(base64.b64decode(found["data"]["ca.crt"])))


def test_a_node_gets_a_certificate_for_its_own_pod(
    devcluster: DevCluster, signer: Any, ns: str
) -> None:
    pod = make_pod(devcluster, ns, "web", SIGNER)
    started = time.monotonic()
    key, pcr = request_as_node(devcluster, pod, SIGNER)
    done = settled(devcluster, pcr, timeout=10)
    elapsed = time.monotonic() - started
    assert condition(done).type == "Issued"
    assert elapsed < 2.0, f"issued after {elapsed:.2f}s"

    chain = x509.load_pem_x509_certificates(done["status"]["certificateChain"].encode())
    leaf, intermediate = chain
    root = _roots(devcluster)[0]
    leaf.verify_directly_issued_by(intermediate)
    intermediate.verify_directly_issued_by(root)
    assert leaf.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == keys.public_der(key)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
        f"spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/default"
    ]
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.CLIENT_AUTH, ExtendedKeyUsageOID.SERVER_AUTH}
    not_before = dt.datetime.fromisoformat(done["status"]["notBefore"])
    not_after = dt.datetime.fromisoformat(done["status"]["notAfter"])
    refresh = dt.datetime.fromisoformat(done["status"]["beginRefreshAt"])
    assert leaf.not_valid_before_utc == not_before
    assert leaf.not_valid_after_utc == not_after
    assert not_after - not_before == dt.timedelta(hours=12)  # the policy's maximum
    assert not_before + dt.timedelta(minutes=10) <= refresh <= not_after - dt.timedelta(minutes=10)
    assert abs(dt.datetime.now(dt.UTC) - not_before) < dt.timedelta(minutes=5)


DENIALS = [
    pytest.param(
        {"key_type": "RSA4096"},
        model.UNSUPPORTED_KEY_TYPE,
        "ECDSAP256",
        id="key type outside the policy is UnsupportedKeyType and names a supported one",
    ),
    pytest.param(
        {"spec": {"podUID": "00000000-0000-0000-0000-000000000000"}},
        model.POD_UID_MISMATCH,
        "00000000-0000-0000-0000-000000000000",
        id="pod UID mismatch",
    ),
    pytest.param(
        {"spec": {"podName": "nobody-here"}},
        model.POD_NOT_FOUND,
        "nobody-here",
        id="pod gone",
    ),
    pytest.param(
        {"spec": {"nodeName": "node-b"}},
        model.POD_NOT_ON_NODE,
        "node-b",
        id="admin asks for a pod on another node",
    ),
    pytest.param(
        {"spec": {"nodeUID": "11111111-1111-1111-1111-111111111111"}},
        model.NODE_UID_MISMATCH,
        "11111111",
        id="node UID mismatch",
    ),
    pytest.param(
        {"spec": {"serviceAccountName": "admin-sa"}},
        model.SERVICE_ACCOUNT_MISMATCH,
        "admin-sa",
        id="admin asks for another service account's identity",
    ),
    pytest.param(
        {"spec": {"unverifiedUserAnnotations": {"evil.example/escalate": "yes"}}},
        model.UNKNOWN_ANNOTATION,
        "evil.example/escalate",
        id="unknown annotation key is named",
    ),
    pytest.param(
        {"spec": {"unverifiedUserAnnotations": {"podcert.dev/dns-names": "not a name!"}}},
        model.INVALID_ANNOTATION,
        "not a name!",
        id="malformed DNS name annotation",
    ),
    pytest.param(
        {"spec": {"unverifiedUserAnnotations": {"podcert.dev/dns-names": "bank.example.com"}}},
        model.DNS_NAME_NOT_ALLOWED,
        "bank.example.com",
        id="requested DNS name the pod is not entitled to",
    ),
    pytest.param(
        {"namespace": "other"},
        model.POLICY_DENIED,
        "other",
        id="namespace outside the policy",
    ),
    pytest.param(
        {"phase": "Succeeded"},
        model.POD_NOT_RUNNABLE,
        "Succeeded",
        id="finished pod",
    ),
]


@pytest.mark.parametrize(("change", "reason", "named"), DENIALS)
def test_each_denial_is_a_condition_and_an_event(
    devcluster: DevCluster, signer: Any, change: dict[str, Any], reason: str, named: str
) -> None:
    ns = devcluster.namespace(change.get("namespace", "sig"))
    key_type = change.get("key_type", "ECDSAP256")
    pod = make_pod(devcluster, ns, "app", SIGNER, key_type=key_type)
    core = client.CoreV1Api(devcluster.admin)
    core.create_namespaced_service_account(ns, {"metadata": {"name": "admin-sa"}})
    if "phase" in change:
        pod.status.phase = change["phase"]
        core.replace_namespaced_pod_status(pod.metadata.name, ns, pod)
    if "spec" in change:
        # An admin bypasses NodeRestriction: only the signer's own checks stand in the way.
        key = keys.generate("ECDSAP256")
        pcr = create_pcr(
            devcluster.admin, ns, pcr_spec(devcluster, pod, SIGNER, key, **change["spec"])
        )
    else:
        _, pcr = request_as_node(devcluster, pod, SIGNER, key_type=key_type)
    done = settled(devcluster, pcr)
    cond = condition(done)
    assert (cond.type, cond.reason) == ("Denied", reason)
    assert named in cond.message
    assert "certificateChain" not in done["status"]
    events = events_for(devcluster, done)
    assert [e["reason"] for e in events] == [reason]
    assert named in events[0]["message"]


def test_service_dns_names_follow_the_services_that_select_the_pod(
    devcluster: DevCluster, signer: Any, ns: str
) -> None:
    core = client.CoreV1Api(devcluster.admin)
    core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": "api"},
            "spec": {"selector": {"app": "api"}, "ports": [{"port": 443}]},
        },
    )
    selected = make_pod(devcluster, ns, "api-0", SIGNER, labels={"app": "api"})
    lonely = make_pod(devcluster, ns, "batch-0", SIGNER, labels={"app": "batch"})

    def dns_names(pcr: Any) -> set[str]:
        chain = x509.load_pem_x509_certificates(pcr["status"]["certificateChain"].encode())
        san = chain[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return set(san.get_values_for_type(x509.DNSName))

    # The Service cache is a watch: give it the moment it needs to see the new Service.
    _, first = request_as_node(devcluster, selected, SIGNER)
    assert dns_names(settled(devcluster, first)) == {
        f"api.{ns}.svc",
        f"api.{ns}.svc.cluster.local",
    }
    _, second = request_as_node(devcluster, lonely, SIGNER)
    assert dns_names(settled(devcluster, second)) == set()

    # Asking for a name it is entitled to is fine; one it is not is Denied.
    key = keys.generate("ECDSAP256")
    ok = create_pcr(
        devcluster.admin,
        ns,
        pcr_spec(
            devcluster,
            selected,
            SIGNER,
            key,
            unverifiedUserAnnotations={"podcert.dev/dns-names": f"api.{ns}.svc"},
        ),
    )
    assert condition(settled(devcluster, ok)).type == "Issued"
    bad = create_pcr(
        devcluster.admin,
        ns,
        pcr_spec(
            devcluster,
            lonely,
            SIGNER,
            key,
            unverifiedUserAnnotations={"podcert.dev/dns-names": f"api.{ns}.svc"},
        ),
    )
    assert condition(settled(devcluster, bad)).reason == model.DNS_NAME_NOT_ALLOWED


def test_requests_for_other_signers_are_left_alone(
    devcluster: DevCluster, signer: Any, ns: str
) -> None:
    other = "other.example.com/not-ours"
    pod = make_pod(devcluster, ns, "x", other)
    _, pcr = request_as_node(devcluster, pod, other)
    # Our own request made after it settles; the other one must still be untouched then.
    mine_pod = make_pod(devcluster, ns, "y", SIGNER)
    _, mine = request_as_node(devcluster, mine_pod, SIGNER)
    settled(devcluster, mine)
    current = Rest(devcluster.admin).request(
        "GET",
        path_of("certificates.k8s.io/v1", "podcertificaterequests", ns, pcr["metadata"]["name"]),
    )
    assert not current.get("status")


def test_metrics_count_outcomes(devcluster: DevCluster, signer: Any, ns: str) -> None:
    pod = make_pod(devcluster, ns, "counted", SIGNER)
    _, pcr = request_as_node(devcluster, pod, SIGNER)
    assert condition(settled(devcluster, pcr, timeout=10)).type == "Issued"
    text = signer.metrics()
    issued = {"signer_name": SIGNER, "outcome": "Issued", "reason": "Issued"}
    counted = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "podcert_signer_requests_total" and sample.labels == issued
    ]
    assert len(counted) == 1 and counted[0] >= 1
    assert "podcert_signer_issue_latency_seconds_bucket" in text
    assert 'podcert_build_info{component="signer"' in text
    assert "process_resident_memory_bytes" in text
    assert "_created" not in text
    assert "PRIVATE KEY" not in text


def test_survives_sigkill_halfway_through_500_requests(
    devcluster: DevCluster, tmp_path: Path
) -> None:
    signer_name = "test.podcert.dev/crash"
    ns = devcluster.namespace("crash")
    audit_path = tmp_path / "audit.jsonl"
    args = dict(namespace="podcert-crash", extra=[f"--audit-log={audit_path}", "--workers=4"])
    pods = [make_pod(devcluster, ns, f"p{i}", signer_name) for i in range(500)]
    pcrs = [request_as_node(devcluster, pod, signer_name)[1] for pod in pods]
    names = {p["metadata"]["name"] for p in pcrs}
    rest = Rest(devcluster.admin)
    listing = path_of("certificates.k8s.io/v1", "podcertificaterequests", ns)

    def issued() -> int:
        items = rest.request("GET", listing)["items"]
        return sum(1 for item in items if (item.get("status") or {}).get("certificateChain"))

    first = processes.signer(devcluster.root, tmp_path, [signer_name], **args).start()  # type: ignore[arg-type]
    try:
        first.wait_ready()
        deadline = time.monotonic() + 60
        while issued() < 200 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        first.kill()
    halfway = issued()
    assert 0 < halfway < 500, f"{halfway} issued at the kill: not halfway"

    second = processes.signer(devcluster.root, tmp_path, [signer_name], **args).start()  # type: ignore[arg-type]
    try:
        second.wait_ready()
        deadline = time.monotonic() + 90
        while issued() < 500 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        second.stop()
    items = rest.request("GET", listing)["items"]
    assert {i["metadata"]["name"] for i in items} == names
    assert all(condition(i).type == "Issued" for i in items), "some request was not issued"

    lines = audit_path.read_bytes().splitlines()
    result = writer.verify(lines, _roots_of(devcluster, "podcert-crash"), dt.datetime.now(dt.UTC))
    assert result.ok, result.problems
    # Issuance is logged write-ahead: every certificate the API holds is in the log (a kill
    # between the two may add an entry for a leaf that was never published, nothing more).
    audited = {e.serial for e in writer.iter_entries(lines) if e.decision == "issued"}
    published = {f"{_leaf(i).serial_number:x}" for i in items}
    assert published <= audited
    assert len(audited) - len(published) <= 4  # at most one in flight per worker


def _leaf(pcr: Any) -> x509.Certificate:
    return x509.load_pem_x509_certificates(pcr["status"]["certificateChain"].encode())[0]


def _roots_of(devcluster: DevCluster, namespace: str) -> list[x509.Certificate]:
    import base64

    found = Rest(devcluster.admin).request("GET", path_of("v1", "secrets", namespace, "podcert-ca"))
    return list(x509.load_pem_x509_certificates(base64.b64decode(found["data"]["ca.crt"])))
