"""`podcert demo`: the whole path on a real local control plane, narrated for a newcomer.

Brings up the devcluster (building kube-apiserver and etcd the first time), starts the signer as
its ServiceAccount, creates a pod with a podCertificate volume, asks for its identity as the node
(what the kubelet or `podcert shim` does), shows the certificate, shows a hostile request denied,
and takes everything down. Exits 0 when every step did what it should.
"""

from __future__ import annotations

import argparse
import base64
import tempfile
import time
from pathlib import Path
from typing import Any

from cryptography import x509

from devcluster import cluster, kube, processes
from kubelet_shim import keys
from podcert.rest import JSON, Rest, path_of
from signer import objects

SIGNER = "podcert.dev/workload"
PCRS = "certificates.k8s.io/v1"


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "demo", help="run the end-to-end demo on a local devcluster"
    )
    p.add_argument("--dir", type=Path, default=None, help="state folder (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="leave the devcluster running at the end")
    p.set_defaults(run=run)


def say(text: str) -> None:
    print(text, flush=True)


def _wait_settled(rest: Rest, namespace: str, name: str, timeout: float = 15.0) -> JSON:
    path = path_of(PCRS, "podcertificaterequests", namespace, name)
    deadline = time.monotonic() + timeout
    while True:
        current = rest.request("GET", path)
        if objects.outcome(current):
            return current
        if time.monotonic() > deadline:
            raise TimeoutError(f"{namespace}/{name} was not settled in {timeout:.0f}s")
        time.sleep(0.05)


def _request(api: Any, pod: JSON, node: JSON, sa: JSON, **spec: Any) -> JSON:
    key = keys.generate("ECDSAP256")
    body = {
        "apiVersion": PCRS,
        "kind": "PodCertificateRequest",
        "metadata": {"generateName": f"{pod['metadata']['name']}-"},
        "spec": {
            "signerName": SIGNER,
            "podName": pod["metadata"]["name"],
            "podUID": pod["metadata"]["uid"],
            "serviceAccountName": sa["metadata"]["name"],
            "serviceAccountUID": sa["metadata"]["uid"],
            "nodeName": node["metadata"]["name"],
            "nodeUID": node["metadata"]["uid"],
            "stubPKCS10Request": base64.b64encode(keys.stub_csr(key)).decode(),
            **spec,
        },
    }
    ns = pod["metadata"]["namespace"]
    return Rest(api).request("POST", path_of(PCRS, "podcertificaterequests", ns), body=body)


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="podcert-demo-") as tmp:
        root = args.dir or Path(tmp) / "devcluster"
        say("== 1. A real control plane: etcd + kube-apiserver v1.37, built from Go modules ==")
        state = cluster.up(root, progress=lambda line: say("   " + line))
        signer = None
        try:
            say(f"   API server ready at {state.server}")
            say("\n== 2. The signer, running as its ServiceAccount with least-privilege RBAC ==")
            signer = processes.signer(root, Path(tmp), [SIGNER]).start()
            signer.wait_ready()
            say(f"   serving {SIGNER}; the CA lives in Secret podcert-system/podcert-ca")

            say("\n== 3. A pod with a podCertificate volume, bound to node-a ==")
            with kube.admin_client(root) as admin:
                kube.ensure_namespace(admin, "shop")
                kube.create_pod(
                    admin,
                    "shop",
                    "checkout",
                    node="node-a",
                    service_account="checkout",
                    volumes=[kube.pod_certificate_volume(SIGNER)],
                )
                kube.ensure_node(admin, "node-a")
                rest = Rest(admin)
                pod = rest.request("GET", path_of("v1", "pods", "shop", "checkout"))
                node = rest.request("GET", path_of("v1", "nodes", None, "node-a"))
                sa = rest.request("GET", path_of("v1", "serviceaccounts", "shop", "checkout"))
                say("   pod shop/checkout, service account checkout")

                say("\n== 4. node-a asks for the pod's identity (key made on the node) ==")
                with kube.api_client(kube.node_kubeconfig(root, "node-a")) as node_api:
                    pcr = _request(node_api, pod, node, sa)
                done = _wait_settled(rest, "shop", pcr["metadata"]["name"])
                status = done["status"]
                leaf = x509.load_pem_x509_certificates(status["certificateChain"].encode())[0]
                san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                spiffe_id = san.get_values_for_type(x509.UniformResourceIdentifier)[0]
                say(f"   {status['conditions'][0]['type']}: {spiffe_id}")
                say(f"   valid {status['notBefore']} .. {status['notAfter']}")
                say(f"   the node should refresh from {status['beginRefreshAt']}")

                say("\n== 5. node-b asks for the same pod: NodeRestriction refuses ==")
                with kube.api_client(kube.node_kubeconfig(root, "node-b")) as other:
                    try:
                        _request(other, pod, node, sa)
                        say("   UNEXPECTED: accepted")
                        return 1
                    except Exception as err:
                        say(f"   refused: {str(err).splitlines()[0][:160]}")

                say("\n== 6. An admin (no NodeRestriction) asks for another SA's identity ==")
                kube.ensure_service_account(admin, "shop", "payments")
                payments = rest.request("GET", path_of("v1", "serviceaccounts", "shop", "payments"))
                forged = _request(admin, pod, node, payments)
                denied = _wait_settled(rest, "shop", forged["metadata"]["name"])
                cond = denied["status"]["conditions"][0]
                say(f"   {cond['type']} ({cond['reason']}): {cond['message']}")
                if cond["type"] != "Denied":
                    return 1
            say("\n== Done: right pod issued, wrong node refused, forged identity denied ==")
            return 0
        finally:
            if signer is not None:
                signer.stop()
            if not args.keep:
                cluster.down(root)
                say("   devcluster stopped; no process left behind")
