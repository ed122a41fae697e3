"""CA revoke at 200 pods on shim and kubelet nodes: per mode, the time from `podcert signer ca
revoke` to no live credential chaining to the revoked root, and the failed calls of an mTLS pair
meanwhile.

    .venv/bin/python -m bench.bench_revoke [--pods 200] [--shim-nodes 2] [--hollow-nodes 2]
        [--modes evict,now,wait-refresh] [--rate 20] [--budget 5] [--json FILE]
    flock /tmp/podcert-real-node.lock .venv/bin/python -m bench.bench_revoke --real \
        --hollow-nodes 1 --pods 20 --modes wait-refresh    # the kubelet node is the real one

With --real the kubelet node is the real kubelet on containerd + runc (node-real, one per
machine, busybox containers), not kubemark's.

One devcluster; one `podcert signer` as its ServiceAccount in podcert-system for the default
signer name, refreshing leaves at a tenth of their life (the pods ask for 3600 s, the API's
shortest; the API puts beginRefreshAt at least 10 minutes after notBefore); --shim-nodes
`podcert shim` nodes and --hollow-nodes kubemark hollow kubelets (the kubelet's own pod
certificate manager and atomic writer, containers faked). Half the pods are on the shim nodes
(bare pods: the shim re-keys them in place), half on the hollow nodes, one Deployment per node
(an evicted pod comes back) with a PodDisruptionBudget of maxUnavailable --budget. Two of the
shim pods carry the example mTLS pair: examples.mtls's server and client as processes reading
the shim-written credential and trust files, the client at --rate calls a second (a hollow node
runs no container, and an evicted pod's files go with it, so the pair lives on shim nodes).

Per mode, in --modes order, each revoking the generation signing then (the mode before replaced
every leaf, so every pod starts on it):
- `evict`: `ca revoke GEN`: shim pods re-keyed, kubelet pods evicted in waves (--wave-size 10);
- `now`: `ca revoke GEN --now`: the same, the root out of every bundle at once;
- `wait-refresh`: `ca revoke GEN --wait-refresh`: kubelet pods re-key at their own refresh.
Each command also gets `--signer-name` (a pod whose requests the controller-manager deleted
after 15 minutes stays stale until it asks again, instead of being forgotten).
Measured from the command's start: `clean`, every live pod's credential file on disk (under the
shim's root or the hollow kubelet's) no longer chains to the revoked generation (polled every
0.5 s); `done`, the command exited (it untrusts the root then); `untrusted`, no
ClusterTrustBundle of the signer holds the revoked root; the pair's calls during the mode
(a fresh client per mode) and how many failed.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509

from bench.bench_time_to_credential import devcluster
from devcluster import images, kube, nodes, processes
from devcluster.identities import Paths
from devcluster.nodestate import NodeState
from devcluster.stack import listening, wait_for
from devcluster.supervise import free_port
from podcert.api.volumes import volume_dir
from podcert.client.rest import JSON, Rest, path_of
from signer.authority import revoke, schedule

SIGNER = processes.DEFAULT_SIGNER
SIGNER_NAMESPACE = "podcert-system"
NAMESPACE = "revoke-bench"
TRUST_DOMAIN = "cluster.local"
BUNDLE, TRUST = "credentialbundle.pem", "trust-bundle.pem"
LIFETIME = 3600
MODES = {"evict": [], "now": ["--now"], "wait-refresh": ["--wait-refresh"]}
TIMEOUTS = {"evict": 600, "now": 600, "wait-refresh": 1800}
# A container that exits at once on SIGTERM (the real node's pods).
KEEP_RUNNING = ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def identity_volume() -> dict[str, Any]:
    volume = kube.pod_certificate_volume(
        SIGNER, max_expiration_seconds=LIFETIME, trust_bundle_signer=True
    )
    volume["projected"]["defaultMode"] = 0o600
    return volume


@dataclass
class Bench:
    root: Path
    work: Path
    signer: processes.Signer | None = None
    shims: dict[str, processes.Shim] = field(default_factory=dict)
    hollow: dict[str, NodeState] = field(default_factory=dict)
    server: processes.Process | None = None
    pair: tuple[str, str] = ("", "")  # the server's and the client's pod UIDs
    port: int = 0
    real: bool = False  # the kubelet node is the real kubelet (containers run)

    @property
    def kubeconfig(self) -> Path:
        return Paths(self.root.resolve()).admin_kubeconfig

    def rest(self) -> Rest:
        return Rest(kube.admin_client(self.root))

    # --- set up ----------------------------------------------------------------------------

    def start(self, shim_nodes: int, hollow_nodes: int, pods: int, budget: int) -> None:
        self.signer = processes.signer(
            self.root,
            self.work / "signer",
            [SIGNER],
            namespace=SIGNER_NAMESPACE,
            extra=["--refresh-fraction=0.1"],
        ).start()
        self.signer.wait_ready(60)
        admin = kube.admin_client(self.root)
        kube.ensure_namespace(admin, NAMESPACE)
        for i in range(shim_nodes):
            node = f"node-shim-{i}"
            kube.ensure_node(admin, node)
            proc = processes.shim(self.root, self.work, node, root=self.work / "roots" / node)
            self.shims[node] = proc.start()
        for proc in self.shims.values():
            proc.wait_ready(60)
        per_hollow = (pods // 2) // max(1, hollow_nodes)
        for i in range(hollow_nodes):
            node = "node-real" if self.real else f"node-hollow-{i}"
            self.hollow[node] = nodes.start(
                self.root, node, hollow=not self.real, max_pods=per_hollow + 20
            )
        shim_pods = pods - per_hollow * hollow_nodes
        names = list(self.shims)
        server = kube.create_pod(
            admin,
            NAMESPACE,
            "pair-server",
            node=names[0],
            service_account="pair-server",
            volumes=[identity_volume()],
        )
        client = kube.create_pod(
            admin,
            NAMESPACE,
            "pair-client",
            node=names[-1],
            service_account="pair-client",
            volumes=[identity_volume()],
        )
        self.pair = (server.metadata.uid, client.metadata.uid)
        for j in range(shim_pods - 2):
            kube.create_pod(
                admin,
                NAMESPACE,
                f"app-{j}",
                node=names[j % len(names)],
                service_account="app",
                volumes=[identity_volume()],
            )
        kube.ensure_service_account(admin, NAMESPACE, "app")
        for node in self.hollow:
            self._deployment(node, per_hollow, budget)
        say(
            f"{pods} pods: {shim_pods} on {len(self.shims)} shim node(s), "
            f"{per_hollow * hollow_nodes} on {len(self.hollow)} kubelet node(s)"
        )
        wait_for(lambda: self.holding(None) == pods, 600, f"{pods} pods holding a credential")
        self._start_server()

    def _deployment(self, node: str, replicas: int, budget: int) -> None:
        labels = {"app": node}
        template = {
            "metadata": {"labels": labels},
            "spec": {
                "nodeName": node,
                "serviceAccountName": "app",
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "app",
                        "image": images.BUSYBOX_IMAGE if self.real else "registry.invalid/app:1",
                        "imagePullPolicy": "IfNotPresent",
                        **({"command": KEEP_RUNNING} if self.real else {}),
                        "volumeMounts": [{"name": "identity", "mountPath": "/var/run/identity"}],
                    }
                ],
                "volumes": [identity_volume()],
            },
        }
        rest = self.rest()
        rest.request(
            "POST",
            path_of("apps/v1", "deployments", NAMESPACE),
            body={
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": node, "namespace": NAMESPACE},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": labels},
                    "template": template,
                },
            },
        )
        rest.request(
            "POST",
            path_of("policy/v1", "poddisruptionbudgets", NAMESPACE),
            body={
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": node, "namespace": NAMESPACE},
                "spec": {"maxUnavailable": budget, "selector": {"matchLabels": labels}},
            },
        )

    def _folder(self, uid: str, node: str) -> Path | None:
        if node in self.shims:
            return self.shims[node].volume_dir(uid)
        if node in self.hollow:
            return volume_dir(self.hollow[node].root, uid, "identity")
        return None

    def _start_server(self) -> None:
        server, _ = self._pair_folders()
        self.port = free_port()
        self.server = processes.Process(
            args=[
                f"--credential-bundle={server / BUNDLE}",
                f"--trust-bundle={server / TRUST}",
                f"--allow-workload={NAMESPACE}/pair-client",
                "--host=127.0.0.1",
                f"--port={self.port}",
                "--reload-interval=0.5",
            ],
            log=self.work / "pair-server.log",
            module="examples.mtls.server",
        ).start()
        wait_for(lambda: listening(self.port), 30, "the pair's server")

    def _pair_folders(self) -> tuple[Path, Path]:
        names = list(self.shims)
        server = self.shims[names[0]].volume_dir(self.pair[0])
        client = self.shims[names[-1]].volume_dir(self.pair[1])
        return server, client

    def start_client(self, mode: str, rate: float) -> processes.Process:
        _, client = self._pair_folders()
        return processes.Process(
            args=[
                f"--credential-bundle={client / BUNDLE}",
                f"--trust-bundle={client / TRUST}",
                f"--server-id=spiffe://{TRUST_DOMAIN}/ns/{NAMESPACE}/sa/pair-server",
                f"--url=https://127.0.0.1:{self.port}/",
                f"--rate={rate}",
                "--reload-interval=0.5",
            ],
            log=self.work / f"pair-client-{mode}.log",
            module="examples.mtls.client",
        ).start()

    # --- look --------------------------------------------------------------------------------

    def live_pods(self) -> list[JSON]:
        items: list[JSON] = self.rest().request("GET", path_of("v1", "pods", NAMESPACE))["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def holding(self, revoked: revoke.Revocation | None) -> int:
        """Live pods with a credential on disk (`revoked` None), or with one chaining to it."""
        count = 0
        for pod in self.live_pods():
            folder = self._folder(pod["metadata"]["uid"], pod["spec"].get("nodeName", ""))
            chain = _chain(folder / BUNDLE) if folder else None
            if chain and (revoked is None or revoke.chains_to(chain, revoked)):
                count += 1
        return count

    def published(self, revoked: revoke.Revocation) -> bool:
        found = self.rest().request(
            "GET",
            path_of("certificates.k8s.io/v1", "clustertrustbundles"),
            query={"fieldSelector": f"spec.signerName={SIGNER}"},
        )
        return any(
            revoke.fingerprint(c) == revoked.root_sha256
            for item in found["items"]
            for c in x509.load_pem_x509_certificates(item["spec"]["trustBundle"].encode())
        )

    def active(self) -> revoke.Revocation:
        """What revoking the active generation records: its id and fingerprints."""
        found = self.rest().request("GET", path_of("v1", "secrets", SIGNER_NAMESPACE, "podcert-ca"))
        data = {k: base64.b64decode(v) for k, v in found["data"].items()}
        now = dt.datetime.now(dt.UTC)
        gen = next(g for g in schedule.from_secret(data, now) if g.state == "active")
        return revoke.record(gen, now, untrusted=False)

    def stop(self) -> None:
        procs = [self.server, *self.shims.values(), self.signer]
        for proc in procs:
            if proc is not None:
                proc.stop()
        for node in self.hollow:
            nodes.stop(self.root, node)


def _chain(path: Path) -> list[x509.Certificate] | None:
    try:
        return x509.load_pem_x509_certificates(path.read_bytes())
    except (OSError, ValueError):
        return None


def _summary(proc: processes.Process) -> dict[str, Any]:
    lines = [line for line in proc.output().splitlines() if line.startswith("{")]
    found: dict[str, Any] = json.loads(lines[-1]) if lines else {}
    return found


def run_mode(bench: Bench, mode: str, rate: float, wave_size: int) -> dict[str, Any]:
    target = bench.active()
    before = bench.holding(target)
    client = bench.start_client(mode, rate)
    time.sleep(2.0)  # the client's first calls before the revoke
    load = os.getloadavg()[0]
    say(f"[{mode}] revoking {target.id}: {before} live pod(s) hold its leaves")
    log = (bench.work / f"revoke-{mode}.log").open("w")
    started = time.monotonic()
    command = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "podcert",
            "signer",
            f"--kubeconfig={bench.kubeconfig}",
            f"--namespace={SIGNER_NAMESPACE}",
            "ca",
            "revoke",
            target.id,
            *MODES[mode],
            f"--signer-name={SIGNER}",
            f"--wave-size={wave_size}",
            "--retry-seconds=2",
            f"--timeout={TIMEOUTS[mode]}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    clean = done = untrusted = None
    last = before
    deadline = started + TIMEOUTS[mode] + 60
    while time.monotonic() < deadline and None in (clean, done, untrusted):
        elapsed = time.monotonic() - started
        if clean is None:
            left = bench.holding(target)
            if left != last:
                say(f"[{mode}] {elapsed:6.1f}s: {left} live pod(s) hold its leaves")
                last = left
            if left == 0:
                clean = elapsed
        if done is None and command.poll() is not None:
            done = elapsed
            say(f"[{mode}] {elapsed:6.1f}s: the command exited {command.returncode}")
        if untrusted is None and not bench.published(target):
            untrusted = elapsed
            say(f"[{mode}] {elapsed:6.1f}s: the root is in no trust bundle")
        time.sleep(0.5)
    time.sleep(2.0)  # the client's last calls after the end
    client.stop()
    if command.poll() is None:
        command.kill()
    log.close()
    calls = _summary(client)
    result = {
        "mode": mode,
        "generation": target.id,
        "podsHolding": before,
        "cleanSeconds": clean,
        "commandSeconds": done,
        "commandExit": command.returncode,
        "untrustedSeconds": untrusted,
        "calls": calls.get("requests"),
        "failedCalls": calls.get("failed"),
        "errors": calls.get("errors"),
        "load1": [round(load, 2), round(os.getloadavg()[0], 2)],
    }
    say(f"[{mode}] {json.dumps(result)}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=200, help="pods in all, half on each kind")
    parser.add_argument("--shim-nodes", type=int, default=2)
    parser.add_argument("--hollow-nodes", type=int, default=2)
    parser.add_argument("--modes", default="evict,now,wait-refresh")
    parser.add_argument("--rate", type=float, default=20.0, help="the pair's calls a second")
    parser.add_argument("--budget", type=int, default=5, help="each Deployment's maxUnavailable")
    parser.add_argument("--wave-size", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument(
        "--real", action="store_true", help="the kubelet node is the real kubelet (one node)"
    )
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes modes among {', '.join(MODES)}")
    if args.shim_nodes < 2 or args.hollow_nodes < 1:
        parser.error("--shim-nodes 2 at least (the pair's two ends), --hollow-nodes 1 at least")
    if args.real and args.hollow_nodes != 1:
        parser.error("--real runs one kubelet node: --hollow-nodes 1")
    if args.real and (reason := nodes.real_node_unavailable()):
        parser.error(f"--real: {reason}")
    results = []
    with devcluster("podcert-bench-revoke-") as (root, work):
        bench = Bench(root, work, real=args.real)
        try:
            bench.start(args.shim_nodes, args.hollow_nodes, args.pods, args.budget)
            for mode in modes:
                results.append(run_mode(bench, mode, args.rate, args.wave_size))
        finally:
            bench.stop()
    print(json.dumps(results, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
