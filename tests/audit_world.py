"""The audit's world for its unit tests: one signer, one node and its pods, and what the signer
and the shim would leave behind (`World`), made real where it can be: leaves signed by the
signer's own CA code, volumes written by the shim's atomic writer, an audit log written by the
signer's writer. The cluster's objects are as `audit.snapshot.read_cluster` hands them over: pods
as API dicts, requests decoded from their JSON into the typed request.

Each test file of an audit step opens one with `open_world` (its `world` fixture) and reads a
`Snapshot` of it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from audit import Report, Snapshot, TrustSource
from audit.snapshot import read_audit_log, read_root
from kubelet_shim.atomic import AtomicDirStorage
from kubelet_shim.storage import FileSpec
from podcert.api.requests import decode_request
from signer import certs, model
from signer.auditlog.writer import AuditLog, Entry
from signer.authority import ca

T0 = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
SIGNER = "example.com/podcert"
TRUST_DOMAIN = "td.example"
LIFETIME = dt.timedelta(hours=24)
NS = "shop"

Key = ec.EllipticCurvePrivateKey


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def pkcs8(key: Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def wire_time(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Leaf:
    key: Key
    chain_pem: str
    serial: int
    not_before: dt.datetime
    not_after: dt.datetime
    begin_refresh_at: dt.datetime


@dataclass
class World:
    """One signer, one node, its pods; what the signer and the shim would leave behind."""

    tmp: Path
    authority: ca.CABundle
    log: AuditLog
    pods: list[dict[str, Any]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    n: int = 0
    last: dt.datetime = T0  # the newest decision in the audit log
    sealed: bool = False

    @property
    def node_root(self) -> Path:
        return self.tmp / "node"

    @property
    def log_path(self) -> Path:
        return self.tmp / "audit.jsonl"

    @property
    def trust_path(self) -> Path:
        path = self.tmp / "trust.pem"
        path.write_bytes(pem(self.authority.root))
        return path

    def leaf(
        self,
        pod: str,
        at: dt.datetime,
        *,
        key: Key | None = None,
        issuer: ca.CABundle | None = None,
        lifetime: dt.timedelta = LIFETIME,
    ) -> Leaf:
        key = key or ec.generate_private_key(ec.SECP256R1())
        not_before = at - dt.timedelta(minutes=1)
        not_after = not_before + lifetime
        refresh = not_before + lifetime / 2
        plan = model.LeafPlan(
            public_key=key.public_key(),
            spiffe_id=f"spiffe://{TRUST_DOMAIN}/ns/{NS}/sa/{pod}",
            dns_names=(),
            not_before=not_before,
            not_after=not_after,
            begin_refresh_at=refresh,
        )
        serial = certs.random_serial()
        chain = certs.sign_leaf(plan, ca.issuing_ca(issuer or self.authority), serial)
        return Leaf(key, chain, serial, not_before, not_after, refresh)

    def pod(self, name: str, uid: str, signer: str = SIGNER) -> dict[str, Any]:
        pod = {
            "metadata": {"namespace": NS, "name": name, "uid": uid},
            "spec": {
                "nodeName": "node-a",
                "volumes": [
                    {
                        "name": "identity",
                        "projected": {
                            "sources": [
                                {
                                    "podCertificate": {
                                        "signerName": signer,
                                        "keyType": "ECDSAP256",
                                        "credentialBundlePath": "credentialbundle.pem",
                                    }
                                },
                                {
                                    "clusterTrustBundle": {
                                        "signerName": SIGNER,
                                        "path": "trust-bundle.pem",
                                    }
                                },
                            ]
                        },
                    }
                ],
            },
        }
        self.pods.append(pod)
        return pod

    def request(
        self,
        pod: str,
        uid: str,
        at: dt.datetime,
        leaf: Leaf | None = None,
        *,
        signer: str = SIGNER,
        outcome: str | None = "Issued",
        audit: bool = True,
    ) -> dict[str, Any]:
        """A PodCertificateRequest as the API shows it, logged by the signer when it decided."""
        self.n += 1
        status: dict[str, Any] = {}
        if outcome == "Issued":
            assert leaf is not None
            status = {
                "certificateChain": leaf.chain_pem,
                "notBefore": wire_time(leaf.not_before),
                "notAfter": wire_time(leaf.not_after),
                "beginRefreshAt": wire_time(leaf.begin_refresh_at),
            }
        if outcome is not None:
            status["conditions"] = [
                {
                    "type": outcome,
                    "status": "True",
                    "reason": outcome,
                    "lastTransitionTime": wire_time(at),
                }
            ]
        pcr = {
            "metadata": {
                "namespace": NS,
                "name": f"req-{self.n}",
                "uid": f"pcr-{self.n}",
                "creationTimestamp": wire_time(at),
            },
            "spec": {
                "signerName": signer,
                "podName": pod,
                "podUID": uid,
                "serviceAccountName": pod,
                "nodeName": "node-a",
            },
            "status": status,
        }
        self.requests.append(pcr)
        if audit and outcome is not None:
            self.last = max(self.last, at)
            self.log.append(
                Entry(
                    time=at,
                    namespace=NS,
                    name=f"req-{self.n}",
                    uid=f"pcr-{self.n}",
                    pod=pod,
                    node="node-a",
                    service_account=pod,
                    decision=outcome.lower(),  # type: ignore[arg-type]
                    reason=outcome,
                    signer_name=signer,
                    spiffe_id=f"spiffe://{TRUST_DOMAIN}/ns/{NS}/sa/{pod}" if leaf else None,
                    serial=f"{leaf.serial:x}" if leaf else None,
                    not_before=leaf.not_before if leaf else None,
                    not_after=leaf.not_after if leaf else None,
                )
            )
        return pcr

    def write(self, uid: str, leaf: Leaf, trust: bytes | None = None) -> None:
        """What the shim writes: credential bundle and trust bundle, atomically."""
        files = {
            "credentialbundle.pem": FileSpec(pkcs8(leaf.key) + leaf.chain_pem.encode(), 0o600),
            "trust-bundle.pem": FileSpec(trust or pem(self.authority.root), 0o644),
        }
        AtomicDirStorage(self.node_root).write_volume(uid, "identity", files, None)

    def running_pod(self, name: str, uid: str, at: dt.datetime = T0) -> Leaf:
        """A pod whose credential was issued at `at` and is on disk."""
        self.pod(name, uid)
        leaf = self.leaf(name, at)
        self.request(name, uid, at, leaf)
        self.write(uid, leaf)
        return leaf

    def checkpoint(self, at: dt.datetime, *, force: bool = False) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        pem = certs.sign_audit_certificate(
            key.public_key(),
            TRUST_DOMAIN,
            ca.issuing_ca(self.authority),
            T0 - dt.timedelta(hours=1),
            T0 + dt.timedelta(days=30),
            certs.random_serial(),
        )
        self.log.checkpoint(key, x509.load_pem_x509_certificates(pem.encode()), at, force=force)

    def seal(self) -> None:
        """Checkpoint what is unsigned, as the signer's timer would a minute later, and close."""
        if self.sealed:
            return
        self.checkpoint(self.last + dt.timedelta(minutes=1))
        self.log.close()
        self.sealed = True

    def snapshot(self, *, cluster: bool = True, disk: bool = True, log: bool = True) -> Snapshot:
        self.seal()
        return Snapshot(
            pods=tuple(self.pods) if cluster else None,
            requests=tuple(decode_request(msgspec.json.encode(r)) for r in self.requests)
            if cluster
            else None,
            volumes=read_root(self.node_root) if disk else None,
            trust=(TrustSource(f"{SIGNER}:roots", pem(self.authority.root), SIGNER),),
            audit_logs=(("audit.jsonl", read_audit_log(self.log_path)),) if log else None,
            ca_roots=pem(self.authority.root),
        )

    def cli(self, *extra: str, now: dt.datetime) -> list[str]:
        """Arguments for `podcert audit` over this world's files."""
        self.seal()
        ca_roots = self.tmp / "ca-roots.pem"
        ca_roots.write_bytes(pem(self.authority.root))
        return [
            "audit",
            f"--root={self.node_root}",
            f"--audit-log={self.log_path}",
            f"--trust-bundle={self.trust_path}",
            f"--ca-roots={ca_roots}",
            f"--now={wire_time(now)}",
            "--jobs=1",
            *extra,
        ]


def kinds(report: Report) -> list[str]:
    return sorted(f.kind for f in report.findings)


NOW = T0 + dt.timedelta(hours=2)  # two hours into 24 h leaves: fresh


def healthy(world: World, pods: int = 3) -> list[Leaf]:
    leaves = [world.running_pod(f"web-{i}", f"uid-{i}") for i in range(pods)]
    world.checkpoint(T0 + dt.timedelta(minutes=1))
    return leaves


def new_signer_ca() -> ca.CABundle:
    """The signer's CA, valid for a month before `T0`."""
    return ca.new_ca("podcert", T0 - dt.timedelta(days=30))


@contextmanager
def open_world(tmp: Path, authority: ca.CABundle) -> Iterator[World]:
    """A world under `tmp` whose audit log is closed on the way out."""
    log = AuditLog(tmp / "audit.jsonl", fsync="never")
    try:
        yield World(tmp, authority, log)
    finally:
        log.close()
