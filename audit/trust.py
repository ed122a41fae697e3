"""Trust anchors: which roots each signer's bundles hold, and what is wrong with any of them
(expiring, or trusted with no CA of the signer behind it).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from audit.examine import VolumeFacts, sha256_of
from audit.model import Finding, Root, Settings, Snapshot, TrustSource, duration_text, fmt_time
from bundles.formats import (
    BundleError,
    describe,
    load_trust_bundle,
)


class TrustIndex:
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
            sha256_of(r) for s, roots in self.sources if s.signer_name is None for r in roots
        }
        self.by_signer: dict[str, set[str]] = defaultdict(set)
        for source, roots in self.sources:
            if source.signer_name is not None:
                self.by_signer[source.signer_name].update(sha256_of(r) for r in roots)

    def anchors_for(self, signer_name: str | None) -> set[str] | None:
        """Fingerprints a chain of this signer may lead to; None when any given root will do."""
        if signer_name is None or signer_name not in self.by_signer:
            return None
        return self.by_signer[signer_name] | self.general


# --- trust anchors ------------------------------------------------------------------------------


def judge_roots(
    snapshot: Snapshot,
    trust: TrustIndex,
    facts: Sequence[VolumeFacts],
    now: dt.datetime,
    settings: Settings,
    findings: list[Finding],
    notes: list[str],
) -> tuple[Root, ...]:
    sources: dict[bytes, list[str]] = defaultdict(list)
    for source, roots in trust.sources:
        if settings.signer_names and source.signer_name not in (None, *settings.signer_names):
            continue  # another signer's bundle: not what this audit was asked about
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
            ca_roots = {sha256_of(c) for c in x509.load_pem_x509_certificates(snapshot.ca_roots)}
        except ValueError as exc:
            notes.append(f"the signer's CA roots could not be read ({exc}): not checked")
    else:
        notes.append("the signer's CA roots were not given: roots without a CA are not checked")

    out: list[Root] = []
    for der, where in sources.items():
        cert = x509.load_der_x509_certificate(der)
        fingerprint = sha256_of(cert)
        described = describe(cert)
        subject = f"root {described}"
        not_after = cert.not_valid_after_utc
        if not_after <= now:
            findings.append(Finding("root-expiring", subject, f"expired at {fmt_time(not_after)}"))
        elif not_after - now < settings.root_expiry_warning:
            findings.append(
                Finding(
                    "root-expiring",
                    subject,
                    f"expires at {fmt_time(not_after)}, in {duration_text(not_after - now)}",
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
