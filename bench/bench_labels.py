"""Memory: what pods with thousands of labels cost the signer, the API server and etcd.

    .venv/bin/python -m bench.bench_labels [--pods 1000] [--labels 7000] [--threads 4]
        [--annotation-bytes 0] [--tree PATH ...] [--rounds 1]

Kubernetes bounds each label (key <= 317 bytes, value <= 63), not their number, so any tenant who
may create pods can make their labels as large as the pod itself (etcd's 1.5 MiB per object).
On a fresh devcluster: `podcert signer` (policy `dnsNames.services: true`, the one feature that
reads labels) runs as its ServiceAccount; its RSS (VmRSS of /proc/<pid>/status) is read once it
is ready on the empty cluster. Then `--pods` Pending pods (bound to a Node object with no
kubelet) are created, each with `--labels` labels of 60 bytes of JSON each
(`"tenant.example/k00042":"p0042-vvv..."`, about 420 KB a pod at 7,000) and optionally
`--annotation-bytes` of annotations. Reported:

- the running signer's RSS after the pods came in through its watch (read after its own watch
  has delivered a marker pod created last: the signer settles a request for it);
- a restarted signer's RSS once ready (its list went through every pod: what a crash-looping
  signer relists), and its peak (VmHWM) during that list;
- the API server's and etcd's RSS before and after, and the creation's wall time;
- with `--tree` (once per checkout, e.g. `git archive <commit> | tar -x -C /tmp/old`), the
  restart measured for the signer of each checkout in turn, `--rounds` times alternated, on the
  one loaded cluster (the running signer and the DNS names are this checkout's);
- that the DNS names still come out right: a request for one of the pods is Issued with the name
  of a Service whose selector key is among its thousands of labels.
"""

from __future__ import annotations

import argparse
import base64
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cryptography import x509

from bench.bench_time_to_credential import devcluster, pid_of, prepare_namespace, rss_mib
from devcluster import identities, kube, planestate, processes
from devcluster.kube import pod_certificate_volume
from podcert.api import keys
from podcert.client.rest import JSON, ApiError, Rest, path_of


def labels_size(labels: dict[str, str]) -> int:
    """Bytes of the labels as the API server writes them (JSON without spaces)."""
    return 1 + sum(len(k) + len(v) + 6 for k, v in labels.items())


SIGNER = "bench.podcert.dev/labels"
SIGNER_NAMESPACE = "podcert-labels"
NAMESPACE = "tenant"
NODE = "node-nowhere"
PCRS = "certificates.k8s.io/v1"
POLICY = f"""
signers:
  - name: {SIGNER}
    trustDomain: labels.bench
    dnsNames:
      services: true
      clusterDomain: cluster.local
"""
DEEP_KEY = "tenant.example/deep"


def labels_of(i: int, count: int) -> dict[str, str]:
    labels = {f"tenant.example/k{n:05d}": f"p{i:04d}-" + "v" * 30 for n in range(count - 1)}
    labels[DEEP_KEY] = "deep"
    return labels


def pod_body(i: int, count: int, annotation_bytes: int) -> JSON:
    annotations = {
        f"tenant.example/a{n}": "a" * 60_000 for n in range(max(0, annotation_bytes) // 60_000)
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"big-{i}",
            "namespace": NAMESPACE,
            "labels": labels_of(i, count),
            "annotations": annotations,
        },
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "app",
                    "image": "registry.invalid/app:1",
                    "volumeMounts": [{"name": "identity", "mountPath": "/var/run/identity"}],
                }
            ],
            # NodeRestriction lets a node ask only for a pod that mounts the signer's source.
            "volumes": [pod_certificate_volume(SIGNER)],
        },
    }


def start_signer(
    root: Path, work: Path, policy: Path, tree: Path = processes.REPO
) -> processes.Signer:
    """The signer of the checkout at `tree`, ready (every cache listed)."""
    proc = processes.signer(
        root, work, [SIGNER], namespace=SIGNER_NAMESPACE, extra=[f"--policy={policy}"]
    )
    if tree == processes.REPO:
        proc.start()
    else:  # `python -m podcert` finds the package in its working directory first
        proc.log.parent.mkdir(parents=True, exist_ok=True)
        with proc.log.open("ab") as out:
            proc.proc = subprocess.Popen(
                [sys.executable, "-m", proc.module, *proc.args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **proc.env},
                cwd=tree,
            )
    return proc.wait_ready(timeout=600)


