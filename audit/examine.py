"""One node volume at a time: parse every credential and trust file in it and check each chain.

The one expensive step of the audit, pure and per volume, so the CLI can run it in a process pool
while it reads the files; the report does not depend on where it ran.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

from audit import layout
from audit.model import KEY_MARK, VolumeFiles
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
class ReadableKey:
    """A file holding a private key that users other than its owner may read."""

    path: str
    mode: int  # its permission bits, as read


@dataclass(frozen=True)
class VolumeFacts:
    pod_uid: str
    volume: str
    credentials: tuple[DiskCredential, ...]
    trust_files: tuple[TrustFile, ...]
    readable_keys: tuple[ReadableKey, ...] = ()


_CERT_MARK: Final = b"-----BEGIN CERTIFICATE-----"
# Read permission for the file's group or for others. The real kubelet writes key files with the
# volume's defaultMode (0644 unless the pod sets one) and 0640 with fsGroup; the shim with 0600.
SHARED_READ: Final = 0o044


def examine_volume(
    volume: VolumeFiles, *, roots: tuple[bytes, ...], now: dt.datetime
) -> VolumeFacts:
    """Parse and check every credential in one volume against `roots` (DER).

    Files are told apart by content, as a node root has no pod spec: key and certificates is a
    credential bundle; a key alone is a key file, paired with the chain file that matches it; CA
    certificates alone are a trust bundle. With no `roots`, chains are checked against the
    volume's own trust bundle files: what the pod itself trusts (in a SPIFFE credential folder,
    its own trust domain's file: `audit.layout`). A key-bearing file whose mode
    (when known) lets its group or others read it is a `ReadableKey`.
    """
    bundles: list[str] = []
    keys: list[str] = []
    chains: list[str] = []
    trust_files: list[TrustFile] = []
    credentials: list[DiskCredential] = []
    for path, data in sorted(volume.files.items()):
        has_key, has_cert = KEY_MARK in data, _CERT_MARK in data
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
    anchors = anchor_set(roots or tuple(r for t in trust_files for r in t.roots))
    in_files = {t.path: t.roots for t in trust_files}
    for path in bundles:
        try:
            chain = _bundle_chain(volume.files[path])
            problem = layout.credential_problem(path, volume.files[path])
        except BundleError as exc:
            problem = str(exc)
        if problem is not None:
            credentials.append(DiskCredential(path, None, None, problem))
            continue
        # In a credential folder, the chain is judged by its own trust domain's file alone.
        own = None if roots else layout.own_roots(path, chain[0], in_files)
        facts = cert_facts(chain, anchors if own is None else anchor_set(own.roots), now)
        if own is not None and own.problem is not None:
            facts = replace(facts, chain_problem=own.problem, chain_checked=True)
        credentials.append(DiskCredential(path, None, facts, None))
    for chain_path, key_path in _pairs(volume.files, chains, keys):
        if key_path is None:
            # A projection with only certificateChainPath: the chain is all there is to check.
            try:
                chain = tuple(x509.load_pem_x509_certificates(volume.files[chain_path]))
            except ValueError as exc:
                credentials.append(DiskCredential(chain_path, None, None, str(exc)))
                continue
            credentials.append(
                DiskCredential(chain_path, None, cert_facts(chain, anchors, now), None)
            )
            continue
        try:
            credential = load_credential_files(volume.files[key_path], volume.files[chain_path])
        except BundleError as exc:
            credentials.append(DiskCredential(chain_path, key_path, None, str(exc)))
            continue
        facts = cert_facts(credential.chain, anchors, now)
        credentials.append(DiskCredential(chain_path, key_path, facts, None))
    for key_path in keys:
        if not any(c.key_path == key_path for c in credentials):
            credentials.append(
                DiskCredential(key_path, key_path, None, "a key file with no certificate chain")
            )
    readable = tuple(
        ReadableKey(path, mode)
        for path in sorted((*bundles, *keys))
        if (mode := volume.modes.get(path)) is not None and mode & SHARED_READ
    )
    return VolumeFacts(
        volume.pod_uid, volume.volume, tuple(credentials), tuple(trust_files), readable
    )


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


class Anchors:
    """Trust roots, with each CA-to-root signature check done once (thousands of leaves share a
    handful of intermediates)."""

    def __init__(self, roots: Sequence[x509.Certificate]) -> None:
        self.roots = tuple(roots)
        self._fingerprints = {root: sha256_of(root) for root in self.roots}
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
def anchor_set(roots: tuple[bytes, ...]) -> Anchors:
    return Anchors(list(dict.fromkeys(x509.load_der_x509_certificate(der) for der in roots)))


def cert_facts(chain: Sequence[x509.Certificate], anchors: Anchors, now: dt.datetime) -> CertFacts:
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
    chain: Sequence[x509.Certificate], anchors: Anchors, at: dt.datetime
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


def sha256_of(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex()
