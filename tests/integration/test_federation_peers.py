"""Federation against misbehaving peers, on a real signer and API
server, the peers' bundle endpoints served from this test process on loopback (https_web, the
peers' certificates from a test CA given as webRoots):

- a slow peer, trickling its answer a byte a second (every read quick, the answer endless), is
  cut off at the fetch's deadline, while a healthy peer listed after it has its bundle
  published, and updated, within its own refresh interval;
- a peer whose bundle lists another domain's root, the signer's own root, an intermediate and a
  leaf gets only its genuine roots published, each refusal logged naming the domain and the
  certificate, and the other domain keeps its root.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from kubernetes import client

from devcluster import processes
from devcluster.testing import DevCluster, eventually
from podcert.client.rest import ApiError, Rest, path_of
from signer.authority import spiffebundle
from signer.federation.poller import FETCH_DEADLINE
from tests.integration.conftest import StartSigner

SIGNER = "peers.podcert.dev/workload"
FEDERATED_SIGNER = "podcert.dev/federated"  # manifests/signer/rbac.yaml lets the signer attest it
HINT = 5  # seconds: the healthy peers' refresh hint (the signer's floor)
SLACK = 15.0  # shared cores: a leader to elect, a fetch, a write, a watch event


@pytest.fixture(scope="module")
def web_ca() -> trustme.CA:
    """The peers' Web PKI: their serving certificates, and the signer's webRoots."""
    return trustme.CA()


@pytest.fixture(scope="module")
def web_roots(web_ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("peers") / "web-roots.pem"
    web_ca.cert_pem.write_to_path(str(path))
    return path


def server_context(web_ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    web_ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


def root(ca: trustme.CA) -> x509.Certificate:
    return x509.load_pem_x509_certificate(ca.cert_pem.bytes())


def der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


class Peer:
    """A healthy bundle endpoint serving whatever certificates it is given."""

    def __init__(self, web_ca: trustme.CA) -> None:
        self.body = b""
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = peer.body
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.socket = server_context(web_ca).wrap_socket(self.httpd.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def serve(self, certs: list[x509.Certificate], sequence: int) -> None:
        doc = spiffebundle.bundle_document(certs, sequence, dt.timedelta(seconds=HINT))
        self.body = json.dumps(doc).encode()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class SlowPeer:
    """A bundle endpoint that completes the handshake, reads the request, then answers a byte
    a second for ever (until the client goes or the test ends)."""

    def __init__(self, web_ca: trustme.CA) -> None:
        self.context = server_context(web_ca)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"https://127.0.0.1:{self.listener.getsockname()[1]}/"
        self.stopping = threading.Event()
        self.requests = 0
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with (
            contextlib.suppress(OSError),
            conn,
            self.context.wrap_socket(conn, server_side=True) as tls,
        ):
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = tls.recv(4096)
                if not chunk:
                    return
                request += chunk
            self.requests += 1
            tls.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            while not self.stopping.wait(1.0):
                tls.sendall(b"a")

    def stop(self) -> None:
        self.stopping.set()
        self.listener.close()


@contextlib.contextmanager
def serving(peer: Peer | SlowPeer) -> Iterator[None]:
    peer.thread.start()
    try:
        yield
    finally:
        peer.stop()


def policy(domains: list[tuple[str, str]], web_roots: Path) -> str:
    listed = "".join(
        f"""
    - trustDomain: {td}
      bundleEndpointURL: {url}
      bundleEndpointProfile: https_web
      webRoots: {web_roots}"""
        for td, url in domains
    )
    return f"""
signers:
  - name: {SIGNER}
    trustDomain: peers.podcert.test
    allow:
      - namespaces: ["peers-*"]
federation:
  signerName: {FEDERATED_SIGNER}
  trustDomains:{listed}
"""


def published(devcluster: DevCluster, td: str) -> set[bytes] | None:
    """The roots in `td`'s ClusterTrustBundle (None: there is none)."""
    name = f"{FEDERATED_SIGNER.replace('/', ':')}:{td}"
    try:
        ctb = Rest(devcluster.admin).request(
            "GET", path_of("certificates.k8s.io/v1", "clustertrustbundles", None, name)
        )
    except ApiError as err:
        if err.status == 404:
            return None
        raise
    pem = ctb["spec"]["trustBundle"].encode()
    return {der(c) for c in x509.load_pem_x509_certificates(pem)}


def start(start_signer: StartSigner, tmp_path: Path, namespace: str, text: str) -> processes.Signer:
    (tmp_path / "policy.yaml").write_text(text)
    return start_signer(SIGNER, namespace=namespace, policy=tmp_path / "policy.yaml")


