"""`podcert inspect FILE` as a pure function: a credential bundle, a certificate chain file or a
trust bundle, as bytes, and `now` (and, if given, trust anchors) -> what it holds.

What the file is, is read from its blocks as `bundles.formats` parses them: a private key with
certificates is a credential bundle, CA certificates alone a trust bundle, a leaf first without
a key a chain file. The private key's type is shown, never a byte of it. The refresh hint is not
in any of these files: the kubelet (and the shim) write the key and the chain only, and the
hint lives on the request's `status.beginRefreshAt` (`podcert explain pod` shows it while the
request exists), so the inspection says so instead of guessing. With anchors, each root is
tried on its own (`bundles.formats.verify_chain`) and the root the chain leads to is named (the
audit's own check, `audit.examine.cert_facts`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from audit.examine import anchor_set, cert_facts
from bundles.formats import BundleError, NoKeyError, NotCaError, load_credential, load_trust_bundle
from bundles.spiffe import CertificateIdError, spiffe_id_of
from podcert.api.keys import key_type_of
from podcert.api.times import format_time

Kind = Literal["credential-bundle", "certificate-chain", "trust-bundle", "unreadable"]
NO_REFRESH_HINT: Final = (
    "not in the file: the kubelet writes only the key and the chain; the hint is the "
    "request's status.beginRefreshAt (podcert explain pod shows it while the request exists)"
)


@dataclass(frozen=True)
class CertificateView:
    subject: str
    issuer: str
    spiffe_id: str | None
    is_ca: bool
    not_before: dt.datetime
    not_after: dt.datetime
    sha256: str

    def as_json(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "issuer": self.issuer,
            "spiffeID": self.spiffe_id,
            "isCA": self.is_ca,
            "notBefore": format_time(self.not_before),
            "notAfter": format_time(self.not_after),
            "sha256": self.sha256,
        }


@dataclass(frozen=True)
class Inspection:
    path: str
    kind: Kind
    spiffe_id: str | None
    key_type: str | None  # the credential's key, or the leaf's public key in a chain file
    certificates: tuple[CertificateView, ...]  # the chain leaf first, or the trust bundle's roots
    validity: str  # valid / expired / not yet valid, for the leaf (or every root)
    refresh_hint: str
    anchor: CertificateView | None  # the root of --trust-bundle that vouches for the chain
    anchors_checked: bool
    problems: tuple[str, ...]

    @property
    def healthy(self) -> bool:
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "fileKind": self.kind,
            "spiffeID": self.spiffe_id,
            "keyType": self.key_type,
            "validity": self.validity,
            "refreshHint": self.refresh_hint,
            "certificates": [c.as_json() for c in self.certificates],
            "anchorsChecked": self.anchors_checked,
            "anchor": self.anchor.as_json() if self.anchor else None,
            "problems": list(self.problems),
            "healthy": self.healthy,
        }


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _spiffe(cert: x509.Certificate) -> str | None:
    try:
        return str(spiffe_id_of(cert))
    except CertificateIdError:
        return None


def view(cert: x509.Certificate) -> CertificateView:
    return CertificateView(
        subject=cert.subject.rfc4514_string(),
        issuer=cert.issuer.rfc4514_string(),
        spiffe_id=_spiffe(cert),
        is_ca=_is_ca(cert),
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        sha256=cert.fingerprint(hashes.SHA256()).hex(),
    )


def _validity(cert: x509.Certificate, now: dt.datetime) -> str:
    if now < cert.not_valid_before_utc:
        return "not yet valid"
    if now >= cert.not_valid_after_utc:
        return "expired"
    return "valid"


def _anchor(
    chain: tuple[x509.Certificate, ...], anchors: Sequence[x509.Certificate], now: dt.datetime
) -> tuple[x509.Certificate | None, str | None]:
    """The root of `anchors` the chain leads to, or why it leads to none (the audit's check:
    signatures link by link, judged inside the leaf's own validity window)."""
    if not anchors:
        return None, "the trust bundle holds no root"
    roots = anchor_set(tuple(r.public_bytes(serialization.Encoding.DER) for r in anchors))
    facts = cert_facts(chain, roots, now)
    found = next((r for r in roots.roots if roots.fingerprint(r) == facts.anchor), None)
    return found, facts.chain_problem


def inspect_file(
    path: str,
    data: bytes,
    now: dt.datetime,
    anchors: Sequence[x509.Certificate] | None = None,
) -> Inspection:
    """What `data` (the file at `path`) holds, judged at `now` against `anchors` if given."""
    checked = anchors is not None
    try:
        credential = load_credential(data)
    except NoKeyError:
        credential = None
    except BundleError as err:
        return _unreadable(path, str(err), checked)
    if credential is not None:
        return _chain(path, "credential-bundle", credential.chain, credential.key, now, anchors)
    try:
        bundle = load_trust_bundle(data)
    except NotCaError:
        try:
            chain = tuple(x509.load_pem_x509_certificates(data))
        except ValueError as err:
            return _unreadable(path, f"certificate chain: {err}", checked)
        return _chain(path, "certificate-chain", chain, None, now, anchors)
    except BundleError as err:
        return _unreadable(path, str(err), checked)
    validities = {_validity(root, now) for root in bundle.roots}
    problems = tuple(
        f"root {view(r).subject} is {_validity(r, now)}"
        for r in bundle.roots
        if _validity(r, now) != "valid"
    )
    return Inspection(
        path=path,
        kind="trust-bundle",
        spiffe_id=None,
        key_type=None,
        certificates=tuple(view(r) for r in bundle.roots),
        validity="valid" if validities == {"valid"} else ", ".join(sorted(validities)),
        refresh_hint="a trust bundle has none: it changes when the signer's CA does",
        anchor=None,
        anchors_checked=False,
        problems=problems,
    )


def _unreadable(path: str, problem: str, checked: bool) -> Inspection:
    return Inspection(
        path, "unreadable", None, None, (), "-", NO_REFRESH_HINT, None, checked, (problem,)
    )


def _chain(
    path: str,
    kind: Kind,
    chain: tuple[x509.Certificate, ...],
    key: Any,
    now: dt.datetime,
    anchors: Sequence[x509.Certificate] | None,
) -> Inspection:
    leaf = chain[0]
    problems = []
    spiffe_id = None
    try:
        spiffe_id = str(spiffe_id_of(leaf))
    except CertificateIdError as err:
        problems.append(f"the leaf has no SPIFFE ID: {err}")
    public = key.public_key() if key is not None else leaf.public_key()
    validity = _validity(leaf, now)
    if validity != "valid":
        problems.append(f"the leaf is {validity}")
    anchor = None
    if anchors is not None:
        anchor, why = _anchor(chain, anchors, now)
        if anchor is None:
            problems.append(f"no root of the trust bundle anchors it: {why}")
    return Inspection(
        path=path,
        kind=kind,
        spiffe_id=spiffe_id,
        key_type=key_type_of(public) or type(public).__name__,
        certificates=tuple(view(c) for c in chain),
        validity=validity,
        refresh_hint=NO_REFRESH_HINT,
        anchor=view(anchor) if anchor is not None else None,
        anchors_checked=anchors is not None,
        problems=tuple(problems),
    )


def inspection_table(found: Inspection) -> str:
    """The text `podcert inspect` prints for people."""
    lines = [f"File:          {found.path} ({found.kind})"]
    if found.kind != "trust-bundle" and found.kind != "unreadable":
        lines += [
            f"SPIFFE ID:     {found.spiffe_id or '-'}",
            f"Key type:      {found.key_type or '-'}",
        ]
    if found.certificates:
        leaf = found.certificates[0]
        if found.kind == "trust-bundle":
            lines.append(f"Roots:         {len(found.certificates)}, {found.validity}")
        else:
            lines.append(
                f"Validity:      {found.validity}, {format_time(leaf.not_before)} to "
                f"{format_time(leaf.not_after)}"
            )
        lines.append(f"Refresh hint:  {found.refresh_hint}")
        heading = "Roots:" if found.kind == "trust-bundle" else "Chain (leaf first):"
        lines.append(heading)
        for n, cert in enumerate(found.certificates):
            name = cert.subject or cert.spiffe_id or "<empty subject>"
            lines += [
                f"  [{n}] {name}" + (" (CA)" if cert.is_ca else ""),
                f"      issuer {cert.issuer or '-'}",
                f"      valid {format_time(cert.not_before)} to {format_time(cert.not_after)}",
                f"      sha256 {cert.sha256}",
            ]
    if found.anchors_checked:
        anchor = found.anchor
        lines.append(
            f"Anchored by:   {anchor.subject} (sha256 {anchor.sha256[:16]})"
            if anchor
            else "Anchored by:   none of the given roots"
        )
    lines += [f"Problem:       {problem}" for problem in found.problems]
    return "\n".join(lines) + "\n"
