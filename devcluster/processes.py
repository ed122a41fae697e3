"""Run podcert's own components as real processes against the devcluster, with real identities.

The signer runs as its ServiceAccount with exactly the RBAC in manifests/signer/rbac.yaml and
the admission policy on its ClusterTrustBundle writes in manifests/signer/trust-bundle-policy.yaml;
used by the integration tests, the benchmarks and the demo.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import yaml

from devcluster import kube
from devcluster.supervise import end, free_port
from podcert.api.volumes import volume_dir

REPO = Path(__file__).resolve().parent.parent
SIGNER_RBAC = REPO / "manifests" / "signer" / "rbac.yaml"
SIGNER_TRUST_BUNDLE_POLICY = REPO / "manifests" / "signer" / "trust-bundle-policy.yaml"
DEFAULT_SIGNER = "podcert.dev/workload"
# The federated trust domains' signer name rbac.yaml grants `attest` on (kept as shipped).
FEDERATED_SIGNER = "podcert.dev/federated"
SHIPPED_SIGNER_USER = "system:serviceaccount:podcert-system:podcert-signer"


def signer_rbac(
    namespace: str,
    signer_names: Sequence[str],
    suffix: str = "",
    webhook_configuration: str | None = None,
) -> list[dict[str, Any]]:
    """manifests/signer/rbac.yaml for another namespace, signer names, object-name suffix and
    webhook configuration (the one whose caBundle the signer keeps)."""
    docs = [d for d in yaml.safe_load_all(SIGNER_RBAC.read_text()) if d]
    out: list[dict[str, Any]] = []
    for doc in docs:
        meta = doc["metadata"]
        if "namespace" in meta:
            meta["namespace"] = namespace
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding") and suffix:
            meta["name"] = f"{meta['name']}-{suffix}"
        if doc["kind"] == "ClusterRoleBinding" and suffix:
            doc["roleRef"]["name"] = f"{doc['roleRef']['name']}-{suffix}"
        for subject in doc.get("subjects", []):
            subject["namespace"] = namespace
        for rule in doc.get("rules", []):
            if rule.get("resourceNames") == [DEFAULT_SIGNER]:
                rule["resourceNames"] = list(signer_names)
            if webhook_configuration and "validatingwebhookconfigurations" in rule["resources"]:
                rule["resourceNames"] = [webhook_configuration]
        out.append(doc)
    return out


def cel_strings(values: Sequence[str]) -> str:
    """A CEL list literal of strings (names and signer names hold no quote)."""
    assert all("'" not in v and "\\" not in v for v in values), values
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def signer_trust_bundle_policy(
    namespace: str, signer_names: Sequence[str], suffix: str = ""
) -> list[dict[str, Any]]:
    """manifests/signer/trust-bundle-policy.yaml for the signer of another namespace and signer
    names (plus the federated name rbac.yaml grants), under an object-name suffix. Only the
    user and the names change: every check stays as shipped."""
    docs = [d for d in yaml.safe_load_all(SIGNER_TRUST_BUNDLE_POLICY.read_text()) if d]
    user = f"system:serviceaccount:{namespace}:podcert-signer"
    for doc in docs:
        if suffix:
            doc["metadata"]["name"] = f"{doc['metadata']['name']}-{suffix}"
        spec = doc["spec"]
        if doc["kind"] == "ValidatingAdmissionPolicyBinding":
            spec["policyName"] = f"{spec['policyName']}-{suffix}" if suffix else spec["policyName"]
            continue
        [condition] = spec["matchConditions"]
        assert SHIPPED_SIGNER_USER in condition["expression"], condition
        condition["expression"] = condition["expression"].replace(SHIPPED_SIGNER_USER, user)
        [names] = spec["variables"]
        assert names["name"] == "signerNames", names
        assert names["expression"] == cel_strings([DEFAULT_SIGNER, FEDERATED_SIGNER]), names
        names["expression"] = cel_strings([*signer_names, FEDERATED_SIGNER])
    return docs


@dataclass
class Process:
    """A podcert subcommand running as a child process, its output in a log file."""

    args: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    module: str = "podcert"  # run as `python -m <module> <args>`

    def start(self) -> Self:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                cwd=REPO,
            )
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        return end(self.proc, timeout)

    def kill(self) -> None:
        """SIGKILL: no clean-up, as a crash or an OOM kill would leave it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


