"""A whole devcluster upgraded in place under traffic, as a platform team upgrades a cluster:
the control plane one minor up, then the nodes one by one, again, while pods
hold podcert credentials and the example mTLS pair keeps calling.

`Upgrade(root, work, shape)` starts, on a control plane of `shape.start`: two signer replicas
(leader election, an audit log each), one shim node, `shape.hollow_nodes` hollow kubelets and, with
`shape.real_node`, the real kubelet (containerd; one per machine: its caller checks
`nodes.real_node_unavailable()` first), `shape.pods_per_node` pods with an identity volume on each
node, and the pair: its server on a pod of the real node (whose kubelet keeps its root directory and
re-keys every projection when it restarts, so the server's credential changes under it at each node
step), its client on the shim node. `run()` then goes through `shape.targets`: for each, the control
plane (`devcluster.upgrade.control_plane`), one new pod per node (what a kubelet still on the old
minor asks of the new API server, in its own form), then each kubelet
(`devcluster.upgrade.kubelet`). The shim node has no kubelet to upgrade (the shim's own upgrade is a
release of podcert's, not of Kubernetes'): it lives through the control plane changes.

What it records, for the caller to judge (`Report`):
- after each step, every pod whose files do not hold a valid credential once the step settled
  (the cheapest honest check is the pod's own files: the credential bundle parses, chains to the
  pod's trust file at the current time, the trust file holds exactly the signer's published
  roots, and the leaf names the pod's SPIFFE ID; a restarted kubelet's pods also hold a new key);
- all along, once a second, the same check of every pod whose files outlive a kubelet restart
  (the shim's and the real node's), from the first time it held a valid credential on (a hollow
  kubelet starts on a fresh root and writes its pods' files again: its pods are judged after
  each step);
- every request's outcome, listed every second through v1beta1 (served by every minor here, and
  the one view holding every form's key), and every decision in both audit logs;
- each kubelet restart's re-key storm: the requests it created, how long the restart took, when
  the last of its requests was issued (audit log time) and the pods' new files were in place;
- the pair's own summary (failed calls) and `podcert audit` of each node at the end.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

from bundles import formats
from devcluster import cluster, images, kube, nodes, nodestate, processes, upgrade
from devcluster.identities import Paths
from devcluster.stack import listening, wait_for
from devcluster.supervise import free_port
from podcert.api import requests
from podcert.api.versions import group_version
from podcert.api.volumes import volume_dir
from podcert.auditlog import iter_entries
from podcert.client.rest import JSON, ApiError, Rest, path_of

SIGNER = processes.DEFAULT_SIGNER
SIGNER_NAMESPACE = "podcert-system"
NAMESPACE = "upgrade"
TRUST_DOMAIN = "cluster.local"
SHIM_NODE = "node-shim"
REAL_NODE = "node-real"
BUNDLE, TRUST = "credentialbundle.pem", "trust-bundle.pem"
BETA = group_version("v1beta1")
SLEEP = ["sh", "-c", "trap 'exit 0' TERM; sleep 86400 & wait"]
SETTLE_TIMEOUT = 120.0  # a step whose pods hold no valid credential by then has failed


@dataclass(frozen=True)
class Shape:
    start: str = "1.35"
    targets: tuple[str, ...] = ("1.36", "1.37")
    hollow_nodes: int = 2
    real_node: bool = True
    pods_per_node: int = 2
    rate: float = 50.0
    # The signers' code from another release (an unpacked wheel, first on their PYTHONPATH):
    # what upgrading Kubernetes under that release does.
    signer_release: Path | None = None


@dataclass(frozen=True)
class Pod:
    name: str
    uid: str
    node: str
    service_account: str

    @property
    def spiffe_id(self) -> str:
        return f"spiffe://{TRUST_DOMAIN}/ns/{NAMESPACE}/sa/{self.service_account}"


@dataclass(frozen=True)
class Storm:
    """The requests one kubelet restart made: each pod's projection asked again, a new key."""

    created: int
    issued: int
    restart_seconds: float  # the restart command, until the kubelet runs and reports its release
    last_issued_seconds: float  # from the restart's start to the last of them issued
    files_seconds: float  # from the restart's start to every pod's new credential on disk


@dataclass
class Step:
    name: str
    seconds: float = 0.0
    storm: Storm | None = None
    invalid: dict[str, str] = field(default_factory=dict)  # pod -> why, once the step settled
    forms: dict[str, str] = field(default_factory=dict)  # node -> the form its new pod's asked


