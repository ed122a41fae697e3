"""Start and stop a real etcd + kube-apiserver on loopback, detached, with state under one folder.

The folder holds everything: PKI, etcd data, logs, `state.json` (ports and pids) and
`admin.kubeconfig`. `up` returns only when /readyz answers; `down` leaves no process behind.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from devcluster import pki
from devcluster.build import Binaries, ensure_binaries

Progress = Callable[[str], None]

SERVICE_CIDR = "10.0.0.0/24"
ISSUER = "https://kubernetes.default.svc"
READY_TIMEOUT = 180.0


class ClusterError(RuntimeError):
    """The control plane did not come up (or down); the message says which process and why."""


@dataclass(frozen=True)
class State:
    etcd_pid: int
    apiserver_pid: int
    etcd_port: int
    apiserver_port: int
    etcd_binary: str
    apiserver_binary: str

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"


@dataclass(frozen=True)
class Paths:
    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    def node_kubeconfig(self, node: str) -> Path:
        return self.root / "nodes" / f"{node}.kubeconfig"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def kubeconfig(server: str, ca_pem: bytes, user: str, creds: dict[str, str]) -> str:
    """A one-cluster, one-user kubeconfig. `creds` is either client cert/key data or a token."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "devcluster",
                    "cluster": {
                        "server": server,
                        "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                    },
                }
            ],
            "users": [{"name": user, "user": creds}],
            "contexts": [{"name": user, "context": {"cluster": "devcluster", "user": user}}],
            "current-context": user,
        },
        sort_keys=False,
    )


def cert_creds(pair: pki.KeyPair) -> dict[str, str]:
    return {
        "client-certificate-data": base64.b64encode(pair.cert_pem).decode(),
        "client-key-data": base64.b64encode(pair.key_pem).decode(),
    }


def _write_pki(paths: Paths, now: dt.datetime) -> None:
    """Create the CA, serving and admin certificates, and the service-account key, once."""
    paths.pki.mkdir(parents=True, exist_ok=True, mode=0o700)
    if (paths.pki / "ca.crt").exists():
        return
    ca = pki.make_ca("podcert-devcluster-ca", now)
    serving = pki.issue(
        ca,
        "kube-apiserver",
        now,
        server_names=(
            "127.0.0.1",
            "localhost",
            "10.0.0.1",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
        ),
        client=False,
    )
    admin = pki.issue(ca, "podcert-admin", now, organizations=("system:masters",))
    pki.write_private(paths.pki / "ca.key", ca.key_pem)
    pki.write_private(paths.pki / "apiserver.key", serving.key_pem)
    pki.write_private(paths.pki / "admin.key", admin.key_pem)
    sa_private, sa_public = pki.service_account_key()
    pki.write_private(paths.pki / "sa.key", sa_private)
    (paths.pki / "sa.pub").write_bytes(sa_public)
    (paths.pki / "apiserver.crt").write_bytes(serving.cert_pem)
    (paths.pki / "admin.crt").write_bytes(admin.cert_pem)
    (paths.pki / "ca.crt").write_bytes(ca.cert_pem)


def load_ca(paths: Paths) -> pki.KeyPair:
    return pki.KeyPair((paths.pki / "ca.crt").read_bytes(), (paths.pki / "ca.key").read_bytes())


def etcd_args(binary: Path, paths: Paths, client_port: int, peer_port: int) -> list[str]:
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        str(binary),
        "--name=devcluster",
        f"--data-dir={paths.root / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=devcluster={peer}",
        # A throwaway test store: durability across power loss buys nothing here.
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def apiserver_args(binary: Path, paths: Paths, etcd_port: int, port: int) -> list[str]:
    p = paths.pki
    return [
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        # Loopback cannot back the kubernetes Service endpoints; nothing here needs them.
        "--endpoint-reconciler-type=none",
        f"--secure-port={port}",
        f"--cert-dir={p}",
        f"--tls-cert-file={p / 'apiserver.crt'}",
        f"--tls-private-key-file={p / 'apiserver.key'}",
        f"--client-ca-file={p / 'ca.crt'}",
        f"--service-account-issuer={ISSUER}",
        f"--service-account-key-file={p / 'sa.pub'}",
        f"--service-account-signing-key-file={p / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        # Serve the older API beside v1 so the code can be tested against 1.35/1.36 clusters.
        "--runtime-config=certificates.k8s.io/v1beta1=true",
        "--allow-privileged=true",
        "--profiling=false",
        "--v=1",
    ]


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # detached: survives the caller, has its own process group
        )


def _exited(proc: subprocess.Popen[bytes], log: Path) -> Callable[[], str | None]:
    """A `failed` probe for wait_until: the process ended, with its log tail as the reason."""
    return lambda: (
        None
        if proc.poll() is None
        else (f"exited with code {proc.returncode}; log tail:\n{_log_tail(log)}")
    )


