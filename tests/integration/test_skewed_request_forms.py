"""Every request form a skewed node can send, read, on a real 1.37 API server
with certificates.k8s.io/v1beta1 enabled (as the devcluster runs it, for older kubelets).

A 1.35 kubelet sends its key as pkixPublicKey + proofOfPossession through v1beta1; the server
stores both, but its v1 view (what the signer lists and watches) has neither. The signer reads
such a request through v1beta1 and issues to the key it names, the proof checked; its status
goes through v1 (the status subresource keeps the stored spec, so the API server compares the
leaf with the stored pkixPublicKey and accepts it). A 1.36 kubelet's stub CSR through v1beta1
survives the conversion. The webhook, registered as shipped (apiVersions ["*"]), gets a v1beta1
create as made and judges the 1.35 form as it judges v1; registered for v1 only, it gets the
object converted, its key dropped, and refuses it saying so. Last, the API server restarted
without v1beta1 after such a request was stored: the signer, which learned at start that
v1beta1 served, meets a 404, asks discovery again and denies `KeyNotServed`.

Requests are made as the node (its client certificate, so NodeRestriction applies), as
tests/integration/test_version_compat.py makes them on 1.35 and 1.36. The module runs its own
cluster (its last test restarts the API server with other flags).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from bundles import formats
from devcluster import cluster, flags, kube, processes
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

V1 = group_version("v1")
BETA = group_version("v1beta1")
SIGNER = "skew.podcert.dev/issue"  # settled by the signer's own checks
HOOKED = "skew.podcert.dev/hooked"  # behind the webhook, registered as shipped
HOOKED_V1 = "skew.podcert.dev/hooked-v1"  # behind the webhook, registered for v1 only
LATER = "skew.podcert.dev/later"  # the signer that meets an API server without v1beta1
NAMESPACE = "podcert-skew"
NODE = "skew-node"
TRUST_DOMAIN = "skew.test"
SERVED = (SIGNER, HOOKED, HOOKED_V1)


def policy(names: tuple[str, ...]) -> str:
    """Every key type for the default service account, for each of `names`."""
    return "signers:\n" + "".join(
        f"""  - name: {name}
    trustDomain: {TRUST_DOMAIN}
    keyTypes: [RSA3072, RSA4096, ECDSAP256, ECDSAP384, ECDSAP521, ED25519]
    allow:
      - namespaces: ["*"]
        serviceAccounts: ["default"]
"""
        for name in names
    )


@dataclass
class Skewed:
    """A 1.37 devcluster, podcert's signer (and its webhook) running on it."""

    cluster: DevCluster
    signer: processes.Signer
    work: Path


@pytest.fixture(scope="module")
def skewed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Skewed]:
    work = tmp_path_factory.mktemp("skewed-forms")
    root = work / "cluster"
    state = cluster.up(root, kube_version="1.37")
    try:
        handle = DevCluster(root, state)
        (work / "policy.yaml").write_text(policy(SERVED))
        port = free_port()
        signer = processes.signer(
            root,
            work,
            list(SERVED),
            namespace=NAMESPACE,
            extra=[
                f"--policy={work / 'policy.yaml'}",
                f"--webhook-port={port}",
                "--webhook-host=127.0.0.1",
                "--webhook-dns-name=localhost",
            ],
        )
        try:
            signer.start().wait_ready(60)
            register_webhook(
                handle, NAMESPACE, port, HOOKED, name="podcert-skew-webhook", api_versions=["*"]
            )
            register_webhook(
                handle,
                NAMESPACE,
                port,
                HOOKED_V1,
                name="podcert-skew-webhook-v1",
                api_versions=["v1"],
            )
            grant_create(handle, "mallory")
            kube.ensure_node(handle.admin, NODE)
            yield Skewed(handle, signer, work)
        finally:
            signer.stop()
            handle.admin.close()
    finally:
        cluster.down(root)


# --- requests as the node ------------------------------------------------------------------------


def make_pod(skewed: Skewed, ns: str, name: str, signer: str, account: str = "default") -> Any:
    return helpers.make_pod(
        skewed.cluster,
        ns,
        name,
        signer,
        node=NODE,
        service_account=account,
        trust_bundle_signer=True,
    )