def request_for(rest: Rest, root: Path, pod_name: str) -> JSON:
    """A request for the pod as its node makes it; returns it settled."""
    pod = rest.request("GET", path_of("v1", "pods", NAMESPACE, pod_name))
    node = rest.request("GET", path_of("v1", "nodes", None, NODE))
    sa = rest.request("GET", path_of("v1", "serviceaccounts", NAMESPACE, "default"))
    key = keys.generate("ECDSAP256")
    body = {
        "apiVersion": PCRS,
        "kind": "PodCertificateRequest",
        "metadata": {"generateName": "req-"},
        "spec": {
            "signerName": SIGNER,
            "podName": pod_name,
            "podUID": pod["metadata"]["uid"],
            "serviceAccountName": "default",
            "serviceAccountUID": sa["metadata"]["uid"],
            "nodeName": NODE,
            "nodeUID": node["metadata"]["uid"],
            "maxExpirationSeconds": 86400,
            "stubPKCS10Request": base64.b64encode(keys.stub_csr(key)).decode(),
        },
    }
    with kube.api_client(kube.node_kubeconfig(root, NODE)) as api:
        made = Rest(api).request(
            "POST", path_of(PCRS, "podcertificaterequests", NAMESPACE), body=body
        )
    path = path_of(PCRS, "podcertificaterequests", NAMESPACE, made["metadata"]["name"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = rest.request("GET", path)
        if (found.get("status") or {}).get("conditions"):
            return found
        time.sleep(0.05)
    raise RuntimeError(f"request for {pod_name} not settled in 120 s")


def dns_names(pcr: JSON) -> list[str]:
    chain = x509.load_pem_x509_certificates(pcr["status"]["certificateChain"].encode())
    san = chain[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return sorted(san.get_values_for_type(x509.DNSName))


def run(args: argparse.Namespace) -> None:
    with devcluster("podcert-bench-labels-") as (root, work):
        state = planestate.read_state(identities.Paths(root.resolve()))
        assert state is not None
        rest = prepare_namespace(root, NAMESPACE)
        kube.ensure_node(kube.admin_client(root), NODE)
        rest.request(
            "POST",
            path_of("v1", "services", NAMESPACE),
            body={
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "deep"},
                "spec": {"selector": {DEEP_KEY: "deep"}, "ports": [{"port": 443}]},
            },
        )
        policy = work / "policy.yaml"
        policy.write_text(POLICY)

        def control_plane() -> str:
            return (
                f"API server {rss_mib(state.apiserver_pid):.0f} MiB, "
                f"etcd {rss_mib(state.etcd_pid):.0f} MiB"
            )

        signer = start_signer(root, work, policy)
        print(f"empty cluster: signer {rss_mib(pid_of(signer)):.1f} MiB; {control_plane()}")

        started = time.monotonic()
        errors: list[str] = []

        def one(i: int) -> None:
            try:
                rest.request(
                    "POST",
                    path_of("v1", "pods", NAMESPACE),
                    body=pod_body(i, args.labels, args.annotation_bytes),
                )
            except ApiError as err:
                errors.append(f"big-{i}: {err}")

        with ThreadPoolExecutor(args.threads) as pool:
            list(pool.map(one, range(args.pods)))
        if errors:
            raise RuntimeError(f"{len(errors)} pods not created, first: {errors[0]}")
        made = time.monotonic() - started
        size = labels_size(labels_of(0, args.labels))
        print(
            f"{args.pods} pods x {args.labels} labels ({size / 1e3:.0f} KB of labels each) "
            f"created in {made:.1f} s; {control_plane()}"
        )
        # A marker pod created last: once the signer has issued for it, its pod watch has
        # delivered every pod before it (one resource's events come in order).
        rest.request("POST", path_of("v1", "pods", NAMESPACE), body=pod_body(args.pods, 1, 0))
        marker = request_for(rest, root, f"big-{args.pods}")
        print(f"running signer after its watch: {rss_mib(pid_of(signer)):.1f} MiB")
        signer.stop()

        for _ in range(args.rounds):
            for tree in args.tree or [processes.REPO]:
                restarted = time.monotonic()
                signer = start_signer(root, work, policy, tree.resolve())
                ready = time.monotonic() - restarted
                print(
                    f"restarted signer ({tree}), ready in {ready:.1f} s: "
                    f"{rss_mib(pid_of(signer)):.1f} MiB "
                    f"(peak {rss_mib(pid_of(signer), 'VmHWM'):.1f} MiB)",
                    flush=True,
                )
                signer.stop()
        signer = start_signer(root, work, policy)
        issued = request_for(rest, root, "big-0")
        condition = issued["status"]["conditions"][0]
        print(
            f"request for big-0: {condition['type']} with DNS names "
            f"{dns_names(issued) if condition['type'] == 'Issued' else condition['message']}"
        )
        print(f"marker: {marker['status']['conditions'][0]['type']}; {control_plane()}")
        signer.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--labels", type=int, default=7000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--annotation-bytes", type=int, default=0)
    parser.add_argument(
        "--tree", type=Path, action="append", help="a checkout whose signer restarts"
    )
    parser.add_argument("--rounds", type=int, default=1)
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