def test_a_slow_peer_never_delays_a_healthy_peers_bundle(
    devcluster: DevCluster,
    start_signer: StartSigner,
    web_ca: trustme.CA,
    web_roots: Path,
    tmp_path: Path,
) -> None:
    slow, healthy = SlowPeer(web_ca), Peer(web_ca)
    first, second = root(trustme.CA()), root(trustme.CA())
    healthy.serve([first], 1)
    # The slow domain is listed first, and sorts first.
    domains = [("a-slow.test", slow.url), ("z-healthy.test", healthy.url)]
    with serving(slow), serving(healthy):
        signer = start(start_signer, tmp_path, "podcert-peers-slow", policy(domains, web_roots))
        try:
            eventually(
                lambda: published(devcluster, "z-healthy.test") == {der(first)},
                timeout=HINT + SLACK,
                what="the healthy peer's bundle, while the slow peer's fetch is under way",
            )
            timed_out = "federation with a-slow.test: bundle not taken (endpoint: "
            # The healthy bundle came before the slow fetch was cut off: not queued behind it.
            assert timed_out not in signer.output()
            eventually(lambda: slow.requests >= 1, timeout=SLACK, what="the slow peer asked")
            eventually(
                lambda: f"no whole answer within {FETCH_DEADLINE:g}s" in signer.output(),
                timeout=FETCH_DEADLINE + SLACK,
                what="the slow peer's fetch cut off at the deadline",
            )
            assert timed_out in signer.output()
            # A change of the healthy peer's roots reaches the cluster within its interval,
            # the slow peer still trickling to the next fetch.
            healthy.serve([second], 2)
            changed = time.monotonic()
            eventually(
                lambda: published(devcluster, "z-healthy.test") == {der(second)},
                timeout=HINT + SLACK,
                what="the healthy peer's new root",
            )
            took = time.monotonic() - changed
            assert published(devcluster, "a-slow.test") is None
            assert took < HINT + SLACK, took
        finally:
            signer.stop()  # it prunes the federated bundles of domains it does not know


def signer_roots(devcluster: DevCluster, namespace: str) -> list[x509.Certificate]:
    secret = client.CoreV1Api(devcluster.admin).read_namespaced_secret("podcert-ca", namespace)
    return x509.load_pem_x509_certificates(base64.b64decode(secret.data["ca.crt"]))


def fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex()


def test_a_contested_root_stays_with_its_owner_and_only_roots_are_published(
    devcluster: DevCluster,
    start_signer: StartSigner,
    web_ca: trustme.CA,
    web_roots: Path,
    tmp_path: Path,
) -> None:
    namespace = "podcert-peers-contested"
    owner, contester = Peer(web_ca), Peer(web_ca)
    owner_root = root(trustme.CA())
    contester_ca = trustme.CA()
    contester_root, contester_new = root(contester_ca), root(trustme.CA())
    owner.serve([owner_root], 1)
    contester.serve([contester_root], 1)
    # The contester is listed first and sorts first: neither decides who owns a root.
    domains = [("a-contester.test", contester.url), ("z-owner.test", owner.url)]
    with serving(owner), serving(contester):
        signer = start(start_signer, tmp_path, namespace, policy(domains, web_roots))
        try:
            eventually(
                lambda: (
                    published(devcluster, "z-owner.test") == {der(owner_root)}
                    and published(devcluster, "a-contester.test") == {der(contester_root)}
                ),
                timeout=HINT + SLACK,
                what="both peers' bundles",
            )
            [local] = signer_roots(devcluster, namespace)
            intermediate = root(contester_ca.create_child_ca())
            leaf = x509.load_pem_x509_certificate(
                contester_ca.issue_cert("leaf.test").cert_chain_pems[0].bytes()
            )
            contester.serve(
                [contester_root, contester_new, owner_root, local, intermediate, leaf], 2
            )
            eventually(
                lambda: (
                    published(devcluster, "a-contester.test")
                    == {der(contester_root), der(contester_new)}
                ),
                timeout=HINT + SLACK,
                what="the contester's genuine new root, and only it, published beside its first",
            )
            refusals = {
                fingerprint(
                    owner_root
                ): "(owned-by-another-domain): a root of federated trust domain z-owner.test",
                fingerprint(local): "(local-root)",
                fingerprint(intermediate): "(not-self-signed)",
                fingerprint(leaf): "(not-a-ca)",
            }
            log = signer.output()
            for print_, reason in refusals.items():
                line = next(
                    (x for x in log.splitlines() if f"sha256:{print_}" in x and "refused" in x), ""
                )
                assert "a-contester.test: certificate" in line and reason in line, (reason, line)
            assert published(devcluster, "z-owner.test") == {der(owner_root)}
        finally:
            signer.stop()