def create(api: Any, namespace: str, spec: dict[str, Any], version: str = BETA) -> JSON:
    return helpers.create_pcr(api, namespace, spec, version=version)


def as_node(
    skewed: Skewed, pod: Any, signer: str, key: keys.PrivateKey, form: KeyForm, version: str = BETA
) -> JSON:
    spec = pcr_spec(skewed.cluster, pod, signer, key, form)
    return create(skewed.cluster.node(NODE), pod.metadata.namespace, spec, version)


def read(skewed: Skewed, pcr: JSON, version: str) -> JSON:
    meta = pcr["metadata"]
    path = path_of(version, "podcertificaterequests", meta["namespace"], meta["name"])
    return Rest(skewed.cluster.admin).request("GET", path)


def settled(skewed: Skewed, pcr: JSON, timeout: float = 15.0) -> JSON:
    """The request once settled, as v1 shows it (what a 1.37 kubelet and the audit read)."""
    return helpers.settled(
        skewed.cluster,
        pcr,
        timeout,
        version=V1,
        explain=lambda: f"signer log:\n{skewed.signer.output()[-4000:]}",
    )


def leaf_spki(pcr: JSON) -> bytes:
    chain = pcr["status"]["certificateChain"].encode()
    return keys.spki_der(x509.load_pem_x509_certificates(chain)[0].public_key())


def refusal(call: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    return caught.value


# --- what the API server stores and shows ---------------------------------------------------


def test_the_v1_view_of_a_1_35_request_has_no_key_and_v1beta1_shows_it(skewed: Skewed) -> None:
    ns = skewed.cluster.namespace("skew-view")
    pod = make_pod(skewed, ns, "view", "skew.podcert.dev/nobody")
    key = keys.generate("ECDSAP256")
    made = as_node(skewed, pod, "skew.podcert.dev/nobody", key, PROOF_OF_POSSESSION)
    assert not requests.parse_request(read(skewed, made, V1)).spec.holds_key, "v1 drops the key"
    beta = read(skewed, made, BETA)
    assert beta["spec"]["pkixPublicKey"] == made["spec"]["pkixPublicKey"]
    assert beta["spec"]["proofOfPossession"] == made["spec"]["proofOfPossession"]


def test_a_wrong_proof_is_refused_by_the_api_server_at_creation(skewed: Skewed) -> None:
    ns = skewed.cluster.namespace("skew-proof")
    pod = make_pod(skewed, ns, "proof", SIGNER)
    key = keys.generate("ECDSAP256")
    wrong = pcr_spec(skewed.cluster, pod, SIGNER, key, PROOF_OF_POSSESSION)
    wrong.update(requests.key_fields(PROOF_OF_POSSESSION, key, "another-pod-uid"))
    err = refusal(lambda: create(skewed.cluster.node(NODE), ns, wrong))
    assert err.status == 422 and "spec.proofOfPossession" in err.message, err.message


# --- the signer ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "form",
    [
        pytest.param(PROOF_OF_POSSESSION, id="1.35 form: pkixPublicKey + proof through v1beta1"),
        pytest.param(STUB_CSR, id="1.36 form: stub CSR through v1beta1"),
    ],
)
def test_a_skewed_nodes_request_is_issued_to_the_key_it_names(
    skewed: Skewed, form: KeyForm
) -> None:
    ns = skewed.cluster.namespace("skew-issue")
    pod = make_pod(skewed, ns, f"issue-{form.lower()}", SIGNER)
    made = []
    for key_type in keys.KEY_TYPES:
        key = keys.generate(key_type)
        made.append((key_type, key, as_node(skewed, pod, SIGNER, key, form)))
    for key_type, key, pcr in made:
        done = settled(skewed, pcr)
        assert helpers.terminal(done)[:2] == ("Issued", "Issued"), (key_type, done["status"])
        # The API server took the Issued status through v1 only because the leaf's key is the
        # stored one; checked here too.
        assert leaf_spki(done) == keys.public_der(key), key_type
        credential = formats.load_credential_files(
            formats.dump_private_key(key), done["status"]["certificateChain"].encode()
        )
        assert str(credential.spiffe_id) == f"spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/default"
    assert "rejected the status" not in skewed.signer.output()


