"""The signer's SPIFFE bundle endpoint, fetched by go-spiffe's
`federation.FetchBundle` (which parses it with spiffebundle) as another trust domain would.

With the https_spiffe profile, through a whole CA rotation (prepare -> activate -> retire), each
fetch authenticated with the bundle fetched before it (the out-of-band first one: the CA Secret's
roots): every trusted root is served, the sequence moves on every change of roots and never goes
back, not even across a restart. With https_web, an operator's Web PKI certificate.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kubernetes import client

from devcluster import build
from devcluster.identities import Paths
from devcluster.supervise import free_port
from devcluster.testing import DevCluster, eventually
from tests.integration.conftest import StartSigner
from tests.integration.interop_helpers import GoSpiffe, GoSpiffeRefused

TRUST_DOMAIN = "bundle.test"
ENDPOINT_ID = f"spiffe://{TRUST_DOMAIN}/podcert/bundle-endpoint"


@pytest.fixture(scope="module")
def gospiffe() -> GoSpiffe:
    return GoSpiffe(build.ensure_interop("gospiffe"))


def secret_roots(devcluster: DevCluster, namespace: str) -> list[x509.Certificate]:
    """The roots the CA Secret trusts (ca.crt): what an operator hands a peer out of band."""
    secret = client.CoreV1Api(devcluster.admin).read_namespaced_secret("podcert-ca", namespace)
    return x509.load_pem_x509_certificates(base64.b64decode(secret.data["ca.crt"]))


def write_roots(path: Path, roots: list[x509.Certificate]) -> Path:
    path.write_bytes(b"".join(r.public_bytes(serialization.Encoding.PEM) for r in roots))
    return path


def authorities(fetched: dict[str, Any]) -> list[x509.Certificate]:
    return [
        x509.load_der_x509_certificate(base64.b64decode(der)) for der in fetched["x509_authorities"]
    ]


def ders(roots: list[x509.Certificate]) -> set[bytes]:
    return {r.public_bytes(serialization.Encoding.DER) for r in roots}


def test_go_spiffe_fetches_the_bundle_with_https_spiffe_through_a_ca_rotation(
    devcluster: DevCluster, start_signer: StartSigner, gospiffe: GoSpiffe, tmp_path: Path
) -> None:
    namespace, port = "podcert-bundle", free_port()
    signer_flags: dict[str, Any] = {
        "namespace": namespace,
        "trust_domain": TRUST_DOMAIN,
        "bundle_endpoint_port": port,
        "bundle_endpoint_host": "127.0.0.1",
    }
    first_signer = start_signer("bundle.podcert.dev/workload", **signer_flags)
    url = f"https://127.0.0.1:{port}/"
    admin = Paths(devcluster.root.resolve()).admin_kubeconfig

    def ca(action: str, *more: str) -> None:
        signer_cli = [sys.executable, "-m", "podcert", "signer", f"--kubeconfig={admin}"]
        done = subprocess.run(
            [*signer_cli, f"--namespace={namespace}", "ca", action, *more],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]

    def fetch(trusted: Path) -> dict[str, Any]:
        return gospiffe.run("fetch-bundle", url=url, endpoint_id=ENDPOINT_ID, trust_bundle=trusted)

    def fetched_when(trusted: Path, roots: int) -> dict[str, Any]:
        """The first fetch whose bundle holds `roots` roots (the signer follows the Secret)."""
        found: dict[str, Any] = eventually(
            lambda: (got := fetch(trusted)) and len(got["x509_authorities"]) == roots and got,
            timeout=30,
            what=f"a bundle with {roots} roots",
        )
        return found

    # The first bundle, authenticated with the roots handed over out of band.
    original = secret_roots(devcluster, namespace)
    out_of_band = write_roots(tmp_path / "out-of-band.pem", original)
    first = fetch(out_of_band)
    assert first["trust_domain"] == TRUST_DOMAIN
    assert first["refresh_hint_seconds"] == 300
    assert ders(authorities(first)) == ders(original)
    sequences = [first["sequence"]]

    # prepare: the new root is served beside the old one, and the sequence moves.
    ca("prepare")
    prepared = fetched_when(out_of_band, 2)
    assert ders(authorities(prepared)) == ders(secret_roots(devcluster, namespace))
    assert ders(original) < ders(authorities(prepared))
    sequences.append(prepared["sequence"])
    both = write_roots(tmp_path / "both.pem", authorities(prepared))

    # activate: the endpoint's SVID now comes from the new CA, so only a consumer that polled
    # during the overlap (and holds the new root) still authenticates it.
    ca("activate")
    eventually(
        lambda: _refused(lambda: fetch(out_of_band)),
        timeout=30,
        what="the endpoint's SVID from the new CA",
    )
    activated = fetch(both)
    assert ders(authorities(activated)) == ders(authorities(prepared))
    sequences.append(activated["sequence"])

    # retire: the old root leaves the bundle, and the sequence moves again.
    ca("retire", "--force")
    retired = fetched_when(both, 1)
    assert ders(authorities(retired)) == ders(authorities(prepared)) - ders(original)
    sequences.append(retired["sequence"])
    assert sequences[1] > sequences[0] and sequences[3] > sequences[2] >= sequences[1]

    # A restart (as a new leader would be) serves the same sequence: it lives in the Secret.
    only_new = write_roots(tmp_path / "new.pem", authorities(retired))
    first_signer.stop()
    start_signer("bundle.podcert.dev/workload", **signer_flags, workdir=tmp_path)
    restarted = eventually(lambda: _fetched(lambda: fetch(only_new)), timeout=30, what="refetch")
    assert restarted["sequence"] == sequences[-1]
    assert ders(authorities(restarted)) == ders(authorities(retired))


def _refused(call: Any) -> bool:
    try:
        call()
    except GoSpiffeRefused:
        return True
    return False


def _fetched(call: Any) -> Any:
    try:
        return call()
    except GoSpiffeRefused:
        return None


def test_go_spiffe_fetches_the_bundle_with_https_web(
    devcluster: DevCluster, start_signer: StartSigner, gospiffe: GoSpiffe, tmp_path: Path
) -> None:
    namespace, port = "podcert-bundle-web", free_port()
    web_ca = trustme.CA()
    served = web_ca.issue_cert("127.0.0.1")
    served.cert_chain_pems[0].write_to_path(str(tmp_path / "chain.pem"))
    for blob in served.cert_chain_pems[1:]:
        blob.write_to_path(str(tmp_path / "chain.pem"), append=True)
    served.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    (tmp_path / "key.pem").chmod(0o600)
    web_ca.cert_pem.write_to_path(str(tmp_path / "web-roots.pem"))
    start_signer(
        "bundle-web.podcert.dev/workload",
        namespace=namespace,
        trust_domain=TRUST_DOMAIN,
        bundle_endpoint_port=port,
        bundle_endpoint_host="127.0.0.1",
        bundle_endpoint_cert=tmp_path / "chain.pem",
        bundle_endpoint_key=tmp_path / "key.pem",
    )
    fetched = gospiffe.run(
        "fetch-bundle",
        url=f"https://127.0.0.1:{port}/",
        web_roots=tmp_path / "web-roots.pem",
        trust_domain=TRUST_DOMAIN,
    )
    assert fetched["trust_domain"] == TRUST_DOMAIN
    assert ders(authorities(fetched)) == ders(secret_roots(devcluster, namespace))
    # The Web PKI certificate is no SVID: https_spiffe authentication of it fails.
    roots = write_roots(tmp_path / "td.pem", secret_roots(devcluster, namespace))
    with pytest.raises(GoSpiffeRefused):
        gospiffe.run(
            "fetch-bundle",
            url=f"https://127.0.0.1:{port}/",
            endpoint_id=ENDPOINT_ID,
            trust_bundle=roots,
        )
