"""The rotation audit as one pure function: `audit_findings(snapshot, now) -> Report`.

Why it exists: pod credentials rotate silently, so the way to know that rotation works is to look
at everything that records it at once — the cluster's PodCertificateRequests, pods and
ClusterTrustBundles, the files a node projected into pod volumes, and the signer's audit log — and
join them per pod projection. Each input is optional; every join is made only from what was given.

Pure: the inputs arrive as a `Snapshot` of bytes and API dicts (see `bundles.snapshot` for the
reading), the time as `now`. The one expensive step, parsing and checking every credential on a
node, is a pure per-volume function (`examine_volume`) that a caller may run itself, in parallel,
and hand in as `examined`; the report does not depend on where it ran.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

from bundles.auditlog import AuditLogError, Entry, iter_entries, verify
from bundles.formats import (
    MAX_BUNDLE_BYTES,
    BundleError,
    NotCaError,
    describe,
    load_credential,
    load_credential_files,
    load_trust_bundle,
)
from bundles.spiffe import CertificateIdError, spiffe_id_of
from podcert import pcrs
from podcert.pcrs import terminal_condition
from podcert.times import parse_time

JSON = Mapping[str, Any]

State = Literal[
    "fresh",  # valid, refresh point not reached
    "refresh due",  # past its refresh point, within the kubelet's grace
    "overdue",  # more than the grace past its refresh point
    "expired",  # past notAfter
    "pending",  # waiting for the signer, for a normal while
    "stuck",  # waiting far longer than normal, or for a signer name nobody serves
    "denied",
    "failed",
    "unseen",  # neither a credential nor a request was seen for it
]
FindingKind = Literal[
    "expired",
    "overdue",
    "stuck",
    "denied",
    "failed",
    "unreadable",  # credential files that a consumer could not load
    "bad-spiffe-id",
    "untrusted-chain",
    "key-reused",
    "wrong-identity",  # a credential whose SPIFFE ID or issuance names another pod or account
    "credential-shared",  # one certificate or key in two projections
    "not-in-audit-log",
    "root-expiring",
    "root-without-ca",
    "audit-log",
]

# The states that need someone's attention, each also a finding of the same name.
_STATE_FINDINGS: Final[Mapping[str, FindingKind]] = {
    "expired": "expired",
    "overdue": "overdue",
    "stuck": "stuck",
    "denied": "denied",
    "failed": "failed",
}
# Which state wins when a projection has a credential and a newer request (ties: the request).
_SEVERITY: Final[Mapping[str, int]] = {
    "unseen": 0,
    "fresh": 0,
    "pending": 1,
    "refresh due": 1,
    "overdue": 3,
    "stuck": 4,
    "denied": 4,
    "failed": 4,
    "expired": 5,
}
_SHORT_SERIAL: Final = 16  # hex digits of a serial shown in messages


@dataclass(frozen=True)
class Settings:
    """Thresholds, and which projections to report (empty filters: all)."""

    # A request waiting this long is stuck: the signer normally answers within seconds.
    stuck_after: dt.timedelta = dt.timedelta(minutes=5)
    # A request for a signer name no signer has ever answered is stuck after this long.
    no_signer_grace: dt.timedelta = dt.timedelta(minutes=1)
    # The kubelet's CertificateOverdueForRefresh: this long past the refresh point.
    overdue_grace: dt.timedelta = dt.timedelta(minutes=10)
    # Trust anchors expiring within this window are reported.
    root_expiry_warning: dt.timedelta = dt.timedelta(days=7)
    # Audit log entries not covered by a checkpoint this long after they were written are
    # reported: the signer checkpoints on a timer (a minute by default), so an older unsigned
    # tail means checkpointing stopped, or checkpoints were stripped from a rewritten log.
    unsigned_max_age: dt.timedelta = dt.timedelta(minutes=15)
    # A certificate the cluster or a node holds that was issued longer ago than this must be
    # covered by a signed checkpoint (the signer checkpoints every minute). Judged by times the
    # attacker of a log cannot write: the cluster's and the checkpoints' own signed `iat`.
    checkpoint_max_lag: dt.timedelta = dt.timedelta(minutes=5)
    # The signer's `podcert_signer_audit_checkpoint` metric: the log must reach this checkpoint.
    min_checkpoint: int | None = None
    # Check the audit log's hash chain only, as the operator asked: with no trust roots the
    # checkpoints cannot be tied to the signer, which is otherwise a finding.
    log_chain_only: bool = False
    # Where the refresh point lies when no request tells it (the kubelet's half-life hint).
    hintless_refresh_fraction: float = 0.5
    namespaces: frozenset[str] = frozenset()
    signer_names: frozenset[str] = frozenset()
    node_name: str | None = None


# --- inputs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VolumeFiles:
    """One projected volume on a node: relative path -> bytes (PEM files only)."""

    pod_uid: str
    volume: str
    files: Mapping[str, bytes] = field(repr=False)


@dataclass(frozen=True)
class TrustSource:
    """Trust anchors from one place: a ClusterTrustBundle, or a file given by the operator."""

    name: str
    pem: bytes = field(repr=False)
    # The signer whose anchors these are; None for a file that applies to every signer.
    signer_name: str | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything the audit looks at. None means "not read" (as opposed to read and empty)."""

    pods: tuple[JSON, ...] | None = None  # the cluster's pods (API dicts)
    requests: tuple[JSON, ...] | None = None  # PodCertificateRequests (API dicts)
    volumes: tuple[VolumeFiles, ...] | None = None  # a node's projected volumes
    trust: tuple[TrustSource, ...] = ()
    # Each signer replica's audit log: (name, lines without newlines). Joined as one record.
    audit_logs: tuple[tuple[str, tuple[bytes, ...]], ...] | None = None
    ca_roots: bytes | None = None  # PEM: the roots the signer holds CA keys for
    inputs: tuple[str, ...] = ()  # what was read, for the report header


# --- outputs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    subject: str  # what it is about: a projection, a root, the audit log
    message: str


@dataclass(frozen=True)
class Projection:
    """One podCertificate projection of one pod, joined across every input."""

    pod_uid: str
    namespace: str | None
    pod: str | None
    volume: str | None
    path: str | None  # the credential file (bundle, or chain) inside the volume
    signer_name: str | None
    spiffe_id: str | None
    serial: str | None  # hex, as the audit log writes it
    not_before: dt.datetime | None
    not_after: dt.datetime | None
    begin_refresh_at: dt.datetime | None
    refresh_hint: Literal["request", "estimated"] | None
    state: State
    rotations: int  # distinct leaves seen for it across requests, audit log and disk
    findings: tuple[Finding, ...] = ()

    @property
    def subject(self) -> str:
        return _subject(self.namespace, self.pod, self.pod_uid, self.volume, self.path)


