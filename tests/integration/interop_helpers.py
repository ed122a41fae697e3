"""Running go-spiffe (tests/interop/gospiffe, built by devcluster/build.py) and the Python example
pair on projected files, so the tests can ask the reference SPIFFE library what it makes of
podcert's credentials and bundle endpoint.

Each go-spiffe subcommand prints one JSON object; a refusal is its exit status 1 and the reason
on stderr, which `GoSpiffe.run` raises as `GoSpiffeRefused` with that reason.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from devcluster import processes
from devcluster.stack import listening
from devcluster.supervise import free_port
from devcluster.testing import eventually

BUNDLE = "credentialbundle.pem"
TRUST = "trust-bundle.pem"


class GoSpiffeRefused(AssertionError):
    """go-spiffe said no; the message is its own reason."""


def flags(**values: Any) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in values.items() if v is not None]


@dataclass(frozen=True)
class Files:
    """A pod's projected identity volume: its credential bundle and trust bundle."""

    folder: Path

    @property
    def credential(self) -> Path:
        return self.folder / BUNDLE

    @property
    def trust(self) -> Path:
        return self.folder / TRUST

    def roots(self) -> int:
        try:
            return self.trust.read_bytes().count(b"BEGIN CERTIFICATE")
        except OSError:
            return 0

    def ready(self) -> bool:
        try:
            return b"CERTIFICATE" in self.credential.read_bytes() and self.roots() > 0
        except OSError:
            return False

    def args(self) -> dict[str, str]:
        return {"credential_bundle": str(self.credential), "trust_bundle": str(self.trust)}


@dataclass(frozen=True)
class GoSpiffe:
    binary: Path

    def run(self, command: str, timeout: float = 30, **values: Any) -> dict[str, Any]:
        done = subprocess.run(
            [str(self.binary), command, *flags(**values)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise GoSpiffeRefused(done.stderr.strip() or f"exit {done.returncode}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    def verify(self, files: Files) -> dict[str, Any]:
        return self.run("verify", **files.args())

    def client(self, files: Files | None, url: str, **peer: str) -> dict[str, Any]:
        """`peer`: server_id=... (AuthorizeID) or server_trust_domain=... (AuthorizeMemberOf);
        without files, workload_api=... (the SVID and bundles from a Workload API)."""
        return self.run("client", **(files.args() if files else {}), url=url, requests=3, **peer)

    @contextmanager
    def calling(self, url: str, **peer: str) -> Iterator[GoProcess]:
        """A client calling `url` with a new connection (a new handshake) every 200 ms until
        the block ends; `stop()` gives its summary. `peer` as for `client`."""
        proc = subprocess.Popen(
            [
                str(self.binary),
                "client",
                *flags(url=url, duration="30m", interval="200ms", **peer),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        running = GoProcess(proc)
        try:
            yield running
        finally:
            running.stop()

    @contextmanager
    def serve(self, files: Files | None, **peer: str) -> Iterator[GoProcess]:
        """`peer`: client_id=... (AuthorizeID) or client_trust_domain=... (AuthorizeMemberOf);
        without files, workload_api=... (the SVID and bundles from a Workload API)."""
        proc = subprocess.Popen(
            [str(self.binary), "serve", *flags(**(files.args() if files else {}), **peer)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        server = GoProcess(proc)
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            if not first:
                raise GoSpiffeRefused(_read(proc.stderr))
            server.address = json.loads(first)["listening"]
            yield server
        finally:
            server.stop()


@dataclass
class GoProcess:
    """A go-spiffe server or long-running client; `stop()` ends it and returns its summary."""

    proc: subprocess.Popen[str]
    address: str = ""
    summary: dict[str, Any] | None = None

    @property
    def url(self) -> str:
        return f"https://{self.address}/"

    def stop(self) -> dict[str, Any]:
        if self.summary is None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            out, _ = self.proc.communicate(timeout=15)
            self.summary = last_json(out) or {}
        return self.summary


def _read(stream: IO[str] | None) -> str:
    return stream.read().strip() if stream is not None else ""


def last_json(text: str) -> dict[str, Any] | None:
    """The last JSON line of a command's output (its summary), None when it printed none."""
    lines = [line for line in text.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def python_client_flags(files: Files, url: str, server_id: str, **more: Any) -> list[str]:
    """examples.mtls.client's flags: the pod's files, the server and its expected ID, `more`."""
    return flags(**files.args(), server_id=server_id, url=url, **more)


def python_client(
    files: Files, url: str, server_id: str, duration: float = 1.0, **more: Any
) -> dict[str, Any]:
    """examples.mtls.client for `duration` seconds (20 requests a second unless `rate=` says
    otherwise); its summary with its exit status (it exits 1 on any failure)."""
    more.setdefault("rate", 20)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.mtls.client",
            *python_client_flags(files, url, server_id, duration=duration, **more),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=processes.REPO,
    )
    summary = last_json(done.stdout) or {"stderr": done.stderr[-2000:], "ok": 0, "failed": -1}
    summary["exit"] = done.returncode
    return summary


@dataclass(frozen=True)
class Operator:
    """podcert's operator commands (`python -m podcert ...`) as the devcluster's admin."""

    kubeconfig: Path

    def run(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "podcert", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"podcert {' '.join(args[:3])}: {done.stderr[-2000:]}"
        return done.stdout

    def ca(self, namespace: str, action: str, *more: str) -> None:
        """`podcert signer ca <action>` on the CA of the signer in `namespace`."""
        self.run(
            "signer",
            f"--kubeconfig={self.kubeconfig}",
            f"--namespace={namespace}",
            "ca",
            action,
            *more,
        )

    def rotate(self, namespace: str, pod: str) -> None:
        """`podcert shim rotate`: a new key and leaf for one pod."""
        self.run(
            "shim",
            "rotate",
            f"--kubeconfig={self.kubeconfig}",
            f"--namespace={namespace}",
            f"--pod={pod}",
        )


@contextmanager
def python_server(files: Files, log: Path, **peer: str) -> Iterator[str]:
    """examples.mtls.server on a free loopback port; yields its URL. `peer`: allow_id=... or
    allow_trust_domain=..."""
    port = free_port()
    proc = processes.Process(
        args=flags(**files.args(), host="127.0.0.1", port=port, reload_interval=0.5, **peer),
        log=log,
        module="examples.mtls.server",
    ).start()
    try:
        eventually(lambda: listening(port), timeout=15, what="the Python example server")
        yield f"https://127.0.0.1:{port}/"
    finally:
        proc.stop()
