"""The fleet the chaos soak (`bench.soak`) runs and hurts: two signer replicas, three shim nodes, a
node run by the real kubelet, pods with identities, and example mTLS pairs talking all along.

Everything is a real process on a devcluster: the signer replicas as their ServiceAccount (with
leader election), each shim as its node, the kubelet as its node (containerd and real containers
where the machine allows it, kubemark's hollow kubelet where not), the pairs reading the files the
shims and the kubelet project. A killed process is started again as its Deployment or DaemonSet
would start it: same command line, same files.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509

from bundles import formats
from devcluster import images, kube, nodes, processes
from devcluster.identities import Paths
from devcluster.nodestate import NodeState
from devcluster.stack import listening, wait_for
from devcluster.supervise import free_port
from podcert.api.volumes import volume_dir
from podcert.client.rest import JSON, ApiError, Rest, path_of

SIGNER = processes.DEFAULT_SIGNER
SIGNER_NAMESPACE = "podcert-system"
NAMESPACE = "soak"
TRUST_DOMAIN = "cluster.local"
BUNDLE, TRUST = "credentialbundle.pem", "trust-bundle.pem"
LEASE = "podcert-signer"
KUBELET_NODE = "node-k"
# One hour, the API's shortest lifetime, refreshed at a tenth of it: every credential rotates on
# its own every six minutes or so, on the shim's nodes and the kubelet's alike.
LIFETIME = 3600
REFRESH_FRACTION = 0.1
SLEEP = ["sh", "-c", "trap 'exit 0' TERM; sleep 86400 & wait"]


def identity_volume() -> dict[str, Any]:
    volume = kube.pod_certificate_volume(
        SIGNER, max_expiration_seconds=LIFETIME, trust_bundle_signer=True
    )
    volume["projected"]["defaultMode"] = 0o600  # the key for its owner only (README)
    return volume


@dataclass
class Pod:
    name: str
    uid: str
    node: str
    service_account: str
    folder: Path  # where its identity volume is projected

    @property
    def bundle(self) -> Path:
        return self.folder / BUNDLE

    @property
    def trust(self) -> Path:
        return self.folder / TRUST


@dataclass
class Pair:
    """An example server and client, each reading one pod's files."""

    server_pod: Pod
    client_pod: Pod
    port: int
    server: processes.Process
    client: processes.Process

    def summaries(self) -> dict[str, JSON]:
        out: dict[str, JSON] = {}
        for name, proc in (("client", self.client), ("server", self.server)):
            lines = [line for line in proc.output().splitlines() if line.startswith("{")]
            out[name] = json.loads(lines[-1]) if lines else {}
        return out


