"""Start and stop a real control plane on loopback, detached, with state under one folder: etcd,
kube-apiserver, kube-controller-manager and kube-scheduler of one Kubernetes minor (1.35, 1.36 or
1.37), with what that minor needs switched on for pod certificates.

The folder holds everything: PKI, etcd data, logs, `state.json` (ports and pids) and
`admin.kubeconfig`. `up` returns only when every component answers; `down` stops the kubelets
started with `devcluster.nodes` too, and leaves no process behind.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import functools
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
from typing import TypeVar

import yaml

from devcluster import pki
from devcluster.build import DEFAULT_KUBE_VERSION, Binaries, ensure_binaries

Progress = Callable[[str], None]
T = TypeVar("T")

SERVICE_CIDR = "10.0.0.0/24"
ISSUER = "https://kubernetes.default.svc"
READY_TIMEOUT = 180.0

# certificates.k8s.io/v1beta1 (ClusterTrustBundle, PodCertificateRequest) is off by default in
# every minor; 1.35 and 1.36 serve only it, 1.37 serves it beside v1 for code that speaks it.
RUNTIME_CONFIG = "certificates.k8s.io/v1beta1=true"
# pkg/features/kube_features.go: all three are beta and off by default in 1.35 and 1.36, GA (on)
# in 1.37. PodCertificateRequest also gates the podCertificate projection (kubelet, pod
# validation) and the controller-manager's request cleaner; ClusterTrustBundleProjection needs
# ClusterTrustBundle.
POD_CERTIFICATE_GATES = (
    "ClusterTrustBundle",
    "ClusterTrustBundleProjection",
    "PodCertificateRequest",
)
FEATURE_GATES = {
    "1.35": POD_CERTIFICATE_GATES,
    "1.36": POD_CERTIFICATE_GATES,
    "1.37": (),
}


def feature_gates(kube_version: str) -> dict[str, bool]:
    """The gates a minor needs switched on for pod certificates (the same for every component)."""
    return dict.fromkeys(FEATURE_GATES[kube_version], True)


def feature_gate_flags(kube_version: str) -> list[str]:
    gates = feature_gates(kube_version)
    if not gates:
        return []
    return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in gates.items())]


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
    kube_version: str = DEFAULT_KUBE_VERSION
    controller_manager_pid: int = 0
    controller_manager_binary: str = ""
    controller_manager_port: int = 0
    scheduler_pid: int = 0
    scheduler_binary: str = ""
    scheduler_port: int = 0

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

    def component_kubeconfig(self, component: str) -> Path:
        return self.root / f"{component}.kubeconfig"


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


# The identities the bootstrap RBAC expects of the control plane's own clients.
COMPONENT_USERS = {
    "kube-controller-manager": ("system:kube-controller-manager", ()),
    "kube-scheduler": ("system:kube-scheduler", ()),
}


def _write_component_identities(paths: Paths, server: str, now: dt.datetime) -> None:
    """Client certificates (and kubeconfigs) for the controller-manager, the scheduler and the
    API server's own calls to kubelets; made once, re-pointed at the current port each time."""
    ca = load_ca(paths)
    kubelet_client = paths.pki / "apiserver-kubelet-client.crt"
    if not kubelet_client.exists():
        pair = pki.issue(
            ca, "kube-apiserver-kubelet-client", now, organizations=("system:masters",)
        )
        pki.write_private(paths.pki / "apiserver-kubelet-client.key", pair.key_pem)
        kubelet_client.write_bytes(pair.cert_pem)
    for component, (user, groups) in COMPONENT_USERS.items():
        cert, key = paths.pki / f"{component}.crt", paths.pki / f"{component}.key"
        if not cert.exists():
            pair = pki.issue(ca, user, now, organizations=groups)
            pki.write_private(key, pair.key_pem)
            cert.write_bytes(pair.cert_pem)
        pair = pki.KeyPair(cert.read_bytes(), key.read_bytes())
        text = kubeconfig(server, ca.cert_pem, user, cert_creds(pair))
        pki.write_private(paths.component_kubeconfig(component), text.encode())


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


