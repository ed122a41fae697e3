"""Real kubelet vs shim: the same signer on the same devcluster, side by side in one run.

    flock /tmp/podcert-real-node.lock .venv/bin/python -m bench.bench_real_kubelet \\
        [--nodes real,hollow,shim] [--pods 200] [--real-pods N] [--threads 8] [--settle 15]

One devcluster and one `podcert signer` as shipped; one node per kind named in --nodes, each with
its own namespace and pods:
- `shim`: `podcert shim` (as shipped) serving node-shim;
- `hollow`: kubemark's hollow kubelet as node-hollow, the real kubelet code (pod certificate
  manager, projected volume plugin, atomic writer) on a fake container runtime, with a real
  kubelet's API client limits (50 QPS, burst 100);
- `real`: the real kubelet on containerd + runc as node-real, each pod a real busybox container.
  One real node per machine: run the command under the lock the other users of this machine take.
Each kubelet's maxPods is raised above the pod count. Every pod mounts
devcluster.stack.identity_volume: its credential bundle and the signer's ClusterTrustBundle.

Three figures per kind:
(a) pod -> credential on disk: the kinds one after the other, in --nodes order (each kind's pods
    stay, so later kinds run beside the earlier ones' idle pods). A warm-up pod (not counted),
    then N pods created through --threads threads, each stamped just before its create call; the
    pods' credentialbundle.pem under the node's root is polled every 10 ms. A watch on
    PodCertificateRequests splits it: create call -> request created -> Issued -> file on disk.
(b) CA prepare -> new root in every pod's trust file: with every kind's pods in place, one
    `podcert signer ca prepare`, and every trust file polled every 20 ms until it holds two
    roots; timed from the CA Secret's change (a watch), as in bench_trust_propagation.
(c) restart: each node in turn restarts its agent: the shim gets SIGTERM and a new process starts
    on the same root; a kubelet is restarted alone (devcluster.nodes.restart_kubelet: a real
    node's containers keep running; kubemark comes back with a fresh root). Counted: the
    PodCertificateRequests made for the kind's pods from the restart until every pod holds a
    credential again and none has been made for --settle seconds, and the volumes rewritten.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.bench_restart import count_pcrs
from bench.bench_time_to_credential import (
    Created,
    component_pids,
    cpu_of,
    create_pods,
    devcluster,
    in_background,
    percentile,
    prepare_namespace,
    wait_until,
)
from bench.bench_trust_propagation import CA_SECRET, FirstChange, roots_in, trust_bundle_path
from devcluster import host, images, kube, nodes, processes
from devcluster.nodestate import NodeState, node_dir
from devcluster.stack import BUNDLE, SIGNER_NAMESPACE, TRUST, Stack, identity_volume
from podcert.client.rest import ApiError, Rest, path_of

KINDS = ("real", "hollow", "shim")
PCRS = "certificates.k8s.io/v1"
POLL_CREDENTIAL = 0.01
POLL_TRUST = 0.02
REAL_COMMAND = ("sleep", "infinity")


# --- the nodes ---------------------------------------------------------------------------------


class Node:
    """One kind of node agent serving its own node and namespace."""

    kind = ""

    def __init__(self, cluster_root: Path, work: Path, pods: int) -> None:
        self.cluster_root, self.work, self.pods = cluster_root, work, pods
        self.name = f"node-{self.kind}"
        self.namespace = f"side-{self.kind}"

    def start(self) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        """Restart the agent alone; returns once it is up again."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop what `start` started (kubelets are also stopped by the devcluster's down)."""

    @property
    def root(self) -> Path:
        """The folder that holds pods/ (a hollow kubelet's changes on a restart)."""
        raise NotImplementedError

    def volume_dir(self, pod_uid: str) -> Path:
        return self.root / "pods" / pod_uid / "volumes" / "kubernetes.io~projected" / "identity"

    def pids(self) -> dict[str, int]:
        return {}

    def cpu(self) -> float:
        """CPU seconds used so far by the agent (a real node: everything in its cgroup)."""
        return sum(cpu_of(self.pids()).values())

    @property
    def image(self) -> tuple[str, Sequence[str]]:
        return "registry.invalid/app:1", ()


