"""The values the signer decides with: the live facts about a request, and the outcomes.

Pure data. Nothing here imports `kubernetes` or `aiohttp`. The request itself is the typed
`podcert.api.requests.PodCertificateRequest`, decoded at the wire; the decision
(`signer.issue.decide`) is a function of it, these facts and `now`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

import msgspec
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificateIssuerPrivateKeyTypes,
    CertificatePublicKeyTypes,
)

# Why a request is denied, failed or put off: closed types, so that a reason mistyped anywhere
# (a decision, the settlement, a test of the checks) fails the type check. Each Denied reason is
# a distinct thing a human can act on; the values are API-visible (the condition's reason).
BindingReason = Literal[
    "PodNotFound",
    "PodUIDMismatch",
    "PodNotOnNode",
    "PodNotRunnable",  # finished (Succeeded/Failed) or being deleted
    "NodeNotFound",
    "NodeUIDMismatch",
    "ServiceAccountMismatch",
]
"""The NodeRestriction checks against live state (`decide.binding_problem`)."""
DenyReason = Literal[
    BindingReason,
    "UnsupportedKeyType",  # fixed by the API for this case
    "InvalidRequest",  # the spec, stub CSR or public key cannot be used
    "InvalidProofOfPossession",  # v1beta1: proofOfPossession is not the key's signature of podUID
    "KeyNotServed",  # the key's form is in no version the API server serves (v1beta1 disabled)
    "UnknownAnnotation",
    "InvalidAnnotation",
    "DNSNameNotAllowed",
    "PolicyDenied",  # no allow rule matches this namespace/service account
]
FailReason = Literal["SignerMisconfigured"]  # permanent faults on the signer's side only
RetryReason = Literal["CANotLoaded", "CANotYetValid", "CATooShort"]  # transient, our side

BINDING_REASONS: Final = frozenset(get_args(BindingReason))

# Denied reasons by name.
UNSUPPORTED_KEY_TYPE: Final[DenyReason] = "UnsupportedKeyType"
INVALID_REQUEST: Final[DenyReason] = "InvalidRequest"
INVALID_PROOF_OF_POSSESSION: Final[DenyReason] = "InvalidProofOfPossession"
KEY_NOT_SERVED: Final[DenyReason] = "KeyNotServed"
POD_NOT_FOUND: Final[BindingReason] = "PodNotFound"
POD_UID_MISMATCH: Final[BindingReason] = "PodUIDMismatch"
POD_NOT_ON_NODE: Final[BindingReason] = "PodNotOnNode"
POD_NOT_RUNNABLE: Final[BindingReason] = "PodNotRunnable"
NODE_NOT_FOUND: Final[BindingReason] = "NodeNotFound"
NODE_UID_MISMATCH: Final[BindingReason] = "NodeUIDMismatch"
SERVICE_ACCOUNT_MISMATCH: Final[BindingReason] = "ServiceAccountMismatch"
UNKNOWN_ANNOTATION: Final[DenyReason] = "UnknownAnnotation"
INVALID_ANNOTATION: Final[DenyReason] = "InvalidAnnotation"
DNS_NAME_NOT_ALLOWED: Final[DenyReason] = "DNSNameNotAllowed"
POLICY_DENIED: Final[DenyReason] = "PolicyDenied"

# Failed reasons.
SIGNER_MISCONFIGURED: Final[FailReason] = "SignerMisconfigured"


# The facts below are cached for every pod, node and ServiceAccount of the cluster (150,000 pods
# and more): msgspec Structs, as small as slotted classes and, with gc=False, never traversed by
# the cyclic garbage collector (whose full passes over as many dataclasses held the interpreter
# lock for 0.1-0.4 s). They hold only strings, a bool and a read-only mapping: no cycles.


class Pod(msgspec.Struct, frozen=True, gc=False):
    namespace: str
    name: str
    uid: str
    node_name: str
    service_account_name: str
    phase: str = "Pending"
    deleting: bool = False
    # None: more labels than a cache keeps (`signer.issue.facts.LABELS_KEPT`); read the pod live
    # when they are needed.
    labels: Mapping[str, str] | None = msgspec.field(default_factory=dict)


class Node(msgspec.Struct, frozen=True, gc=False):
    name: str
    uid: str


class ServiceAccount(msgspec.Struct, frozen=True, gc=False):
    namespace: str
    name: str
    uid: str


class KeyUnavailable(Exception):
    """The CA key could not sign this once (its token unreachable or refusing): retry, never
    fail the request. The message names the token, never key material."""


@dataclass(frozen=True)
class IssuingCA:
    """The CA that signs leaves now: an intermediate, its key, and the root it chains to."""

    certificate: x509.Certificate
    key: CertificateIssuerPrivateKeyTypes = field(repr=False)
    root: x509.Certificate
    # An upstream's intermediates between this CA and `root` (nearest first), sent after it.
    upstream: tuple[x509.Certificate, ...] = ()
    # The earliest notAfter of the chain (the intermediate's, under podcert's own root), read
    # once: every leaf's plan is bounded by it.
    not_after: dt.datetime = field(init=False)

    def __post_init__(self) -> None:
        # No leaf may outlive any link of its chain: the upstream's intermediates and root too.
        chain = (self.certificate, *self.upstream, self.root)
        object.__setattr__(self, "not_after", min(c.not_valid_after_utc for c in chain))


@dataclass(frozen=True)
class Facts:
    """Live cluster state read for one request. None means: looked up, does not exist."""

    pod: Pod | None
    node: Node | None
    service_account: ServiceAccount | None
    # DNS names the pod is entitled to through the Services that select it.
    service_dns_names: frozenset[str] = frozenset()
    ca: IssuingCA | None = None
    # The view read shows no key and no version the API server serves shows it: a 1.35 node's
    # pkixPublicKey, stored, but seen only at v1 because v1beta1 is not served (any more).
    key_not_served: bool = False


@dataclass(frozen=True)
class LeafPlan:
    """Everything the certificate will say, decided before anything is signed."""

    public_key: CertificatePublicKeyTypes
    spiffe_id: str
    dns_names: tuple[str, ...]
    not_before: dt.datetime
    not_after: dt.datetime
    begin_refresh_at: dt.datetime


@dataclass(frozen=True)
class Issue:
    plan: LeafPlan


@dataclass(frozen=True)
class Deny:
    reason: DenyReason
    message: str


@dataclass(frozen=True)
class Retry:
    """Not now: decide again after `after` (transient; never becomes Failed)."""

    after: dt.timedelta
    reason: RetryReason


@dataclass(frozen=True)
class Fail:
    reason: FailReason
    message: str


Decision = Issue | Deny | Retry | Fail


@dataclass(frozen=True)
class Signed:
    """An `Issue` carried out: the chain (PEM, leaf first) signed to the plan, and its serial."""

    plan: LeafPlan
    chain_pem: str = field(repr=False)
    serial: int


Answer = Signed | Deny | Fail
"""What the signer writes for a request: the terminal outcome the settlement turns into a
status, an audit entry, an Event and metric labels (`signer.issue.settle`)."""
