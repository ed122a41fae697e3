"""Start and stop a real control plane on loopback, detached, with state under one folder: etcd,
kube-apiserver, kube-controller-manager and kube-scheduler of one Kubernetes minor (1.35, 1.36 or
1.37), with what that minor needs switched on for pod certificates.

The folder holds everything: PKI, etcd data, logs, `state.json` (ports and pids) and
`admin.kubeconfig`. `up` returns only when every component answers; `down` stops the kubelets
started with `devcluster.nodes` too, and leaves no process behind. `devcluster.upgrade` moves a
running control plane to the next minor in place, on the same etcd data.
"""

import contextlib
import datetime as dt
import functools
import ssl
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from devcluster import nodes, pki
from devcluster.build import DEFAULT_KUBE_VERSION, Binaries, ensure_binaries
from devcluster.flags import apiserver_args, controller_manager_args, etcd_args, scheduler_args
from devcluster.identities import (
    Paths,
    admin_ssl,
    cert_creds,
    kubeconfig,
    load_ca,
    write_component_identities,
    write_pki,
)
from devcluster.planestate import State, processes, read_state, running, save
from devcluster.supervise import (
    ClusterError,
    Progress,
    exited,
    free_port,
    get_ok,
    spawn,
    stop,
    wait_until,
)

READY_TIMEOUT = 180.0


def insecure_ssl() -> ssl.SSLContext:
    """The controller-manager and scheduler serve /healthz with a certificate they make up."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def up(
    root: Path,
    *,
    kube_version: str = DEFAULT_KUBE_VERSION,
    binaries: Binaries | None = None,
    progress: Progress = lambda _line: None,
    timeout: float = READY_TIMEOUT,
    apiserver_profiling: bool = False,
) -> State:
    """Start the control plane of `kube_version` under `root` and wait until every part answers
    (with `apiserver_profiling`, the API server serves /debug/pprof to the admin). Idempotent
    for the same version."""
    paths = Paths(root.resolve())
    paths.root.mkdir(parents=True, exist_ok=True)
    current = running(paths)
    if current is not None:
        if current.kube_version != kube_version:
            raise ClusterError(
                f"a {current.kube_version} devcluster already runs under {paths.root}; "
                f"stop it (down) before starting {kube_version}, or upgrade it in place "
                f"(upgrade --kube-version {kube_version})"
            )
        progress(f"devcluster {current.kube_version} already running at {current.server}")
        return current
    down(paths.root)  # clear the remains of a half-dead cluster
    bins = binaries or ensure_binaries(progress, kube_version)
    now = dt.datetime.now(dt.UTC)
    write_pki(paths, now)

    etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
    kcm_port, scheduler_port = free_port(), free_port()
    server = f"https://127.0.0.1:{api_port}"
    write_component_identities(paths, server, now)
    logs = {
        name: paths.logs / f"{name}.log"
        for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
    }
    progress(f"starting etcd on 127.0.0.1:{etcd_port}")
    etcd = spawn(etcd_args(bins.etcd, paths, etcd_port, peer_port), logs["etcd"])
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
        controller_manager_version=kube_version,
        scheduler_version=kube_version,
        apiserver_profiling=apiserver_profiling,
    )
    save(paths, state)
    deadline = time.monotonic() + timeout
    try:
        wait_until(
            lambda: get_ok(f"http://127.0.0.1:{etcd_port}/health"),
            deadline,
            "etcd",
            failed=exited(etcd, logs["etcd"]),
        )
        progress(f"starting kube-apiserver {kube_version} on 127.0.0.1:{api_port}")
        api = spawn(
            apiserver_args(
                bins.kube_apiserver,
                paths,
                etcd_port,
                api_port,
                kube_version,
                profiling=apiserver_profiling,
            ),
            logs["kube-apiserver"],
        )
        state = State(**{**asdict(state), "apiserver_pid": api.pid})
        save(paths, state)
        wait_until(
            lambda: get_ok(f"{server}/readyz", admin_ssl(paths)),
            deadline,
            "kube-apiserver",
            interval=0.25,
            failed=exited(api, logs["kube-apiserver"]),
        )
        progress("starting kube-controller-manager and kube-scheduler")
        kcm = spawn(
            controller_manager_args(bins.kube_controller_manager, paths, kcm_port, kube_version),
            logs["kube-controller-manager"],
        )
        scheduler = spawn(
            scheduler_args(bins.kube_scheduler, paths, scheduler_port, kube_version),
            logs["kube-scheduler"],
        )
        state = State(
            **{**asdict(state), "controller_manager_pid": kcm.pid, "scheduler_pid": scheduler.pid}
        )
        save(paths, state)
        insecure = insecure_ssl()
        for name, proc, port in (
            ("kube-controller-manager", kcm, kcm_port),
            ("kube-scheduler", scheduler, scheduler_port),
        ):
            healthz = f"https://127.0.0.1:{port}/healthz"
            wait_until(
                functools.partial(get_ok, healthz, insecure),
                deadline,
                name,
                interval=0.25,
                failed=exited(proc, logs[name]),
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


def down(root: Path, grace: float = 10.0) -> None:
    """Stop the kubelets and the control plane that `up` started under `root`; a no-op when
    nothing runs."""
    paths = Paths(root.resolve())
    nodes.stop_all(paths.root)
    state = read_state(paths)
    if state is None:
        return
    for pid, binary in processes(state):
        stop(pid, binary, grace)
    paths.state.unlink(missing_ok=True)


def restart_apiserver(root: Path, timeout: float = READY_TIMEOUT) -> State:
    """Stop and start only kube-apiserver (same port, same etcd): for fault-injection tests."""
    paths = Paths(root.resolve())
    state = read_state(paths)
    if state is None:
        raise ClusterError(f"no devcluster state under {paths.root}")
    stop(state.apiserver_pid, state.apiserver_binary, 10.0)
    log = paths.logs / "kube-apiserver.log"
    args = apiserver_args(
        Path(state.apiserver_binary),
        paths,
        state.etcd_port,
        state.apiserver_port,
        state.kube_version,
        profiling=state.apiserver_profiling,
    )
    proc = spawn(args, log)
    state = State(**{**asdict(state), "apiserver_pid": proc.pid})
    save(paths, state)
    ctx = admin_ssl(paths)
    wait_until(
        lambda: get_ok(f"{state.server}/readyz", ctx),
        time.monotonic() + timeout,
        "kube-apiserver",
        interval=0.25,
        failed=exited(proc, log),
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