@dataclass(frozen=True)
class Root:
    """A trust anchor found in some trust bundle."""

    fingerprint: str  # sha256 hex
    described: str
    not_after: dt.datetime
    sources: tuple[str, ...]
    has_ca: bool | None  # None when the signer's CA roots were not given


@dataclass(frozen=True)
class AuditLogReport:
    name: str
    lines: int
    entries: int
    checkpoints: int
    unsigned_tail: int
    anchored: bool
    last_checkpoint: int | None
    last_checkpoint_at: dt.datetime | None
    anchors: frozenset[str]
    first_broken_line: int | None
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class Report:
    now: dt.datetime
    inputs: tuple[str, ...]
    projections: tuple[Projection, ...]
    roots: tuple[Root, ...]
    audit_logs: tuple[AuditLogReport, ...] | None
    findings: tuple[Finding, ...]  # every finding, the projections' included
    notes: tuple[str, ...]  # what could not be checked, and why

    @property
    def healthy(self) -> bool:
        return not self.findings

    @property
    def audit_log(self) -> AuditLogReport | None:
        """The first (usually the only) audit log's report."""
        return self.audit_logs[0] if self.audit_logs else None

    def summary(self) -> str:
        states = Counter(p.state for p in self.projections)
        parts = [f"{len(self.projections)} projection(s)"]
        if states:
            order = sorted(states, key=lambda s: (-_SEVERITY[s], s))
            parts[0] += " (" + ", ".join(f"{states[s]} {s}" for s in order) + ")"
        parts.append(f"{len(self.roots)} trust root(s)")
        for log in self.audit_logs or ():
            verdict = "verified" if log.ok else f"broken at line {log.first_broken_line}"
            anchored = ", anchored" if log.anchored else ", NOT anchored"
            parts.append(f"audit log {log.entries} entries {verdict}{anchored}")
        kinds = Counter(f.kind for f in self.findings)
        if kinds:
            listed = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
            verdict = f"{len(self.findings)} finding(s): {listed}"
        else:
            verdict = "healthy"
        return f"{'; '.join(parts)} — {verdict}"

    def as_json(self) -> dict[str, Any]:
        return {
            "now": _time(self.now),
            "healthy": self.healthy,
            "summary": self.summary(),
            "inputs": list(self.inputs),
            "findings": [_finding_json(f) for f in self.findings],
            "projections": [
                {
                    "podUID": p.pod_uid,
                    "namespace": p.namespace,
                    "pod": p.pod,
                    "volume": p.volume,
                    "path": p.path,
                    "signerName": p.signer_name,
                    "spiffeID": p.spiffe_id,
                    "serial": p.serial,
                    "notBefore": _time(p.not_before),
                    "notAfter": _time(p.not_after),
                    "beginRefreshAt": _time(p.begin_refresh_at),
                    "refreshHint": p.refresh_hint,
                    "state": p.state,
                    "rotations": p.rotations,
                    "findings": [_finding_json(f) for f in p.findings],
                }
                for p in self.projections
            ],
            "roots": [
                {
                    "sha256": r.fingerprint,
                    "certificate": r.described,
                    "notAfter": _time(r.not_after),
                    "sources": list(r.sources),
                    "hasCA": r.has_ca,
                }
                for r in self.roots
            ],
            "auditLogs": None
            if self.audit_logs is None
            else [
                {
                    "name": log.name,
                    "lines": log.lines,
                    "entries": log.entries,
                    "checkpoints": log.checkpoints,
                    "lastCheckpoint": log.last_checkpoint,
                    "lastCheckpointAt": _time(log.last_checkpoint_at),
                    "unsignedTail": log.unsigned_tail,
                    "anchored": log.anchored,
                    "firstBrokenLine": log.first_broken_line,
                    "problems": list(log.problems),
                }
                for log in self.audit_logs
            ],
            "notes": list(self.notes),
        }


def _finding_json(finding: Finding) -> dict[str, str]:
    return {"kind": finding.kind, "subject": finding.subject, "message": finding.message}


