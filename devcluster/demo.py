"""`podcert demo`: the whole of podcert on a real local control plane, narrated for a newcomer.

Brings up the devcluster (building kube-apiserver and etcd the first time), starts the signer as
its ServiceAccount and a shim for one node, creates two pods that get their identities, shows a
third on a node run by the real kubelet (containerd and a real container where the machine
allows it, with a one-line reason and kubemark's hollow kubelet where not), keeps the
example mTLS pair talking while it forces a leaf rotation and then a full CA rotation, shows that
a wrong node and a forged identity are refused, prints the `podcert audit` table, and takes
everything down. Exits 0 when every step did what it should; Ctrl-C stops cleanly.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cryptography import x509
from kubernetes import client
from kubernetes.client import ApiException

from bundles import formats
from devcluster import cluster, host, images, kube, nodes
from devcluster.nodestate import NodeState
from devcluster.stack import BUNDLE, TRUST, Stack, identity_volume, wait_for
from podcert.api import keys
from podcert.api.requests import outcome
from podcert.api.volumes import volume_dir
from podcert.client.rest import JSON, ApiError, Rest, path_of
from podcert.errors import ConfigError

PCRS = "certificates.k8s.io/v1"


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "demo", help="run the end-to-end demo on a local devcluster"
    )
    p.add_argument("--dir", type=Path, default=None, help="work folder (default: a temp dir)")
    p.add_argument("--rate", type=float, default=50.0, help="requests/s of the example client")
    p.set_defaults(run=run)


def say(text: str = "") -> None:
    print(text, flush=True)


def step(title: str) -> None:
    say(f"\n== {title} ==")


def _spiffe(leaf: x509.Certificate) -> str:
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return str(san.get_values_for_type(x509.UniformResourceIdentifier)[0])


LAB = "lab"  # the wrong parties' target lives apart, so the audit of `shop` stays about shop
KUBELET_NODE = "node-k"
MAX_RATE = 1000.0  # the example client on one core
# The container says what it sees of its credential, then waits to be stopped (a shell that
# traps TERM, so deleting the pod takes no grace period).
MOUNT = "/var/run/identity"
REPORT = [
    "sh",
    "-c",
    f"stat -L -c 'mode=%a' {MOUNT}/{BUNDLE} && grep -c 'BEGIN CERTIFICATE' {MOUNT}/{BUNDLE}"
    " && trap 'exit 0' TERM && sleep 3600 & wait",
]


def _forge(stack: Stack, api: Any, pod: JSON, service_account: str) -> JSON:
    """A request for `pod` naming `service_account`, made by `api`'s identity."""
    rest = stack.rest()
    node = rest.request("GET", path_of("v1", "nodes", None, pod["spec"]["nodeName"]))
    sa = rest.request("GET", path_of("v1", "serviceaccounts", LAB, service_account))
    body = {
        "apiVersion": PCRS,
        "kind": "PodCertificateRequest",
        "metadata": {"generateName": "forged-"},
        "spec": {
            "signerName": stack.signer_name,
            "podName": pod["metadata"]["name"],
            "podUID": pod["metadata"]["uid"],
            "serviceAccountName": service_account,
            "serviceAccountUID": sa["metadata"]["uid"],
            "nodeName": node["metadata"]["name"],
            "nodeUID": node["metadata"]["uid"],
            "stubPKCS10Request": base64.b64encode(
                keys.stub_csr(keys.generate("ECDSAP256"))
            ).decode(),
        },
    }
    return Rest(api).request("POST", path_of(PCRS, "podcertificaterequests", LAB), body=body)


def run(args: argparse.Namespace) -> int:
    if not 0 < args.rate <= MAX_RATE:
        raise ConfigError(f"--rate must be above 0 and at most {MAX_RATE:g} requests/s")
    with tempfile.TemporaryDirectory(prefix="podcert-demo-") as tmp:
        work = (args.dir or Path(tmp)).resolve()
        root = work / "devcluster"
        step("1. A real cluster: etcd, kube-apiserver, controller-manager, scheduler v1.37 from Go")
        cluster.down(root)  # a story starts from nothing: a folder used before is reset
        shutil.rmtree(root / "etcd", ignore_errors=True)
        state = cluster.up(root, progress=lambda line: say("   " + line))
        stack = Stack(root, work)
        ok = False
        try:
            say(f"   API server ready at {state.server}")
            ok = _story(stack, work, args.rate)
        except KeyboardInterrupt:
            say("\n   interrupted: taking everything down")
        except (TimeoutError, RuntimeError, ApiError, ApiException) as err:
            say(f"\n   FAILED: {err}")
        finally:
            stack.stop()
            cluster.down(root)
            say("   signer, shim, example pair and devcluster stopped; no process left behind")
        return 0 if ok else 1