# --- the webhook ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("form", "version"),
    [
        pytest.param(STUB_CSR, V1, id="v1 form through v1"),
        pytest.param(PROOF_OF_POSSESSION, BETA, id="1.35 form through v1beta1"),
    ],
)
def test_the_webhook_judges_the_1_35_form_as_the_v1_form(
    skewed: Skewed, form: KeyForm, version: str
) -> None:
    ns = skewed.cluster.namespace("skew-hook")
    key = keys.generate("ECDSAP256")
    pod = make_pod(skewed, ns, f"hooked-{version.rsplit('/')[-1]}", HOOKED)
    # Anyone else with RBAC create: refused (once the registration reaches the API server's
    # caches, within moments).
    spec = pcr_spec(skewed.cluster, pod, HOOKED, key, form)
    message = eventually(
        lambda: _refused(lambda: create(skewed.cluster.user("mallory"), ns, spec, version)),
        timeout=15,
        what="the webhook to refuse mallory",
    )
    assert "only the node the pod runs on" in message, message
    # The node: admitted, then issued.
    pcr = as_node(skewed, pod, HOOKED, key, form, version)
    assert helpers.terminal(settled(skewed, pcr))[0] == "Issued"
    # The node, for a service account the policy refuses: refused, with the reason.
    blocked = make_pod(skewed, ns, f"blocked-{version.rsplit('/')[-1]}", HOOKED, "blocked")
    err = refusal(lambda: as_node(skewed, blocked, HOOKED, key, form, version))
    assert err.status == 403 and "PolicyDenied" in err.message, err.message


def test_a_webhook_registered_for_v1_only_gets_the_1_35_form_keyless_and_says_so(
    skewed: Skewed,
) -> None:
    ns = skewed.cluster.namespace("skew-hook-v1")
    pod = make_pod(skewed, ns, "hooked-v1", HOOKED_V1)
    key = keys.generate("ECDSAP256")
    # Once the registration is in place the v1 form of anyone else is refused, the node's
    # admitted and issued.
    spec = pcr_spec(skewed.cluster, pod, HOOKED_V1, key, STUB_CSR)
    eventually(
        lambda: _refused(lambda: create(skewed.cluster.user("mallory"), ns, spec, V1)),
        timeout=15,
        what="the v1-only webhook to refuse mallory",
    )
    pcr = as_node(skewed, pod, HOOKED_V1, key, STUB_CSR, V1)
    assert helpers.terminal(settled(skewed, pcr))[0] == "Issued"
    # The 1.35 form comes converted to v1, its key dropped: refused naming the registration.
    err = refusal(lambda: as_node(skewed, pod, HOOKED_V1, key, PROOF_OF_POSSESSION))
    assert err.status == 403 and "KeyNotServed" in err.message, err.message
    assert "converted from 'v1beta1'" in err.message and '["*"]' in err.message


def _refused(call: Any) -> str | None:
    """The API server's 403 message, or None when the call was admitted."""
    try:
        call()
    except ApiError as err:
        if err.status != 403:
            raise
        return err.message
    return None


# --- the audit -----------------------------------------------------------------------------


