"""A create whose answer is lost on the way must not become two requests.

The shim runs as its node against the real API server through a small TLS proxy (it holds the
node's client certificate upstream, so the API server sees the node) that drops the first 201 a
PodCertificateRequest create gets: it reads the answer's status line and closes both sides
without passing it on. On the attacked deployment the transport then sent the POST again on a
new connection and the pod's one create became two requests with the same key, both Issued.
Now the transport never resends a written POST, and the shim's retry, which asks again for the
same key under the same name, meets 409 AlreadyExists and adopts the request the API server
applied: one request, issued once, the pod's files holding its key.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
import yaml
from cryptography import x509

from bundles import formats
from devcluster.testing import DevCluster, eventually
from podcert.api import keys
from tests.integration.conftest import StartShim, StartSigner
from tests.integration.shim_helpers import certificate_volume, outcome, requests_of

SIGNER = "replay.podcert.dev/test"
SIGNER_NAMESPACE = "podcert-replay"
NODE = "replay-node-a"
DEADLINE = 20.0


class DropFirstCreated:
    """A TLS proxy to the API server that drops the answer to the first PodCertificateRequest
    create the API server answered 201, after the server applied it.

    All its TLS runs on one asyncio loop in a thread of its own. An SSL connection must never
    be read in one thread while another writes it (OpenSSL's rule; Python does not lock it):
    the proxy this replaced did so, a reading and a writing thread per connection, and once in
    a while a list through it never got its answer and the shim never became ready."""

    def __init__(self, upstream: str, context: ssl.SSLContext, served: ssl.SSLContext) -> None:
        host, _, port = upstream.removeprefix("https://").partition(":")
        self.upstream = (host, int(port))
        self.context = context  # to the API server, as the node
        self.served = served  # to the shim
        self.dropped = 0
        self.creates = 0
        self.port = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._loop = asyncio.new_event_loop()
        listening = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(listening,), daemon=True)
        self._thread.start()
        if not listening.wait(10):
            raise RuntimeError("the proxy did not start listening in 10 s")

    def _run(self, listening: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.served)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        listening.set()
        self._loop.run_forever()

    async def _serve(self, down_r: asyncio.StreamReader, down_w: asyncio.StreamWriter) -> None:
        self._writers.append(down_w)
        try:
            up_r, up_w = await asyncio.open_connection(
                *self.upstream, ssl=self.context, server_hostname=self.upstream[0]
            )
        except OSError:
            down_w.close()
            return
        self._writers.append(up_w)
        # Set (before the request goes up) when the next answer on this connection is a
        # create's: the shim's client sends one request at a time on a connection.
        create_next = asyncio.Event()
        pumps = [
            asyncio.create_task(self._requests(down_r, up_w, create_next)),
            asyncio.create_task(self._answers(up_r, down_w, create_next)),
        ]
        # Either side ending (or the drop) ends the connection, both ways.
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for pump in pumps:
            pump.cancel()
        for writer in (up_w, down_w):
            writer.close()

    async def _requests(
        self, down: asyncio.StreamReader, up: asyncio.StreamWriter, create_next: asyncio.Event
    ) -> None:
        buffer = b""
        with contextlib.suppress(OSError):
            while data := await down.read(65536):
                buffer += data
                while b"\r\n\r\n" in buffer:
                    head, _, rest = buffer.partition(b"\r\n\r\n")
                    lines = head.decode("latin-1").split("\r\n")
                    method, target, _ = lines[0].split(" ", 2)
                    length = next(
                        (int(v) for n, _, v in (x.partition(":") for x in lines[1:])
                         if n.strip().lower() == "content-length"),
                        0,
                    )  # fmt: skip
                    if len(rest) < length:
                        break
                    buffer = rest[length:]
                    if method == "POST" and target.split("?")[0].endswith(
                        "/podcertificaterequests"
                    ):
                        self.creates += 1
                        create_next.set()
                    up.write(head + b"\r\n\r\n" + rest[:length])
                    await up.drain()

    async def _answers(
        self, up: asyncio.StreamReader, down: asyncio.StreamWriter, create_next: asyncio.Event
    ) -> None:
        with contextlib.suppress(OSError):
            while data := await up.read(65536):
                if create_next.is_set():
                    create_next.clear()
                    while len(data) < 12 and (more := await up.read(65536)):
                        data += more
                    if data.startswith(b"HTTP/1.1 201") and self.dropped == 0:
                        self.dropped += 1
                        return  # applied upstream; the answer never reaches the shim
                down.write(data)
                await down.drain()

    def close(self) -> None:
        async def shut() -> None:
            self._server.close()
            for writer in self._writers:
                writer.close()

        asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def proxied_kubeconfig(
    devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, DropFirstCreated]]:
    """The node's kubeconfig, pointed at the proxy (trusting the proxy's own CA)."""
    config = yaml.safe_load(devcluster.node_kubeconfig(NODE).read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    folder = tmp_path_factory.mktemp("replay")
    (folder / "ca.crt").write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    (folder / "node.crt").write_bytes(base64.b64decode(user["client-certificate-data"]))
    (folder / "node.key").write_bytes(base64.b64decode(user["client-key-data"]))
    upstream = ssl.create_default_context(cafile=str(folder / "ca.crt"))
    upstream.load_cert_chain(folder / "node.crt", folder / "node.key")
    proxy_ca = trustme.CA()
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    proxy_ca.issue_cert("127.0.0.1").configure_cert(served)
    proxy = DropFirstCreated(cluster["server"], upstream, served)
    cluster["server"] = f"https://127.0.0.1:{proxy.port}"
    cluster["certificate-authority-data"] = base64.b64encode(proxy_ca.cert_pem.bytes()).decode()
    path = folder / "node-via-proxy.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    yield path, proxy
    proxy.close()


def test_a_create_whose_201_was_dropped_is_one_request_issued_once(
    devcluster: DevCluster,
    start_signer: StartSigner,
    start_shim: StartShim,
    proxied_kubeconfig: tuple[Path, DropFirstCreated],
    tmp_path: Path,
) -> None:
    kubeconfig, proxy = proxied_kubeconfig
    start_signer(SIGNER, namespace=SIGNER_NAMESPACE)
    shim = start_shim(NODE, kubeconfig=kubeconfig, root=tmp_path / "root")
    ns = devcluster.namespace("replay")
    pod = devcluster.pod(ns, "web", node=NODE, volumes=[certificate_volume(SIGNER)])

    bundle = eventually(
        lambda: _read(shim.volume_dir(pod.metadata.uid) / "credentialbundle.pem"),
        timeout=DEADLINE,
        what="the pod's credential",
    )
    assert proxy.dropped == 1, "the proxy dropped the first create's 201"
    assert proxy.creates >= 2, "the shim asked again after the lost answer"

    [request] = requests_of(devcluster, ns, pod.metadata.uid)
    assert outcome(request) == "Issued"
    credential = formats.load_credential(bundle)
    assert keys.spki_der(credential.leaf.public_key()) == keys.spki_der(credential.key.public_key())
    chain = x509.load_pem_x509_certificates(request["status"]["certificateChain"].encode())
    assert credential.chain == tuple(chain), "the pod holds that one request's chain"


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