@dataclass
class Report:
    steps: list[Step] = field(default_factory=list)
    gaps: list[tuple[float, str, str]] = field(default_factory=list)  # (t, pod, why) sampled
    outcomes: dict[str, str | None] = field(default_factory=dict)  # request uid -> outcome
    decisions: dict[str, int] = field(default_factory=dict)  # audit log decisions, counted
    answered_twice: list[str] = field(default_factory=list)  # request uids decided twice
    pair: dict[str, Any] = field(default_factory=dict)  # the pair's own summaries
    audits: dict[str, tuple[int, str]] = field(default_factory=dict)  # node -> (exit, tail)
    pods: int = 0


def spki(credential: formats.Credential) -> bytes:
    return credential.leaf.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def judge(
    pod: Pod, folder: Path, roots: frozenset[bytes], now: dt.datetime, not_key: bytes = b""
) -> tuple[formats.Credential | None, str | None]:
    """The pod's credential as its files hold it, and why it is not valid (None when it is)."""
    try:
        credential = formats.load_credential((folder / BUNDLE).read_bytes())
        trust = formats.load_trust_bundle((folder / TRUST).read_bytes())
        formats.verify_chain(credential, trust, now)
        found = str(credential.spiffe_id)
    except (OSError, ValueError) as err:  # absent, torn, or not chaining
        return None, f"{type(err).__name__}: {err}"
    held = frozenset(r.public_bytes(serialization.Encoding.DER) for r in trust.roots)
    if held != roots:
        return credential, "the trust file is not the signer's published roots"
    if found != pod.spiffe_id:
        return credential, f"names {found}, not {pod.spiffe_id}"
    if not_key and spki(credential) == not_key:
        return credential, "still the key from before the restart"
    return credential, None


