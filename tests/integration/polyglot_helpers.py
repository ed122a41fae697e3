"""Credential folders and the example programs of every language, as the polyglot tests use them.

A `Folder` is a pod's SPIFFE Filesystem Delivery credential folder (`credential-bundle.pem`, the
PKCS#8 key then the chain; one `<trust-domain>.trust-bundle.pem` per trust domain), written by
the shim's atomic writer with leaves the signer's own code signs. `Program` runs the Go or Java
example (examples/go, examples/java) as a server or a client; `PythonServer` and `PythonClient`
run the Python example pair (examples/mtls) on the same folder's files. Every process writes
its output to a log file the tests poll; nothing here sleeps.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from devcluster import processes
from devcluster.stack import listening
from devcluster.supervise import end, free_port
from devcluster.testing import eventually
from kubelet_shim.atomic import AtomicDirStorage
from kubelet_shim.storage import FileSpec
from podcert.api import keys
from signer import certs, model
from signer.authority import ca

CREDENTIAL = "credential-bundle.pem"
TRUST_SUFFIX = ".trust-bundle.pem"
DEADLINE = 30.0  # seconds any one condition may take to come true
RELOADED = "new TLS material"  # what the Python side logs on each reload


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def pem(*certificates: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


def serial_of(chain_pem: bytes) -> str:
    return f"{x509.load_pem_x509_certificate(chain_pem).serial_number:x}"


@dataclass
class Folder:
    """One pod's credential folder, rewritten whole (atomically) at every change."""

    storage: AtomicDirStorage
    uid: str
    spiffe_id: str
    credential: bytes = b""
    serial: str = ""  # the current leaf's (hex)
    bundles: dict[str, bytes] = field(default_factory=dict)  # trust domain -> roots (PEM)

    @property
    def path(self) -> Path:
        return self.storage.volume_dir(self.uid, "credentials")

    def issue(
        self,
        issuer: ca.CABundle,
        key_type: keys.KeyType = "ECDSAP256",
        spiffe_id: str | None = None,
    ) -> str:
        """A new key of `key_type` and a leaf for it from `issuer`, signed by the signer's own
        code; the trust bundles stay as they are. Returns the leaf's serial (hex)."""
        key = keys.generate(key_type)
        not_before = now() - dt.timedelta(minutes=1)
        plan = model.LeafPlan(
            public_key=key.public_key(),
            spiffe_id=spiffe_id or self.spiffe_id,
            dns_names=(),
            not_before=not_before,
            not_after=not_before + dt.timedelta(hours=1),
            begin_refresh_at=not_before + dt.timedelta(minutes=30),
        )
        chain = certs.sign_leaf(plan, ca.issuing_ca(issuer), certs.random_serial()).encode()
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        self.credential = key_pem + chain
        self.serial = serial_of(chain)
        self._write()
        return self.serial

    def trust(self, trust_domain: str, *roots: x509.Certificate) -> None:
        """Set one trust domain's roots; none removes its file (de-federation)."""
        if roots:
            self.bundles[trust_domain] = pem(*roots)
        else:
            self.bundles.pop(trust_domain, None)
        self._write()

    def _write(self) -> None:
        files = {CREDENTIAL: FileSpec(self.credential, 0o600)} if self.credential else {}
        files |= {td + TRUST_SUFFIX: FileSpec(roots) for td, roots in self.bundles.items()}
        self.storage.write_volume(self.uid, "credentials", files, None)

    def python_args(self, trust_domain: str) -> list[str]:
        """The Python example reads the same files by name: the credential bundle and our
        trust domain's bundle."""
        return [
            f"--credential-bundle={self.path / CREDENTIAL}",
            f"--trust-bundle={self.path / (trust_domain + TRUST_SUFFIX)}",
        ]


def json_lines(text: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line cut short while it is written
    return out


@dataclass
class Running:
    """A child process whose stdout and stderr go to one log file."""

    proc: subprocess.Popen[bytes]
    log: Path
    summary: dict[str, Any] | None = None

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in json_lines(self.output()) if e.get("event") == kind]

    def stop(self) -> dict[str, Any]:
        """SIGTERM, then the summary it printed last (a JSON line without "event")."""
        if self.summary is None:
            end(self.proc, 20)
            lines = [e for e in json_lines(self.output()) if "event" not in e]
            assert lines, f"{self.log.name} printed no summary:\n{self.output()[-3000:]}"
            self.summary = {**lines[-1], "exit": self.proc.returncode}
        return self.summary

    def wait(self, timeout: float = 60) -> dict[str, Any]:
        """Its own end (a client given --requests), then its summary."""
        self.proc.wait(timeout)
        return self.stop()


def start(command: list[str], log: Path, env: dict[str, str] | None = None) -> Running:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=processes.REPO,
        )
    return Running(proc, log)


@dataclass(frozen=True)
class Program:
    """The Go or the Java example: `command` runs it (`server` or `client` follows)."""

    language: str
    command: tuple[str, ...]

    def server(self, folder: Folder, log: Path, *peer: str) -> tuple[Running, str]:
        """A server on a free loopback port, peer rules as flags; it and its URL."""
        port = free_port()
        running = start(
            [
                *self.command,
                "server",
                f"--folder={folder.path}",
                f"--listen=127.0.0.1:{port}",
                *peer,
            ],
            log,
        )
        eventually(
            lambda: running.events("listening") or _exited(running),
            timeout=DEADLINE,
            what=f"the {self.language} server listening",
        )
        return running, f"https://127.0.0.1:{port}/"

    def client(self, folder: Folder, url: str, log: Path, *flags: str) -> Running:
        """A client calling `url`; flags: the peer rules, --requests/--duration/--rate."""
        return start(
            [*self.command, "client", f"--folder={folder.path}", f"--url={url}", *flags], log
        )


def _exited(running: Running) -> bool:
    if running.proc.poll() is not None:
        raise AssertionError(f"{running.log.name} exited early:\n{running.output()[-3000:]}")
    return False


def python_server(folder: Folder, trust_domain: str, log: Path, *peer: str) -> tuple[Running, str]:
    """examples.mtls.server on the folder's files, on a free loopback port; it and its URL."""
    port = free_port()
    running = start(
        [
            sys.executable,
            "-m",
            "examples.mtls.server",
            *folder.python_args(trust_domain),
            "--host=127.0.0.1",
            f"--port={port}",
            "--reload-interval=0.5",
            *peer,
        ],
        log,
    )
    eventually(
        lambda: listening(port) or _exited(running), timeout=DEADLINE, what="the Python server"
    )
    return running, f"https://127.0.0.1:{port}/"


def python_client(folder: Folder, trust_domain: str, url: str, log: Path, *flags: str) -> Running:
    """examples.mtls.client on the folder's files, 20 calls a second until stopped (unless
    `flags` say otherwise)."""
    return start(
        [
            sys.executable,
            "-m",
            "examples.mtls.client",
            *folder.python_args(trust_domain),
            f"--url={url}",
            "--rate=20",
            "--reload-interval=0.5",
            *flags,
        ],
        log,
    )


def reloads(running: Running) -> int:
    """How often the Python side swapped in new material (its first load is one)."""
    return running.output().count(RELOADED)