class ShimNode(Node):
    kind = "shim"

    def __init__(self, cluster_root: Path, work: Path, pods: int) -> None:
        super().__init__(cluster_root, work, pods)
        self.shim: processes.Shim | None = None
        self.starts = 0

    def _new(self) -> processes.Shim:
        self.starts += 1
        return processes.shim(
            self.cluster_root,
            self.work,
            self.name,
            root=self.work / "shim-root",
            log_name=f"{self.name}-{self.starts}",
        )

    def start(self) -> None:
        self.shim = self._new().start().wait_ready()

    def restart(self) -> None:
        assert self.shim is not None
        self.shim.stop(timeout=30.0)
        self.shim = self._new().start().wait_ready(timeout=120.0)

    def stop(self) -> None:
        if self.shim is not None:
            self.shim.stop()

    @property
    def root(self) -> Path:
        return self.work / "shim-root"

    def pids(self) -> dict[str, int]:
        proc = self.shim.proc if self.shim is not None else None
        return {"shim": proc.pid} if proc is not None else {}


class KubeletNode(Node):
    hollow = True

    def __init__(self, cluster_root: Path, work: Path, pods: int) -> None:
        super().__init__(cluster_root, work, pods)
        self.state: NodeState | None = None

    def start(self) -> None:
        # A margin over the pods: the warm-up pod, and a restart's pods still being counted.
        self.state = nodes.start(
            self.cluster_root, self.name, hollow=self.hollow, max_pods=self.pods + 20
        )

    def restart(self) -> None:
        self.state = nodes.restart_kubelet(self.cluster_root, self.name)

    @property
    def root(self) -> Path:
        assert self.state is not None
        return self.state.root

    def pids(self) -> dict[str, int]:
        assert self.state is not None
        return {"kubelet": self.state.kubelet_pid}

    def throttled(self) -> list[str]:
        """The kubelet's own word that its API client waited: client-go logs a wait over 1 s
        at most once every 10 s at the default verbosity."""
        log = node_dir(self.cluster_root, self.name) / "kubelet.log"
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return [m.group(1) for line in lines if (m := _WAITED.search(line))]


class HollowNode(KubeletNode):
    kind = "hollow"


class RealNode(KubeletNode):
    kind = "real"
    hollow = False

    def start(self) -> None:
        reason = nodes.real_node_unavailable()
        if reason:
            raise SystemExit(f"cannot run a real node: {reason}")
        super().start()

    def cpu(self) -> float:
        """kubelet, containerd, its shims and the containers: all run in the node's cgroup."""
        assert self.state is not None
        usage = host.CGROUP_V1 / "cpuacct" / self.state.cgroup.lstrip("/") / "cpuacct.usage"
        try:
            return int(usage.read_text()) / 1e9
        except (OSError, ValueError):
            return super().cpu()

    @property
    def image(self) -> tuple[str, Sequence[str]]:
        return images.BUSYBOX_IMAGE, REAL_COMMAND


_WAITED = re.compile(r'Waited before sending request.*?delay="([^"]+)"')

NODE_KINDS: dict[str, type[Node]] = {"shim": ShimNode, "hollow": HollowNode, "real": RealNode}


# --- what the API server saw -------------------------------------------------------------------


@dataclass
class Requests:
    """Every PodCertificateRequest's creation and issuance as one watch saw them (monotonic)."""

    created: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # ns -> (t, pod)
    by_pod: dict[str, float] = field(default_factory=dict)  # pod UID -> first request seen
    issued: dict[str, float] = field(default_factory=dict)  # pod UID -> first Issued seen
    names: set[str] = field(default_factory=set)  # requests seen
    error: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def follow(self, rest: Rest) -> None:
        path = path_of(PCRS, "podcertificaterequests")
        version = str(rest.request("GET", path, query={"limit": 1})["metadata"]["resourceVersion"])

        def run() -> None:
            nonlocal version
            while True:
                try:
                    for event in rest.watch(path, version, timeout_seconds=120):
                        obj = event.get("object", {})
                        version = str(obj.get("metadata", {}).get("resourceVersion", version))
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            self._saw(obj, time.monotonic())
                except ApiError as err:
                    self.error = str(err)  # a gap: the counts below come from lists as well
                    time.sleep(0.5)
                    with contextlib.suppress(ApiError):
                        listing = rest.request("GET", path, query={"limit": 1})
                        version = str(listing["metadata"]["resourceVersion"])

        in_background(run)

    def _saw(self, obj: dict[str, object], at: float) -> None:
        meta, spec, status = (obj.get(k) or {} for k in ("metadata", "spec", "status"))
        assert isinstance(meta, dict) and isinstance(spec, dict) and isinstance(status, dict)
        uid, name = str(spec.get("podUID", "")), str(meta.get("name", ""))
        issued = any(c.get("type") == "Issued" for c in status.get("conditions") or [])
        with self.lock:
            if name not in self.names:
                self.names.add(name)
                self.created.setdefault(str(meta.get("namespace")), []).append((at, uid))
                self.by_pod.setdefault(uid, at)
            if issued:
                self.issued.setdefault(uid, at)

    def made_since(self, namespace: str, since: float, uids: set[str]) -> list[float]:
        """When requests were made since `since` for these pods of the namespace."""
        with self.lock:
            return [t for t, u in self.created.get(namespace, []) if t >= since and u in uids]


