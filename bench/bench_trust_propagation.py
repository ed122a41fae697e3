"""Trust propagation: `podcert signer ca prepare` -> the new root in every pod's trust file.

    .venv/bin/python -m bench.bench_trust_propagation [--pods 200] [--threads 8]

On a fresh devcluster: the signer and a shim for node-a run as child processes. N pods on node-a
mount devcluster.stack.identity_volume (a podCertificate source and a clusterTrustBundle source
with the signer's name and an empty label selector); the benchmark waits until every pod holds its
credential and a trust file with the one root. Then it runs `podcert signer ca prepare` as an
operator would (a subprocess, admin kubeconfig) and polls all N trust files until each holds two
roots. Watches on the CA Secret and on the signer's ClusterTrustBundle stamp when each changed, so
the figure is split into the signer's part (Secret -> ClusterTrustBundle) and the shim's part
(ClusterTrustBundle -> files). Target (DESIGN.md section 5): CA change -> every pod <= 5 s.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

from bench.bench_time_to_credential import (
    create_pods,
    devcluster,
    percentile,
    prepare_namespace,
    wait_until,
)
from devcluster.stack import BUNDLE, SIGNER_NAMESPACE, TRUST, Stack, identity_volume
from podcert.api.versions import group_version
from podcert.client.discovery import certificates_versions
from podcert.client.rest import ApiError, Rest, path_of

TARGET_SECONDS = 5.0
POLL = 0.02
CA_SECRET = "podcert-ca"  # noqa: S105 (the Secret's name, the signer's default)


def roots_in(path: Path) -> int:
    try:
        return path.read_bytes().count(b"BEGIN CERTIFICATE")
    except OSError:
        return 0


class FirstChange:
    """Watches one list from its current version; stamps the monotonic time of the first change."""

    def __init__(self, rest: Rest, path: str, field_selector: str) -> None:
        self.at: float | None = None
        self.error: str | None = None
        listing = rest.request("GET", path, query={"fieldSelector": field_selector})
        version = str(listing["metadata"]["resourceVersion"])
        self._thread = threading.Thread(
            target=self._run, args=(rest, path, version, field_selector), daemon=True
        )
        self._thread.start()

    def _run(self, rest: Rest, path: str, version: str, selector: str) -> None:
        try:
            for event in rest.watch(path, version, timeout_seconds=120, fieldSelector=selector):
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    self.at = time.monotonic()
                    return
        except ApiError as err:
            self.error = str(err)


def trust_bundle_path(rest: Rest) -> str:
    """The ClusterTrustBundle collection this API server serves (v1, else v1beta1)."""
    version = certificates_versions(rest)[1]
    if version is None:
        raise RuntimeError("the API server serves no ClusterTrustBundles")
    return path_of(group_version(version), "clustertrustbundles")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--threads", type=int, default=8, help="concurrent pod create calls")
    parser.add_argument("--timeout", type=float, default=60.0, help="give up after (seconds)")
    args = parser.parse_args()

    with devcluster("podcert-bench-trust-") as (root, work):
        stack = Stack(root, work, namespace="trust")
        rest = prepare_namespace(root, stack.namespace)
        try:
            stack.start_signer()
            shim = stack.start_shim()
            names = [f"p{i}" for i in range(args.pods)]
            created = create_pods(
                rest,
                stack.namespace,
                names,
                stack.node,
                [identity_volume(stack.signer_name)],
                args.threads,
            )
            if created.errors:
                raise SystemExit(f"pod creation failed: {created.errors[:3]}")
            volumes = [shim.volume_dir(uid) for uid in created.uids.values()]
            wait_until(
                lambda: all((v / BUNDLE).exists() and roots_in(v / TRUST) == 1 for v in volumes),
                120.0,
                f"{args.pods} pods holding a credential and one root",
            )
            print(f"{args.pods} pods hold their credential and a trust file with one root")

            secret = FirstChange(
                rest,
                path_of("v1", "secrets", SIGNER_NAMESPACE),
                f"metadata.name={CA_SECRET}",
            )
            bundle = FirstChange(
                rest, trust_bundle_path(rest), f"spec.signerName={stack.signer_name}"
            )
            launched = time.monotonic()
            stack.ca("prepare")
            exited = time.monotonic()

            seen: dict[int, float] = {}
            deadline = exited + args.timeout
            while len(seen) < len(volumes) and time.monotonic() < deadline:
                for i, volume in enumerate(volumes):
                    if i not in seen and roots_in(volume / TRUST) == 2:
                        seen[i] = time.monotonic()
                time.sleep(POLL)
        finally:
            stack.stop()

    print(
        f"`podcert signer ca prepare` ran {exited - launched:.2f}s (interpreter start-up "
        f"included); trust files polled every {POLL * 1000:.0f} ms"
    )
    if secret.at is None or bundle.at is None:
        print(f"watch problem: secret {secret.error}, bundle {bundle.error}")
        sys.exit(1)
    print(
        f"  CA Secret changed at +{secret.at - launched:.2f}s after launch; "
        f"ClusterTrustBundle updated {bundle.at - secret.at:.3f}s after the Secret"
    )
    if seen:
        after_secret = [t - secret.at for t in seen.values()]
        after_bundle = [t - bundle.at for t in seen.values()]
        print(
            f"  Secret -> pod trust file with 2 roots: first {min(after_secret):.3f}s, "
            f"p50 {percentile(after_secret, 50):.3f}s, p99 {percentile(after_secret, 99):.3f}s, "
            f"all {max(after_secret):.3f}s"
        )
        print(
            f"  ClusterTrustBundle -> all {len(seen)} trust files: {max(after_bundle):.3f}s; "
            f"command launch -> all: {max(seen.values()) - launched:.2f}s"
        )
    missing = len(volumes) - len(seen)
    if missing:
        print(f"MISSING: {missing} pods without the new root after {args.timeout:.0f}s")
    total = max(seen.values()) - secret.at if seen else float("inf")
    verdict = "met" if total <= TARGET_SECONDS and not missing else "MISSED"
    print(
        f"CA change -> new root in all {args.pods} pods: {total:.3f}s "
        f"(target <= {TARGET_SECONDS:.0f}s: {verdict})"
    )
    if missing:
        sys.exit(1)


if __name__ == "__main__":
    main()
