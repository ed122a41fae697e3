"""podcert federated with SPIRE, both ways, through the bundle endpoints.

A SPIRE server and agent (built from modules by devcluster.spire, run on loopback, the agent
attested with a join token, workloads with the unix attestor) hold trust domain spire.test;
podcert's signer holds podcert.test. Each polls the other's bundle endpoint with the
https_spiffe profile (SPIRE's `federation` configuration with `bundle_endpoint` and
`federates_with`; podcert's policy `federation:` section), after one out-of-band exchange of
roots. podcert publishes SPIRE's roots in a ClusterTrustBundle of their own, which the pod
projects beside its own trust bundle.

A workload holding a SPIRE SVID (go-spiffe's workloadapi.X509Source on the agent's socket) and a
pod holding a podcert SVID (files projected by the shim, used by the Python example pair) talk
mutual TLS in both directions, each authorizing the other's SPIFFE ID. Through a podcert CA
rotation (prepare -> activate -> retire) SPIRE takes each change of roots from the endpoint and
traffic keeps flowing both ways without one failed request. docs/SPIRE.md shows this
configuration.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kubernetes import client

from devcluster import build, kube, processes
from devcluster.identities import Paths
from devcluster.spire import Federate, SpireDomain, ensure_spire
from devcluster.supervise import free_port
from devcluster.testing import DevCluster, eventually
from podcert.client.rest import Rest, path_of
from tests.integration.conftest import StartShim, StartSigner
from tests.integration.interop_helpers import (
    Files,
    GoSpiffe,
    GoSpiffeRefused,
    Operator,
    last_json,
    python_client,
    python_client_flags,
    python_server,
)

SIGNER = "federation.podcert.dev/workload"
FEDERATED_SIGNER = "podcert.dev/federated"  # manifests/signer/rbac.yaml lets the signer attest it
PODCERT_TD = "podcert.test"
SPIRE_TD = "spire.test"
NAMESPACE = "podcert-federation"
NODE = "fed-node"
FEDERATED_FILE = "federated-spire.pem"
# A SPIRE path shaped like a pod's: a partner chooses its paths freely.
SPIRE_WORKLOAD = f"spiffe://{SPIRE_TD}/ns/shop/sa/web"
PODCERT_ENDPOINT_ID = f"spiffe://{PODCERT_TD}/podcert/bundle-endpoint"
TIMEOUT = 180  # SPIRE polls every 15 s at most, its agent syncs every 5 s; shared cores


@pytest.fixture(scope="module", autouse=True)
def federated_bundles_removed(devcluster: DevCluster) -> Iterator[None]:
    """Leave the session's cluster as this module found it: set up first, so torn down after
    the module's signer stopped, it deletes the federated bundles that signer published
    (SPIRE's day-long roots), which a later module's whole-cluster audit would judge."""
    yield
    rest = Rest(devcluster.admin)
    path = path_of("certificates.k8s.io/v1", "clustertrustbundles", None)
    listed = rest.request(
        "GET", path, query={"fieldSelector": f"spec.signerName={FEDERATED_SIGNER}"}
    )
    for item in listed["items"]:
        rest.request("DELETE", f"{path}/{item['metadata']['name']}")


@pytest.fixture(scope="module")
def gospiffe() -> GoSpiffe:
    return GoSpiffe(build.ensure_interop("gospiffe"))


@pytest.fixture(scope="module")
def podcert_endpoint_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def spire(tmp_path_factory: pytest.TempPathFactory, podcert_endpoint_port: int) -> Iterator[Any]:
    """SPIRE for spire.test, federating with podcert.test's endpoint (not yet trusted: its
    roots are handed over once the signer has made them)."""
    domain = SpireDomain.start(
        ensure_spire(),
        SPIRE_TD,
        tmp_path_factory.mktemp("spire"),
        federates_with=[
            Federate(PODCERT_TD, f"https://127.0.0.1:{podcert_endpoint_port}/", PODCERT_ENDPOINT_ID)
        ],
    )
    try:
        domain.start_agent()
        yield domain
    finally:
        domain.stop()


def policy(spire: SpireDomain, bootstrap: Path) -> str:
    return f"""
signers:
  - name: {SIGNER}
    trustDomain: {PODCERT_TD}
    allow:
      - namespaces: ["fed-*"]
federation:
  signerName: {FEDERATED_SIGNER}
  trustDomains:
    - trustDomain: {SPIRE_TD}
      bundleEndpointURL: {spire.bundle_endpoint}
      bundleEndpointProfile: https_spiffe
      endpointSPIFFEID: {spire.server_id}
      bootstrapBundle: {bootstrap}