# --- (a) pod -> credential on disk -------------------------------------------------------------


def wait_running(node: Node, rest: Rest, pods: int, timeout: float) -> float | None:
    """On a kubelet's node, wait until all its pods run (a real node starts their containers
    after the credential is written): the next step must not overlap with that. Seconds taken."""
    if node.kind == "shim":  # nothing runs the shim's pods
        return None
    started = time.monotonic()

    def running() -> bool:
        listing = rest.request("GET", path_of("v1", "pods", node.namespace))
        phases = [i.get("status", {}).get("phase") for i in listing.get("items") or []]
        return phases.count("Running") >= pods

    wait_until(running, timeout, f"{node.kind}: {pods} pods Running", 0.5)
    return time.monotonic() - started


@dataclass
class Credentials:
    seen: dict[str, float]  # pod -> seconds from its create call to the file on disk
    missing: list[str]
    created: Created
    took: float  # first create call -> last credential
    cpu: dict[str, float]
    load: float


def until_on_disk(
    node: Node, rest: Rest, names: Sequence[str], threads: int, timeout: float, signer: str
) -> tuple[dict[str, float], list[str], Created]:
    """Create the pods on the node; seconds from each create call to its bundle on disk."""
    image, command = node.image
    created = Created()
    creator = in_background(
        lambda: create_pods(
            rest,
            node.namespace,
            names,
            node.name,
            [identity_volume(signer)],
            threads,
            created,
            image=image,
            command=command,
        )
    )
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while True:
        for name, uid, started in created.snapshot():
            if name not in seen and (node.volume_dir(uid) / BUNDLE).exists():
                seen[name] = time.monotonic() - started
        if not creator.is_alive() and len(seen) + len(created.errors) >= len(names):
            break
        if time.monotonic() > deadline:
            break
        time.sleep(POLL_CREDENTIAL)
    creator.join()
    return seen, [n for n in names if n not in seen], created


def measure_credentials(
    node: Node,
    rest: Rest,
    names: Sequence[str],
    threads: int,
    timeout: float,
    signer: str,
    base: dict[str, int],
) -> Credentials:
    warm, missing, _ = until_on_disk(node, rest, ["warm-up"], 1, 60.0, signer)
    if missing:
        raise SystemExit(f"{node.kind}: the warm-up pod got no credential in 60 s")
    print(f"[{node.kind}] warm-up pod: {warm['warm-up']:.2f}s (not counted)", flush=True)
    load = os.getloadavg()[0]
    before = {**cpu_of(base), node.kind: node.cpu()}
    started = time.monotonic()
    seen, missing, created = until_on_disk(node, rest, names, threads, timeout, signer)
    took = time.monotonic() - started
    after = {**cpu_of(base), node.kind: node.cpu()}
    cpu = {k: after[k] - before[k] for k in after if k in before}
    return Credentials(seen, missing, created, took, cpu, load)


def report_credentials(node: Node, result: Credentials, requests: Requests) -> None:
    figures = list(result.seen.values())
    print(f"[{node.kind}] {len(figures)} of {node.pods} pods on disk (load {result.load:.1f})")
    if not figures:
        return
    print(
        f"[{node.kind}] pod create -> credential on disk: p50 {percentile(figures, 50):.3f}s  "
        f"p95 {percentile(figures, 95):.3f}s  p99 {percentile(figures, 99):.3f}s  "
        f"max {max(figures):.3f}s; all {result.took:.2f}s after the first create",
        flush=True,
    )
    stages: dict[str, list[float]] = {"request": [], "issue": [], "write": []}
    with requests.lock:
        for name, uid in result.created.uids.items():
            started = result.created.started[name]
            made, issued = requests.by_pod.get(uid), requests.issued.get(uid)
            if name not in result.seen or made is None or issued is None:
                continue
            stages["request"].append(made - started)
            stages["issue"].append(issued - made)
            stages["write"].append(started + result.seen[name] - issued)
    labels = {
        "request": "create call -> request created",
        "issue": "request created -> Issued",
        "write": "Issued -> credential on disk",
    }
    for stage, values in stages.items():
        if values:
            print(
                f"[{node.kind}]   {labels[stage]:<32} p50 {percentile(values, 50):.3f}s  "
                f"p99 {percentile(values, 99):.3f}s  max {max(values):.3f}s  (n={len(values)})"
            )
    parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(result.cpu.items(), key=lambda x: -x[1]))
    print(f"[{node.kind}]   CPU seconds over those {result.took:.2f}s: {parts}", flush=True)
    if isinstance(node, KubeletNode):
        waits = node.throttled()
        print(
            f"[{node.kind}]   kubelet log, client-side throttling over 1 s (logged at most every "
            f"10 s): {', '.join(waits) or 'none'}"
        )


