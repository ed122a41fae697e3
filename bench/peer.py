"""The Go signer podcert is measured against, run beside it on one devcluster.

The source is `../shared/peer` next to this checkout (or `--peer PATH`, or PODCERT_PEER): a
controller-runtime PodCertificateRequest signer (informer caches, N reconcile workers) ported to
certificates.k8s.io/v1, whose README says how it was measured. It is built once per content of
its sources into the cache, as the devcluster's binaries are, and runs as the cluster's admin
with a P-256 CA in files made here, as its README runs it. It checks much less than podcert
(the pod's name only: no node, UID or ServiceAccount re-checks, no audit log), so a ratio
against it prices podcert's checks too.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Self

from devcluster import build, identities, pki, processes

REPO: Final = Path(__file__).resolve().parents[1]
BINARY: Final = "pcs-controller"


def source(explicit: Path | None = None) -> Path:
    """Where the peer's Go module is: `explicit`, else PODCERT_PEER, else ../shared/peer."""
    if explicit is not None:
        return explicit.resolve()
    if env := os.environ.get("PODCERT_PEER"):
        return Path(env).resolve()
    return (REPO.parent / "shared" / "peer").resolve()


def ensure(folder: Path) -> Path:
    """The peer's binary, built into the cache on first use (about a minute)."""
    return build.ensure_module_program(folder, BINARY, "./cmd")


def make_ca(folder: Path, now: dt.datetime) -> tuple[Path, Path]:
    """A P-256 CA for the peer (`ca.pem`, `ca-key.pem`, the key 0600 from the start), made as
    the devcluster makes its own (`devcluster.pki`)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = pki.make_ca("peer-ca", now)
    cert_path, key_path = folder / "ca.pem", folder / "ca-key.pem"
    cert_path.write_bytes(ca.cert_pem)
    pki.write_private(key_path, ca.key_pem)
    return cert_path, key_path


@dataclass
class Peer(processes.Process):
    """One run of the peer, a `devcluster.processes.Process` whose command is the Go binary."""

    binary: Path = Path()

    @classmethod
    def for_cluster(cls, binary: Path, root: Path, work: Path, signer: str, workers: int) -> Peer:
        ca, ca_key = make_ca(work / "peer-ca", dt.datetime.now(dt.UTC))
        args = [
            f"--kubeconfig={identities.Paths(root.resolve()).admin_kubeconfig}",
            f"--signer-name={signer}",
            f"--ca-cert-path={ca}",
            f"--ca-key-path={ca_key}",
            "--metrics-bind-address=0",
            "--health-probe-bind-address=0",
            "--zap-devel=false",
            "--zap-log-level=info",
            f"--max-concurrent-reconciles={workers}",
        ]
        return cls(args=args, log=work / f"peer-{signer.replace('/', '_')}.log", binary=binary)

    def start(self) -> Self:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(self.binary), *self.args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
            )
        return self
