"""The signer keeps its own webhook's caBundle, so the shipped webhook configuration
(no caBundle in it) works without a manual patch, and keeps working through a CA rotation.

The configuration is the one in manifests/signer/admission-webhook.yaml, pointed at this test's
signer and port; the signer has exactly the RBAC of manifests/signer/rbac.yaml for that one
object. Throughout prepare -> activate -> retire a prober makes the API server call the webhook
again and again: a node's request for its own pod must be admitted, another user's refused
with the webhook's own message, and nothing else (a TLS failure calling the webhook is
"failed calling webhook") may ever come back.
"""

from __future__ import annotations

import base64
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from devcluster import kube
from devcluster.identities import Paths
from devcluster.supervise import free_port
from devcluster.testing import DevCluster, eventually
from podcert.api import keys
from podcert.client.rest import ApiError, Rest, path_of
from tests.integration.conftest import StartSigner
from tests.integration.helpers import create_pcr, make_pod, pcr_spec, request_as_node
from tests.integration.test_admission import grant_create

SIGNER = "whca.podcert.dev/workload"
NAMESPACE = "podcert-whca"
CONFIGURATION = "podcert-whca"
MANIFEST = Path(__file__).resolve().parents[2] / "manifests" / "signer" / "admission-webhook.yaml"
REFUSAL = "only the node the pod runs on may request its certificate"
CONFIGS = path_of("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations")


@dataclass
class Hook:
    port: int
    signer: Any


@pytest.fixture(scope="module")
def hook(devcluster: DevCluster, start_signer: StartSigner) -> Iterator[Hook]:
    port = free_port()
    config = yaml.safe_load(MANIFEST.read_text())
    config["metadata"]["name"] = CONFIGURATION
    webhook = config["webhooks"][0]
    webhook["matchConditions"][0]["expression"] = f"object.spec.signerName in ['{SIGNER}']"
    # The shipped clientConfig names the in-cluster Service; here the signer runs on this host.
    webhook["clientConfig"] = {"url": f"https://localhost:{port}/validate-podcertificaterequests"}
    assert "caBundle" not in webhook["clientConfig"]
    kube.apply(devcluster.admin, [config])
    proc = start_signer(
        SIGNER,
        namespace=NAMESPACE,
        webhook_port=port,
        webhook_host="127.0.0.1",
        webhook_dns_name="localhost",
        webhook_configuration=CONFIGURATION,
    )
    try:
        yield Hook(port, proc)
    finally:
        kube.delete(devcluster.admin, [config])