def _time(moment: dt.datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def _subject(
    namespace: str | None, pod: str | None, pod_uid: str, volume: str | None, path: str | None
) -> str:
    who = f"{namespace}/{pod}" if namespace and pod else f"pod {pod_uid}"
    where = "/".join(part for part in (volume, path) if part)
    return f"{who} {where}" if where else who


# --- one volume on disk (the per-volume step a caller may run in parallel) ----------------------


@dataclass(frozen=True)
class CertFacts:
    """What the audit needs from one leaf and its chain; plain values, cheap to pass around."""

    serial: str
    spki_sha256: str
    spiffe_id: str | None
    id_problem: str | None
    not_before: dt.datetime
    not_after: dt.datetime
    anchor: str | None  # sha256 of the trust root the chain leads to
    chain_problem: str | None  # None when the chain verified, or was not checked
    chain_checked: bool


@dataclass(frozen=True)
class DiskCredential:
    path: str  # the bundle, or the chain file of a key + chain pair
    key_path: str | None
    cert: CertFacts | None
    problem: str | None  # why a consumer could not load it


@dataclass(frozen=True)
class TrustFile:
    path: str
    roots: tuple[bytes, ...]  # DER
    problem: str | None


@dataclass(frozen=True)
class VolumeFacts:
    pod_uid: str
    volume: str
    credentials: tuple[DiskCredential, ...]
    trust_files: tuple[TrustFile, ...]


_KEY_MARK: Final = b"PRIVATE KEY-----"
_CERT_MARK: Final = b"-----BEGIN CERTIFICATE-----"


def examine_volume(
    volume: VolumeFiles, *, roots: tuple[bytes, ...], now: dt.datetime
) -> VolumeFacts:
    """Parse and check every credential in one volume against `roots` (DER).

    Files are told apart by content, as a node root has no pod spec: key and certificates is a
    credential bundle; a key alone is a key file, paired with the chain file that matches it; CA
    certificates alone are a trust bundle. With no `roots`, chains are checked against the
    volume's own trust bundle files: what the pod itself trusts.
    """
    bundles: list[str] = []
    keys: list[str] = []
    chains: list[str] = []
    trust_files: list[TrustFile] = []
    credentials: list[DiskCredential] = []
    for path, data in sorted(volume.files.items()):
        has_key, has_cert = _KEY_MARK in data, _CERT_MARK in data
        if has_key and has_cert:
            bundles.append(path)
        elif has_key:
            keys.append(path)
        elif has_cert:
            parsed = _trust_file(data)
            if isinstance(parsed, tuple):
                trust_files.append(TrustFile(path, parsed, None))
            elif parsed == "chain":
                chains.append(path)
            else:
                trust_files.append(TrustFile(path, (), parsed))
    anchors = _anchors(roots or tuple(r for t in trust_files for r in t.roots))
    for path in bundles:
        try:
            chain = _bundle_chain(volume.files[path])
        except BundleError as exc:
            credentials.append(DiskCredential(path, None, None, str(exc)))
            continue
        credentials.append(DiskCredential(path, None, _cert_facts(chain, anchors, now), None))
    for chain_path, key_path in _pairs(volume.files, chains, keys):
        if key_path is None:
            # A projection with only certificateChainPath: the chain is all there is to check.
            try:
                chain = tuple(x509.load_pem_x509_certificates(volume.files[chain_path]))
            except ValueError as exc:
                credentials.append(DiskCredential(chain_path, None, None, str(exc)))
                continue
            credentials.append(
                DiskCredential(chain_path, None, _cert_facts(chain, anchors, now), None)
            )
            continue
        try:
            credential = load_credential_files(volume.files[key_path], volume.files[chain_path])
        except BundleError as exc:
            credentials.append(DiskCredential(chain_path, key_path, None, str(exc)))
            continue
        facts = _cert_facts(credential.chain, anchors, now)
        credentials.append(DiskCredential(chain_path, key_path, facts, None))
    for key_path in keys:
        if not any(c.key_path == key_path for c in credentials):
            credentials.append(
                DiskCredential(key_path, key_path, None, "a key file with no certificate chain")
            )
    return VolumeFacts(volume.pod_uid, volume.volume, tuple(credentials), tuple(trust_files))


def _bundle_chain(data: bytes) -> tuple[x509.Certificate, ...]:
    """The chain of a credential bundle, exactly as `load_credential` accepts or refuses it.

    Thousands of bundles end in the same intermediate, so the usual layout (key, leaf, then the
    rest of the chain) is read as key + leaf, strictly, plus a tail parsed once per distinct
    content. Anything else, and any failure, goes through `load_credential` on the whole file,
    which names the defect.
    """
    split = data.find(_CERT_MARK, data.find(_CERT_MARK) + 1)
    if split > 0 and len(data) <= MAX_BUNDLE_BYTES:
        tail = _chain_tail(data[split:])
        if tail is not None:
            with contextlib.suppress(BundleError):
                return load_credential(data[:split]).chain + tail
    return load_credential(data).chain


@functools.lru_cache(maxsize=256)
def _chain_tail(data: bytes) -> tuple[x509.Certificate, ...] | None:
    """Intermediates after the leaf, if they are well-formed CA certificates and nothing else."""
    try:
        roots = load_trust_bundle(data).roots
    except BundleError:
        return None
    return roots if len(roots) == data.count(_CERT_MARK) else None


def _pairs(
    files: Mapping[str, bytes], chains: list[str], keys: list[str]
) -> Iterator[tuple[str, str | None]]:
    """(chain, key) pairs: a key goes with the chain whose leaf it certifies.

    One key and one chain always pair (a mismatch then shows as KeyMismatchError), so a torn
    rotation is reported rather than read as two unrelated files.
    """
    if len(chains) == 1 and len(keys) == 1:
        yield chains[0], keys[0]
        return
    free = list(keys)
    for chain_path in chains:
        match = None
        for key_path in free:
            try:
                load_credential_files(files[key_path], files[chain_path])
            except BundleError:
                continue
            match = key_path
            break
        if match is not None:
            free.remove(match)
        yield chain_path, match


@functools.lru_cache(maxsize=256)
def _trust_file(data: bytes) -> tuple[bytes, ...] | str:
    """A trust bundle's roots (DER), "chain" for a file of non-CA certificates, else the problem.

    Cached by content: every pod of a signer holds the same trust bundle bytes.
    """
    try:
        bundle = load_trust_bundle(data)
    except NotCaError:
        return "chain"
    except BundleError as exc:
        return f"unreadable trust bundle: {exc}"
    return tuple(root.public_bytes(serialization.Encoding.DER) for root in bundle.roots)


class _Anchors:
    """Trust roots, with each CA-to-root signature check done once (thousands of leaves share a
    handful of intermediates)."""

    def __init__(self, roots: Sequence[x509.Certificate]) -> None:
        self.roots = tuple(roots)
        self._fingerprints = {root: _fingerprint(root) for root in self.roots}
        self._by_subject: dict[x509.Name, list[x509.Certificate]] = defaultdict(list)
        for root in self.roots:
            self._by_subject[root.subject].append(root)
        self._signed: dict[tuple[x509.Certificate, x509.Certificate], bool] = {}
        self._keys: dict[x509.Certificate, PublicKeyTypes | None] = {}

    def fingerprint(self, root: x509.Certificate) -> str:
        return self._fingerprints[root]

    def candidates(self, cert: x509.Certificate) -> list[x509.Certificate]:
        return self._by_subject.get(cert.issuer, [])

    def signed(self, cert: x509.Certificate, issuer: x509.Certificate, *, memo: bool) -> bool:
        """Whether `issuer` signed `cert`; CA-to-CA results are remembered (`memo`)."""
        if not memo:
            return self._check(cert, issuer)
        known = self._signed.get((cert, issuer))
        if known is None:
            known = self._signed[cert, issuer] = self._check(cert, issuer)
        return known

    def _check(self, cert: x509.Certificate, issuer: x509.Certificate) -> bool:
        # verify_directly_issued_by, with the issuer's key decoded once, not once per leaf.
        if cert.issuer != issuer.subject:
            return False
        if issuer not in self._keys:
            try:
                self._keys[issuer] = issuer.public_key()
            except (ValueError, UnsupportedAlgorithm):
                self._keys[issuer] = None
        return _signature_valid(cert, self._keys[issuer])


@functools.lru_cache(maxsize=64)
def _anchors(roots: tuple[bytes, ...]) -> _Anchors:
    return _Anchors(list(dict.fromkeys(x509.load_der_x509_certificate(der) for der in roots)))


def _cert_facts(
    chain: Sequence[x509.Certificate], anchors: _Anchors, now: dt.datetime
) -> CertFacts:
    leaf = chain[0]
    try:
        spiffe_id: str | None = str(spiffe_id_of(leaf))
        id_problem = None
    except CertificateIdError as exc:
        spiffe_id, id_problem = None, str(exc)
    spki = leaf.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    not_before, not_after = leaf.not_valid_before_utc, leaf.not_valid_after_utc
    anchor, problem = None, None
    if anchors.roots:
        # Judged inside the leaf's own window: an expired leaf is reported as expired, not
        # again as an untrusted chain; an expired intermediate or root still shows here.
        at = min(max(now, not_before), not_after)
        anchor, problem = _verify_chain(chain, anchors, at)
    return CertFacts(
        serial=f"{leaf.serial_number:x}",
        spki_sha256=hashlib.sha256(spki).hexdigest(),
        spiffe_id=spiffe_id,
        id_problem=id_problem,
        not_before=not_before,
        not_after=not_after,
        anchor=anchor,
        chain_problem=problem,
        chain_checked=bool(anchors.roots),
    )


def _verify_chain(
    chain: Sequence[x509.Certificate], anchors: _Anchors, at: dt.datetime
) -> tuple[str | None, str | None]:
    """(root fingerprint, None) when the chain leads to a root at `at`, else (None, problem).

    The checks `bundles.formats.verify_chain` makes for a TLS peer — signatures link by link,
    validity windows, CA flags — on a chain alone (no key), and naming the root reached.
    """
    for position, cert in enumerate(chain):
        role = "leaf" if position == 0 else f"chain certificate #{position + 1}"
        if not cert.not_valid_before_utc <= at <= cert.not_valid_after_utc:
            return None, f"{role} {describe(cert)} is outside its validity window"
        if position > 0 and not _is_ca(cert):
            return None, f"{role} {describe(cert)} is not a CA"
        if position > 0 and cert in anchors.roots:
            return anchors.fingerprint(cert), None
        # Leaves are unique, CA certificates repeat: remember only the CA checks.
        found = [r for r in anchors.candidates(cert) if anchors.signed(cert, r, memo=position > 0)]
        valid = [r for r in found if r.not_valid_before_utc <= at <= r.not_valid_after_utc]
        if valid:
            return anchors.fingerprint(valid[0]), None
        if position + 1 == len(chain):
            why = "only by expired roots" if found else "by no root in the trust bundles"
            return None, f"{role} {describe(cert)} is signed {why}"
        if not anchors.signed(cert, chain[position + 1], memo=position > 0):
            return None, f"{role} {describe(cert)} is not signed by the next certificate"
    return None, "empty chain"  # unreachable: chains have a leaf


def _signature_valid(cert: x509.Certificate, key: PublicKeyTypes | None) -> bool:
    """The check `verify_directly_issued_by` makes after the name match, for each key type."""
    signature, data = cert.signature, cert.tbs_certificate_bytes
    try:
        parameters, digest = cert.signature_algorithm_parameters, cert.signature_hash_algorithm
        if (
            isinstance(key, rsa.RSAPublicKey)
            and isinstance(parameters, padding.PKCS1v15 | padding.PSS)
            and digest is not None
        ):
            key.verify(signature, data, parameters, digest)
        elif isinstance(key, ec.EllipticCurvePublicKey) and isinstance(parameters, ec.ECDSA):
            key.verify(signature, data, parameters)
        elif isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
            key.verify(signature, data)
        else:
            return False  # a key type that cannot sign certificates, or a mismatched algorithm
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False
    return True


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def _fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex()


# --- the cluster's objects ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    """A podCertificate source in a pod's spec."""

    volume: str
    index: int
    signer_name: str
    paths: tuple[str, ...]  # bundle, key and chain paths that are set
    shown_path: str | None  # the bundle, else the chain


@dataclass(frozen=True)
class _Request:
    uid: str
    namespace: str
    name: str
    pod_uid: str
    pod_name: str
    signer_name: str
    node_name: str
    created: dt.datetime | None
    outcome: Literal["Issued", "Denied", "Failed"] | None
    message: str
    chain: tuple[x509.Certificate, ...]
    begin_refresh_at: dt.datetime | None
    service_account: str = ""
    issued_at: dt.datetime | None = None  # the Issued condition's time, written by the signer


def _str(obj: object, *path: str) -> str:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj if isinstance(obj, str) else ""


def _sources(pod: JSON) -> list[_Source]:
    found: list[_Source] = []
    volumes = (pod.get("spec") or {}).get("volumes")
    for volume in volumes if isinstance(volumes, list) else ():
        if not isinstance(volume, Mapping):
            continue
        sources = (volume.get("projected") or {}).get("sources")
        for index, source in enumerate(sources if isinstance(sources, list) else ()):
            cert = source.get("podCertificate") if isinstance(source, Mapping) else None
            if not isinstance(cert, Mapping):
                continue
            bundle = _str(cert, "credentialBundlePath")
            chain = _str(cert, "certificateChainPath")
            paths = tuple(p for p in (bundle, _str(cert, "keyPath"), chain) if p)
            found.append(
                _Source(
                    _str(volume, "name"),
                    index,
                    _str(cert, "signerName"),
                    paths,
                    bundle or chain or None,
                )
            )
    return found


def _request(pcr: JSON) -> _Request | None:
    meta, spec, status = pcr.get("metadata"), pcr.get("spec"), pcr.get("status") or {}
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return None
    condition = terminal_condition(status)
    outcome = pcrs.outcome(pcr)
    chain: tuple[x509.Certificate, ...] = ()
    pem = status.get("certificateChain") if isinstance(status, Mapping) else None
    if outcome == "Issued" and isinstance(pem, str):
        try:
            chain = tuple(x509.load_pem_x509_certificates(pem.encode()))
        except ValueError:
            chain = ()  # the API server checked it on write; a broken one is not ours to judge
    message = f"{condition[1]}: {condition[2]}".strip(": ") if condition else ""
    return _Request(
        uid=_str(meta, "uid"),
        namespace=_str(meta, "namespace"),
        name=_str(meta, "name"),
        pod_uid=_str(spec, "podUID"),
        pod_name=_str(spec, "podName"),
        signer_name=_str(spec, "signerName"),
        node_name=_str(spec, "nodeName"),
        created=parse_time(meta.get("creationTimestamp")),
        outcome=outcome,
        message=message,
        chain=chain,
        begin_refresh_at=parse_time(
            status.get("beginRefreshAt") if isinstance(status, Mapping) else None
        ),
        service_account=_str(spec, "serviceAccountName"),
        issued_at=_issued_at(status) if outcome == "Issued" else None,
    )


def _issued_at(status: object) -> dt.datetime | None:
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for cond in conditions if isinstance(conditions, list) else ():
        if isinstance(cond, Mapping) and cond.get("type") == "Issued":
            return parse_time(cond.get("lastTransitionTime"))
    return None


def _entries(lines: Sequence[bytes]) -> list[Entry]:
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
class _Proj:
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
    requests: list[_Request] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)