class Upgrade:
    def __init__(self, root: Path, work: Path, shape: Shape, say: Callable[[str], None]) -> None:
        self.root, self.work, self.shape, self.say = root, work, shape, say
        self.signers: list[processes.Signer] = []
        self.shim: processes.Shim | None = None
        self.kubelets: dict[str, nodestate.NodeState] = {}
        self.pods: list[Pod] = []
        self.pair: dict[str, processes.Process] = {}
        self.roots: frozenset[bytes] = frozenset()
        self.report = Report()
        self._lock = threading.Lock()
        self._held: set[str] = set()  # pods that have held a valid credential: sampled from then
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="upgrade-watch", daemon=True)
        self.rest: Rest  # once the control plane is up
        self._watch_rest: Rest  # the sampler's own connections

    # --- start -------------------------------------------------------------------------------

    def start(self) -> None:
        shape = self.shape
        cluster.up(self.root, kube_version=shape.start, progress=self.say)
        self.rest = Rest(kube.admin_client(self.root))
        self._watch_rest = Rest(kube.admin_client(self.root))
        for i in range(2):
            work = self.work / f"replica-{i}"
            extra = [f"--identity=replica-{i}", f"--audit-log={work / 'audit.jsonl'}"]
            proc = processes.signer(self.root, work, [SIGNER], extra=extra)
            if shape.signer_release is not None:
                proc.env["PYTHONPATH"] = str(shape.signer_release)
            self.signers.append(proc.start())
        with kube.admin_client(self.root) as admin:
            kube.ensure_node(admin, SHIM_NODE)
            kube.ensure_namespace(admin, NAMESPACE)
        root = self.work / "shim-root"
        self.shim = processes.shim(self.root, self.work, SHIM_NODE, root=root).start()
        for signer in self.signers:
            signer.wait_ready(60)
        self.shim.wait_ready(60)
        names = ([REAL_NODE] if shape.real_node else []) + [
            f"node-hollow-{i}" for i in range(shape.hollow_nodes)
        ]
        for node in names:
            hollow = node != REAL_NODE
            self.kubelets[node] = nodes.start(
                self.root, node, hollow=hollow, kube_version=shape.start, progress=self.say
            )
        for node in [SHIM_NODE, *self.kubelets]:
            for i in range(shape.pods_per_node):
                self.create_pod(f"app-{node}-{i}", node, "app")
        server_node = REAL_NODE if shape.real_node else SHIM_NODE
        server = self.create_pod("pair-server", server_node, "pair-server")
        client = self.create_pod("pair-client", SHIM_NODE, "pair-client")
        self.roots = self.published_roots()
        step, began = Step(f"start on {shape.start}"), time.monotonic()
        self.settle(self.pods, step)
        step.seconds = time.monotonic() - began
        self._record(step)
        self.start_pair(server, client)
        self._thread.start()

    def create_pod(self, name: str, node: str, account: str) -> Pod:
        volume = kube.pod_certificate_volume(SIGNER, trust_bundle_signer=True)
        volume["projected"]["defaultMode"] = 0o600  # the key for its owner only (README)
        real = node == REAL_NODE
        with kube.admin_client(self.root) as admin:
            created = kube.create_pod(
                admin,
                NAMESPACE,
                name,
                node=node,
                service_account=account,
                volumes=[volume],
                image=images.BUSYBOX_IMAGE if real else "registry.invalid/app:1",
                command=SLEEP if real else None,
            )
        pod = Pod(name, created.metadata.uid, node, account)
        with self._lock:
            self.pods.append(pod)
        return pod

    def folder(self, pod: Pod) -> Path:
        if pod.node == SHIM_NODE:
            assert self.shim is not None
            return self.shim.volume_dir(pod.uid)
        return volume_dir(self.kubelets[pod.node].root, pod.uid, "identity")

    def published_roots(self) -> frozenset[bytes]:
        def roots() -> frozenset[bytes] | None:
            items = self.rest.request("GET", path_of(BETA, "clustertrustbundles"))["items"]
            pem = "".join(
                i["spec"]["trustBundle"] for i in items if i["spec"].get("signerName") == SIGNER
            )
            if not pem:
                return None
            bundle = formats.load_trust_bundle(pem.encode())
            return frozenset(r.public_bytes(serialization.Encoding.DER) for r in bundle.roots)

        found: frozenset[bytes] = wait_for(roots, 60, "the signer's ClusterTrustBundle")
        return found

    def start_pair(self, server: Pod, client: Pod) -> None:
        port = free_port()

        def files(pod: Pod) -> list[str]:
            folder = self.folder(pod)
            return [f"--credential-bundle={folder / BUNDLE}", f"--trust-bundle={folder / TRUST}"]

        self.pair["server"] = processes.Process(
            args=[
                *files(server),
                f"--allow-workload={NAMESPACE}/{client.service_account}",
                "--host=127.0.0.1",
                f"--port={port}",
                "--reload-interval=0.5",
            ],
            log=self.work / "pair-server.log",
            module="examples.mtls.server",
        ).start()
        wait_for(lambda: listening(port), 30, "the example server")
        self.pair["client"] = processes.Process(
            args=[
                *files(client),
                f"--server-id={server.spiffe_id}",
                f"--url=https://127.0.0.1:{port}/",
                f"--rate={self.shape.rate}",
                "--reload-interval=0.5",
            ],
            log=self.work / "pair-client.log",
            module="examples.mtls.client",
        ).start()

    # --- look ----------------------------------------------------------------------------------

    def list_requests(self, rest: Rest | None = None) -> list[JSON]:
        found: list[JSON] = (rest or self.rest).request(
            "GET", path_of(BETA, "podcertificaterequests", NAMESPACE)
        )["items"]
        return found

    def _watch(self) -> None:
        began = time.monotonic()
        while not self._stop.wait(1.0):
            try:
                seen = {
                    r["metadata"]["uid"]: requests.outcome(r)
                    for r in self.list_requests(self._watch_rest)
                }
            except (ApiError, OSError):  # the API server restarting: next time
                seen = {}
            with self._lock:
                self.report.outcomes.update(seen)
                kept = [
                    p for p in self.pods if p.node in (SHIM_NODE, REAL_NODE) and p.uid in self._held
                ]
            now = dt.datetime.now(dt.UTC)
            for pod in kept:
                _, why = judge(pod, self.folder(pod), self.roots, now)
                if why:
                    self.report.gaps.append((time.monotonic() - began, pod.name, why))

    def settle(
        self, pods: Iterable[Pod], step: Step, not_keys: dict[str, bytes] | None = None
    ) -> None:
        """Wait until every one of `pods` holds a valid credential (a new key where `not_keys`
        names the old one); what is still wrong at the deadline goes into `step.invalid`."""
        pending = list(pods)
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while pending:
            now = dt.datetime.now(dt.UTC)
            why: dict[str, str] = {}
            for pod in pending:
                old = (not_keys or {}).get(pod.uid, b"")
                credential, reason = judge(pod, self.folder(pod), self.roots, now, old)
                if reason is None and credential is not None:
                    with self._lock:
                        self._held.add(pod.uid)
                else:
                    why[pod.name] = reason or "no credential"
            pending = [p for p in pending if p.name in why]
            if pending and time.monotonic() > deadline:
                step.invalid.update(why)
                break
            if pending:
                time.sleep(0.1)

    # --- the upgrade ----------------------------------------------------------------------------

    def run(self) -> Report:
        current = self.shape.start
        for target in self.shape.targets:
            self.control_plane(current, target)
            for node in list(self.kubelets):
                self.kubelet(node, current, target)
            current = target
        return self.report

    def control_plane(self, current: str, target: str) -> None:
        step = Step(f"control plane {current} -> {target}")
        began = time.monotonic()
        upgrade.control_plane(self.root, target, progress=self.say)
        step.seconds = time.monotonic() - began
        # A new pod on every node: each kubelet still on `current` asks the new API server.
        late = [
            self.create_pod(f"late-{target.replace('.', '-')}-{node}", node, "app")
            for node in [SHIM_NODE, *self.kubelets]
        ]
        self.settle(self.pods, step)
        for item in self.list_requests():
            spec = item["spec"]
            pod = next((p for p in late if p.uid == spec.get("podUID")), None)
            if pod is not None:
                step.forms[pod.node] = (
                    requests.STUB_CSR
                    if spec.get("stubPKCS10Request")
                    else requests.PROOF_OF_POSSESSION
                )
        self._record(step)

    def kubelet(self, node: str, current: str, target: str) -> None:
        step = Step(f"node {node} {current} -> {target}")
        on_node = [p for p in self.pods if p.node == node]
        keys = {}
        for pod in on_node:
            credential, _ = judge(pod, self.folder(pod), self.roots, dt.datetime.now(dt.UTC))
            if credential is not None:
                keys[pod.uid] = spki(credential)
        before = {r["metadata"]["uid"] for r in self.list_requests()}
        since, began = dt.datetime.now(dt.UTC), time.monotonic()
        self.kubelets[node] = upgrade.kubelet(self.root, node, target, progress=self.say)
        restart = time.monotonic() - began
        self.settle(on_node, step, keys)
        files = time.monotonic() - began
        mine = {p.uid for p in on_node}

        def storm() -> list[JSON] | None:
            new = [
                r
                for r in self.list_requests()
                if r["metadata"]["uid"] not in before and r["spec"].get("podUID") in mine
            ]
            return new if all(requests.outcome(r) for r in new) else None

        new = wait_for(storm, 60, f"node {node}'s new requests answered")
        issued = [r for r in new if requests.outcome(r) == "Issued"]
        uids = {r["metadata"]["uid"] for r in issued}
        times = [e.time for e in self.audit_entries() if e.uid in uids]
        last = (max(times) - since).total_seconds() if times else float("nan")
        step.seconds = files
        step.storm = Storm(len(new), len(issued), restart, last, files)
        self._record(step)

    def _record(self, step: Step) -> None:
        self.report.steps.append(step)
        self.say(f"{step.name}: {step.seconds:.1f} s" + (f", {step.storm}" if step.storm else ""))

    # --- finish -------------------------------------------------------------------------------

    def audit_logs(self) -> list[Path]:
        return [self.work / f"replica-{i}" / "audit.jsonl" for i in range(len(self.signers))]

    def audit_entries(self) -> list[Any]:
        out: list[Any] = []
        for path in self.audit_logs():
            if path.exists():
                out += iter_entries(path.read_bytes().splitlines())
        return out

    def finish(self) -> Report:
        """Stop the pair and the sampler; the requests, the audit logs and `podcert audit`."""
        report = self.report
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        for name in ("client", "server"):
            proc = self.pair.pop(name, None)
            if proc is not None:
                proc.stop()
                lines = [line for line in proc.output().splitlines() if line.startswith("{")]
                report.pair[name] = json.loads(lines[-1]) if lines else {}
        for item in self.list_requests():
            report.outcomes[item["metadata"]["uid"]] = requests.outcome(item)
        decided: Counter[str] = Counter()
        for entry in self.audit_entries():
            report.decisions[entry.decision] = report.decisions.get(entry.decision, 0) + 1
            decided[entry.uid] += 1
        report.answered_twice = sorted(uid for uid, n in decided.items() if n > 1)
        for node in [SHIM_NODE, *self.kubelets]:
            report.audits[node] = self.audit(node)
        report.pods = len(self.pods)
        return report

    def audit(self, node: str) -> tuple[int, str]:
        """`podcert audit` of one node: the cluster, its root and both replicas' audit logs."""
        assert self.shim is not None
        root = self.shim.root if node == SHIM_NODE else self.kubelets[node].root
        args = [
            sys.executable,
            "-m",
            "podcert",
            "audit",
            f"--kubeconfig={Paths(self.root.resolve()).admin_kubeconfig}",
            f"--root={root}",
            f"--node={node}",
            f"--namespace={NAMESPACE}",
            f"--signer-name={SIGNER}",
            *(f"--audit-log={p}" for p in self.audit_logs()),
        ]
        done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
        return done.returncode, "" if done.returncode == 0 else (done.stdout + done.stderr)[-1500:]

    def stop(self) -> None:
        self._stop.set()
        for proc in [*self.pair.values(), *([self.shim] if self.shim else []), *self.signers]:
            proc.stop()
        self.pair.clear()