def ca_step(devcluster: DevCluster, *args: str) -> None:
    kubeconfig = Paths(devcluster.root.resolve()).admin_kubeconfig
    command = [sys.executable, "-m", "podcert", "signer", f"--kubeconfig={kubeconfig}"]
    done = subprocess.run(
        [*command, f"--namespace={NAMESPACE}", "ca", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def der_set(pem: bytes) -> frozenset[bytes]:
    return frozenset(
        c.public_bytes(serialization.Encoding.DER) for c in x509.load_pem_x509_certificates(pem)
    )


def trusted_roots(devcluster: DevCluster) -> frozenset[bytes]:
    """What the CA Secret says every peer must trust now (its ca.crt)."""
    secret = Rest(devcluster.admin).request(
        "GET", path_of("v1", "secrets", NAMESPACE, "podcert-ca")
    )
    return der_set(base64.b64decode(secret["data"]["ca.crt"]))


def ca_bundle(devcluster: DevCluster) -> bytes:
    config = Rest(devcluster.admin).request("GET", f"{CONFIGS}/{CONFIGURATION}")
    return base64.b64decode(config["webhooks"][0]["clientConfig"].get("caBundle", ""))


def bundle_is_current(devcluster: DevCluster) -> bool:
    bundle = ca_bundle(devcluster)
    return bool(bundle) and der_set(bundle) == trusted_roots(devcluster)


def served_issuer(port: int, bundle: bytes) -> bytes:
    """Connect as the API server does (SNI localhost, verifying against the caBundle it holds):
    the issuing key (authority key identifier) of the certificate the webhook serves. Raises if
    it does not verify. Not the issuer's name: two CAs made in one second share it."""
    context = ssl.create_default_context(cadata=bundle.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    cert = x509.load_der_x509_certificate(der)
    return cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier


@dataclass
class Prober:
    """Makes the API server call the webhook until stopped; every answer is recorded."""

    devcluster: DevCluster
    namespace: str
    pod: Any
    stop: threading.Event = field(default_factory=threading.Event)
    answers: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def run(self) -> None:
        mallory = self.devcluster.user("mallory")
        for _ in range(2000):  # bounded: a rotation takes seconds
            if self.stop.is_set():
                return
            try:
                request_as_node(self.devcluster, self.pod, SIGNER)
                self.answers.append("admitted")
            except ApiError as err:
                self.failures.append(f"the node's own request: {err.status} {err.message}")
            try:
                spec = pcr_spec(self.devcluster, self.pod, SIGNER, keys.generate("ECDSAP256"))
                create_pcr(mallory, self.namespace, spec)
                self.failures.append("mallory's request was admitted")
            except ApiError as err:
                if REFUSAL in err.message:
                    self.answers.append("refused")
                else:
                    self.failures.append(f"mallory's request: {err.status} {err.message}")


def test_the_shipped_configuration_gets_its_ca_bundle_with_no_manual_step(
    devcluster: DevCluster, hook: Hook
) -> None:
    eventually(lambda: bundle_is_current(devcluster), timeout=15, what="the caBundle set")
    grant_create(devcluster, "mallory")
    ns = devcluster.namespace("whca")
    pod = make_pod(devcluster, ns, "web", SIGNER)
    # The API server reads the new configuration within moments.
    eventually(lambda: _admitted(devcluster, pod), timeout=15, what="a node's request admitted")
    spec = pcr_spec(devcluster, pod, SIGNER, keys.generate("ECDSAP256"))
    with pytest.raises(ApiError, match=REFUSAL):
        create_pcr(devcluster.user("mallory"), ns, spec)


def _admitted(devcluster: DevCluster, pod: Any) -> bool:
    try:
        request_as_node(devcluster, pod, SIGNER)
    except ApiError:
        return False
    return True


def test_admission_keeps_answering_through_a_ca_rotation(
    devcluster: DevCluster, hook: Hook
) -> None:
    eventually(lambda: bundle_is_current(devcluster), timeout=15, what="the caBundle set")
    grant_create(devcluster, "mallory")
    ns = devcluster.namespace("whca-rot")
    pod = make_pod(devcluster, ns, "api", SIGNER)
    eventually(lambda: _admitted(devcluster, pod), timeout=15, what="a node's request admitted")
    first_issuer = served_issuer(hook.port, ca_bundle(devcluster))

    prober = Prober(devcluster, ns, pod)
    thread = threading.Thread(target=prober.run, name="webhook-prober", daemon=True)
    thread.start()
    try:
        seen = 0

        def answered_again() -> bool:
            """The webhook answered at least twice more since the last look."""
            return len(prober.answers) >= seen + 2 or bool(prober.failures)

        for step in (["prepare"], ["activate"], ["retire", "--force"]):
            ca_step(devcluster, *step)
            eventually(
                lambda: bundle_is_current(devcluster), timeout=15, what=f"caBundle after {step}"
            )
            seen = len(prober.answers)
            eventually(answered_again, timeout=30, what=f"answers after {step}")
            # What the webhook serves now verifies against what the API server was given.
            issuer = served_issuer(hook.port, ca_bundle(devcluster))
            if step == ["prepare"]:
                assert issuer == first_issuer  # the new CA is trusted, not yet signing
                assert len(der_set(ca_bundle(devcluster))) == 2
            else:
                assert issuer != first_issuer  # served from the new CA
        assert len(der_set(ca_bundle(devcluster))) == 1  # the old root is gone
    finally:
        prober.stop.set()
        thread.join(timeout=60)
    assert prober.failures == []
    assert "admitted" in prober.answers and "refused" in prober.answers


def test_the_signer_exports_leadership_and_the_ca_states(hook: Hook) -> None:
    """The metrics the shipped alerts read, from a running signer (after the rotation above:
    one active CA, none prepared or retired)."""

    def value(name: str, labels: str = "") -> float | None:
        for line in hook.signer.metrics().splitlines():
            if line.startswith(f"{name}{labels} "):
                return float(line.rsplit(" ", 1)[1])
        return None

    assert eventually(lambda: value("podcert_signer_leader") == 1.0, timeout=15)
    assert value("podcert_signer_ca_generations", '{state="active"}') == 1.0
    assert value("podcert_signer_ca_generations", '{state="prepared"}') == 0.0


def _allowed(rest: Rest, verb: str, name: str = "") -> bool:
    attrs = {"verb": verb, "group": "admissionregistration.k8s.io"}
    attrs |= {"resource": "validatingwebhookconfigurations", "name": name}
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": "system:serviceaccount:podcert-system:podcert-signer",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:podcert-system"],
            "resourceAttributes": attrs,
        },
    }
    out = rest.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=review)
    return bool(out["status"].get("allowed"))


def test_the_shipped_rbac_allows_exactly_its_own_configuration(devcluster: DevCluster) -> None:
    docs = [d for d in yaml.safe_load_all((MANIFEST.parent / "rbac.yaml").read_text()) if d]
    kube.ensure_namespace(devcluster.admin, "podcert-system")
    kube.apply(devcluster.admin, docs)
    rest = Rest(devcluster.admin)
    assert all(_allowed(rest, verb, "podcert-signer") for verb in ("list", "watch", "update"))
    assert not _allowed(rest, "update", "someone-elses-webhook")
    assert not _allowed(rest, "list")  # without the name: every configuration
    assert not any(_allowed(rest, verb) for verb in ("create", "deletecollection"))
    assert not any(_allowed(rest, v, "podcert-signer") for v in ("delete", "patch", "get"))
