"""What the tests with the real kubelet read and do: the files it projects into a pod (and the
SPIFFE Filesystem Delivery volume that asks for them), the signer's ClusterTrustBundle roots,
the operator's `podcert signer ca` steps, and a stopwatch for how long a change takes to reach
the files."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from bundles.foldersource import FolderSource
from bundles.source import SourceError
from devcluster.identities import Paths
from devcluster.testing import DevCluster, Kubelet
from podcert.client.rest import JSON, Rest, path_of

CERTIFICATES = "certificates.k8s.io/v1"
BUNDLE = "credentialbundle.pem"
TRUST = "trust-bundle.pem"
# A container that stays up and exits at once on SIGTERM (busybox's `sleep` as PID 1 would
# ignore it and hold a pod's deletion for its whole grace period).
KEEP_RUNNING = ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]


def spiffe_volume(
    signer_name: str,
    trust_domain: str,
    *,
    name: str = "spiffe",
    channel: str = "live",
    federated: Sequence[str] = (),
) -> dict[str, Any]:
    """A projected volume in the SPIFFE Filesystem Delivery layout (docs/filesystem-delivery.md):
    `credential-bundle.pem`, the `channel` bundle of our own trust domain selected by the
    standard's labels, and an optional source for each trust domain in `federated` (one that no
    bundle matches projects an empty file: not federated, or no longer)."""

    def bundle(peer: str, **extra: Any) -> dict[str, Any]:
        labels = {
            "k8s.spiffe.io/canarying": channel,
            "k8s.spiffe.io/workload-trust-domain": trust_domain,
            "k8s.spiffe.io/peer-trust-domain": peer,
        }
        return {
            "clusterTrustBundle": {
                "signerName": signer_name,
                "labelSelector": {"matchLabels": labels},
                "path": f"{peer}.trust-bundle.pem",
                **extra,
            }
        }

    certificate = {
        "signerName": signer_name,
        "keyType": "ECDSAP256",
        "credentialBundlePath": "credential-bundle.pem",
    }
    sources = [{"podCertificate": certificate}, bundle(trust_domain)]
    sources += [bundle(peer, optional=True) for peer in federated]
    return {"name": name, "projected": {"sources": sources}}


def folder_source(directory: Path) -> FolderSource | None:
    """A folder source over a projected credential folder, or None while it is not all there."""
    try:
        return FolderSource(directory)
    except SourceError:
        return None


def read(kubelet: Kubelet, pod_uid: str, name: str) -> bytes | None:
    """A file the kubelet projected into the pod's `identity` volume (None: not there yet)."""
    try:
        data = (kubelet.volume_dir(pod_uid) / name).read_bytes()
    except OSError:
        return None
    return data or None


def certificates_in(kubelet: Kubelet, pod_uid: str, name: str) -> list[x509.Certificate]:
    """The certificates in a projected file, in file order and with any duplicates ([] if none)."""
    data = read(kubelet, pod_uid, name)
    return x509.load_pem_x509_certificates(data) if data else []


def trust_bundle_roots(devcluster: DevCluster, signer_name: str) -> list[x509.Certificate]:
    """Every root in the ClusterTrustBundles linked to `signer_name`, each once (what the
    kubelet projects for a clusterTrustBundle source naming the signer, with an empty label
    selector: the signer's live and preview bundles both)."""
    found = Rest(devcluster.admin).request(
        "GET",
        path_of(CERTIFICATES, "clustertrustbundles"),
        query={"fieldSelector": f"spec.signerName={signer_name}"},
    )
    every = [
        cert
        for item in found["items"]
        for cert in x509.load_pem_x509_certificates(item["spec"]["trustBundle"].encode())
    ]
    return list(dict.fromkeys(every))


def requests_for(devcluster: DevCluster, namespace: str, pod_uid: str) -> list[JSON]:
    """The pod's PodCertificateRequests, oldest first."""
    items = Rest(devcluster.admin).request(
        "GET", path_of(CERTIFICATES, "podcertificaterequests", namespace)
    )["items"]
    mine = [i for i in items if i["spec"]["podUID"] == pod_uid]
    return sorted(mine, key=lambda i: (i["metadata"]["creationTimestamp"], i["metadata"]["name"]))


def pod_events(devcluster: DevCluster, namespace: str, pod_uid: str) -> list[JSON]:
    items: list[JSON] = Rest(devcluster.admin).request(
        "GET",
        path_of("v1", "events", namespace),
        query={"fieldSelector": f"involvedObject.uid={pod_uid}"},
    )["items"]
    return items


def ca(devcluster: DevCluster, signer_namespace: str, action: str, *flags: str) -> str:
    """`podcert signer ca ACTION` as an operator runs it: its own process, the admin kubeconfig,
    against the Secret of the signer in `signer_namespace`."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "podcert",
            "signer",
            f"--kubeconfig={Paths(devcluster.root.resolve()).admin_kubeconfig}",
            f"--namespace={signer_namespace}",
            "ca",
            action,
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"podcert signer ca {action} failed: {done.stderr.strip()[-800:]}")
    return done.stdout


def first_seen(
    probes: Mapping[str, Callable[[], bool]], *, since: float, timeout: float, interval: float = 0.1
) -> dict[str, float]:
    """Poll every probe until each has held once; the seconds from `since` (a monotonic time) to
    the first poll that saw it hold. Fails at the deadline naming the probes still waiting."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(probes):
        for name, probe in probes.items():
            if name not in seen and probe():
                seen[name] = time.monotonic() - since
        if len(seen) == len(probes):
            break
        if time.monotonic() > deadline:
            waiting = sorted(set(probes) - set(seen))
            raise AssertionError(f"timed out after {timeout}s waiting for {waiting} (saw {seen})")
        time.sleep(interval)
    return seen


def spki(cert: x509.Certificate) -> bytes:
    """A certificate's public key (DER SubjectPublicKeyInfo), comparable across certificates."""
    return cert.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