# --- (b) CA prepare -> every trust file --------------------------------------------------------


def measure_trust(
    stack: Stack, rest: Rest, volumes: dict[str, list[Path]], timeout: float
) -> dict[str, dict[int, float]]:
    """One `ca prepare`; per kind, volume index -> seconds from the Secret's change to 2 roots."""

    def settled() -> bool:
        return all(
            (v / BUNDLE).exists() and roots_in(v / TRUST) == 1
            for dirs in volumes.values()
            for v in dirs
        )

    wait_until(settled, 120.0, "every pod's credential and one root")
    secret = FirstChange(
        rest, path_of("v1", "secrets", SIGNER_NAMESPACE), f"metadata.name={CA_SECRET}"
    )
    bundle = FirstChange(rest, trust_bundle_path(rest), f"spec.signerName={stack.signer_name}")
    load = os.getloadavg()[0]
    launched = time.monotonic()
    stack.ca("prepare")
    print(f"`podcert signer ca prepare` ran {time.monotonic() - launched:.2f}s (load {load:.1f})")
    seen: dict[str, dict[int, float]] = {kind: {} for kind in volumes}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pending = False
        for kind, dirs in volumes.items():
            for i, volume in enumerate(dirs):
                if i in seen[kind]:
                    continue
                if roots_in(volume / TRUST) == 2:
                    seen[kind][i] = time.monotonic()
                else:
                    pending = True
        if not pending:
            break
        time.sleep(POLL_TRUST)
    if secret.at is None or bundle.at is None:
        raise SystemExit(f"watch problem: secret {secret.error}, bundle {bundle.error}")
    print(f"  ClusterTrustBundle updated {bundle.at - secret.at:.3f}s after the CA Secret")
    at = secret.at
    return {kind: {i: t - at for i, t in times.items()} for kind, times in seen.items()}


def report_trust(kind: str, total: int, after_secret: dict[int, float]) -> None:
    values = list(after_secret.values())
    if not values:
        print(f"[{kind}] CA Secret -> two roots: no trust file of {total} changed")
        return
    missing = total - len(values)
    print(
        f"[{kind}] CA Secret -> two roots in the trust file: first {min(values):.2f}s, "
        f"p50 {percentile(values, 50):.2f}s, p99 {percentile(values, 99):.2f}s, "
        f"all {len(values)} of {total}: {max(values):.2f}s"
        + (f"; MISSING {missing}" if missing else ""),
        flush=True,
    )


# --- (c) restart -------------------------------------------------------------------------------


@dataclass
class Restart:
    up: float  # restart call -> agent up (shim ready, kubelet's lease renewed)
    new_requests: int  # in the API, the whole namespace (warm-up pod included)
    watched: int  # PCRs the watch saw made for the measured pods since the restart
    last_request: float | None  # restart -> last new PCR
    rewritten: int  # volumes whose ..data changed (or written anew)
    last_write: float | None  # restart -> all rewritten volumes on disk
    volumes: int


def measure_restart(
    node: Node, rest: Rest, uids: Sequence[str], requests: Requests, settle: float, timeout: float
) -> Restart:
    """Restart the agent; count requests until every pod holds a credential and no request has
    been made for `settle` seconds."""
    pods = set(uids)
    before = count_pcrs(rest, node.namespace)
    old_root = node.root
    links = {uid: _link(node.volume_dir(uid)) for uid in uids}
    started = time.monotonic()
    node.restart()
    up = time.monotonic() - started
    deadline = started + timeout
    written: dict[str, float] = {}
    while True:
        now = time.monotonic()
        for uid in uids:
            if uid not in written:
                link = _link(node.volume_dir(uid))
                if link is not None and (node.root != old_root or link != links[uid]):
                    written[uid] = now - started
        made = requests.made_since(node.namespace, started, pods)
        quiet_since = max([started + up, *made])
        on_disk = all((node.volume_dir(u) / BUNDLE).exists() for u in uids)
        if on_disk and now - quiet_since >= settle:
            break
        if now > deadline:
            print(f"[{node.kind}] restart: not settled in {timeout:.0f}s")
            break
        time.sleep(0.1)
    after = count_pcrs(rest, node.namespace)
    made = requests.made_since(node.namespace, started, pods)
    return Restart(
        up=up,
        new_requests=after - before,
        watched=len(made),
        last_request=max(made) - started if made else None,
        rewritten=len(written),
        last_write=max(written.values()) if written else None,
        volumes=len(uids),
    )


