"""A rolling update of the signer from release 0.1.0 to the working tree, under traffic.

Two replicas of 0.1.0 (its kept wheel, releases/0.1.0/, unpacked and run with the locked
dependencies of this tree's venv) serve one signer name on the session's cluster, each with its
own audit log, as a Deployment's pods each have theirs. The update replaces them one at a time,
each new replica opening the log its predecessor wrote: the standby first, then the leader, so
the lease passes 0.1.0 -> working tree -> working tree, then back to 0.1.0 (a rollback, on a
log the working tree continued), while a node keeps asking for certificates. Throughout: every
request is issued, and issued once (one `issued` entry across both logs); the CA 0.1.0 created
signs every leaf; each log verifies, anchored to that CA, its chain and checkpoint numbers
unbroken where the versions meet, and `podcert audit --min-checkpoint` (the number each
replica last exported) is satisfied.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import re
import subprocess
import sys
import threading
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from devcluster import processes
from devcluster.testing import DevCluster, eventually
from podcert.auditlog import iter_entries, verify
from podcert.client.rest import JSON, Rest, path_of
from signer.authority import schedule
from tests.integration.helpers import condition, make_pod, request_as_node, settled

ROOT = Path(__file__).resolve().parents[2]
WHEEL = ROOT / "releases" / "0.1.0" / "podcert-0.1.0-py3-none-any.whl"
SIGNER, NAMESPACE = "upgrade.podcert.dev/main", "podcert-upgrade"
LEASE = ["--lease-duration=4", "--renew-deadline=3", "--retry-period=1"]
REQUESTS_PER_SECOND = 10


def run_release(release: Path, args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """`podcert ARGS` from an unpacked release, its output appended to `log`: -P and the
    release as the working directory, so nothing of this tree is imported."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-P", "-m", "podcert", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(release)},
            cwd=release,
        )