@dataclass
class Fleet:
    root: Path  # the devcluster's folder
    work: Path
    signers: list[processes.Signer] = field(default_factory=list)
    shims: dict[str, processes.Shim] = field(default_factory=dict)
    kubelet: NodeState | None = None
    kubelet_reason: str | None = None  # why the kubelet's node is hollow, if it is
    pods: list[Pod] = field(default_factory=list)
    pairs: list[Pair] = field(default_factory=list)

    @property
    def admin_kubeconfig(self) -> Path:
        return Paths(self.root.resolve()).admin_kubeconfig

    def rest(self) -> Rest:
        return Rest(kube.admin_client(self.root))

    # --- start -----------------------------------------------------------------------------

    def start_signers(self, replicas: int) -> None:
        for i in range(replicas):
            work = self.work / f"replica-{i}"
            proc = processes.signer(
                self.root,
                work,
                [SIGNER],
                namespace=SIGNER_NAMESPACE,
                extra=[
                    f"--identity=replica-{i}",
                    f"--audit-log={work / 'audit.jsonl'}",
                    f"--refresh-fraction={REFRESH_FRACTION}",
                ],
            )
            self.signers.append(proc.start())
        for proc in self.signers:
            proc.wait_ready(60)

    def start_shims(self, count: int) -> None:
        for i in range(count):
            node = f"node-{i}"
            with kube.admin_client(self.root) as admin:
                kube.ensure_node(admin, node)
            proc = processes.shim(self.root, self.work, node, root=self.work / "roots" / node)
            self.shims[node] = proc.start()
        for proc in self.shims.values():
            proc.wait_ready(60)

    def start_kubelet(self, progress: Any, sync_seconds: float | None = None) -> None:
        """The real kubelet where the machine allows one, else the hollow one. `sync_seconds`
        shortens a real kubelet's pod resync, which paces how soon a new root reaches its
        pods' trust files (the kubelet's own: 1 min plus jitter)."""
        reason = nodes.real_node_unavailable()
        self.kubelet_reason = reason
        sync = dt.timedelta(seconds=sync_seconds) if sync_seconds and reason is None else None
        self.kubelet = nodes.start(
            self.root,
            KUBELET_NODE,
            hollow=reason is not None,
            progress=progress,
            sync_frequency=sync,
        )

    @property
    def kubelet_is_real(self) -> bool:
        return self.kubelet is not None and self.kubelet_reason is None

    def create_pods(self, count: int, kubelet_pods: int, accounts: int) -> None:
        """`count` pods over the shims' nodes and the kubelet's (`kubelet_pods` of them there),
        running as `accounts` service accounts in turn."""
        shim_nodes = list(self.shims)
        placement = [KUBELET_NODE] * kubelet_pods + [
            shim_nodes[i % len(shim_nodes)] for i in range(count - kubelet_pods)
        ]
        with kube.admin_client(self.root) as admin:
            kube.ensure_namespace(admin, NAMESPACE)
            for i, node in enumerate(placement):
                self.pods.append(self._create_pod(admin, f"app-{i}", node, f"sa-{i % accounts}"))

    def _create_pod(self, admin: Any, name: str, node: str, account: str) -> Pod:
        on_kubelet = node == KUBELET_NODE
        created = kube.create_pod(
            admin,
            NAMESPACE,
            name,
            node=node,
            service_account=account,
            volumes=[identity_volume()],
            image=images.BUSYBOX_IMAGE if on_kubelet else "registry.invalid/app:1",
            command=SLEEP if on_kubelet else None,
        )
        uid = created.metadata.uid
        if on_kubelet:
            assert self.kubelet is not None
            folder = volume_dir(self.kubelet.root, uid, "identity")
        else:
            folder = self.shims[node].volume_dir(uid)
        return Pod(name, uid, node, account, folder)

    def start_pairs(self, count: int, rate: float) -> None:
        """`count` pairs across the shims' nodes, and one whose server lives on the kubelet's
        node when that node is real (a hollow kubelet's root moves on each restart)."""
        shim_nodes = list(self.shims)
        homes = [
            (shim_nodes[i % len(shim_nodes)], shim_nodes[(i + 1) % len(shim_nodes)])
            for i in range(count)
        ]
        if self.kubelet_is_real:
            homes.append((KUBELET_NODE, shim_nodes[0]))
        with kube.admin_client(self.root) as admin:
            for i, (server_node, client_node) in enumerate(homes):
                server = self._create_pod(
                    admin, f"pair-{i}-server", server_node, f"pair-{i}-server"
                )
                client = self._create_pod(
                    admin, f"pair-{i}-client", client_node, f"pair-{i}-client"
                )
                self.pods += [server, client]
                self.wait_credentials([server, client], 120)
                self.pairs.append(self._start_pair(i, server, client, rate))

    def _start_pair(self, i: int, server_pod: Pod, client_pod: Pod, rate: float) -> Pair:
        port = free_port()
        server = processes.Process(
            args=[
                f"--credential-bundle={server_pod.bundle}",
                f"--trust-bundle={server_pod.trust}",
                f"--allow-workload={NAMESPACE}/{client_pod.service_account}",
                "--host=127.0.0.1",
                f"--port={port}",
                "--reload-interval=0.5",
            ],
            log=self.work / f"pair-{i}-server.log",
            module="examples.mtls.server",
        ).start()
        wait_for(lambda: listening(port), 30, f"pair {i}'s server")
        client = processes.Process(
            args=[
                f"--credential-bundle={client_pod.bundle}",
                f"--trust-bundle={client_pod.trust}",
                f"--server-id=spiffe://{TRUST_DOMAIN}/ns/{NAMESPACE}/sa/{server_pod.service_account}",
                f"--url=https://127.0.0.1:{port}/",
                f"--rate={rate}",
                "--reload-interval=0.5",
            ],
            log=self.work / f"pair-{i}-client.log",
            module="examples.mtls.client",
        ).start()
        return Pair(server_pod, client_pod, port, server, client)

    # --- look --------------------------------------------------------------------------------

    def wait_credentials(self, pods: list[Pod], timeout: float) -> None:
        missing = list(pods)

        def done() -> bool:
            missing[:] = [p for p in missing if read_credential(p) is None]
            return not missing

        wait_for(done, timeout, f"credentials of {len(pods)} pods ({len(missing)} missing)")

    def leader(self) -> str | None:
        try:
            lease = self.rest().request(
                "GET", path_of("coordination.k8s.io/v1", "leases", SIGNER_NAMESPACE, LEASE)
            )
        except (ApiError, OSError):
            return None
        holder: str | None = lease.get("spec", {}).get("holderIdentity")
        return holder

    def shim_accounts(self) -> list[str]:
        """The service accounts with pods on the shims' nodes (`podcert shim rotate` re-keys)."""
        return sorted({p.service_account for p in self.pods if p.node in self.shims})

    def requests(self) -> list[JSON]:
        found = self.rest().request(
            "GET", path_of("certificates.k8s.io/v1", "podcertificaterequests", NAMESPACE)
        )
        items: list[JSON] = found["items"]
        return items

    def podcert(self, *args: str, timeout: float = 60.0) -> str:
        """A podcert command as an operator runs it, retried until it succeeds or `timeout`
        passes (the faults make the API server briefly unreachable)."""
        deadline = time.monotonic() + timeout
        while True:
            done = subprocess.run(
                [sys.executable, "-m", "podcert", *args],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if done.returncode == 0:
                return done.stdout
            if time.monotonic() > deadline:
                raise RuntimeError(f"podcert {' '.join(args[:3])}: {done.stderr.strip()[-400:]}")
            time.sleep(1.0)

    def rotate(self, account: str) -> None:
        """Re-key every pod of `account` on the shims' nodes, as an operator does: pod by pod,
        since `--service-account` refuses to claim the re-key of the account's pods on kubelet
        nodes (those the CA rotation re-keys by restarting their kubelet)."""
        for pod in self.pods:
            if pod.service_account == account and pod.node in self.shims:
                self.podcert(
                    "shim",
                    "rotate",
                    f"--kubeconfig={self.admin_kubeconfig}",
                    f"--namespace={NAMESPACE}",
                    f"--pod={pod.name}",
                )

    def ca(self, action: str, *flags: str) -> str:
        return self.podcert(
            "signer",
            "ca",
            action,
            f"--kubeconfig={self.admin_kubeconfig}",
            f"--namespace={SIGNER_NAMESPACE}",
            *flags,
        )

    def stop(self) -> None:
        for pair in self.pairs:
            for proc in (pair.client, pair.server):
                proc.stop()
        for proc in [*self.shims.values(), *self.signers]:
            proc.stop()


def read_credential(pod: Pod) -> formats.Credential | None:
    """The pod's credential when it is on disk and chains to the roots in its own trust file."""
    try:
        credential = formats.load_credential(pod.bundle.read_bytes())
        roots = formats.load_trust_bundle(pod.trust.read_bytes())
        formats.verify_chain(credential, roots, dt.datetime.now(dt.UTC))
    except (OSError, ValueError):  # absent, half-written or not (yet) chaining: not ready
        return None
    return credential


def trust_roots(pod: Pod) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pod.trust.read_bytes())
    except (OSError, ValueError):
        return []
