"""Peer authorization by SPIFFE ID, as small predicate factories (py-spiffe `authorize_*` style).

TLS proves that the peer holds a key certified by a root we trust; these predicates decide whether
that identity may talk to us. A decision is a value (`Verdict`) with a sentence fit for a log line,
never an exception, so a hostile or broken peer certificate cannot crash a handler. The example
services reuse the same factories. Pure: no I/O, no clock.

Every rule names the trust domains it admits: `allow_ids` and `allow_trust_domain` by their
argument, `allow_workloads` by its required `trust_domain` (the local one, or `ANY_TRUST_DOMAIN`
said out loud). A federated partner chooses its own paths freely, so a rule that matched
`/ns/shop/sa/web` in every trust domain would let any partner impersonate every local workload.

Peers are judged by the chain TLS verified, never by the leaf alone (`authorize_peer_chain`): a
federated trust domain's root vouches for that trust domain's IDs only, and a chain that ends at
a root we do not know (a library that loaded more roots into a shared context) is refused.
`bundles.handshake` runs that judgement inside the handshake.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

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

ANY_TRUST_DOMAIN: Final = "*"  # allow_workloads(..., trust_domain=ANY_TRUST_DOMAIN): every one


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
    namespace_glob: str, service_account_glob: str, *, trust_domain: str
) -> Authorizer:
    """Allow `/ns/<ns>/sa/<sa>` IDs of `trust_domain` whose namespace and service account match
    the globs.

    Globs are fnmatch patterns matched case-sensitively (`*`, `?`, `[...]`). `trust_domain` is
    required: pass the local one (e.g. `TLSSource.trust_domain`), a partner's, or
    `ANY_TRUST_DOMAIN` to admit the same path from every trust domain any trusted root vouches
    for, federated partners included.
    """
    td = None if trust_domain == ANY_TRUST_DOMAIN else parse_trust_domain(trust_domain)
    rule = f"namespace {namespace_glob!r} / service account {service_account_glob!r}"
    rule += f" in trust domain {td}" if td is not None else " in any trust domain"

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


def authorize_peer_chain(
    chain: Sequence[bytes] | None, trusted: Mapping[bytes, str | None], authorizer: Authorizer
) -> Verdict:
    """Authorize a peer by the chain TLS verified (DER, leaf first, trust anchor last).

    `trusted` maps every root the TLS context trusts (DER) to the federated trust domain it
    belongs to, or to None for one of our own roots. A federated root vouches for IDs of its
    own trust domain only (SPIFFE federation), so a peer whose chain ends there must hold an ID
    in that domain; a chain ending at a root not in `trusted` is refused; a chain ending at one
    of our own roots is judged by `authorizer` alone. A missing, unparsable or ID-less leaf gives
    a denied verdict, never an exception.
    """
    if not chain:
        return Verdict(False, "The peer presented no certificate, or TLS verified no chain.")
    try:
        peer = spiffe_id_of(load_certificate(chain[0]))
    except BundleError as exc:
        return Verdict(False, f"The peer certificate cannot be parsed: {_clause(exc)}.")
    except CertificateIdError as exc:
        return Verdict(False, f"The peer certificate carries no usable SPIFFE ID: {_clause(exc)}.")
    if chain[-1] not in trusted:
        return Verdict(False, f"{peer} chains to a root that is neither ours nor a federated one.")
    anchor = trusted[chain[-1]]
    if anchor is not None and not peer.member_of(anchor):
        return Verdict(
            False,
            f"{peer} chains to a root of federated trust domain {anchor}, which vouches "
            "for its own IDs only.",
        )
    return authorizer(peer)


def _clause(text: object) -> str:
    """A sentence or exception message as a clause to embed in another sentence."""
    return str(text).rstrip(".")