def _story(stack: Stack, work: Path, rate: float) -> bool:
    audit_log = work / "audit.jsonl"
    step("2. The signer, as its ServiceAccount with least-privilege RBAC")
    stack.start_signer(f"--audit-log={audit_log}", "--audit-checkpoint-every=10")
    say(
        f"   serving {stack.signer_name}; CA in Secret podcert-system/podcert-ca; "
        "roots published as ClusterTrustBundle podcert.dev:workload:roots"
    )
    step(f"3. The node agent (podcert shim) for {stack.node}, with the node's own identity")
    stack.start_shim()
    say(f"   projecting into {work / 'node'}/pods/<uid>/volumes/kubernetes.io~projected/")

    step("4. Two pods with a podCertificate + clusterTrustBundle volume: api and web")
    started = time.monotonic()
    pods = stack.create_pods()
    for name, pod in pods.items():
        leaf = stack.wait_identity(pod)
        say(
            f"   {name}: {_spiffe(leaf)}  serial {leaf.serial_number:x}  "
            f"(on disk {time.monotonic() - started:.2f}s after creation; key made on the node)"
        )

    if not _kubelet_story(stack):
        return False

    step("6. The example pair talks mutual TLS with those files")
    stack.start_pair(pods, rate=rate)
    say(
        f"   client -> https://127.0.0.1:{stack.port}/ at {rate:.0f} requests/s; the server "
        "allows only ns/shop/sa/web, the client only ns/shop/sa/api"
    )

    step("7. A leaf rotation of both pods (emergency re-key: podcert shim rotate)")
    for name, pod in pods.items():
        old, new = stack.rekey(name, pod)
        say(f"   {name}: serial {old.serial_number if old else 0:x} -> {new.serial_number:x}")

    step("8. A full CA rotation: prepare, activate, retire")
    stack.ca("prepare")
    wait_for(lambda: all(stack.trust_roots(p) == 2 for p in pods.values()), 15, "the new root")
    say("   prepared: the new root is in both pods' trust files next to the old one")
    stack.ca("activate")
    for name, pod in pods.items():
        _, new = stack.rekey(name, pod)
        say(f"   activated: {name} re-issued by the new CA ({new.issuer.rfc4514_string()})")
    stack.ca("retire", "--force")
    wait_for(lambda: all(stack.trust_roots(p) == 1 for p in pods.values()), 15, "one root")
    say("   retired: the old root is gone from every trust file")

    step("9. What the wrong parties get")
    rest = stack.rest()
    with kube.admin_client(stack.root) as admin:
        kube.ensure_namespace(admin, LAB)
        kube.ensure_service_account(admin, LAB, "payments")
        kube.create_pod(
            admin,
            LAB,
            "target",
            node=stack.node,
            service_account="web",
            volumes=[kube.pod_certificate_volume(stack.signer_name)],
        )
    target = rest.request("GET", path_of("v1", "pods", LAB, "target"))
    with kube.api_client(kube.node_kubeconfig(stack.root, "node-b")) as node_b:
        try:
            _forge(stack, node_b, target, "web")
            say("   UNEXPECTED: node-b was allowed to ask for a pod on node-a")
            return False
        except ApiError as err:
            say(f"   node-b asks for lab/target's identity: API server refuses ({err.status})")
    with kube.admin_client(stack.root) as admin:
        forged = _forge(stack, admin, target, "payments")
    name = forged["metadata"]["name"]

    def settled() -> JSON | None:
        got = rest.request("GET", path_of(PCRS, "podcertificaterequests", LAB, name))
        return got if outcome(got) else None

    cond = wait_for(settled, 15, "the forged request's outcome")["status"]["conditions"][0]
    say(f"   an admin asks for lab/target as 'payments': {cond['type']} ({cond['reason']})")
    if cond["type"] != "Denied":
        return False

    step("10. The pair's own count")
    summary = stack.stop_pair()
    client, server = summary.get("client", {}), summary.get("server", {})
    say(
        f"   client: {client.get('ok', 0)} ok, {client.get('failed', '?')} failed; "
        f"saw {len(client.get('server_serials', []))} server certificates"
    )
    say(
        f"   server: served {server.get('served', 0)}, saw "
        f"{len(server.get('client_serials', []))} client certificates"
    )

    step("11. podcert audit: cluster + node files + the signer's audit log")
    audit = subprocess.run(
        [
            sys.executable,
            "-m",
            "podcert",
            "audit",
            f"--kubeconfig={stack.admin_kubeconfig}",
            f"--root={work / 'node'}",
            f"--audit-log={audit_log}",
            f"--namespace={stack.namespace}",
            f"--signer-name={stack.signer_name}",
            "--all",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    say(audit.stdout.rstrip())
    good = client.get("failed") == 0 and client.get("ok", 0) > 0 and audit.returncode == 0
    step(
        "Done: " + ("every step as expected, zero failed requests" if good else "SOMETHING FAILED")
    )
    return good


def _real_node_unavailable() -> str | None:
    """Why the demo's kubelet node cannot be real here, after installing Debian's containerd and
    runc when they are all that is missing and we may."""
    reason = nodes.real_node_unavailable()
    if reason and host.missing_packages() and os.geteuid() == 0:
        host.install_packages(lambda line: say("   " + line))
        reason = nodes.real_node_unavailable()
    return reason


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes() or None
    except OSError:
        return None


def _kubelet_story(stack: Stack) -> bool:
    """A pod on a node run by the real kubelet: the kubelet makes the key and the request, the
    same signer answers, the container reads its credential; deleting the pod takes it away."""
    reason = _real_node_unavailable()
    kind = "hollow kubelet (kubemark)" if reason else "real kubelet, containerd + runc"
    step(f"5. A third node, {KUBELET_NODE}, run by the {kind}")
    if reason:
        say(f"   no real node on this machine ({reason}):")
        say("   kubemark's hollow kubelet stands in: the kubelet's own code, containers faked")
    node = nodes.start(
        stack.root, KUBELET_NODE, hollow=reason is not None, progress=lambda x: say("   " + x)
    )
    volume = identity_volume(stack.signer_name)
    volume["projected"]["defaultMode"] = 0o600  # the README's advice: the key for its owner only
    started = time.monotonic()
    with kube.admin_client(stack.root) as admin:
        kube.create_pod(
            admin,
            stack.namespace,
            "report",
            node=KUBELET_NODE,
            service_account="report",
            volumes=[volume],
            image=images.BUSYBOX_IMAGE,
            command=REPORT,
        )
    rest = stack.rest()
    pod = rest.request("GET", path_of("v1", "pods", stack.namespace, "report"))
    folder = volume_dir(node.root, pod["metadata"]["uid"], volume["name"])
    bundle = wait_for(lambda: _read(folder / BUNDLE), 60, "the kubelet's credential")
    took = time.monotonic() - started
    trust = wait_for(lambda: _read(folder / TRUST), 15, "the kubelet's trust bundle")
    credential = formats.load_credential(bundle)
    formats.verify_chain(credential, formats.load_trust_bundle(trust), dt.datetime.now(dt.UTC))
    found = rest.request("GET", path_of(PCRS, "podcertificaterequests", stack.namespace))
    asked = {i["spec"]["nodeName"] for i in found["items"] if i["spec"]["podName"] == "report"}
    say(
        f"   report: {credential.spiffe_id}  serial {credential.leaf.serial_number:x}  "
        f"(written by the kubelet {took:.2f}s after creation; requested by {', '.join(asked)})"
    )
    if not reason and not _container_reads(stack, node):
        return False
    with kube.admin_client(stack.root) as admin:
        client.CoreV1Api(admin).delete_namespaced_pod("report", stack.namespace)
    wait_for(lambda: not folder.exists(), 60, "the kubelet to remove the deleted pod's files")
    say("   pod deleted: the kubelet removed its key and certificate from the node")
    return True


def _container_reads(stack: Stack, node: NodeState) -> bool:
    """What the container printed: its credential's mode and how many certificates it holds."""
    with kube.admin_client(stack.root) as admin:
        core = client.CoreV1Api(admin)

        def output() -> str | None:
            pod = core.read_namespaced_pod("report", stack.namespace)
            if pod.status is None or pod.status.phase != "Running":
                return None
            text: str = core.read_namespaced_pod_log("report", stack.namespace)
            return text if text.count("\n") >= 2 else None

        logs: str = wait_for(output, 60, "the container to start and print what it sees")
    mode, _, count = logs.strip().partition("\n")
    say(f"   inside the container on {node.node}: {BUNDLE} {mode}, {count} certificate(s)")
    return mode == "mode=600"
