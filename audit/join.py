"""Reading the cluster's objects and joining every input per pod projection.

A projection is one podCertificate source of one pod; files on a node, requests and audit log
entries are attached to it by pod UID, volume, path, serial and request UID, whichever the inputs
carry. Each join is made only from what was given.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cryptography import x509

from audit.examine import DiskCredential, ReadableKey, VolumeFacts
from audit.model import Settings, Snapshot
from podcert.api.pods import CertificateSource, parse_pod
from podcert.api.requests import PodCertificateRequest, Read, RequestError, certificates
from podcert.auditlog import AuditLogError, Entry, iter_entries

# --- the cluster's objects ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """A request as the audit joins it: the typed request as read, and its certificate chain
    parsed once (the audit reads the leaf of every issued request several times)."""

    pcr: PodCertificateRequest
    # Leaf first; empty unless the request is Issued with a chain that parses (the API server
    # checked it on write; a broken one is not ours to judge).
    chain: tuple[x509.Certificate, ...]

    @classmethod
    def of(cls, pcr: PodCertificateRequest) -> Request:
        status = pcr.status
        chain: tuple[x509.Certificate, ...] = ()
        if status.outcome == "Issued" and status.certificate_chain:
            try:
                chain = certificates(status)
            except RequestError:
                chain = ()
        return cls(pcr, chain)

    @property
    def message(self) -> str:
        """The terminal condition's "reason: message" ("" while the request is not settled)."""
        status = self.pcr.status
        return f"{status.reason}: {status.message}".strip(": ") if status.condition else ""


def _str(obj: object, *path: str) -> str:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj if isinstance(obj, str) else ""


def joinable(requests: Iterable[Read]) -> list[Request]:
    """The requests that read as requests; one of the wrong shape (`Unreadable`: the API server
    never returns one) is left out."""
    return [Request.of(r) for r in requests if isinstance(r, PodCertificateRequest)]


def readable_entries(lines: Sequence[bytes]) -> list[Entry]:
    """The entries that parse; `verify` reports the ones that do not."""
    found: list[Entry] = []
    for line in lines:
        try:
            found.extend(iter_entries([line]))
        except AuditLogError:
            continue
    return found


# --- joining ------------------------------------------------------------------------------------


@dataclass
class Proj:
    """A projection being assembled from the inputs (mutable while joining)."""

    pod_uid: str
    namespace: str | None = None
    pod: str | None = None
    node: str | None = None
    service_account: str | None = None
    volume: str | None = None
    path: str | None = None
    signer_name: str | None = None
    paths: tuple[str, ...] = ()
    disk: DiskCredential | None = None
    readable_keys: list[ReadableKey] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)