def test_podcert_audit_joins_a_1_35_request_issued_on_1_37(
    skewed: Skewed, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = skewed.cluster.namespace("skew-audit")
    pod = make_pod(skewed, ns, "audited", SIGNER)
    done = settled(
        skewed, as_node(skewed, pod, SIGNER, keys.generate("ED25519"), PROOF_OF_POSSESSION)
    )
    assert helpers.terminal(done)[0] == "Issued"
    capsys.readouterr()
    kubeconfig = Paths(skewed.cluster.root.resolve()).admin_kubeconfig
    code = main(["audit", f"--kubeconfig={kubeconfig}", f"--namespace={ns}", "-o", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["findings"]
    [found] = report["projections"]
    assert (found["pod"], found["state"]) == ("audited", "fresh")
    assert found["spiffeID"] == f"spiffe://{TRUST_DOMAIN}/ns/{ns}/sa/default"


# --- the API server's flags: last, as these restart it ------------------------------------

# What a 1.37 API server needs while 1.35/1.36 kubelets remain: they create and watch requests and
# watch ClusterTrustBundles at v1beta1 (docs/guides/upgrading.md names this).
OLD_KUBELETS = (
    "--runtime-config=certificates.k8s.io/v1beta1/podcertificaterequests=true,"
    "certificates.k8s.io/v1beta1/clustertrustbundles=true"
)


def restart_apiserver(skewed: Skewed, monkeypatch: pytest.MonkeyPatch, runtime_config: str) -> None:
    """Restart kube-apiserver (same etcd, same port) with `runtime_config` for its flag."""
    args = flags.apiserver_args

    def replaced(*a: Any, **k: Any) -> list[str]:
        return [runtime_config if s.startswith("--runtime-config=") else s for s in args(*a, **k)]

    monkeypatch.setattr(cluster, "apiserver_args", replaced)
    cluster.restart_apiserver(skewed.cluster.root)


def test_the_runtime_config_for_old_kubelets_serves_what_they_read(
    skewed: Skewed, monkeypatch: pytest.MonkeyPatch
) -> None:
    restart_apiserver(skewed, monkeypatch, OLD_KUBELETS)
    listing = Rest(skewed.cluster.admin).get(f"/apis/{BETA}") or {}
    names = {r["name"] for r in listing.get("resources", [])}
    assert {"podcertificaterequests", "podcertificaterequests/status"} <= names, names
    assert "clustertrustbundles" in names, names
    # And the signer, which kept running, still reads a 1.35 request through it.
    ns = skewed.cluster.namespace("skew-flags")
    pod = make_pod(skewed, ns, "flags", SIGNER)
    key = keys.generate("ECDSAP256")
    done = settled(skewed, as_node(skewed, pod, SIGNER, key, PROOF_OF_POSSESSION), timeout=30)
    assert helpers.terminal(done)[:2] == ("Issued", "Issued")
    assert leaf_spki(done) == keys.public_der(key)


def test_without_v1beta1_a_stored_1_35_request_is_denied_key_not_served(
    skewed: Skewed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signer for LATER learned at start that v1beta1 serves requests; it is paused while a
    1.35 request is made for it and the API server restarts without v1beta1, so its first look
    at the request meets a 404 at v1beta1, discovery says v1beta1 is gone, and it denies."""
    root = skewed.cluster.root
    ns = skewed.cluster.namespace("skew-gone")
    pod = make_pod(skewed, ns, "gone", LATER)
    (skewed.work / "later.yaml").write_text(policy((LATER,)))
    later = processes.signer(
        root,
        skewed.work,
        [LATER],
        namespace="podcert-skew-later",
        extra=[f"--policy={skewed.work / 'later.yaml'}", "--no-trust-bundles"],
    )
    later.start().wait_ready(60)
    assert later.proc is not None
    try:
        os.kill(later.proc.pid, signal.SIGSTOP)
        try:
            made = as_node(skewed, pod, LATER, keys.generate("ECDSAP256"), PROOF_OF_POSSESSION)
            restart_apiserver(
                skewed, monkeypatch, "--runtime-config=certificates.k8s.io/v1beta1=false"
            )
            assert Rest(skewed.cluster.admin).get(f"/apis/{BETA}") is None, "v1beta1 is off"
        finally:
            os.kill(later.proc.pid, signal.SIGCONT)

        def denied() -> JSON | None:
            found = read(skewed, made, V1)
            return found if requests.outcome(found) else None

        try:
            done = eventually(denied, timeout=60, what="the request to be settled")
        except AssertionError as err:
            raise AssertionError(f"{err}\nsigner log:\n{later.output()[-4000:]}") from None
        kind, reason, message = helpers.terminal(done)
        assert (kind, reason) == ("Denied", "KeyNotServed"), message
        assert "spec.pkixPublicKey" in message and "1.35 kubelets" in message
        assert "certificates.k8s.io/v1beta1/podcertificaterequests=true" in message
    finally:
        later.stop()
