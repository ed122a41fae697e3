"""The faults of the chaos soak (`bench.soak`), each one thing that happens to real clusters, and
the CA rotation that runs through them.

A fault returns a short description of what it did. Killed processes come back after a short
delay, as their Deployment or DaemonSet would bring them back. The CA rotation is a campaign of
several steps (prepare, activate, re-key, retire) that the soak advances between faults, so every
other fault also lands in the middle of a rotation.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.soak_fleet import Fleet, Pod, read_credential, trust_roots
from devcluster import cluster, nodes, planestate
from devcluster.identities import Paths
from devcluster.planestate import State
from podcert.api.volumes import volume_dir

FAULTS = (
    "kill-leader",
    "kill-shim",
    "restart-apiserver",
    "pause-etcd",
    "cut-watches",
    "rotate-service-account",
    "ca-rotation",
    "restart-kubelet",
)
ETCD_PAUSE = 5.0


@dataclass
class Restart:
    at: float  # monotonic
    what: str
    start: Callable[[], None]


@dataclass
class Faults:
    fleet: Fleet
    rng: random.Random
    pending: list[Restart] = field(default_factory=list)
    campaign: CaRotation | None = None
    rotations_done: list[dict[str, float]] = field(default_factory=list)
    restarts: int = 0

    def run(self, name: str) -> str:
        return {
            "kill-leader": self.kill_leader,
            "kill-shim": self.kill_shim,
            "restart-apiserver": self.restart_apiserver,
            "pause-etcd": self.pause_etcd,
            "cut-watches": self.cut_watches,
            "rotate-service-account": self.rotate_service_account,
            "ca-rotation": self.start_ca_rotation,
            "restart-kubelet": self.restart_kubelet,
        }[name]()

    def eligible(self) -> list[str]:
        return [f for f in FAULTS if f != "ca-rotation" or self.campaign is None]

    # --- processes ---------------------------------------------------------------------------

    def kill_leader(self) -> str:
        leader = self.fleet.leader()
        for proc in self.fleet.signers:
            identity = _identity(proc.args)
            if leader == identity and proc.running:
                proc.kill()
                # It comes back as a new pod would: under a new name, so the lease must pass
                # to the other replica (or wait out its duration), not resume under the old one.
                self.restarts += 1
                proc.args = [
                    f"--identity={identity.split('.')[0]}.{self.restarts}"
                    if a.startswith("--identity=")
                    else a
                    for a in proc.args
                ]
                self._restart_later(identity, proc.start, 2.0)
                return f"SIGKILL {identity} (the leader)"
        return f"no running leader to kill (lease holder {leader})"

    def kill_shim(self) -> str:
        node = self.rng.choice(sorted(self.fleet.shims))
        proc = self.fleet.shims[node]
        if not proc.running:
            return f"shim on {node} already down"
        proc.kill()
        self._restart_later(f"shim {node}", proc.start, 1.0)
        return f"SIGKILL the shim of {node}"

    def restart_kubelet(self) -> str:
        if self.fleet.kubelet is None:
            return "no kubelet"
        self.fleet.kubelet = nodes.restart_kubelet(self.fleet.root, self.fleet.kubelet.node)
        if not self.fleet.kubelet_is_real:  # kubemark makes a new root on each start
            for pod in self.fleet.pods:
                if pod.node == self.fleet.kubelet.node:
                    pod.folder = volume_dir(self.fleet.kubelet.root, pod.uid, "identity")
        return f"restart the kubelet of {self.fleet.kubelet.node}"

    def _restart_later(self, what: str, start: Callable[[], object], delay: float) -> None:
        self.pending.append(Restart(time.monotonic() + delay, what, lambda: _ignore(start())))

    def restart_due(self) -> list[str]:
        now = time.monotonic()
        due = [r for r in self.pending if r.at <= now]
        self.pending = [r for r in self.pending if r.at > now]
        for restart in due:
            restart.start()
        return [r.what for r in due]

    # --- the control plane ---------------------------------------------------------------------

    def _state(self) -> State:
        state = planestate.read_state(Paths(self.fleet.root.resolve()))
        assert state is not None
        return state

    def restart_apiserver(self) -> str:
        started = time.monotonic()
        cluster.restart_apiserver(self.fleet.root)
        return f"kube-apiserver stopped and started ({time.monotonic() - started:.1f}s)"

    def pause_etcd(self) -> str:
        pid = self._state().etcd_pid
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(ETCD_PAUSE)  # the fault itself: etcd frozen this long
        finally:
            os.kill(pid, signal.SIGCONT)
        return f"etcd paused {ETCD_PAUSE:.0f}s (SIGSTOP/SIGCONT)"

    def cut_watches(self) -> str:
        """Abort every TCP connection to the API server (every watch, every client)."""
        port = self._state().apiserver_port
        done = subprocess.run(
            ["ss", "-K", "-t", "dst", "127.0.0.1", "dport", "=", str(port)],
            capture_output=True,
            text=True,
            check=False,
        )
        cut = max(0, len(done.stdout.splitlines()) - 1)
        return f"{cut} connections to kube-apiserver aborted (ss -K)"

    # --- operators -------------------------------------------------------------------------

    def rotate_service_account(self) -> str:
        account = self.rng.choice(self.fleet.shim_accounts())
        self.fleet.rotate(account)
        return f"podcert shim rotate --pod, for each pod of {account} on a shim node"

    def start_ca_rotation(self) -> str:
        self.campaign = CaRotation(self.fleet, self)
        return self.campaign.advance() or "CA rotation started"

    def advance_campaign(self) -> str | None:
        if self.campaign is None:
            return None
        said = self.campaign.advance()
        if self.campaign.step == "done":
            self.rotations_done.append(self.campaign.took)
            self.campaign = None
        return said


class CaRotation:
    """prepare -> the new root in every pod's trust file -> activate -> every pod re-keyed (shim
    rotate for each account, a kubelet restart for the kubelet's pods) -> every leaf from the new
    CA -> retire -> the old root gone from every trust file."""

    def __init__(self, fleet: Fleet, faults: Faults) -> None:
        self.fleet, self.faults = fleet, faults
        self.step = "start"
        self.began = self.step_began = time.monotonic()
        self.old_roots: set[bytes] = set()
        self.took: dict[str, float] = {}

    def _next(self, step: str) -> None:
        now = time.monotonic()
        self.took[self.step] = round(now - self.step_began, 1)
        self.step, self.step_began = step, now

    def advance(self) -> str | None:
        pods = self.fleet.pods
        if self.step == "start":
            self.old_roots = {r.tbs_certificate_bytes for p in pods for r in trust_roots(p)}
            self.fleet.ca("prepare")
            self._next("trust")
            return "ca prepare"
        if self.step == "trust":
            if not all(_has_new_root(p, self.old_roots) for p in pods):
                return None
            self.fleet.ca("activate")
            self._next("rekey")
            return "new root in every trust file; ca activate"
        if self.step == "rekey":
            accounts = self.fleet.shim_accounts()
            for account in accounts:
                self.fleet.rotate(account)
            said = f"re-key: shim rotate for {len(accounts)} accounts"
            if self.fleet.kubelet is not None:
                said += "; " + self.faults.restart_kubelet()
            self._next("leaves")
            return said
        if self.step == "leaves":
            if not all(_leaf_under_new_root(p, self.old_roots) for p in pods):
                return None
            self.fleet.ca("retire", "--force")
            self._next("retired")
            return "every leaf from the new CA; ca retire"
        if self.step == "retired":
            if any(_has_old_root(p, self.old_roots) for p in pods):
                return None
            self._next("done")
            self.took["total"] = round(time.monotonic() - self.began, 1)
            return "old root gone from every trust file: rotation done"
        return None


def _has_new_root(pod: Pod, old: set[bytes]) -> bool:
    return any(r.tbs_certificate_bytes not in old for r in trust_roots(pod))


def _has_old_root(pod: Pod, old: set[bytes]) -> bool:
    return any(r.tbs_certificate_bytes in old for r in trust_roots(pod))


def _leaf_under_new_root(pod: Pod, old: set[bytes]) -> bool:
    credential = read_credential(pod)
    if credential is None:
        return False
    top = credential.chain[-1] if credential.chain else credential.leaf
    roots = [r for r in trust_roots(pod) if r.tbs_certificate_bytes not in old]
    return any(top.issuer == r.subject for r in roots)


def _identity(args: list[str]) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith("--identity="))


def _ignore(_: object) -> None:
    return None