def chain_roots(snapshot: Snapshot) -> tuple[bytes, ...]:
    """The roots (DER) `examine_volume` checks a node's chains against: every trust source."""
    return _TrustIndex(snapshot.trust, []).all_der


def audit_findings(
    snapshot: Snapshot,
    now: dt.datetime,
    settings: Settings | None = None,
    *,
    examined: Iterable[VolumeFacts] | None = None,
) -> Report:
    """Join the inputs per projection and report what is wrong.

    `examined` is a node's volumes already run through `examine_volume(volume,
    roots=chain_roots(snapshot), now=now)` by the caller (the CLI does it in a process pool that
    reads the files as it goes); without it, `snapshot.volumes` are examined here.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    settings = settings or Settings()
    notes: list[str] = []
    findings: list[Finding] = []

    trust = _TrustIndex(snapshot.trust, notes)
    facts: list[VolumeFacts] = []
    if examined is not None:
        facts = list(examined)
    elif snapshot.volumes is not None:
        facts = [examine_volume(v, roots=trust.all_der, now=now) for v in snapshot.volumes]
    if (examined is not None or snapshot.volumes is not None) and not trust.all_der:
        notes.append(
            "no trust bundle given: chains on disk were checked against each pod's own trust bundle"
        )

    logs = snapshot.audit_logs
    entries = [e for _, lines in logs or () for e in _entries(lines)]
    requests = [r for r in map(_request, snapshot.requests or ()) if r is not None]
    projections = _join(snapshot, facts, requests, entries)

    # Signer names someone answers for: a settled request, or an audit log entry.
    served = {r.signer_name for r in requests if r.outcome in ("Issued", "Denied")}
    served |= {e.signer_name for e in entries}
    log_findings: list[Finding] = []
    log_reports = None
    scope = _LogScope(frozenset(), frozenset())
    if logs is not None:
        log_reports, anchored = _audit_logs(
            logs, trust, snapshot.ca_roots, now, settings, log_findings, notes
        )
        scope = _LogScope.of(log_reports, trust, entries, settings)
        if anchored:
            _checkpoint_lag(
                log_reports, _issuances(projections, scope), now, settings, log_findings
            )
    issued_serials = {int(e.serial, 16) for e in entries if e.decision == "issued" and e.serial}
    issued_to = _issued_to(requests, entries)
    copies = _shared(projections)
    reports = [
        _assess(
            p,
            now,
            settings,
            trust,
            served,
            issued_serials if logs is not None and scope.covers(p) else None,
            issued_to,
            copies,
        )
        for p in projections
        if _selected(p, settings)
    ]
    reports.sort(
        key=lambda p: (p.namespace or "~", p.pod or "", p.pod_uid, p.volume or "", p.path or "")
    )
    for report in reports:
        findings.extend(report.findings)
    if snapshot.requests is None and snapshot.volumes is None and examined is None:
        notes.append("neither the cluster nor a node root was read: no projection to report")

    roots = _roots(snapshot, trust, facts, now, settings, findings, notes)
    findings.extend(log_findings)
    return Report(
        now=now,
        inputs=snapshot.inputs,
        projections=tuple(reports),
        roots=roots,
        audit_logs=tuple(log_reports) if log_reports is not None else None,
        findings=tuple(findings),
        notes=tuple(notes),
    )


class _TrustIndex:
    """Trust anchors given by ClusterTrustBundles and files: all of them, and per signer."""

    def __init__(self, sources: Sequence[TrustSource], notes: list[str]) -> None:
        self.sources: list[tuple[TrustSource, tuple[x509.Certificate, ...]]] = []
        for source in sources:
            try:
                roots = load_trust_bundle(source.pem).roots
            except BundleError as exc:
                notes.append(f"trust bundle {source.name} skipped: {exc}")
                continue
            self.sources.append((source, roots))
        every = [root for _, roots in self.sources for root in roots]
        self.all = tuple(dict.fromkeys(every))
        self.all_der = tuple(root.public_bytes(serialization.Encoding.DER) for root in self.all)
        self.general = {
            _fingerprint(r) for s, roots in self.sources if s.signer_name is None for r in roots
        }
        self.by_signer: dict[str, set[str]] = defaultdict(set)
        for source, roots in self.sources:
            if source.signer_name is not None:
                self.by_signer[source.signer_name].update(_fingerprint(r) for r in roots)

    def anchors_for(self, signer_name: str | None) -> set[str] | None:
        """Fingerprints a chain of this signer may lead to; None when any given root will do."""
        if signer_name is None or signer_name not in self.by_signer:
            return None
        return self.by_signer[signer_name] | self.general


def _join(
    snapshot: Snapshot,
    facts: Sequence[VolumeFacts],
    requests: Sequence[_Request],
    entries: Sequence[Entry],
) -> list[_Proj]:
    projections: list[_Proj] = []
    by_volume: dict[tuple[str, str], list[_Proj]] = defaultdict(list)
    by_pod: dict[str, list[_Proj]] = defaultdict(list)

    def add(proj: _Proj) -> _Proj:
        projections.append(proj)
        by_pod[proj.pod_uid].append(proj)
        if proj.volume is not None:
            by_volume[proj.pod_uid, proj.volume].append(proj)
        return proj

    for pod in snapshot.pods or ():
        meta = pod.get("metadata") or {}
        uid, namespace, name = _str(meta, "uid"), _str(meta, "namespace"), _str(meta, "name")
        if not uid:
            continue
        for source in _sources(pod):
            add(
                _Proj(
                    uid,
                    namespace=namespace,
                    pod=name,
                    node=_str(pod, "spec", "nodeName") or None,
                    service_account=_str(pod, "spec", "serviceAccountName") or None,
                    volume=source.volume,
                    path=source.shown_path,
                    signer_name=source.signer_name or None,
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
                owner = add(_Proj(volume.pod_uid, volume=volume.volume, path=credential.path))
            if owner.disk is None or (owner.disk.cert is None and credential.cert is not None):
                owner.disk = credential

    # Requests: to the pod's projection for that signer (by key when several could match).
    request_owner: dict[str, _Proj] = {}
    for request in sorted(
        requests, key=lambda r: r.created or dt.datetime.min.replace(tzinfo=dt.UTC)
    ):
        candidates = [
            p
            for p in by_pod.get(request.pod_uid, ())
            if p.signer_name in (None, request.signer_name)
        ]
        owner = _pick(candidates, request)
        if owner is None:
            owner = add(_Proj(request.pod_uid, signer_name=request.signer_name))
        owner.requests.append(request)
        owner.signer_name = owner.signer_name or request.signer_name
        owner.namespace = owner.namespace or request.namespace
        owner.pod = owner.pod or request.pod_name
        owner.node = owner.node or request.node_name
        owner.service_account = owner.service_account or request.service_account or None
        request_owner[request.uid] = owner

    # Audit log entries: by request UID, by the serial on disk, then by (namespace, pod, signer).
    by_serial = {
        p.disk.cert.serial: p for p in projections if p.disk is not None and p.disk.cert is not None
    }
    for entry in entries:
        owner = request_owner.get(entry.uid)
        if owner is None and entry.serial:
            owner = by_serial.get(_norm_serial(entry.serial))
        if owner is not None:
            owner.signer_name = owner.signer_name or entry.signer_name
            owner.namespace = owner.namespace or entry.namespace
            owner.pod = owner.pod or entry.pod
            owner.node = owner.node or entry.node
    by_name: dict[tuple[str, str, str], _Proj] = {}
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


def _pick(candidates: list[_Proj], request: _Request) -> _Proj | None:
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
    named = [p for p in candidates if p.signer_name == request.signer_name]
    return (named or candidates)[0]


def _norm_serial(serial: str) -> str:
    try:
        return f"{int(serial, 16):x}"
    except ValueError:
        return serial


def _selected(proj: _Proj, settings: Settings) -> bool:
    if settings.namespaces and proj.namespace not in settings.namespaces:
        return False
    if settings.signer_names and proj.signer_name not in settings.signer_names:
        return False
    return not (settings.node_name and proj.node not in (None, settings.node_name))


# --- judging one projection ---------------------------------------------------------------------


def _assess(
    proj: _Proj,
    now: dt.datetime,
    settings: Settings,
    trust: _TrustIndex,
    served: set[str],
    issued_serials: set[int] | None,
    issued_to: Mapping[str, _Holder],
    copies: Mapping[int, str],
) -> Projection:
    subject = _subject(proj.namespace, proj.pod, proj.pod_uid, proj.volume, proj.path)
    findings: list[Finding] = []
    requests = sorted(proj.requests, key=lambda r: r.created or now)
    issued = [r for r in requests if r.outcome == "Issued" and r.chain]
    # Serials and keys of every issued leaf; only the current one's chain is checked below.
    unchecked = _anchors(())
    request_facts = {r.uid: _cert_facts(r.chain, unchecked, now) for r in issued}

    # The current credential: what is on disk, else the newest issued request's leaf.
    current: CertFacts | None = None
    refresh_at: dt.datetime | None = None
    hint: Literal["request", "estimated"] | None = None
    if proj.disk is not None:
        if proj.disk.cert is None:
            findings.append(
                Finding("unreadable", subject, f"{proj.disk.path}: {proj.disk.problem}")
            )
        current = proj.disk.cert
        if current is not None:
            source = next(
                (r for r in issued if request_facts[r.uid].serial == current.serial), None
            )
            if source is not None and source.begin_refresh_at is not None:
                refresh_at, hint = source.begin_refresh_at, "request"
    elif issued:
        newest = issued[-1]
        current = _cert_facts(newest.chain, _anchors(trust.all_der), now)
        if newest.begin_refresh_at is not None:
            refresh_at, hint = newest.begin_refresh_at, "request"
    if current is not None and refresh_at is None:
        lifetime = current.not_after - current.not_before
        refresh_at = current.not_before + lifetime * settings.hintless_refresh_fraction
        hint = "estimated"

    credential_state: State | None = None
    if current is not None and refresh_at is not None:
        if now >= current.not_after:
            credential_state = "expired"
        elif now > refresh_at + settings.overdue_grace:
            credential_state = "overdue"
        elif now >= refresh_at:
            credential_state = "refresh due"
        else:
            credential_state = "fresh"

    # The newest request matters when it is newer than the credential: unanswered or refused.
    request_state: State | None = None
    latest = requests[-1] if requests else None
    superseded = (
        current is not None
        and latest is not None
        and latest.created is not None
        and latest.created < current.not_before
    )
    if latest is not None and latest.outcome != "Issued" and not superseded:
        request_state, message = _request_state(latest, now, settings, served)
        kind = _STATE_FINDINGS.get(request_state)
        if kind is not None:
            findings.append(Finding(kind, subject, message))

    if credential_state is None and request_state is None:
        state: State = "unseen"
    elif credential_state is None or (
        request_state is not None and _SEVERITY[request_state] >= _SEVERITY[credential_state]
    ):
        assert request_state is not None
        state = request_state
    else:
        state = credential_state
    if current is not None and credential_state in ("expired", "overdue"):
        if credential_state == "expired":
            message = f"serial {_short(current.serial)} expired at {_time(current.not_after)}"
        else:
            late = now - (refresh_at or now)
            message = (
                f"serial {_short(current.serial)} is {_duration(late)} past its refresh point "
                f"{_time(refresh_at)} ({hint}) and no newer credential replaced it"
            )
        findings.append(Finding(credential_state, subject, message))

    if current is not None:
        findings.extend(_credential_findings(current, proj, subject, trust, issued_serials))
        findings.extend(_identity_findings(current, proj, subject, issued_to))
    if id(proj) in copies:
        findings.append(Finding("credential-shared", subject, copies[id(proj)]))
    if issued_serials is not None:
        # Joined with the cluster: every certificate a request holds must be in the log. This is
        # what catches a log cut back to an earlier checkpoint (a consistent, signed prefix).
        on_disk = current.serial if current is not None and proj.disk is not None else None
        missing = sorted(
            facts.serial
            for facts in request_facts.values()
            if int(facts.serial, 16) not in issued_serials and facts.serial != on_disk
        )
        for serial in missing:
            findings.append(
                Finding(
                    "not-in-audit-log",
                    subject,
                    f"serial {_short(serial)} was issued by request but is not in the audit log",
                )
            )

    # Rotations and key reuse across every leaf seen for the projection.
    leaves: dict[str, CertFacts] = {f.serial: f for f in request_facts.values()}
    if current is not None:
        leaves[current.serial] = current
    serials = set(leaves) | {
        _norm_serial(e.serial) for e in proj.entries if e.decision == "issued" and e.serial
    }
    by_key: dict[str, list[str]] = defaultdict(list)
    for serial, facts in sorted(leaves.items()):
        by_key[facts.spki_sha256].append(serial)
    for spki, shared in sorted(by_key.items()):
        if len(shared) > 1:
            listed = ", ".join(_short(s) for s in shared)
            findings.append(
                Finding(
                    "key-reused",
                    subject,
                    f"{len(shared)} leaves share one public key (sha256 {spki[:16]}): "
                    f"serials {listed}",
                )
            )

    return Projection(
        pod_uid=proj.pod_uid,
        namespace=proj.namespace,
        pod=proj.pod,
        volume=proj.volume,
        path=proj.path,
        signer_name=proj.signer_name,
        spiffe_id=current.spiffe_id if current is not None else None,
        serial=current.serial if current is not None else None,
        not_before=current.not_before if current is not None else None,
        not_after=current.not_after if current is not None else None,
        begin_refresh_at=refresh_at,
        refresh_hint=hint,
        state=state,
        rotations=len(serials),
        findings=tuple(findings),
    )


def _request_state(
    request: _Request, now: dt.datetime, settings: Settings, served: set[str]
) -> tuple[State, str]:
    where = f"request {request.namespace}/{request.name}"
    if request.outcome == "Denied":
        return "denied", f"{where} was denied: {request.message}"
    if request.outcome == "Failed":
        return "failed", f"{where} failed: {request.message}"
    age = now - request.created if request.created is not None else dt.timedelta(0)
    if request.signer_name not in served and age > settings.no_signer_grace:
        return "stuck", (
            f"{where} has waited {_duration(age)} for signer {request.signer_name}, which "
            "answered none of the requests and audit log entries read (is a signer serving "
            "this name?)"
        )
    if age > settings.stuck_after:
        return "stuck", f"{where} has waited {_duration(age)} for {request.signer_name}"
    return "pending", f"{where} is waiting for {request.signer_name}"


def _credential_findings(
    current: CertFacts,
    proj: _Proj,
    subject: str,
    trust: _TrustIndex,
    issued_serials: set[int] | None,
) -> Iterator[Finding]:
    serial = _short(current.serial)
    if current.id_problem is not None:
        yield Finding("bad-spiffe-id", subject, f"serial {serial}: {current.id_problem}")
    if current.chain_problem is not None:
        yield Finding(
            "untrusted-chain", subject, f"serial {serial} does not verify: {current.chain_problem}"
        )
    elif current.anchor is not None:
        allowed = trust.anchors_for(proj.signer_name)
        if allowed is not None and current.anchor not in allowed:
            yield Finding(
                "untrusted-chain",
                subject,
                f"serial {serial} leads to root sha256 {current.anchor[:16]}, which is not in "
                f"the trust bundles of {proj.signer_name}",
            )
    if (
        issued_serials is not None
        and proj.disk is not None
        and proj.disk.cert is current
        and int(current.serial, 16) not in issued_serials
    ):
        yield Finding(
            "not-in-audit-log",
            subject,
            f"serial {serial} on disk was never issued according to the audit log",
        )


@dataclass(frozen=True)
class _Holder:
    """Whom a serial was issued to, by a request (with the pod's UID) or an audit log entry."""

    namespace: str
    pod: str
    pod_uid: str | None
    service_account: str


def _issued_to(requests: Sequence[_Request], entries: Sequence[Entry]) -> dict[str, _Holder]:
    """serial (normalised hex) -> to whom it was issued; a request's word wins (it has the UID)."""
    holders: dict[str, _Holder] = {}
    for entry in entries:
        if entry.decision == "issued" and entry.serial:
            holders[_norm_serial(entry.serial)] = _Holder(
                entry.namespace, entry.pod, None, entry.service_account
            )
    for request in requests:
        if request.chain:
            holders[f"{request.chain[0].serial_number:x}"] = _Holder(
                request.namespace, request.pod_name, request.pod_uid, request.service_account
            )
    return holders


def _identity_findings(
    current: CertFacts, proj: _Proj, subject: str, issued_to: Mapping[str, _Holder]
) -> Iterator[Finding]:
    """A credential must name the pod that holds it: its SPIFFE ID's namespace and service
    account are the pod's, and it was issued (by request or audit log) to this very pod."""
    serial = _short(current.serial)
    spiffe_path = (current.spiffe_id or "").split("://", 1)[-1].partition("/")[2]
    if current.spiffe_id and proj.namespace and proj.service_account:
        expected = f"ns/{proj.namespace}/sa/{proj.service_account}"
        if spiffe_path != expected:
            yield Finding(
                "wrong-identity",
                subject,
                f"serial {serial} names {current.spiffe_id}, but the pod runs as "
                f"{proj.namespace}/{proj.service_account} (…/{expected})",
            )
            return
    holder = issued_to.get(current.serial)
    if holder is None or proj.disk is None:
        return  # only a credential on disk can sit in the wrong pod
    other_pod = holder.pod_uid is not None and holder.pod_uid != proj.pod_uid
    if proj.namespace and proj.pod:
        other_pod = other_pod or (holder.namespace, holder.pod) != (proj.namespace, proj.pod)
    if other_pod:
        yield Finding(
            "wrong-identity",
            subject,
            f"serial {serial} was issued to pod {holder.namespace}/{holder.pod}, not to this one",
        )


def _shared(projections: Sequence[_Proj]) -> dict[int, str]:
    """id(projection) -> why its credential on disk is also another projection's (the same
    certificate, or another certificate for the same key): a copied credential."""
    by_serial: dict[str, list[_Proj]] = defaultdict(list)
    by_key: dict[str, list[_Proj]] = defaultdict(list)
    for proj in projections:
        if proj.disk is not None and proj.disk.cert is not None:
            by_serial[proj.disk.cert.serial].append(proj)
            by_key[proj.disk.cert.spki_sha256].append(proj)
    out: dict[int, str] = {}
    for what, groups in (("certificate", by_serial), ("private key", by_key)):
        for value, holders in groups.items():
            if len(holders) < 2:
                continue
            for proj in holders:
                others = [
                    _subject(o.namespace, o.pod, o.pod_uid, o.volume, o.path)
                    for o in holders
                    if o is not proj
                ]
                out.setdefault(
                    id(proj),
                    f"the same {what} ({value[:16]}) is also in {', '.join(sorted(others)[:3])}"
                    + (f" and {len(others) - 3} more" if len(others) > 3 else ""),
                )
    return out


# --- trust anchors ------------------------------------------------------------------------------


def _roots(
    snapshot: Snapshot,
    trust: _TrustIndex,
    facts: Sequence[VolumeFacts],
    now: dt.datetime,
    settings: Settings,
    findings: list[Finding],
    notes: list[str],
) -> tuple[Root, ...]:
    sources: dict[bytes, list[str]] = defaultdict(list)
    for source, roots in trust.sources:
        for root in roots:
            sources[root.public_bytes(serialization.Encoding.DER)].append(source.name)
    pods_holding: Counter[bytes] = Counter()
    for volume in facts:
        for trust_file in volume.trust_files:
            pods_holding.update(set(trust_file.roots))
    for der, count in pods_holding.items():
        sources[der].append(f"{count} pod trust bundle file(s) on the node")

    ca_roots: set[str] | None = None
    if snapshot.ca_roots is not None:
        try:
            ca_roots = {_fingerprint(c) for c in x509.load_pem_x509_certificates(snapshot.ca_roots)}
        except ValueError as exc:
            notes.append(f"the signer's CA roots could not be read ({exc}): not checked")
    else:
        notes.append("the signer's CA roots were not given: roots without a CA are not checked")

    out: list[Root] = []
    for der, where in sources.items():
        cert = x509.load_der_x509_certificate(der)
        fingerprint = _fingerprint(cert)
        described = describe(cert)
        subject = f"root {described}"
        not_after = cert.not_valid_after_utc
        if not_after <= now:
            findings.append(Finding("root-expiring", subject, f"expired at {_time(not_after)}"))
        elif not_after - now < settings.root_expiry_warning:
            findings.append(
                Finding(
                    "root-expiring",
                    subject,
                    f"expires at {_time(not_after)}, in {_duration(not_after - now)}",
                )
            )
        has_ca = None if ca_roots is None else fingerprint in ca_roots
        if has_ca is False:
            findings.append(
                Finding(
                    "root-without-ca",
                    subject,
                    f"trusted by {', '.join(where)} but no CA of the signer is behind it",
                )
            )
        out.append(Root(fingerprint, described, not_after, tuple(where), has_ca))
    out.sort(key=lambda r: (r.not_after, r.fingerprint))
    return tuple(out)


# --- the audit log ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _LogScope:
    """Which certificates the audit logs answer for: those of the signer names whose trust
    bundles hold the roots the logs' checkpoints chain to (signed data and the cluster, not
    what a log's entries claim), plus the names its entries and the operator give."""

    signers: frozenset[str]
    anchors: frozenset[str]

    @classmethod
    def of(
        cls,
        reports: Sequence[AuditLogReport],
        trust: _TrustIndex,
        entries: Sequence[Entry],
        settings: Settings,
    ) -> _LogScope:
        anchors = frozenset(a for r in reports for a in r.anchors)
        signers = {s for s, roots in trust.by_signer.items() if roots & anchors}
        signers |= {e.signer_name for e in entries} | settings.signer_names
        return cls(frozenset(signers), anchors)

    def covers(self, proj: _Proj) -> bool:
        if proj.signer_name in self.signers:
            return True
        cert = proj.disk.cert if proj.disk is not None else None
        return cert is not None and cert.anchor in self.anchors


def _issuances(projections: Sequence[_Proj], scope: _LogScope) -> dict[str, dt.datetime]:
    """serial -> when the cluster or a node says it was issued, for what the logs answer for:
    the Issued condition's time (the signer's clock), else the leaf's notBefore (backdated, so
    earlier: the lenient side)."""
    out: dict[str, dt.datetime] = {}
    for proj in projections:
        if not scope.covers(proj):
            continue
        if proj.disk is not None and proj.disk.cert is not None:
            out[proj.disk.cert.serial] = proj.disk.cert.not_before
        for request in proj.requests:
            if request.chain:
                leaf = request.chain[0]
                out[f"{leaf.serial_number:x}"] = request.issued_at or leaf.not_valid_before_utc
    return out


def _audit_logs(
    logs: Sequence[tuple[str, Sequence[bytes]]],
    trust: _TrustIndex,
    ca_roots: bytes | None,
    now: dt.datetime,
    settings: Settings,
    findings: list[Finding],
    notes: list[str],
) -> tuple[list[AuditLogReport], bool]:
    """Verify each replica's log; (reports, whether trust roots anchored them)."""
    roots = list(trust.all)
    if ca_roots is not None:
        with contextlib.suppress(ValueError):  # already noted by _roots
            roots += x509.load_pem_x509_certificates(ca_roots)
    roots = list(dict.fromkeys(roots))
    if not roots:
        if settings.log_chain_only:
            notes.append(
                "--chain-only: the audit log's hash chain was checked, its checkpoints were not "
                "tied to the signer; the log is not vouched for"
            )
        else:
            findings.append(
                Finding(
                    "audit-log",
                    "audit log",
                    "no trust roots were given, so nothing ties the checkpoints to the signer and "
                    "anyone could have written this log: give --kubeconfig or --trust-bundle "
                    "(or --chain-only to check the hash chain alone)",
                )
            )
    reports = [
        _audit_log(name, lines, roots, now, settings, findings, anchor=bool(roots))
        for name, lines in logs
    ]
    return reports, bool(roots)


def _checkpoint_lag(
    reports: Sequence[AuditLogReport],
    issuances: Mapping[str, dt.datetime],
    now: dt.datetime,
    settings: Settings,
    findings: list[Finding],
) -> None:
    """Every certificate issued longer ago than `checkpoint_max_lag` must precede a signed
    checkpoint. Judged by times the writer of a forged log cannot set: the cluster's, and the
    checkpoints' own signed `iat`."""
    signed_until = max(
        (r.last_checkpoint_at for r in reports if r.last_checkpoint_at is not None), default=None
    )
    due = [t for t in issuances.values() if now - t > settings.checkpoint_max_lag]
    if not due:
        return
    newest = max(due)
    if signed_until is None or signed_until < newest:
        signed = _time(signed_until) if signed_until else "never"
        findings.append(
            Finding(
                "audit-log",
                "audit log",
                f"the cluster holds certificates issued until {_time(newest)}, but the newest "
                f"signed checkpoint is from {signed}: checkpoints stopped, or the log was cut "
                "back or stripped of them",
            )
        )


def _audit_log(
    name: str,
    lines: Sequence[bytes],
    roots: list[x509.Certificate],
    now: dt.datetime,
    settings: Settings,
    findings: list[Finding],
    *,
    anchor: bool,
) -> AuditLogReport:
    subject = f"audit log {name}"
    result = verify(lines, roots or None, now)
    problems = tuple(result.problems)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        findings.append(
            Finding(
                "audit-log",
                subject,
                f"first broken line {result.first_broken_line}; {problems[0]}{more}",
            )
        )
    elif anchor and not result.anchored:
        # The signer checkpoints as soon as it opens its log: a log with none is not its log.
        findings.append(
            Finding(
                "audit-log",
                subject,
                "no checkpoint signed by the signer's audit certificate under the trust roots: "
                "the log is not vouched for",
            )
        )
    elif result.unsigned_tail:
        # Entries follow the last checkpoint; too old a tail means checkpointing stopped.
        entries = _entries(lines)
        first = entries[-result.unsigned_tail] if result.unsigned_tail <= len(entries) else None
        if first is not None and now - first.time > settings.unsigned_max_age:
            findings.append(
                Finding(
                    "audit-log",
                    subject,
                    f"the last {result.unsigned_tail} entries (since {_time(first.time)}) are "
                    "covered by no checkpoint; the signer checkpoints every minute",
                )
            )
    if settings.min_checkpoint is not None and (result.last_checkpoint or 0) < (
        settings.min_checkpoint
    ):
        findings.append(
            Finding(
                "audit-log",
                subject,
                f"its newest good checkpoint is number {result.last_checkpoint or 0}, but the "
                f"signer had written number {settings.min_checkpoint}: the log was cut back",
            )
        )
    return AuditLogReport(
        name=name,
        lines=len(lines),
        entries=result.entries,
        checkpoints=result.checkpoints,
        unsigned_tail=result.unsigned_tail,
        anchored=result.anchored,
        last_checkpoint=result.last_checkpoint,
        last_checkpoint_at=result.last_checkpoint_at,
        anchors=result.anchors,
        first_broken_line=result.first_broken_line,
        problems=problems,
    )


# --- small formatting helpers -------------------------------------------------------------------


def _short(serial: str) -> str:
    return serial if len(serial) <= _SHORT_SERIAL else serial[:_SHORT_SERIAL] + "…"


def _duration(delta: dt.timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 0:
        return "-" + _duration(-delta)
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes}m"
    if minutes:
        return f"{minutes}m{seconds}s"
    return f"{seconds}s"
