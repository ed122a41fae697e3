"""Peer authorization by SPIFFE ID, as small predicate factories (py-spiffe `authorize_*` style).

TLS proves that the peer holds a key certified by our trust bundle; these predicates decide whether
that identity may talk to us. A decision is a value (`Verdict`) with a sentence fit for a log line,
never an exception, so a hostile or broken peer certificate cannot crash a handler. The example
services and the signer policy reuse the same factories. Pure: no I/O, no clock.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from bundles.formats import BundleError, load_certificate
from bundles.spiffe import (
    CertificateIdError,
    SpiffeId,
    parse_trust_domain,
    spiffe_id_of,
    workload_of,
)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str  # one sentence, for logs and denial messages

    def __bool__(self) -> bool:
        return self.allowed


Authorizer = Callable[[SpiffeId], Verdict]


def allow_ids(ids: Iterable[str | SpiffeId]) -> Authorizer:
    """Allow exactly these SPIFFE IDs. IDs are parsed now, so a typo fails at startup."""
    allowed = frozenset(i if isinstance(i, SpiffeId) else SpiffeId.parse(i) for i in ids)
    if len(allowed) == 1:
        (only,) = allowed
        yes, no = "is the allowed ID", f"is not the allowed ID {only}"
    else:
        yes = f"is one of the {len(allowed)} allowed IDs"
        no = f"is not one of the {len(allowed)} allowed IDs"

    def authorize(peer: SpiffeId) -> Verdict:
        if peer in allowed:
            return Verdict(True, f"{peer} {yes}.")
        return Verdict(False, f"{peer} {no}.")

    return authorize


def allow_trust_domain(trust_domain: str) -> Authorizer:
    """Allow any ID in the trust domain (`example.org` or `spiffe://example.org`)."""
    td = parse_trust_domain(trust_domain)

    def authorize(peer: SpiffeId) -> Verdict:
        if peer.member_of(td):
            return Verdict(True, f"{peer} is in trust domain {td}.")
        return Verdict(False, f"{peer} is not in trust domain {td}.")

    return authorize


def allow_workloads(
    namespace_glob: str, service_account_glob: str, trust_domain: str | None = None
) -> Authorizer:
    """Allow `/ns/<ns>/sa/<sa>` IDs whose namespace and service account match the globs.

    Globs are fnmatch patterns matched case-sensitively (`*`, `?`, `[...]`); with no
    trust_domain any trust domain matches.
    """
    td = parse_trust_domain(trust_domain) if trust_domain is not None else None
    rule = f"namespace {namespace_glob!r} / service account {service_account_glob!r}"
    if td is not None:
        rule += f" in trust domain {td}"

    def authorize(peer: SpiffeId) -> Verdict:
        if td is not None and not peer.member_of(td):
            return Verdict(False, f"{peer} is not in trust domain {td}.")
        workload = workload_of(peer)
        if workload is None:
            return Verdict(False, f"{peer} is not a /ns/<namespace>/sa/<service account> ID.")
        namespace_ok = fnmatch.fnmatchcase(workload.namespace, namespace_glob)
        service_account_ok = fnmatch.fnmatchcase(workload.service_account, service_account_glob)
        if namespace_ok and service_account_ok:
            return Verdict(True, f"{peer} matches {rule}.")
        return Verdict(False, f"{peer} does not match {rule}.")

    return authorize


def allow_any_of(*authorizers: Authorizer) -> Authorizer:
    """Allow when any authorizer allows (first match wins); with none, deny everything."""

    def authorize(peer: SpiffeId) -> Verdict:
        reasons: list[str] = []
        for authorizer in authorizers:
            verdict = authorizer(peer)
            if verdict.allowed:
                return verdict
            reasons.append(_clause(verdict.reason))
        if not reasons:
            return Verdict(False, f"{peer} is denied: no rule allows any peer.")
        return Verdict(False, f"{peer} is denied by every rule: {'; '.join(reasons)}.")

    return authorize


def authorize_peer_certificate(der: bytes | None, authorizer: Authorizer) -> Verdict:
    """Authorize a peer by its leaf certificate, e.g. `ssl_object.getpeercert(binary_form=True)`.

    A missing, unparsable, or ID-less certificate gives a denied verdict, never an exception.
    """
    if not der:
        return Verdict(False, "The peer presented no certificate.")
    try:
        cert = load_certificate(der)
    except BundleError as exc:
        return Verdict(False, f"The peer certificate cannot be parsed: {_clause(exc)}.")
    try:
        peer = spiffe_id_of(cert)
    except CertificateIdError as exc:
        return Verdict(False, f"The peer certificate carries no usable SPIFFE ID: {_clause(exc)}.")
    return authorizer(peer)


def authorize_peer_chain(
    chain: Sequence[bytes] | None, federated: Mapping[bytes, str], authorizer: Authorizer
) -> Verdict:
    """Authorize a peer by the chain TLS verified (DER, leaf first, trust anchor last).

    `federated` maps each root of a federated trust domain (DER) to that trust domain: such a
    root vouches for IDs of its own trust domain only (SPIFFE federation), so a peer whose
    chain ends there must hold an ID in that domain. A chain ending at one of our own roots is
    judged by `authorizer` alone, as `authorize_peer_certificate` judges it.
    """
    if not chain:
        return Verdict(False, "The peer presented no certificate, or TLS verified no chain.")
    verdict = authorize_peer_certificate(chain[0], allow_all)
    if not verdict:
        return verdict
    peer = spiffe_id_of(load_certificate(chain[0]))
    anchor = federated.get(chain[-1])
    if anchor is not None and not peer.member_of(anchor):
        return Verdict(
            False,
            f"{peer} chains to a root of federated trust domain {anchor}, which vouches "
            "for its own IDs only.",
        )
    return authorizer(peer)


def allow_all(peer: SpiffeId) -> Verdict:
    """Any peer with a valid SPIFFE ID (for composing checks; never a policy on its own)."""
    return Verdict(True, f"{peer} has a valid SPIFFE ID.")


def _clause(text: object) -> str:
    """A sentence or exception message as a clause to embed in another sentence."""
    return str(text).rstrip(".")
