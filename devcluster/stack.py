"""The whole of podcert on a devcluster, as local processes: the signer, a shim for one node, and
the example mTLS pair reading the files the shim projects. Used by `podcert demo` and by the
end-to-end tests, so both exercise exactly the same path.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509

from devcluster import kube, processes
from devcluster.identities import Paths
from devcluster.supervise import free_port
from podcert.client.rest import JSON, Rest, path_of

SIGNER_NAMESPACE = "podcert-system"
BUNDLE = "credentialbundle.pem"
TRUST = "trust-bundle.pem"


def identity_volume(signer: str) -> dict[str, Any]:
    """A pod's identity: its credential bundle and the signer's roots, in one projected volume."""
    return kube.pod_certificate_volume(signer, trust_bundle_signer=True)


def wait_for(probe: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Stack:
    root: Path  # the devcluster's folder
    work: Path  # logs and the shim's node root
    signer_name: str = processes.DEFAULT_SIGNER
    node: str = "node-a"
    namespace: str = "shop"
    signer: processes.Signer | None = None
    shim: processes.Shim | None = None
    pair: dict[str, processes.Process] = field(default_factory=dict)
    port: int = 0

    @property
    def admin_kubeconfig(self) -> Path:
        return Paths(self.root.resolve()).admin_kubeconfig

    def rest(self) -> Rest:
        return Rest(kube.admin_client(self.root))

    # --- components ------------------------------------------------------------------------

    def start_signer(self, *extra: str) -> processes.Signer:
        self.signer = processes.signer(
            self.root, self.work, [self.signer_name], namespace=SIGNER_NAMESPACE, extra=extra
        ).start()
        self.signer.wait_ready()
        return self.signer

    def start_shim(self, *extra: str) -> processes.Shim:
        self.shim = processes.shim(
            self.root, self.work, self.node, root=self.work / "node", extra=extra
        ).start()
        self.shim.wait_ready()
        return self.shim

    def create_pods(self) -> dict[str, JSON]:
        """The server pod (service account `api`) and the client pod (`web`) on our node."""
        with kube.admin_client(self.root) as admin:
            kube.ensure_namespace(admin, self.namespace)
            for name, sa in (("api", "api"), ("web", "web")):
                kube.create_pod(
                    admin,
                    self.namespace,
                    name,
                    node=self.node,
                    service_account=sa,
                    labels={"app": name},
                    volumes=[identity_volume(self.signer_name)],
                )
        rest = self.rest()
        return {
            n: rest.request("GET", path_of("v1", "pods", self.namespace, n)) for n in ("api", "web")
        }

    def volume(self, pod: JSON) -> Path:
        assert self.shim is not None
        return self.shim.volume_dir(pod["metadata"]["uid"])

    def leaf(self, pod: JSON) -> x509.Certificate | None:
        try:
            pem = (self.volume(pod) / BUNDLE).read_bytes()
        except OSError:
            return None
        return x509.load_pem_x509_certificates(pem)[0] if b"CERTIFICATE" in pem else None

    def wait_identity(
        self, pod: JSON, timeout: float = 15.0, not_serial: int | None = None
    ) -> x509.Certificate:
        def probe() -> x509.Certificate | None:
            leaf = self.leaf(pod)
            return leaf if leaf is not None and leaf.serial_number != not_serial else None

        return wait_for(probe, timeout, f"credentials of {pod['metadata']['name']}")  # type: ignore[no-any-return]

    def start_pair(self, pods: dict[str, JSON], rate: float = 50.0) -> None:
        td = "cluster.local"
        self.port = free_port()
        files = {
            n: [
                "--credential-bundle",
                str(self.volume(p) / BUNDLE),
                "--trust-bundle",
                str(self.volume(p) / TRUST),
            ]
            for n, p in pods.items()
        }
        server = processes.Process(
            args=[
                *files["api"],
                f"--allow-workload={self.namespace}/web",
                "--host=127.0.0.1",
                f"--port={self.port}",
                "--reload-interval=0.5",
            ],
            log=self.work / "example-server.log",
            module="examples.mtls.server",
        ).start()
        self.pair["server"] = server
        wait_for(lambda: listening(self.port), 15, "the example server")
        self.pair["client"] = processes.Process(
            args=[
                *files["web"],
                f"--server-id=spiffe://{td}/ns/{self.namespace}/sa/api",
                f"--url=https://127.0.0.1:{self.port}/",
                f"--rate={rate}",
                "--reload-interval=0.5",
            ],
            log=self.work / "example-client.log",
            module="examples.mtls.client",
        ).start()

    def stop_pair(self) -> dict[str, Any]:
        """Stop the client, then the server; their JSON summaries (last line of output)."""
        out: dict[str, Any] = {}
        for name in ("client", "server"):
            proc = self.pair.pop(name, None)
            if proc is None:
                continue
            proc.stop()
            lines = [line for line in proc.output().splitlines() if line.startswith("{")]
            out[name] = json.loads(lines[-1]) if lines else {}
        return out

    # --- operator actions ------------------------------------------------------------------

    def podcert(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "podcert", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"podcert {' '.join(args[:3])} failed: {done.stderr.strip()[-500:]}")
        return done.stdout

    def rotate(self, pod: str) -> None:
        """Emergency re-key of one pod, as an operator would (`podcert shim rotate`)."""
        self.podcert(
            "shim",
            "rotate",
            f"--kubeconfig={self.admin_kubeconfig}",
            f"--namespace={self.namespace}",
            f"--pod={pod}",
        )

    def rekey(
        self, name: str, pod: JSON, timeout: float = 15.0
    ) -> tuple[x509.Certificate | None, x509.Certificate]:
        """Emergency re-key of one pod; its leaf before, and the new one once it is on disk."""
        old = self.leaf(pod)
        self.rotate(name)
        new = self.wait_identity(pod, timeout, not_serial=old.serial_number if old else None)
        return old, new

    def wait_server_sees(self, client: x509.Certificate, timeout: float) -> None:
        """Until the example server has logged a request made with `client`'s certificate."""
        line = f"with certificate serial {client.serial_number:x}"
        wait_for(lambda: line in self.pair["server"].output(), timeout, "the new client serial")

    def ca(self, action: str, *flags: str) -> str:
        return self.podcert(
            "signer",
            f"--kubeconfig={self.admin_kubeconfig}",
            f"--namespace={SIGNER_NAMESPACE}",
            "ca",
            action,
            *flags,
        )

    def trust_roots(self, pod: JSON) -> int:
        try:
            return (self.volume(pod) / TRUST).read_bytes().count(b"BEGIN CERTIFICATE")
        except OSError:
            return 0

    def stop(self) -> None:
        self.stop_pair()
        for proc in (self.shim, self.signer):
            if proc is not None:
                proc.stop()


def listening(port: int) -> bool:
    """Something accepts connections on the loopback `port`."""
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0