def _link(volume: Path) -> str | None:
    try:
        return str((volume / "..data").readlink())
    except OSError:
        return None


def report_restart(node: Node, result: Restart) -> None:
    last = f"{result.last_request:.2f}s" if result.last_request is not None else "-"
    write = f"{result.last_write:.2f}s" if result.last_write is not None else "-"
    print(
        f"[{node.kind}] restart: up after {result.up:.2f}s; new PodCertificateRequests for the "
        f"{result.volumes} pods: {result.watched} (last {last} after the restart; in the "
        f"namespace, warm-up pod included: +{result.new_requests}); volumes rewritten "
        f"{result.rewritten} of {result.volumes} (last {write})",
        flush=True,
    )


# --- the run -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nodes", default="real,hollow,shim", help="kinds, in the order (a) and (c) run them"
    )
    parser.add_argument("--pods", type=int, default=200, help="pods per node")
    parser.add_argument("--real-pods", type=int, default=None, help="pods on the real node")
    parser.add_argument("--threads", type=int, default=8, help="concurrent pod create calls")
    parser.add_argument("--timeout", type=float, default=300.0, help="per step (seconds)")
    parser.add_argument("--settle", type=float, default=15.0, help="(c): quiet seconds")
    parser.add_argument(
        "--skip", default="", help="comma-separated steps to leave out: trust, restart"
    )
    args = parser.parse_args()
    kinds = [k.strip() for k in args.nodes.split(",") if k.strip()]
    if not kinds or any(k not in KINDS for k in kinds) or len(set(kinds)) != len(kinds):
        parser.error(f"--nodes takes distinct kinds among {', '.join(KINDS)}")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}

    with devcluster("podcert-bench-kubelet-") as (root, work):
        stack = Stack(root, work)
        rest = Rest(kube.admin_client(root))
        nodes_: list[Node] = []
        try:
            stack.start_signer()
            requests = Requests()
            requests.follow(rest)
            for kind in kinds:
                pods = args.real_pods if kind == "real" and args.real_pods else args.pods
                node = NODE_KINDS[kind](root, work, pods)
                prepare_namespace(root, node.namespace)
                started = time.monotonic()
                node.start()
                nodes_.append(node)
                print(f"[{kind}] {node.name} up in {time.monotonic() - started:.1f}s", flush=True)
            base = component_pids(root, ("signer", stack.signer))

            print("\n(a) pod create -> credential bundle on disk", flush=True)
            uids: dict[str, list[str]] = {}
            failed = False
            for node in nodes_:
                names = [f"p{i}" for i in range(node.pods)]
                result = measure_credentials(
                    node, rest, names, args.threads, args.timeout, stack.signer_name, base
                )
                report_credentials(node, result, requests)
                if result.missing or result.created.errors:
                    failed = True
                    print(
                        f"[{node.kind}] MISSING {len(result.missing)}; create errors: "
                        f"{result.created.errors[:3]}"
                    )
                uids[node.kind] = [result.created.uids[n] for n in names if n in result.seen]
                took = wait_running(node, rest, len(result.created.uids) + 1, args.timeout)
                if took is not None:
                    print(f"[{node.kind}]   all its pods Running {took:.1f}s later", flush=True)

            if "trust" not in skip:
                print("\n(b) CA prepare -> new root in every pod's trust file", flush=True)
                volumes = {n.kind: [n.volume_dir(u) for u in uids[n.kind]] for n in nodes_}
                times = measure_trust(stack, rest, volumes, args.timeout)
                for node in nodes_:
                    report_trust(node.kind, len(volumes[node.kind]), times[node.kind])
                    failed = failed or len(times[node.kind]) < len(volumes[node.kind])

            if "restart" not in skip:
                print("\n(c) restart: requests made", flush=True)
                for node in nodes_:
                    restart = measure_restart(
                        node, rest, uids[node.kind], requests, args.settle, args.timeout
                    )
                    report_restart(node, restart)
            if requests.error:
                print(f"(the request watch broke once: {requests.error})")
        finally:
            for node in nodes_:
                node.stop()
            stack.stop()
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