@dataclass
class Signer(Process):
    metrics_port: int = 0

    def ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.metrics_port}/readyz"
            with urllib.request.urlopen(url, timeout=1) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def wait_ready(self, timeout: float = 30.0) -> Signer:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if not self.running:
                raise RuntimeError(f"signer exited early:\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"signer not ready in {timeout}s:\n{self.output()[-3000:]}")
            time.sleep(0.05)
        return self

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=2) as resp:
            return str(resp.read().decode())


def install_signer_identity(
    root: Path,
    namespace: str,
    signer_names: Sequence[str],
    suffix: str,
    webhook_configuration: str | None = None,
) -> Path:
    """Namespace, ServiceAccount, least RBAC and the trust-bundle admission policy for a
    signer; returns its token kubeconfig."""
    with kube.admin_client(root) as api:
        kube.ensure_namespace(api, namespace)
        kube.apply(api, signer_rbac(namespace, signer_names, suffix, webhook_configuration))
        kube.apply(api, signer_trust_bundle_policy(namespace, signer_names, suffix))
    return kube.service_account_kubeconfig(root, namespace, "podcert-signer")


def signer(
    root: Path,
    workdir: Path,
    signer_names: Sequence[str],
    *,
    namespace: str = "podcert-system",
    suffix: str = "",
    extra: Sequence[str] = (),
) -> Signer:
    """Start `podcert signer` as its ServiceAccount (not yet waited for; call wait_ready).
    Its RBAC follows its flags: `--webhook-configuration=NAME` in `extra` grants that object."""
    configuration = next(
        (a.partition("=")[2] for a in extra if a.startswith("--webhook-configuration=")), None
    )
    kubeconfig = install_signer_identity(
        root, namespace, signer_names, suffix or namespace, configuration
    )
    port = free_port()
    args = [
        "signer",
        f"--kubeconfig={kubeconfig}",
        f"--namespace={namespace}",
        f"--metrics-port={port}",
        "--metrics-host=127.0.0.1",
        *(f"--signer-name={name}" for name in signer_names),
        *extra,
    ]
    proc = Signer(args=args, log=workdir / f"signer-{namespace}.log", metrics_port=port)
    return proc


@dataclass
class Shim(Process):
    root: Path = field(default_factory=Path)
    metrics_port: int = 0

    def _get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}{path}", timeout=2
            ) as resp:
                return int(resp.status), str(resp.read().decode())
        except urllib.error.HTTPError as err:
            return err.code, ""
        except OSError:
            return 0, ""

    def ready(self) -> bool:
        return self._get("/readyz")[0] == 200

    def wait_ready(self, timeout: float = 30.0) -> Shim:
        deadline = time.monotonic() + timeout
        while not self.ready():
            if not self.running:
                raise RuntimeError(f"shim exited early:\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"shim not ready in {timeout}s:\n{self.output()[-3000:]}")
            time.sleep(0.05)
        return self

    def metrics(self) -> str:
        return self._get("/metrics")[1]

    def sample(self, metric: str, **labels: str) -> float:
        """The value of one series of the metrics text (0 when absent)."""
        for line in self.metrics().splitlines():
            name, _, rest = line.partition("{")
            if name != metric or line.startswith("#"):
                continue
            found = dict(re.findall(r'(\w+)="([^"]*)"', rest.rpartition("}")[0]))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def volume_dir(self, pod_uid: str, volume: str = "identity") -> Path:
        return volume_dir(self.root, pod_uid, volume)


def shim(
    cluster_root: Path,
    workdir: Path,
    node: str,
    *,
    root: Path,
    kubeconfig: Path | None = None,
    cleanup_kubeconfig: Path | None = None,
    extra: Sequence[str] = (),
    log_name: str = "",
) -> Shim:
    """`podcert shim` as `node` (not started). `kubeconfig` defaults to that node's own."""
    port = free_port()
    args = [
        "shim",
        f"--kubeconfig={kubeconfig or kube.node_kubeconfig(cluster_root, node)}",
        f"--node-name={node}",
        f"--root={root}",
        f"--metrics-port={port}",
        "--metrics-host=127.0.0.1",
        *([f"--cleanup-kubeconfig={cleanup_kubeconfig}"] if cleanup_kubeconfig else []),
        *extra,
    ]
    log = workdir / f"shim-{log_name or node}.log"
    return Shim(args=args, log=log, root=root, metrics_port=port)


@contextlib.contextmanager
def running(process: Process) -> Any:
    try:
        yield process
    finally:
        process.stop()