"""


def secret_roots(devcluster: DevCluster) -> list[x509.Certificate]:
    secret = client.CoreV1Api(devcluster.admin).read_namespaced_secret("podcert-ca", NAMESPACE)
    return x509.load_pem_x509_certificates(base64.b64decode(secret.data["ca.crt"]))


@pytest.fixture(scope="module")
def signer(
    devcluster: DevCluster,
    start_signer: StartSigner,
    spire: SpireDomain,
    podcert_endpoint_port: int,
    tmp_path_factory: pytest.TempPathFactory,
) -> Any:
    work = tmp_path_factory.mktemp("federation-signer")
    bootstrap = work / "spire-bootstrap.pem"  # SPIRE's roots, handed to podcert out of band
    bootstrap.write_text(spire.server("bundle", "show", "-format", "pem"))
    (work / "policy.yaml").write_text(policy(spire, bootstrap))
    proc = start_signer(
        SIGNER,
        namespace=NAMESPACE,
        policy=work / "policy.yaml",
        bundle_endpoint_port=podcert_endpoint_port,
        bundle_endpoint_host="127.0.0.1",
        bundle_refresh_hint_seconds=30,
    )
    # ...and podcert's roots to SPIRE (`spire-server bundle set`), the other half of it.
    ours = work / "podcert-bootstrap.pem"
    ours.write_bytes(
        b"".join(r.public_bytes(serialization.Encoding.PEM) for r in secret_roots(devcluster))
    )
    spire.set_bundle(PODCERT_TD, ours)
    # The workload's entry (it may federate with podcert.test once SPIRE holds its bundle).
    # This test process's children (go-spiffe) run as our user: the unix attestor's selector.
    spire.entry(spire.agent_id, SPIRE_WORKLOAD, f"unix:uid:{os.getuid()}", PODCERT_TD)
    return proc


@pytest.fixture(scope="module")
def pod_files(devcluster: DevCluster, signer: Any, start_shim: StartShim) -> tuple[str, Files]:
    """One pod with a podcert SVID, its own roots and SPIRE's (the federated bundle)."""
    shim = start_shim(NODE)
    ns = devcluster.namespace("fed")
    volume = kube.pod_certificate_volume(SIGNER, trust_bundle_signer=True)
    volume["projected"]["sources"].append(
        {
            "clusterTrustBundle": {
                "signerName": FEDERATED_SIGNER,
                "labelSelector": {"matchLabels": {"podcert.dev/trust-domain": SPIRE_TD}},
                "path": FEDERATED_FILE,
            }
        }
    )
    pod = devcluster.pod(ns, "api", node=NODE, service_account="api", volumes=[volume])
    files = Files(shim.volume_dir(pod.metadata.uid))
    eventually(
        lambda: files.ready() and (files.folder / FEDERATED_FILE).is_file(),
        timeout=TIMEOUT,
        what="the pod's credential, trust bundle and SPIRE's roots",
    )
    return f"spiffe://{PODCERT_TD}/ns/{ns}/sa/api", files


def workload_view(gospiffe: GoSpiffe, spire: SpireDomain) -> dict[str, Any]:
    """What a SPIRE workload holds: its SVID and every trust domain's roots (nothing until the
    agent has synced the workload's entry, a few seconds after it is created)."""
    try:
        return gospiffe.run("workload", workload_api=spire.workload_api)
    except GoSpiffeRefused as refused:
        if "no identity issued" not in str(refused):
            raise
        return {"bundles": {}}


def pem_ders(path: Path) -> set[bytes]:
    certs = x509.load_pem_x509_certificates(path.read_bytes())
    return {c.public_bytes(serialization.Encoding.DER) for c in certs}


