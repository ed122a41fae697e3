"""Every component on the older minors. 1.35 and 1.36 serve pod certificates
at certificates.k8s.io/v1beta1 only, and differ there: 1.35's spec takes the key only as
pkixPublicKey + proofOfPossession (a signature over the pod UID), 1.36's takes exactly one of
that or stubPKCS10Request. The compatibility subset, on one real devcluster per minor shared by
the whole module: the signer issues and denies (requests made as the node, so NodeRestriction
applies; each form the server takes; every key type), its webhook admits the node and refuses
anyone else, the shim projects a credential, and `podcert audit` reads cluster and node.

`make controlplane` builds both minors' binaries (cached); the fixture would build a missing one.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bundles import formats
from devcluster import cluster, kube, processes
from devcluster.identities import Paths
from devcluster.supervise import free_port
from devcluster.testing import DevCluster, eventually
from podcert.api import keys, requests
from podcert.api.requests import PROOF_OF_POSSESSION, STUB_CSR, KeyForm
from podcert.api.versions import group_version
from podcert.cli import main
from podcert.client.rest import JSON, ApiError, Rest, path_of
from tests.integration import helpers
from tests.integration.helpers import pcr_spec, register_webhook
from tests.integration.test_admission import grant_create

MINORS = ("1.35", "1.36")
BETA = group_version("v1beta1")
SIGNER = "compat.podcert.dev/issue"  # settled by the signer's own checks
HOOKED = "compat.podcert.dev/hooked"  # behind the signer's admission webhook as well
NAMESPACE = "podcert-compat"
NODE = "compat-node"
TRUST_DOMAIN = "compat.test"
POLICY = f"""
signers:
  - name: {SIGNER}
    trustDomain: {TRUST_DOMAIN}
    keyTypes: [RSA3072, RSA4096, ECDSAP256, ECDSAP384, ECDSAP521, ED25519]
    allow:
      - namespaces: ["*"]
        serviceAccounts: ["default"]
  - name: {HOOKED}
    trustDomain: {TRUST_DOMAIN}
    allow:
      - namespaces: ["*"]
        serviceAccounts: ["default"]
"""
# The forms each minor's PodCertificateRequestSpec takes (pkg/apis/certificates/validation),
# the preferred one first.
FORMS: dict[str, tuple[KeyForm, ...]] = {
    "1.35": (PROOF_OF_POSSESSION,),
    "1.36": (STUB_CSR, PROOF_OF_POSSESSION),
}


@dataclass
class Minor:
    """One older minor's devcluster, with podcert's signer (and its webhook) running on it."""

    version: str
    cluster: DevCluster
    signer: processes.Signer
    work: Path

    @property
    def form(self) -> KeyForm:
        """What the shim sends there: the stub CSR where the spec has it (FORMS lists it first)."""
        return FORMS[self.version][0]


@pytest.fixture(scope="module", params=MINORS)
def minor(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Minor]:
    version: str = request.param
    work = tmp_path_factory.mktemp(f"compat-{version}")
    root = work / "cluster"
    state = cluster.up(root, kube_version=version)
    try:
        handle = DevCluster(root, state)
        policy = work / "policy.yaml"
        policy.write_text(POLICY)
        port = free_port()
        signer = processes.signer(
            root,
            work,
            [SIGNER, HOOKED],
            namespace=NAMESPACE,
            extra=[
                f"--policy={policy}",
                f"--webhook-port={port}",
                "--webhook-host=127.0.0.1",
                "--webhook-dns-name=localhost",
            ],
        )
        try:
            signer.start().wait_ready(60)
            register_webhook(handle, NAMESPACE, port, HOOKED)
            grant_create(handle, "mallory")
            kube.ensure_node(handle.admin, NODE)
            yield Minor(version, handle, signer, work)
        finally:
            signer.stop()
            handle.admin.close()
    finally:
        cluster.down(root)


# --- requests as the node, in a form the server takes -------------------------------------------


def make_pod(minor: Minor, ns: str, name: str, signer: str, account: str = "default") -> Any:
    return helpers.make_pod(
        minor.cluster,
        ns,
        name,
        signer,
        node=NODE,
        service_account=account,
        trust_bundle_signer=True,
    )


def create(api: Any, namespace: str, spec: dict[str, Any]) -> JSON:
    return helpers.create_pcr(api, namespace, spec, version=BETA)


def as_node(minor: Minor, pod: Any, signer: str, key: keys.PrivateKey, form: KeyForm) -> JSON:
    spec = pcr_spec(minor.cluster, pod, signer, key, form)
    return create(minor.cluster.node(NODE), pod.metadata.namespace, spec)


def settled(minor: Minor, pcr: JSON, timeout: float = 15.0) -> JSON:
    return helpers.settled(
        minor.cluster,
        pcr,
        timeout,
        version=BETA,
        explain=lambda: f"signer log:\n{minor.signer.output()[-4000:]}",
    )


def roots(minor: Minor, signer: str) -> formats.TrustBundle:
    """The signer's published roots, from its ClusterTrustBundle at v1beta1."""
    rest = Rest(minor.cluster.admin)

    def published() -> formats.TrustBundle | None:
        items = rest.request("GET", path_of(BETA, "clustertrustbundles"))["items"]
        pem = "".join(
            i["spec"]["trustBundle"] for i in items if i["spec"].get("signerName") == signer
        )
        return formats.load_trust_bundle(pem.encode()) if pem else None

    try:
        return eventually(published, timeout=15, what=f"a v1beta1 ClusterTrustBundle for {signer}")
    except AssertionError as err:
        # What the signer said of its bundles, whatever else it logged since (CI once saw none
        # published on 1.36 for 45 s while it issued, and the log's tail held only denials).
        said = [
            line
            for line in minor.signer.output().splitlines()
            if "rustBundle" in line or "trustbundles" in line or '"level": "error"' in line
        ]
        raise AssertionError(
            f"{err}\nthe signer on its bundles:\n" + "\n".join(said[-40:])
        ) from None