def apiserver_args(
    binary: Path,
    paths: Paths,
    etcd_port: int,
    port: int,
    kube_version: str = DEFAULT_KUBE_VERSION,
) -> list[str]:
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
        f"--runtime-config={RUNTIME_CONFIG}",
        *feature_gate_flags(kube_version),
        # Logs and exec: kubelets listen on loopback, and the node's hostname resolves nowhere.
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
        "--allow-privileged=true",
        "--profiling=false",
        "--v=1",
    ]


# Nodes without a kubelet (most tests make Node objects and bind pods to them by hand) would be
# marked unreachable, tainted, and their pods evicted after 5 minutes: the node lifecycle
# controller stays off. Every other controller runs, as in a real cluster.
CONTROLLERS = "*,-node-lifecycle-controller"


def controller_manager_args(
    binary: Path, paths: Paths, port: int, kube_version: str = DEFAULT_KUBE_VERSION
) -> list[str]:
    p = paths.pki
    return [
        str(binary),
        f"--kubeconfig={paths.component_kubeconfig('kube-controller-manager')}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={p / 'kube-controller-manager'}",
        "--leader-elect=false",
        f"--controllers={CONTROLLERS}",
        # Each controller acts as its own ServiceAccount with the bootstrap RBAC, as in kubeadm.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={p / 'sa.key'}",
        f"--root-ca-file={p / 'ca.crt'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        *feature_gate_flags(kube_version),
        "--profiling=false",
        "--v=1",
    ]


def scheduler_args(
    binary: Path, paths: Paths, port: int, kube_version: str = DEFAULT_KUBE_VERSION
) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={paths.component_kubeconfig('kube-scheduler')}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={paths.pki / 'kube-scheduler'}",
        "--leader-elect=false",
        *feature_gate_flags(kube_version),
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


def wait_until_value(
    probe: Callable[[], T | None],
    deadline: float,
    what: str,
    *,
    interval: float = 0.1,
    failed: Callable[[], str | None] = lambda: None,
) -> T:
    """Like wait_until, for a probe that returns what it found (None until then)."""
    found: list[T] = []

    def check() -> bool:
        value = probe()
        if value is not None:
            found.append(value)
        return value is not None

    wait_until(check, deadline, what, interval=interval, failed=failed)
    return found[0]


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


def _processes(state: State) -> list[tuple[int, str]]:
    """(pid, binary) of every control-plane process the state names, the API server's clients
    first (the stop order)."""
    found = [
        (state.scheduler_pid, state.scheduler_binary),
        (state.controller_manager_pid, state.controller_manager_binary),
        (state.apiserver_pid, state.apiserver_binary),
        (state.etcd_pid, state.etcd_binary),
    ]
    return [(pid, binary) for pid, binary in found if pid]


def running(paths: Paths) -> State | None:
    state = read_state(paths)
    if state is None or not state.apiserver_pid:
        return None
    if all(_alive(pid, binary) for pid, binary in _processes(state)):
        return state
    return None


