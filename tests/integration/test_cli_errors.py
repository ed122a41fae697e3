"""The cases of tests/unit/test_cli_errors.py that need a real API server: credentials
it refuses (401) or that lack the rights (403) answer in one line and exit 1 at every command (3
at the read commands: they could not read the cluster), and a signer whose API server goes away
after it started keeps running, says so without a traceback, and issues again when the server
is back."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import kube, processes
from devcluster.identities import Paths
from devcluster.testing import DevCluster, eventually
from podcert.errors import EXIT_CLUSTER_UNREADABLE
from tests.integration.conftest import StartSigner
from tests.integration.helpers import condition, make_pod, request_as_node, settled
from tests.unit.test_cli_errors import EVERY_COMMAND, READ_COMMANDS, commands

REPO = Path(__file__).resolve().parents[2]
DAEMONS = ("signer", "shim")


def podcert(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "podcert", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        check=False,
    )


@pytest.fixture(scope="module")
def wrong_token(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The admin kubeconfig with a token the API server never issued instead of its cert."""
    config = yaml.safe_load(Paths(devcluster.root.resolve()).admin_kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": "not-a-token-anyone-issued"}
    path = tmp_path_factory.mktemp("creds") / "wrong-token.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def no_rights(devcluster: DevCluster) -> Path:
    """A user the API server knows (client certificate) and no RBAC grants anything."""
    return kube.user_kubeconfig(devcluster.root, "podcert-nobody")


REFUSALS = [
    pytest.param("wrong_token", "401", "credentials are not valid", id="401"),
    pytest.param("no_rights", "403", "lacks a permission", id="403"),
]


@pytest.mark.parametrize(("kubeconfig", "status", "hint"), REFUSALS)
@pytest.mark.parametrize("command", EVERY_COMMAND)
def test_refused_credentials_are_one_line_and_exit_1_or_3(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    command: str,
    kubeconfig: str,
    status: str,
    hint: str,
) -> None:
    argv = commands(request.getfixturevalue(kubeconfig), tmp_path)[command]
    if command in DAEMONS:
        argv.append("--metrics-port=0")

    done = podcert(argv)

    if (command, status) == ("version", "403"):
        # Discovery is open to every authenticated identity: only the signer's part is refused.
        assert done.returncode == 0, done.stderr
        assert "Signer:            unknown: the lease" in done.stdout
        assert "is not readable by this identity (403 Forbidden)" in done.stdout
        return
    assert "Traceback" not in done.stderr, done.stderr
    # A read command tells a cluster it may not read (3) from findings (1).
    assert done.returncode == (EXIT_CLUSTER_UNREADABLE if command in READ_COMMANDS else 1), (
        done.stderr
    )
    lines = done.stderr.strip().splitlines()
    if command in DAEMONS:
        # A daemon retries a refusal a few times (a binding may be on its way), then gives up
        # in one error line.
        errors = [line for line in lines if '"level": "error"' in line]
        assert len(errors) == 1, done.stderr
        assert hint in errors[0] and status in errors[0]
    else:
        assert len(lines) == 1, done.stderr
        assert status in lines[0]


class Proxy:
    """A TCP relay on a fixed local port to the API server, that can be cut (every connection
    closed, nothing listening) and put back: an API server lost after start, as seen from one
    client, without disturbing the session's cluster."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self.listener: socket.socket | None = None
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()

    def start(self) -> Proxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                down, _ = listener.accept()
                up = socket.create_connection(self.upstream)
            except OSError:
                return
            with self.lock:
                self.conns += [down, up]
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        with self.lock:
            conns, self.conns = self.conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


@pytest.fixture
def proxy(devcluster: DevCluster) -> Any:
    server = devcluster.state.server.removeprefix("https://")
    host, port = server.rsplit(":", 1)
    relay = Proxy((host, int(port))).start()
    yield relay
    relay.cut()


def test_a_signer_that_loses_its_api_server_after_start_says_so_and_recovers(
    devcluster: DevCluster, start_signer: StartSigner, proxy: Proxy, tmp_path: Path
) -> None:
    signer_name = "lost.podcert.dev/main"
    # The signer's own identity and RBAC, through the relay.
    identity = processes.install_signer_identity(
        devcluster.root, "podcert-lost", [signer_name], "podcert-lost"
    )
    config = yaml.safe_load(identity.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    relayed = tmp_path / "relayed.kubeconfig"
    relayed.write_text(yaml.safe_dump(config))
    signer = start_signer(
        signer_name,
        namespace="podcert-lost",
        workdir=tmp_path,
        extra=[f"--kubeconfig={relayed}"],
    )
    ns = devcluster.namespace("lost")
    pod = make_pod(devcluster, ns, "app", signer_name, node="lost-node")
    assert (
        condition(settled(devcluster, request_as_node(devcluster, pod, signer_name)[1])).type
        == "Issued"
    )

    proxy.cut()
    eventually(
        lambda: "Connection refused" in signer.output(),
        timeout=60,
        what="the signer to notice its API server is gone",
    )
    assert signer.running
    _, waiting = request_as_node(devcluster, pod, signer_name)
    proxy.start()  # the same port again

    assert condition(settled(devcluster, waiting, timeout=120)).type == "Issued"
    assert signer.running
    assert "Traceback" not in signer.output()
