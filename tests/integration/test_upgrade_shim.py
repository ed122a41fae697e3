"""The shim across its own upgrade, and back: release 0.1.0's shim (its kept wheel, run as
test_upgrade_signer runs 0.1.0's signer) and the working tree's, one after the other on one
node's root.

Whichever release wrote a node's volumes, the other, started on the same root, adopts every one:
each projection fresh from what is on disk, no PodCertificateRequest created, no volume written,
every file, mode, directory and link under the root as it was. Run again with its clock 12 h
ahead, past each certificate's beginRefreshAt but before its notAfter, it refreshes each
projection once, with a new key, from the same CA. The upgrade (0.1.0 -> tree) and the downgrade
(tree -> 0.1.0) behave alike, as decided (CHANGELOG.md): a volume is the kubelet's atomic-writer
layout, which both read, and the shim keeps no state besides.

The signer that issues the first certificates puts beginRefreshAt at a tenth of their lifetime,
the one that issues the refreshes at nine tenths, so the shim 12 h ahead finds the first due and
their replacements not (as test_shim's clock test does).
"""

from __future__ import annotations

import base64
import contextlib
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self, TypeVar

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from bundles import formats
from devcluster import processes
from devcluster.testing import DevCluster, eventually
from podcert.client.rest import Rest, path_of
from tests.integration.shim_helpers import Shim, certificate_volume, outcome, requests_of, shim
from tests.integration.test_upgrade_signer import release, run_release

__all__ = ["release"]  # the fixture: release 0.1.0's wheel, unpacked

SIGNER, SIGNER_NAMESPACE = "shim-upgrade.podcert.dev/main", "podcert-shim-upgrade"
PODS = 10
AHEAD = ("--clock-offset-seconds=43200", "--refresh-jitter-seconds=0")
# The shim's count of the requests it made, by release: renamed after 0.1.0 (a base name ending
# in `_created` is reserved by OpenMetrics).
REQUESTS_MADE = {
    "0.1.0": "podcert_shim_requests_created_total",
    "tree": "podcert_shim_requests_total",
}


@dataclass
class ReleaseShim(processes.Shim):
    """`podcert shim` run from an unpacked release instead of this tree."""

    release: Path = field(default_factory=Path)

    def start(self) -> Self:
        self.proc = run_release(self.release, self.args, self.log)
        return self


@dataclass
class Node:
    """One node's shims, each release in turn, on one root."""

    devcluster: DevCluster
    work: Path
    name: str
    release: Path
    runs: int = 0

    @property
    def root(self) -> Path:
        return self.work / f"root-{self.name}"

    def shim(self, version: str, extra: tuple[str, ...] = ()) -> Shim:
        """This node's shim of `version` ("0.1.0" or "tree"), not yet started."""
        self.runs += 1
        proc = shim(
            self.devcluster,
            self.work,
            self.name,
            root=self.root,
            log_name=f"{self.name}-{self.runs}-{version}",
            extra=extra,
        )
        if version == "0.1.0":
            proc = ReleaseShim(
                args=proc.args,
                log=proc.log,
                root=proc.root,
                metrics_port=proc.metrics_port,
                release=self.release,
            )
        return proc


P = TypeVar("P", processes.Signer, processes.Shim)


@contextlib.contextmanager
def running(proc: P) -> Iterator[P]:
    """`proc` started and ready for the block, stopped after it (also when it never got ready)."""
    try:
        proc.start().wait_ready()
        yield proc
    finally:
        proc.stop()


def signer(devcluster: DevCluster, work: Path, fraction: float) -> processes.Signer:
    """The tree's signer, putting beginRefreshAt at `fraction` of each lifetime; every one
    started in this module shares the CA in SIGNER_NAMESPACE's Secret."""
    return processes.signer(
        devcluster.root,
        work / f"signer-{fraction}",
        [SIGNER],
        namespace=SIGNER_NAMESPACE,
        extra=[f"--refresh-fraction={fraction}"],
    )


def total(proc: Shim, metric: str, **labels: str) -> float:
    """The sum of every series of `metric` with these labels (0 when there is none)."""
    out = 0.0
    for line in proc.metrics().splitlines():
        name, _, rest = line.partition("{")
        if name != metric:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', rest.rpartition("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            out += float(line.rsplit(" ", 1)[1])
    return out