def test_each_side_holds_the_others_roots(
    devcluster: DevCluster, gospiffe: GoSpiffe, spire: SpireDomain, pod_files: tuple[str, Files]
) -> None:
    _, files = pod_files
    # podcert: SPIRE's roots, fetched from its endpoint, in a ClusterTrustBundle of their own.
    name = f"{FEDERATED_SIGNER.replace('/', ':')}:{SPIRE_TD}"
    ctb = Rest(devcluster.admin).request(
        "GET", path_of("certificates.k8s.io/v1", "clustertrustbundles", None, name)
    )
    assert ctb["spec"]["signerName"] == FEDERATED_SIGNER
    assert ctb["metadata"]["labels"]["podcert.dev/trust-domain"] == SPIRE_TD
    assert ctb["metadata"]["labels"]["podcert.dev/federated"] == "true"
    spire_pem = spire.server("bundle", "show", "-format", "pem").encode()
    spire_roots = {
        c.public_bytes(serialization.Encoding.DER)
        for c in x509.load_pem_x509_certificates(spire_pem)
    }
    assert pem_ders(files.folder / FEDERATED_FILE) == spire_roots
    assert pem_ders(files.trust) == {
        r.public_bytes(serialization.Encoding.DER) for r in secret_roots(devcluster)
    }
    # SPIRE: podcert's roots, and its workload gets them over the Workload API.
    eventually(lambda: spire.federated_roots(PODCERT_TD) == 1, timeout=TIMEOUT, what="SPIRE")
    view = eventually(
        lambda: (v := workload_view(gospiffe, spire)) and PODCERT_TD in v["bundles"] and v,
        timeout=TIMEOUT,
        what="podcert.test's roots at the SPIRE workload",
    )
    assert view["spiffe_id"] == SPIRE_WORKLOAD
    assert {base64.b64decode(d) for d in view["bundles"][PODCERT_TD]} == pem_ders(files.trust)


def python_server_flags(files: Files, allow: str) -> dict[str, str]:
    return {
        "federated_trust_bundle": f"{SPIRE_TD}={files.folder / FEDERATED_FILE}",
        "allow_id": allow,
    }


def test_mutual_tls_both_ways_between_a_spire_workload_and_a_pod(
    gospiffe: GoSpiffe, spire: SpireDomain, pod_files: tuple[str, Files], tmp_path: Path
) -> None:
    pod_id, files = pod_files
    eventually(
        lambda: PODCERT_TD in workload_view(gospiffe, spire)["bundles"],
        timeout=TIMEOUT,
        what="podcert.test's roots at the SPIRE workload",
    )
    # SPIRE workload (go-spiffe, AuthorizeID) -> the pod's server (bundles, allow the SPIRE ID).
    with python_server(
        files, tmp_path / "server.log", **python_server_flags(files, SPIRE_WORKLOAD)
    ) as url:
        answer = gospiffe.client(None, url, server_id=pod_id, workload_api=spire.workload_api)
        assert answer["ok"] == 3 and answer["server_id"] == pod_id
        assert {a["caller"] for a in answer["answers"]} == {SPIRE_WORKLOAD}
        # Control: go-spiffe does refuse the pod when told to expect another ID.
        with pytest.raises(GoSpiffeRefused, match="unexpected ID"):
            gospiffe.client(None, url, server_id=f"{pod_id}x", workload_api=spire.workload_api)
    # The pod's client (bundles, the SPIRE ID) -> SPIRE workload's server (AuthorizeID pod).
    with gospiffe.serve(None, client_id=pod_id, workload_api=spire.workload_api) as server:
        summary = python_client(files, server.url, SPIRE_WORKLOAD, **federation_flags(files))
        served = server.stop()
    assert summary["failed"] == 0 and summary["ok"] > 0, summary
    assert served["callers"] == [pod_id]
    # Control: the pod refuses a SPIRE peer it was not told to trust, though its root verifies.
    with gospiffe.serve(None, client_id=pod_id, workload_api=spire.workload_api) as server:
        other = f"spiffe://{SPIRE_TD}/other"
        refused = python_client(files, server.url, other, 0.5, **federation_flags(files))
    assert refused["ok"] == 0 and refused["failed"] > 0


@pytest.mark.parametrize(
    ("rule", "admitted"),
    [
        pytest.param("shop/web", False, id="shop/web is podcert.test's, as the docs run it"),
        pytest.param(f"{SPIRE_TD}/shop/web", True, id="spire.test/shop/web names the partner's"),
    ],
)
def test_a_spire_workload_named_like_a_pod_is_not_one_of_ours(
    gospiffe: GoSpiffe,
    spire: SpireDomain,
    pod_files: tuple[str, Files],
    tmp_path: Path,
    rule: str,
    admitted: bool,
) -> None:
    """The pod's server run with `--allow-workload shop/web` and SPIRE's
    roots as docs/SPIRE.md adds them answered 200 to spiffe://spire.test/ns/shop/sa/web. A rule
    without a trust domain now means the pod's own (podcert.test), refused in the handshake."""
    pod_id, files = pod_files
    eventually(
        lambda: PODCERT_TD in workload_view(gospiffe, spire)["bundles"],
        timeout=TIMEOUT,
        what="podcert.test's roots at the SPIRE workload",
    )
    log = tmp_path / "server.log"
    federated = f"{SPIRE_TD}={files.folder / FEDERATED_FILE}"
    with python_server(files, log, federated_trust_bundle=federated, allow_workload=rule) as url:
        if admitted:
            answer = gospiffe.client(None, url, server_id=pod_id, workload_api=spire.workload_api)
            assert answer["ok"] == 3
            assert {a["caller"] for a in answer["answers"]} == {SPIRE_WORKLOAD}
        else:
            with pytest.raises(GoSpiffeRefused):
                gospiffe.client(None, url, server_id=pod_id, workload_api=spire.workload_api)
            eventually(
                lambda: (
                    f"refused client: {SPIRE_WORKLOAD} is not in trust domain {PODCERT_TD}"
                    in log.read_text()
                ),
                timeout=30,
                what="the server's line for the refused SPIRE workload",
            )