def _insecure_ssl() -> ssl.SSLContext:
    """The controller-manager and scheduler serve /healthz with a certificate they make up."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _save(paths: Paths, state: State) -> None:
    paths.state.write_text(json.dumps(asdict(state)))


def up(
    root: Path,
    *,
    kube_version: str = DEFAULT_KUBE_VERSION,
    binaries: Binaries | None = None,
    progress: Progress = lambda _line: None,
    timeout: float = READY_TIMEOUT,
) -> State:
    """Start the control plane of `kube_version` under `root` and wait until every part answers.
    Idempotent for the same version."""
    paths = Paths(root.resolve())
    paths.root.mkdir(parents=True, exist_ok=True)
    current = running(paths)
    if current is not None:
        if current.kube_version != kube_version:
            raise ClusterError(
                f"a {current.kube_version} devcluster already runs under {paths.root}; "
                f"stop it (down) before starting {kube_version}"
            )
        progress(f"devcluster {current.kube_version} already running at {current.server}")
        return current
    down(paths.root)  # clear the remains of a half-dead cluster
    bins = binaries or ensure_binaries(progress, kube_version)
    now = dt.datetime.now(dt.UTC)
    _write_pki(paths, now)

    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    kcm_port, scheduler_port = free_port(), free_port()
    server = f"https://127.0.0.1:{api_port}"
    _write_component_identities(paths, server, now)
    logs = {
        name: paths.logs / f"{name}.log"
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
    }
    progress(f"starting etcd on 127.0.0.1:{etcd_port}")
    etcd = _spawn(etcd_args(bins.etcd, paths, etcd_port, peer_port), logs["etcd"])
    state = State(
        etcd.pid,
        0,
        etcd_port,
        api_port,
        str(bins.etcd),
        str(bins.kube_apiserver),
        kube_version=kube_version,
        controller_manager_binary=str(bins.kube_controller_manager),
        controller_manager_port=kcm_port,
        scheduler_binary=str(bins.kube_scheduler),
        scheduler_port=scheduler_port,
    )
    _save(paths, state)
    deadline = time.monotonic() + timeout
    try:
        wait_until(
            lambda: _get_ok(f"http://127.0.0.1:{etcd_port}/health"),
            deadline,
            "etcd",
            failed=_exited(etcd, logs["etcd"]),
        )
        progress(f"starting kube-apiserver {kube_version} on 127.0.0.1:{api_port}")
        api = _spawn(
            apiserver_args(bins.kube_apiserver, paths, etcd_port, api_port, kube_version),
            logs["kube-apiserver"],
        )
        state = State(**{**asdict(state), "apiserver_pid": api.pid})
        _save(paths, state)
        wait_until(
            lambda: _get_ok(f"{server}/readyz", _admin_ssl(paths)),
            deadline,
            "kube-apiserver",
            interval=0.25,
            failed=_exited(api, logs["kube-apiserver"]),
        )
        progress("starting kube-controller-manager and kube-scheduler")
        kcm = _spawn(
            controller_manager_args(bins.kube_controller_manager, paths, kcm_port, kube_version),
            logs["kube-controller-manager"],
        )
        scheduler = _spawn(
            scheduler_args(bins.kube_scheduler, paths, scheduler_port, kube_version),
            logs["kube-scheduler"],
        )
        state = State(
            **{**asdict(state), "controller_manager_pid": kcm.pid, "scheduler_pid": scheduler.pid}
        )
        _save(paths, state)
        insecure = _insecure_ssl()
        for name, proc, port in (
            ("kube-controller-manager", kcm, kcm_port),
            ("kube-scheduler", scheduler, scheduler_port),
        ):
            healthz = f"https://127.0.0.1:{port}/healthz"
            wait_until(
                functools.partial(_get_ok, healthz, insecure),
                deadline,
                name,
                interval=0.25,
                failed=_exited(proc, logs[name]),
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
    progress(
        f"devcluster {kube_version} ready at {state.server}; kubeconfig {paths.admin_kubeconfig}"
    )
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
    """Stop the kubelets and the control plane that `up` started under `root`; a no-op when
    nothing runs."""
    from devcluster import nodes  # nodes builds on this module

    paths = Paths(root.resolve())
    nodes.stop_all(paths.root)
    state = read_state(paths)
    if state is None:
        return
    for pid, binary in _processes(state):
        _stop(pid, binary, grace)
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
        Path(state.apiserver_binary),
        paths,
        state.etcd_port,
        state.apiserver_port,
        state.kube_version,
    )
    proc = _spawn(args, log)
    state = State(**{**asdict(state), "apiserver_pid": proc.pid})
    _save(paths, state)
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
def running_cluster(
    root: Path,
    progress: Progress = lambda _line: None,
    kube_version: str = DEFAULT_KUBE_VERSION,
) -> Iterator[State]:
    state = up(root, progress=progress, kube_version=kube_version)
    try:
        yield state
    finally:
        down(root)