def join(
    snapshot: Snapshot,
    facts: Sequence[VolumeFacts],
    requests: Sequence[Request],
    entries: Sequence[Entry],
) -> list[Proj]:
    projections: list[Proj] = []
    by_volume: dict[tuple[str, str], list[Proj]] = defaultdict(list)
    by_pod: dict[str, list[Proj]] = defaultdict(list)

    def add(proj: Proj) -> Proj:
        projections.append(proj)
        by_pod[proj.pod_uid].append(proj)
        if proj.volume is not None:
            by_volume[proj.pod_uid, proj.volume].append(proj)
        return proj

    # Pods: one projection per podCertificate source that `parse_pod` accepts (one the API
    # server would refuse cannot be served, so nothing on a node belongs to it).
    for pod in snapshot.pods or ():
        parsed = parse_pod(pod)
        if not parsed.uid:
            continue
        # As written, not defaulted to "default" as parse_pod does: `read_cluster` trims the
        # service account away, and the pod's requests fill it in.
        service_account = _str(pod, "spec", "serviceAccountName") or None
        for source in (
            s for v in parsed.volumes for s in v.sources if isinstance(s, CertificateSource)
        ):
            add(
                Proj(
                    parsed.uid,
                    namespace=parsed.namespace,
                    pod=parsed.name,
                    node=parsed.node_name or None,
                    service_account=service_account,
                    volume=source.volume,
                    path=source.credential_bundle_path or source.chain_path,
                    signer_name=source.signer_name,
                    paths=source.paths,
                )
            )

    # Files on disk: to the pod source that names the file, else a projection of their own.
    for volume in facts:
        for credential in volume.credentials:
            owner = next(
                (
                    p
                    for p in by_volume.get((volume.pod_uid, volume.volume), ())
                    if credential.path in p.paths or credential.key_path in p.paths
                ),
                None,
            )
            if owner is None:
                owner = add(Proj(volume.pod_uid, volume=volume.volume, path=credential.path))
            if owner.disk is None or (owner.disk.cert is None and credential.cert is not None):
                owner.disk = credential
        # A readable key to the projection that names it or holds it: every key file is some
        # credential's, but a projection keeps one credential, so look at names too.
        for key in volume.readable_keys:
            holders = by_volume.get((volume.pod_uid, volume.volume), ())
            owner = next((p for p in holders if key.path in _files_of(p)), None)
            if owner is None:  # not expected (every key file is a credential's): still reported
                owner = add(Proj(volume.pod_uid, volume=volume.volume, path=key.path))
            owner.readable_keys.append(key)

    # Requests: to the pod's projection for that signer (by key when several could match).
    request_owner: dict[str, Proj] = {}
    for request in sorted(
        requests, key=lambda r: r.pcr.created or dt.datetime.min.replace(tzinfo=dt.UTC)
    ):
        spec = request.pcr.spec
        candidates = [
            p for p in by_pod.get(spec.pod_uid, ()) if p.signer_name in (None, spec.signer_name)
        ]
        owner = _pick(candidates, request)
        if owner is None:
            owner = add(Proj(spec.pod_uid, signer_name=spec.signer_name))
        owner.requests.append(request)
        owner.signer_name = owner.signer_name or spec.signer_name
        owner.namespace = owner.namespace or request.pcr.namespace
        owner.pod = owner.pod or spec.pod_name
        owner.node = owner.node or spec.node_name
        owner.service_account = owner.service_account or spec.service_account_name or None
        request_owner[request.pcr.uid] = owner

    # Audit log entries: by request UID, by the serial on disk, then by (namespace, pod, signer).
    by_serial = {
        p.disk.cert.serial: p for p in projections if p.disk is not None and p.disk.cert is not None
    }
    for entry in entries:
        owner = request_owner.get(entry.uid)
        if owner is None and entry.serial:
            owner = by_serial.get(norm_serial(entry.serial))
        if owner is not None:
            owner.signer_name = owner.signer_name or entry.signer_name
            owner.namespace = owner.namespace or entry.namespace
            owner.pod = owner.pod or entry.pod
            owner.node = owner.node or entry.node
    by_name: dict[tuple[str, str, str], Proj] = {}
    for proj in projections:
        if proj.namespace and proj.pod and proj.signer_name:
            by_name.setdefault((proj.namespace, proj.pod, proj.signer_name), proj)
    for entry in entries:
        owner = request_owner.get(entry.uid) or by_name.get(
            (entry.namespace, entry.pod, entry.signer_name)
        )
        if owner is not None:
            owner.entries.append(entry)
    return projections


def _files_of(proj: Proj) -> tuple[str | None, ...]:
    """The files a projection names (pod spec) or holds (on disk)."""
    disk = (proj.disk.path, proj.disk.key_path) if proj.disk is not None else ()
    return (*proj.paths, *disk)


def _pick(candidates: list[Proj], request: Request) -> Proj | None:
    if len(candidates) <= 1:
        return candidates[0] if candidates else None
    if request.chain:
        serial = f"{request.chain[0].serial_number:x}"
        for proj in candidates:
            if (
                proj.disk is not None
                and proj.disk.cert is not None
                and proj.disk.cert.serial == serial
            ):
                return proj
    named = [p for p in candidates if p.signer_name == request.pcr.spec.signer_name]
    return (named or candidates)[0]


def norm_serial(serial: str) -> str:
    try:
        return f"{int(serial, 16):x}"
    except ValueError:
        return serial


def selected(proj: Proj, settings: Settings) -> bool:
    if settings.namespaces and proj.namespace not in settings.namespaces:
        return False
    if settings.signer_names and proj.signer_name not in settings.signer_names:
        return False
    return not (settings.node_name and proj.node not in (None, settings.node_name))