def _alive(pid: int, binary: str) -> bool:
    """True when `pid` runs `binary` (a recycled pid of another program does not count)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return cmdline.split(b"\0", 1)[0].decode(errors="replace") == binary


def _log_tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_until(
    check: Callable[[], bool],
    deadline: float,
    what: str,
    *,
    interval: float = 0.1,
    failed: Callable[[], str | None] = lambda: None,
) -> None:
    """Poll `check` until it holds, `failed` reports a reason, or the monotonic deadline passes."""
    while True:
        if check():
            return
        reason = failed()
        if reason:
            raise ClusterError(f"{what}: {reason}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{what}: not ready before the deadline")
        time.sleep(interval)


def _admin_ssl(paths: Paths) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(paths.pki / "ca.crt"))
    ctx.load_cert_chain(str(paths.pki / "admin.crt"), str(paths.pki / "admin.key"))
    return ctx


def _get_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:  # noqa: S310 (own URL)
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def read_state(paths: Paths) -> State | None:
    try:
        return State(**json.loads(paths.state.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def running(paths: Paths) -> State | None:
    state = read_state(paths)
    if state is None:
        return None
    if _alive(state.etcd_pid, state.etcd_binary) and _alive(
        state.apiserver_pid, state.apiserver_binary
    ):
        return state
    return None


def up(
    root: Path,
    *,
    binaries: Binaries | None = None,
    progress: Progress = lambda _line: None,
    timeout: float = READY_TIMEOUT,
) -> State:
    """Start etcd and kube-apiserver under `root` and wait for /readyz. Idempotent."""
    paths = Paths(root.resolve())
    paths.root.mkdir(parents=True, exist_ok=True)
    current = running(paths)
    if current is not None:
        progress(f"devcluster already running at {current.server}")
        return current
    down(paths.root)  # clear the remains of a half-dead cluster
    bins = binaries or ensure_binaries(progress)
    _write_pki(paths, dt.datetime.now(dt.UTC))

    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    etcd_log, api_log = paths.logs / "etcd.log", paths.logs / "kube-apiserver.log"
    progress(f"starting etcd on 127.0.0.1:{etcd_port}")
    etcd = _spawn(etcd_args(bins.etcd, paths, etcd_port, peer_port), etcd_log)
    state = State(etcd.pid, 0, etcd_port, api_port, str(bins.etcd), str(bins.kube_apiserver))
    paths.state.write_text(json.dumps(asdict(state)))
    deadline = time.monotonic() + timeout
    try:
        wait_until(
            lambda: _get_ok(f"http://127.0.0.1:{etcd_port}/health"),
            deadline,
            "etcd",
            failed=_exited(etcd, etcd_log),
        )
        progress(f"starting kube-apiserver on 127.0.0.1:{api_port}")
        api = _spawn(apiserver_args(bins.kube_apiserver, paths, etcd_port, api_port), api_log)
        state = State(
            etcd.pid, api.pid, etcd_port, api_port, str(bins.etcd), str(bins.kube_apiserver)
        )
        paths.state.write_text(json.dumps(asdict(state)))
        ctx = _admin_ssl(paths)
        wait_until(
            lambda: _get_ok(f"{state.server}/readyz", ctx),
            deadline,
            "kube-apiserver",
            interval=0.25,
            failed=_exited(api, api_log),
        )
    except BaseException:
        down(paths.root)
        raise
    admin = pki.KeyPair(
        (paths.pki / "admin.crt").read_bytes(), (paths.pki / "admin.key").read_bytes()
    )
    pki.write_private(
        paths.admin_kubeconfig,
        kubeconfig(state.server, load_ca(paths).cert_pem, "admin", cert_creds(admin)).encode(),
    )
    progress(f"devcluster ready at {state.server}; kubeconfig {paths.admin_kubeconfig}")
    return state


def _stop(pid: int, binary: str, grace: float) -> None:
    if not pid or not _alive(pid, binary):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pid, binary) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid, binary):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        hard = time.monotonic() + 5
        while _alive(pid, binary) and time.monotonic() < hard:
            time.sleep(0.05)
    if _alive(pid, binary):
        raise ClusterError(f"{Path(binary).name} (pid {pid}) did not stop")


def down(root: Path, grace: float = 10.0) -> None:
    """Stop whatever `up` started under `root`; a no-op when nothing runs."""
    paths = Paths(root.resolve())
    state = read_state(paths)
    if state is None:
        return
    _stop(state.apiserver_pid, state.apiserver_binary, grace)
    _stop(state.etcd_pid, state.etcd_binary, grace)
    paths.state.unlink(missing_ok=True)


def restart_apiserver(root: Path, timeout: float = READY_TIMEOUT) -> State:
    """Stop and start only kube-apiserver (same port, same etcd): for fault-injection tests."""
    paths = Paths(root.resolve())
    state = read_state(paths)
    if state is None:
        raise ClusterError(f"no devcluster state under {paths.root}")
    _stop(state.apiserver_pid, state.apiserver_binary, 10.0)
    log = paths.logs / "kube-apiserver.log"
    args = apiserver_args(
        Path(state.apiserver_binary), paths, state.etcd_port, state.apiserver_port
    )
    proc = _spawn(args, log)
    state = State(**{**asdict(state), "apiserver_pid": proc.pid})
    paths.state.write_text(json.dumps(asdict(state)))
    ctx = _admin_ssl(paths)
    wait_until(
        lambda: _get_ok(f"{state.server}/readyz", ctx),
        time.monotonic() + timeout,
        "kube-apiserver",
        interval=0.25,
        failed=_exited(proc, log),
    )
    return state


@contextlib.contextmanager
def running_cluster(root: Path, progress: Progress = lambda _line: None) -> Iterator[State]:
    state = up(root, progress=progress)
    try:
        yield state
    finally:
        down(root)