@dataclass
class ReleaseSigner(processes.Signer):
    """`podcert signer` run from an unpacked release instead of this tree."""

    release: Path = field(default_factory=Path)

    def start(self) -> Self:
        self.proc = run_release(self.release, self.args, self.log)
        return self


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("podcert-0.1.0")
    with zipfile.ZipFile(WHEEL) as wheel:
        wheel.extractall(target)
    found = subprocess.run(
        [
            sys.executable,
            "-P",
            "-c",
            "import podcert, signer; print(podcert.__version__, signer.__file__)",
        ],
        cwd=target,
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.split()
    assert found == ["0.1.0", str(target / "signer" / "__init__.py")]
    return target


class Replicas:
    """The signer's replicas, by name; each keeps its workdir (and so its audit log)."""

    def __init__(self, devcluster: DevCluster, workdir: Path, release: Path) -> None:
        self.devcluster, self.workdir, self.release = devcluster, workdir, release
        self.running: dict[str, processes.Signer] = {}
        self.checkpoint: dict[str, int] = {}

    def audit_log(self, name: str) -> Path:
        return self.workdir / name / "audit.jsonl"

    def start(self, name: str, *, old: bool) -> processes.Signer:
        proc = processes.signer(
            self.devcluster.root,
            self.workdir / name,
            [SIGNER],
            namespace=NAMESPACE,
            extra=[*LEASE, f"--identity={name}", f"--audit-log={self.audit_log(name)}"],
        )
        if old:
            proc = ReleaseSigner(
                args=proc.args, log=proc.log, metrics_port=proc.metrics_port, release=self.release
            )
        self.running[name] = proc.start().wait_ready()
        return proc

    def stop(self, name: str) -> None:
        """SIGTERM, after noting the replica's last checkpoint number (its metric), which the
        audit's --min-checkpoint is then held to."""
        proc = self.running[name]
        found = re.search(r"^podcert_signer_audit_checkpoint (\S+)$", proc.metrics(), re.MULTILINE)
        assert found, f"{name} exports no audit checkpoint"
        self.checkpoint[name] = int(float(found[1]))
        code = self.running.pop(name).stop()
        assert code == 0, f"{name} stopped with {code}"

    def stop_all(self) -> None:
        while self.running:
            self.running.popitem()[1].stop()


@pytest.fixture
def replicas(devcluster: DevCluster, tmp_path: Path, release: Path) -> Iterator[Replicas]:
    group = Replicas(devcluster, tmp_path, release)
    yield group
    group.stop_all()


class Traffic:
    """A node asking for certificates at a steady rate on its own thread, until stopped."""

    def __init__(self, devcluster: DevCluster, pods: list[Any]) -> None:
        self.devcluster, self.pods = devcluster, pods
        self.requests: list[JSON] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(1 / REQUESTS_PER_SECOND):
            try:
                self.requests.append(
                    request_as_node(self.devcluster, self.pods[n % len(self.pods)], SIGNER)[1]
                )
            except Exception as err:  # reported by the test, not lost in a thread
                self.errors.append(err)
            n += 1

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def count(self) -> int:
        return len(self.requests)


def holder(devcluster: DevCluster) -> str | None:
    lease = Rest(devcluster.admin).get(
        path_of("coordination.k8s.io/v1", "leases", NAMESPACE, "podcert-signer")
    )
    found = ((lease or {}).get("spec") or {}).get("holderIdentity")
    return str(found) if found else None


def issued_by(replicas: Replicas, name: str) -> int:
    path = replicas.audit_log(name)
    lines = path.read_bytes().splitlines() if path.exists() else []
    return sum(e.decision == "issued" for e in iter_entries(lines))


def leads_and_issues(
    devcluster: DevCluster, replicas: Replicas, name: str, traffic: Traffic
) -> None:
    """`name` holds the lease and issues requests made after it took it."""
    eventually(lambda: holder(devcluster) == name, timeout=20, what=f"{name} leading")
    before, asked = issued_by(replicas, name), traffic.count()
    eventually(lambda: traffic.count() >= asked + 5, timeout=10, what="five more requests")
    eventually(lambda: issued_by(replicas, name) >= before + 5, timeout=20, what=f"{name} issuing")


def ca_roots(devcluster: DevCluster) -> list[x509.Certificate]:
    secret = Rest(devcluster.admin).get(path_of("v1", "secrets", NAMESPACE, "podcert-ca"))
    assert secret is not None
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    return schedule.trusted_roots(schedule.from_secret(data, dt.datetime.now(dt.UTC)))


def test_a_rolling_update_from_0_1_0_issues_every_request_once_and_keeps_ca_and_logs(
    devcluster: DevCluster, replicas: Replicas, tmp_path: Path
) -> None:
    ns = devcluster.namespace("upgrade")
    pods = [make_pod(devcluster, ns, f"p{i}", SIGNER) for i in range(10)]

    replicas.start("replica-a", old=True)
    eventually(lambda: holder(devcluster) == "replica-a", timeout=20, what="0.1.0 leading")
    replicas.start("replica-b", old=True)
    roots = ca_roots(devcluster)  # 0.1.0 created the CA

    with Traffic(devcluster, pods) as traffic:
        leads_and_issues(devcluster, replicas, "replica-a", traffic)
        # The standby first: replica-b comes back on the working tree, on its 0.1.0 log.
        replicas.stop("replica-b")
        replicas.start("replica-b", old=False)
        # Then the leader: the lease passes to the working tree.
        replicas.stop("replica-a")
        leads_and_issues(devcluster, replicas, "replica-b", traffic)
        replicas.start("replica-a", old=False)
        replicas.stop("replica-b")
        leads_and_issues(devcluster, replicas, "replica-a", traffic)
        # A rollback: 0.1.0 again, on the log the working tree continued, takes the lease.
        replicas.start("replica-b", old=True)
        replicas.stop("replica-a")
        leads_and_issues(devcluster, replicas, "replica-b", traffic)
    assert traffic.errors == []

    outcomes = [settled(devcluster, pcr, timeout=30) for pcr in traffic.requests]
    assert Counter(condition(p).type for p in outcomes) == {"Issued": len(outcomes)}
    replicas.stop("replica-b")  # a last checkpoint

    issued: Counter[str] = Counter()
    for name in ("replica-a", "replica-b"):
        lines = replicas.audit_log(name).read_bytes().splitlines()
        result = verify(lines, roots, dt.datetime.now(dt.UTC))
        assert result.problems == [], name
        assert result.anchored, name
        issued.update(e.uid for e in iter_entries(lines) if e.decision == "issued")
    uids = {p["metadata"]["uid"] for p in outcomes}
    assert set(issued) == uids and set(issued.values()) == {1}, "a request issued twice"
    assert ca_roots(devcluster) == roots
    pem = tmp_path / "roots.pem"
    pem.write_bytes(b"".join(r.public_bytes(serialization.Encoding.PEM) for r in roots))
    for name in ("replica-a", "replica-b"):
        # Each log's newest checkpoint is at least the one its replica last exported.
        audited = subprocess.run(
            [
                *(sys.executable, "-m", "podcert", "audit"),
                f"--audit-log={replicas.audit_log(name)}",
                f"--ca-roots={pem}",
                f"--min-checkpoint={replicas.checkpoint[name]}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert audited.returncode == 0, audited.stdout + audited.stderr
        assert "healthy" in audited.stdout
    for pcr in outcomes:
        chain = x509.load_pem_x509_certificates(pcr["status"]["certificateChain"].encode())
        assert chain[-1].issuer in {root.subject for root in roots}