Entry = tuple[int, int, bytes | str]


def snapshot(root: Path) -> dict[str, Entry]:
    """Everything under `root`: each entry's mode and inode, a file's bytes, a link's target."""
    out: dict[str, Entry] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            what: bytes | str = f"-> {path.readlink()}"
        elif stat.S_ISDIR(info.st_mode):
            what = "dir"
        else:
            what = path.read_bytes()
        out[str(path.relative_to(root))] = (stat.S_IMODE(info.st_mode), info.st_ino, what)
    return out


def credential(path: Path) -> formats.Credential | None:
    try:
        return formats.load_credential(path.read_bytes())
    except FileNotFoundError:
        return None


def public_key(leaf: x509.Certificate) -> bytes:
    return leaf.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)


def issuing_ca(devcluster: DevCluster) -> x509.Certificate:
    secret = Rest(devcluster.admin).request(
        "GET", path_of("v1", "secrets", SIGNER_NAMESPACE, "podcert-ca")
    )
    return x509.load_pem_x509_certificates(base64.b64decode(secret["data"]["tls.crt"]))[0]


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shim-upgrade")


@pytest.mark.parametrize(
    ("writer", "reader"),
    [
        pytest.param("0.1.0", "tree", id="upgrade: the tree adopts what 0.1.0 wrote"),
        pytest.param("tree", "0.1.0", id="downgrade: 0.1.0 adopts what the tree wrote"),
    ],
)
def test_the_other_release_adopts_every_volume_with_no_request_then_refreshes_when_due(
    devcluster: DevCluster, release: Path, work: Path, writer: str, reader: str
) -> None:
    node = Node(devcluster, work, f"shim-upgrade-{writer}-{reader}".replace(".", "-"), release)
    ns = devcluster.namespace("shim-upgrade")
    with running(signer(devcluster, work, 0.1)), running(node.shim(writer)) as first:
        pods = [
            devcluster.pod(ns, f"p{i}", node=node.name, volumes=[certificate_volume(SIGNER)])
            for i in range(PODS)
        ]
        paths = [first.volume_dir(p.metadata.uid) / "credentialbundle.pem" for p in pods]
        eventually(
            lambda: all(p.exists() for p in paths), timeout=30, what=f"{writer} writing volumes"
        )
    written = snapshot(node.root)
    requested = {p["metadata"]["name"]: outcome(p) for p in requests_of(devcluster, ns)}
    assert list(requested.values()) == ["Issued"] * PODS

    old = {path: credential(path) for path in paths}
    with running(signer(devcluster, work, 0.9)):
        with running(node.shim(reader)) as adopting:
            eventually(
                lambda: total(adopting, "podcert_shim_projections", state="fresh") == PODS,
                timeout=20,
                what=f"{reader} adopting every volume",
            )
            assert total(adopting, REQUESTS_MADE[reader]) == 0
            assert total(adopting, "podcert_shim_volume_writes_total") == 0
        assert {p["metadata"]["name"] for p in requests_of(devcluster, ns)} == set(requested)
        assert snapshot(node.root) == written, f"{reader} changed what {writer} wrote"

        with running(node.shim(reader, AHEAD)) as ahead:
            eventually(
                lambda: all(credential(p) not in (None, old[p]) for p in paths),
                timeout=30,
                what=f"{reader} refreshing every volume when due",
            )
            eventually(
                lambda: total(ahead, "podcert_shim_projections", state="fresh") == PODS,
                timeout=10,
                what="every projection fresh again",
            )
            assert total(ahead, REQUESTS_MADE[reader], reason="refresh") == PODS
            assert total(ahead, REQUESTS_MADE[reader]) == PODS

    pcrs = requests_of(devcluster, ns)
    assert len(pcrs) == 2 * PODS and {outcome(p) for p in pcrs} == {"Issued"}
    ca = issuing_ca(devcluster)
    for path in paths:
        before, after = old[path], credential(path)
        assert before is not None and after is not None
        assert public_key(after.leaf) != public_key(before.leaf), "a refresh has a new key"
        for leaf in (before.leaf, after.leaf):
            leaf.verify_directly_issued_by(ca)
