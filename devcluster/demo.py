"""`podcert demo`: the whole of podcert on a real local control plane, narrated for a newcomer.

Brings up the devcluster (building kube-apiserver and etcd the first time), starts the signer as
its ServiceAccount and a shim for one node, creates two pods that get their identities, keeps the
example mTLS pair talking while it forces a leaf rotation and then a full CA rotation, shows that
a wrong node and a forged identity are refused, prints the `podcert audit` table, and takes
everything down. Exits 0 when every step did what it should; Ctrl-C stops cleanly.
"""

from __future__ import annotations

import argparse
import base64
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cryptography import x509

from devcluster import cluster, kube
from devcluster.stack import Stack, wait_for
from podcert.api import keys
from podcert.rest import JSON, ApiError, Rest, path_of
from signer import objects

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
    with tempfile.TemporaryDirectory(prefix="podcert-demo-") as tmp:
        work = (args.dir or Path(tmp)).resolve()
        root = work / "devcluster"
        step("1. A real control plane: etcd + kube-apiserver v1.37, built from Go modules")
        state = cluster.up(root, progress=lambda line: say("   " + line))
        stack = Stack(root, work)
        ok = False
        try:
            say(f"   API server ready at {state.server}")
            ok = _story(stack, work, args.rate)
        except KeyboardInterrupt:
            say("\n   interrupted: taking everything down")
        except (TimeoutError, RuntimeError, ApiError) as err:
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

    step("5. The example pair talks mutual TLS with those files")
    stack.start_pair(pods, rate=rate)
    say(
        f"   client -> https://127.0.0.1:{stack.port}/ at {rate:.0f} requests/s; the server "
        "allows only ns/shop/sa/web, the client only ns/shop/sa/api"
    )

    step("6. A leaf rotation of both pods (emergency re-key: podcert shim rotate)")
    for name, pod in pods.items():
        old, new = stack.rekey(name, pod)
        say(f"   {name}: serial {old.serial_number if old else 0:x} -> {new.serial_number:x}")

    step("7. A full CA rotation: prepare, activate, retire")
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

    step("8. What the wrong parties get")
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
        return got if objects.outcome(got) else None

    cond = wait_for(settled, 15, "the forged request's outcome")["status"]["conditions"][0]
    say(f"   an admin asks for lab/target as 'payments': {cond['type']} ({cond['reason']})")
    if cond["type"] != "Denied":
        return False

    step("9. The pair's own count")
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

    step("10. podcert audit: cluster + node files + the signer's audit log")
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