def federation_flags(files: Files) -> dict[str, Any]:
    """The pod's client: SPIRE's roots beside its own (for spire.test IDs only), re-read
    every half second, 5 requests a second."""
    federated = f"{SPIRE_TD}={files.folder / FEDERATED_FILE}"
    return {"federated_trust_bundle": federated, "rate": 5, "reload_interval": 0.5}


def test_traffic_keeps_flowing_through_a_podcert_ca_rotation(
    devcluster: DevCluster,
    gospiffe: GoSpiffe,
    spire: SpireDomain,
    pod_files: tuple[str, Files],
    tmp_path: Path,
) -> None:
    """Both directions run throughout; SPIRE learns each change of podcert's roots from the
    endpoint, and no request fails."""
    pod_id, files = pod_files
    operator = Operator(Paths(devcluster.root.resolve()).admin_kubeconfig)

    def workload_roots() -> int:
        return len(workload_view(gospiffe, spire)["bundles"].get(PODCERT_TD, []))

    def spire_has(roots: int, step: str) -> None:
        eventually(
            lambda: spire.federated_roots(PODCERT_TD) == roots and workload_roots() == roots,
            timeout=TIMEOUT,
            what=f"{roots} podcert.test root(s) at SPIRE and its workload ({step})",
        )

    spire_has(1, "before")
    log = tmp_path / "server.log"
    with (
        python_server(files, log, **python_server_flags(files, SPIRE_WORKLOAD)) as url,
        gospiffe.serve(None, client_id=pod_id, workload_api=spire.workload_api) as go_server,
        gospiffe.calling(url, server_id=pod_id, workload_api=spire.workload_api) as go_client,
    ):
        # SPIRE workload -> pod: go_client, a new connection (a new handshake) every 200 ms.
        # pod -> SPIRE workload: the Python example client, 5 requests a second.
        py_client = processes.Process(
            args=python_client_flags(
                files, go_server.url, SPIRE_WORKLOAD, **federation_flags(files)
            ),
            log=tmp_path / "client.log",
            module="examples.mtls.client",
        ).start()
        try:
            first_leaf = gospiffe.verify(files)["serial"]
            operator.ca(NAMESPACE, "prepare")
            eventually(lambda: files.roots() == 2, timeout=TIMEOUT, what="the pod's two roots")
            spire_has(2, "prepared")
            operator.ca(NAMESPACE, "activate")
            operator.rotate(pod_namespace(pod_id), "api")
            eventually(
                lambda: gospiffe.verify(files)["serial"] != first_leaf,
                timeout=TIMEOUT,
                what="the pod's leaf from the new CA",
            )
            operator.ca(NAMESPACE, "retire", "--force")
            eventually(lambda: files.roots() == 1, timeout=TIMEOUT, what="the pod's one root")
            spire_has(1, "retired")
            # After the retirement, one more round each way beside the running clients.
            after = gospiffe.client(None, url, server_id=pod_id, workload_api=spire.workload_api)
            assert after["ok"] == 3
            again = python_client(files, go_server.url, SPIRE_WORKLOAD, **federation_flags(files))
            assert again["failed"] == 0 and again["ok"] > 0, again
        finally:
            py_client.stop()
    go_summary = go_client.stop()
    py_summary = last_json(py_client.output())
    assert go_summary, "the go-spiffe client printed no summary"
    assert py_summary is not None, py_client.output()[-2000:]
    assert go_summary["failed"] == 0, go_summary["errors"]
    assert py_summary["failed"] == 0, py_summary["errors"]
    assert go_summary["ok"] > 0 and py_summary["ok"] > 0
    # The SPIRE workload talked to the pod's first and its rotated leaf.
    assert first_leaf in go_summary["server_serials"]
    assert len(go_summary["server_serials"]) >= 2


def pod_namespace(spiffe_id: str) -> str:
    return spiffe_id.split("/ns/", 1)[1].split("/", 1)[0]