def refusal(call: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    return caught.value


# --- the API server takes the forms DESIGN.md says --------------------------------------------


def test_the_api_server_takes_the_key_forms_of_its_minor(minor: Minor) -> None:
    ns = minor.cluster.namespace("compat-forms")
    pod = make_pod(minor, ns, "forms", SIGNER)
    key = keys.generate("ECDSAP256")
    # It checks the proof itself at creation, naming the field.
    wrong = pcr_spec(minor.cluster, pod, SIGNER, key, PROOF_OF_POSSESSION)
    wrong.update(requests.key_fields(PROOF_OF_POSSESSION, key, "another-pod-uid"))
    err = refusal(lambda: create(minor.cluster.node(NODE), ns, wrong))
    assert err.status == 422 and "spec.proofOfPossession" in err.message
    stub = pcr_spec(minor.cluster, pod, SIGNER, key, STUB_CSR)
    if minor.version == "1.35":
        # No stubPKCS10Request field at all: the key is missing, so the spec is invalid.
        err = refusal(lambda: create(minor.cluster.node(NODE), ns, stub))
        assert err.status == 422 and "spec.pkixPublicKey" in err.message
    else:
        both = {**stub, **requests.key_fields(PROOF_OF_POSSESSION, key, pod.metadata.uid)}
        err = refusal(lambda: create(minor.cluster.node(NODE), ns, both))
        assert err.status == 422 and "exactly one of" in err.message


# --- the signer: issue and deny ------------------------------------------------------------------


def test_the_signer_issues_every_key_type_in_each_form_the_server_takes(minor: Minor) -> None:
    ns = minor.cluster.namespace("compat-issue")
    pod = make_pod(minor, ns, "issue", SIGNER)
    trusted = roots(minor, SIGNER)
    asked = []
    for key_type in keys.KEY_TYPES:
        for form in FORMS[minor.version]:
            key = keys.generate(key_type)
            pcr = as_node(minor, pod, SIGNER, key, form)
            assert pcr["spec"].get(form)  # the field each form is named after
            asked.append((key_type, form, key, pcr))
    for key_type, form, key, pcr in asked:
        done = settled(minor, pcr)
        assert helpers.terminal(done)[:2] == ("Issued", "Issued"), (key_type, form, done["status"])
        chain = done["status"]["certificateChain"].encode()
        credential = formats.load_credential_files(formats.dump_private_key(key), chain)
        formats.verify_chain(credential, trusted, dt.datetime.now(dt.UTC))
        assert str(credential.spiffe_id) == f"spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/default"
        assert keys.key_type_of(credential.chain[0].public_key()) == key_type


def test_the_signer_denies_with_a_typed_reason_and_an_event(minor: Minor) -> None:
    ns = minor.cluster.namespace("compat-deny")
    pod = make_pod(minor, ns, "deny", SIGNER, account="blocked")
    pcr = as_node(minor, pod, SIGNER, keys.generate("ED25519"), minor.form)
    done = settled(minor, pcr)
    assert helpers.terminal(done)[:2] == ("Denied", "PolicyDenied")
    assert "service account 'blocked'" in done["status"]["conditions"][0]["message"]
    rest = Rest(minor.cluster.admin)
    name = pcr["metadata"]["name"]
    events = eventually(
        lambda: (
            rest.request(
                "GET",
                path_of("v1", "events", ns),
                query={"fieldSelector": f"involvedObject.name={name}"},
            )["items"]
            or None
        ),
        timeout=10,
        what=f"the Denied event on {name}",
    )
    assert events[0]["reason"] == "PolicyDenied"
    assert events[0]["involvedObject"]["apiVersion"] == BETA


# --- the webhook ---------------------------------------------------------------------------------


def test_the_webhook_admits_the_node_and_refuses_anyone_else(minor: Minor) -> None:
    ns = minor.cluster.namespace("compat-hook")
    pod = make_pod(minor, ns, "hooked", HOOKED)
    key = keys.generate("ECDSAP256")
    # The node, in its server's form: admitted (the webhook checks the proof too), then issued.
    assert (
        helpers.terminal(settled(minor, as_node(minor, pod, HOOKED, key, minor.form)))[0]
        == "Issued"
    )
    # Anyone else with RBAC create: refused, whatever the form.
    for form in FORMS[minor.version]:
        spec = pcr_spec(minor.cluster, pod, HOOKED, key, form)
        err = refusal(lambda spec=spec: create(minor.cluster.user("mallory"), ns, spec))
        assert err.status == 403 and "only the node the pod runs on" in err.message, err.message
    # The node, for a service account the policy refuses: refused at admission, with the reason.
    blocked = make_pod(minor, ns, "hooked-blocked", HOOKED, account="blocked")
    err = refusal(lambda: as_node(minor, blocked, HOOKED, key, minor.form))
    assert err.status == 403 and "PolicyDenied" in err.message, err.message


# --- the shim and the audit ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def shim(minor: Minor) -> Iterator[processes.Shim]:
    proc = processes.shim(minor.cluster.root, minor.work, NODE, root=minor.work / "node").start()
    try:
        yield proc.wait_ready(60)
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def projected(minor: Minor, shim: processes.Shim) -> tuple[str, Any]:
    """A pod the shim gave its credential and roots: (namespace, pod)."""
    ns = minor.cluster.namespace("compat-shim")
    volume = kube.pod_certificate_volume(SIGNER, key_type="ED25519", trust_bundle_signer=True)
    pod = minor.cluster.pod(ns, "projected", node=NODE, volumes=[volume])
    folder = shim.volume_dir(pod.metadata.uid)
    try:
        eventually(
            lambda: _read(folder / "credentialbundle.pem") and _read(folder / "trust-bundle.pem"),
            timeout=30,
            what="the shim to project the credential and the roots",
        )
    except AssertionError as err:
        logs = f"shim log:\n{shim.output()[-3000:]}\nsigner log:\n{minor.signer.output()[-3000:]}"
        raise AssertionError(f"{err}\n{logs}") from None
    return ns, pod


def test_the_shim_projects_a_credential_asking_in_the_servers_form(
    minor: Minor, shim: processes.Shim, projected: tuple[str, Any]
) -> None:
    ns, pod = projected
    folder = shim.volume_dir(pod.metadata.uid)
    credential = formats.load_credential(_read(folder / "credentialbundle.pem") or b"")
    trusted = formats.load_trust_bundle(_read(folder / "trust-bundle.pem") or b"")
    formats.verify_chain(credential, trusted, dt.datetime.now(dt.UTC))
    assert str(credential.spiffe_id) == f"spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/default"
    assert keys.key_type_of(credential.chain[0].public_key()) == "ED25519"
    # The request it made: the form this minor takes, the stub CSR wherever the spec has it.
    items = Rest(minor.cluster.admin).request("GET", path_of(BETA, "podcertificaterequests", ns))
    [pcr] = items["items"]
    fields = ("stubPKCS10Request", "pkixPublicKey", "proofOfPossession")
    assert {name for name in fields if pcr["spec"].get(name)} == (
        {"pkixPublicKey", "proofOfPossession"} if minor.version == "1.35" else {"stubPKCS10Request"}
    )
    assert f"on certificates.k8s.io/v1beta1 (keys as {minor.form})" in shim.output()


def test_podcert_audit_reads_the_cluster_and_the_node(
    minor: Minor,
    shim: processes.Shim,
    projected: tuple[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    ns, _ = projected
    capsys.readouterr()
    code = main(
        [
            "audit",
            f"--kubeconfig={Paths(minor.cluster.root.resolve()).admin_kubeconfig}",
            f"--root={shim.root}",
            f"--namespace={ns}",
            "-o",
            "json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["findings"]
    [found] = report["projections"]
    assert (found["pod"], found["state"]) == ("projected", "fresh")
    assert found["refreshHint"] == "request"  # joined to its v1beta1 request
    assert found["path"] == "credentialbundle.pem"  # and to its file on the node
    assert found["spiffeID"] == f"spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/default"
    assert any(SIGNER.replace("/", ":") in s for r in report["roots"] for s in r["sources"])


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes() or None
    except OSError:
        return None
