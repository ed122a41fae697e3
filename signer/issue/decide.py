"""The signer's decision: issue, deny, or try again later, for one PodCertificateRequest.

A purely computational function of the request, the live facts the controller read for it, the
signer's policy and `now`; the controller applies the outcome with one status write. Every
hostile or malformed input ends in a typed `Deny` whose message a human can act on. Transient
trouble on our side (no CA loaded yet, CA about to expire) is a `Retry`, never a terminal outcome
for the pod.

What the request asks for is read here from bytes and strings its requester controls: its key
(`parse_public_key`: the stub CSR, or the key with its proof of possession, each checked again
by `podcert.api.keys` although the API server checked it at creation) and the names its
annotations ask for (`parse_annotations`). Only `podcert.dev/dns-names` is understood, a
comma-separated list of DNS names; unknown keys are denied rather than ignored, since a key we do
not understand may be a request the user believes is honoured. Whether the pod is entitled to the
names is decided against the Services that select it, and whether they are honoured at all is
policy (`dnsNames.allowRequested`). The spec's names and lifetime are checked before any
decision (`podcert.api.requests.invalid`): a request the API server would not admit never
reaches here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from podcert.api import keys
from podcert.api.keys import BY_PREFERENCE, KEY_TYPES
from podcert.api.requests import PodCertificateRequest, ProvenKey, RequestError, subject_key
from podcert.api.validation import MIN_LIFETIME, is_dns_name
from podcert.errors import show
from signer import certs, model
from signer.policy import SignerPolicy

# Retry reasons (for logs and metrics; the request stays pending).
CA_NOT_LOADED: Final[model.RetryReason] = "CANotLoaded"
CA_NOT_YET_VALID: Final[model.RetryReason] = "CANotYetValid"
CA_TOO_SHORT: Final[model.RetryReason] = "CATooShort"

KEY_NOT_SERVED_MESSAGE: Final = (
    "certificates.k8s.io/v1 shows this request without a key: it was made through "
    "certificates.k8s.io/v1beta1 with spec.pkixPublicKey and spec.proofOfPossession (as 1.35 "
    "kubelets make it), which v1 does not have, and this API server does not serve v1beta1 "
    "podcertificaterequests. Enable certificates.k8s.io/v1beta1 (--runtime-config="
    "certificates.k8s.io/v1beta1/podcertificaterequests=true) while 1.35 kubelets remain."
)


def decide(
    request: PodCertificateRequest,
    facts: model.Facts,
    policy: SignerPolicy,
    now: dt.datetime,
    *,
    backdate: dt.timedelta = certs.DEFAULT_LEAF_BACKDATE,
    refresh_fraction: float = certs.DEFAULT_REFRESH_FRACTION,
) -> model.Decision:
    """What to do with `request`, given `facts` read just now and the signer's `policy`.
    `request` is one `podcert.api.requests.invalid` finds nothing wrong with: its names and
    maxExpirationSeconds are within what the API server admits."""
    spec = request.spec
    if spec.signer_name != policy.name:
        raise ValueError(f"policy for {policy.name} applied to a request for {spec.signer_name}")
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")

    # 1. The request itself: a usable key, in a form the server shows.
    if facts.key_not_served:
        return model.Deny(model.KEY_NOT_SERVED, KEY_NOT_SERVED_MESSAGE)
    try:
        key = parse_public_key(request)
    except CSRError as exc:
        message = exc.message
        if exc.reason == model.UNSUPPORTED_KEY_TYPE:
            message += f" Use {_suggest(policy)}."
        return model.Deny(exc.reason, message)

    # 2. Node restriction: the request must describe a live pod on the node that asked.
    denial = binding_problem(request, facts)
    if denial is not None:
        return denial

    # 3. Policy: key type, who may have certificates at all, and which names.
    if key.key_type not in policy.key_types:
        return model.Deny(
            model.UNSUPPORTED_KEY_TYPE,
            f"Key type {key.key_type} is not accepted by signer {policy.name} (it accepts "
            f"{_allowed(policy)}); use {_suggest(policy)}.",
        )
    if not policy.allows(request.namespace, spec.service_account_name):
        return model.Deny(
            model.POLICY_DENIED,
            f"Signer {policy.name} issues no certificates to service account "
            f"{spec.service_account_name!r} in namespace {request.namespace!r}: no allow "
            "rule of its policy matches them.",
        )
    asked = parse_annotations(spec.unverified_user_annotations or {}, policy)
    if isinstance(asked, model.Deny):
        return asked
    for name in asked.dns_names:
        if name not in facts.service_dns_names:
            return model.Deny(
                model.DNS_NAME_NOT_ALLOWED,
                f"Pod {spec.pod_name!r} is not entitled to DNS name {show(name)}: no Service "
                f"in namespace {request.namespace!r} selecting it has that name.",
            )
    issued = facts.service_dns_names if policy.dns.services else frozenset()
    dns_names = tuple(sorted(issued | set(asked.dns_names)))

    # 4. Our side: a CA that can vouch for at least the API's minimum lifetime.
    ca = facts.ca
    if ca is None:
        return model.Retry(after=dt.timedelta(seconds=5), reason=CA_NOT_LOADED)
    ca_not_before = ca.certificate.not_valid_before_utc
    if ca_not_before > now:
        wait = min(max(ca_not_before - now, dt.timedelta(seconds=1)), dt.timedelta(seconds=60))
        return model.Retry(after=wait, reason=CA_NOT_YET_VALID)
    not_before, not_after = certs.lifetime_window(
        now,
        backdate=backdate,
        max_lifetime=min(policy.max_lifetime, dt.timedelta(seconds=spec.max_expiration_seconds)),
        issuer_not_after=ca.not_after,
    )
    if not_after - not_before < MIN_LIFETIME:
        # The CA expires within the hour: rotation will bring a new one; never fail the pod.
        return model.Retry(after=dt.timedelta(seconds=60), reason=CA_TOO_SHORT)

    return model.Issue(
        model.LeafPlan(
            public_key=key.public_key,
            spiffe_id=(
                f"spiffe://{policy.trust_domain}/ns/{request.namespace}"
                f"/sa/{spec.service_account_name}"
            ),
            dns_names=dns_names,
            not_before=not_before,
            not_after=not_after,
            begin_refresh_at=certs.begin_refresh_at(
                request.uid, not_before, not_after, fraction=refresh_fraction
            ),
        )
    )


def binding_problem(request: PodCertificateRequest, facts: model.Facts) -> model.Deny | None:
    """The NodeRestriction checks, against live state: stops anyone but the pod's own node
    (or a stale request) from obtaining the pod's identity. None when the pod, node and service
    account in `facts` are the ones the request names; else the Deny, whose reason is one of
    `model.BINDING_REASONS`. The controller trusts its watched caches exactly when this finds
    no problem in them (else it reads live): one rule for both, so they cannot drift apart."""
    spec = request.spec
    pod = facts.pod
    pod_ref = f"{request.namespace}/{spec.pod_name}"
    if pod is None:
        return model.Deny(model.POD_NOT_FOUND, f"Pod {pod_ref} does not exist.")
    if pod.uid != spec.pod_uid:
        return model.Deny(
            model.POD_UID_MISMATCH,
            f"Pod {pod_ref} has UID {pod.uid}, not {show(spec.pod_uid)} as the request says; "
            "the pod was replaced, so request again for the new pod.",
        )
    if pod.node_name != spec.node_name:
        return model.Deny(
            model.POD_NOT_ON_NODE,
            f"Pod {pod_ref} runs on node {pod.node_name!r}, not on {spec.node_name!r} "
            "where the request comes from.",
        )
    if pod.deleting or pod.phase in ("Succeeded", "Failed"):
        state = "being deleted" if pod.deleting else f"finished (phase {pod.phase})"
        return model.Deny(
            model.POD_NOT_RUNNABLE, f"Pod {pod_ref} is {state} and gets no new certificates."
        )
    node = facts.node
    if node is None:
        return model.Deny(model.NODE_NOT_FOUND, f"Node {spec.node_name!r} does not exist.")
    if node.uid != spec.node_uid:
        return model.Deny(
            model.NODE_UID_MISMATCH,
            f"Node {node.name!r} has UID {node.uid}, not {show(spec.node_uid)} as the request "
            "says; the node was re-registered.",
        )
    if pod.service_account_name != spec.service_account_name:
        return model.Deny(
            model.SERVICE_ACCOUNT_MISMATCH,
            f"Pod {pod_ref} runs as service account {pod.service_account_name!r}, not "
            f"{show(spec.service_account_name)} as the request says.",
        )
    account = facts.service_account
    sa_ref = f"{request.namespace}/{spec.service_account_name}"
    if account is None:
        return model.Deny(
            model.SERVICE_ACCOUNT_MISMATCH, f"Service account {sa_ref} does not exist."
        )
    if account.uid != spec.service_account_uid:
        return model.Deny(
            model.SERVICE_ACCOUNT_MISMATCH,
            f"Service account {sa_ref} has UID {account.uid}, not "
            f"{show(spec.service_account_uid)} as the request says; it was re-created.",
        )
    return None


def _allowed(policy: SignerPolicy) -> str:
    return ", ".join(k for k in KEY_TYPES if k in policy.key_types)


def _suggest(policy: SignerPolicy) -> str:
    return next((k for k in BY_PREFERENCE if k in policy.key_types), "ECDSAP256")


# --- what the request asks for -------------------------------------------------------------------


class CSRError(Exception):
    """The request's key cannot be used; `reason` is the Denied reason to report."""

    def __init__(self, reason: model.DenyReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


_KEY_FAULTS: Final[Mapping[keys.KeyFault, model.DenyReason]] = {
    "malformed": model.INVALID_REQUEST,
    "unsupported": model.UNSUPPORTED_KEY_TYPE,
    "unproven": model.INVALID_PROOF_OF_POSSESSION,
}


def parse_public_key(request: PodCertificateRequest) -> keys.RequestedKey:
    """The subject key of `request`, from its stub CSR or from its PKIX public key whose proof
    of possession verifies over the request's pod UID. Raises CSRError, and nothing else,
    whatever the bytes are."""
    spec = request.spec
    try:
        form = subject_key(
            spec.stub_pkcs10_request or b"",
            spec.pkix_public_key or b"",
            spec.proof_of_possession or b"",
        )
        if isinstance(form, ProvenKey):
            return keys.read_proven_key(
                form.pkix_public_key, form.proof_of_possession, spec.pod_uid
            )
        return keys.read_csr_key(form.der)
    except RequestError as err:
        raise CSRError(model.INVALID_REQUEST, f"{err.field} {err.problem}.") from None
    except keys.UnusableKey as err:
        raise CSRError(_KEY_FAULTS[err.fault], err.message) from None


DNS_NAMES_ANNOTATION: Final = "podcert.dev/dns-names"
KNOWN_ANNOTATIONS: Final = frozenset({DNS_NAMES_ANNOTATION})
MAX_REQUESTED_DNS_NAMES: Final = 100


@dataclass(frozen=True)
class RequestedNames:
    """What the request's annotations ask for: syntax checked, entitlement not yet."""

    dns_names: tuple[str, ...] = ()


def parse_annotations(
    annotations: Mapping[str, str], policy: SignerPolicy
) -> RequestedNames | model.Deny:
    """The names a request's unverifiedUserAnnotations ask for, or the Deny they deserve."""
    unknown = sorted(key for key in annotations if key not in KNOWN_ANNOTATIONS)
    if unknown:
        others = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        return model.Deny(
            model.UNKNOWN_ANNOTATION,
            f"Annotation {show(unknown[0])}{others} is not understood by signer {policy.name}; "
            f"the only supported annotation is {DNS_NAMES_ANNOTATION}.",
        )
    value = annotations.get(DNS_NAMES_ANNOTATION)
    if value is None:
        return RequestedNames()
    entries = [entry.strip() for entry in value.split(",")]
    if len(entries) > MAX_REQUESTED_DNS_NAMES:
        return model.Deny(
            model.INVALID_ANNOTATION,
            f"Annotation {DNS_NAMES_ANNOTATION} lists {len(entries)} names; "
            f"at most {MAX_REQUESTED_DNS_NAMES} are allowed.",
        )
    if "" in entries:
        return model.Deny(
            model.INVALID_ANNOTATION,
            f"Annotation {DNS_NAMES_ANNOTATION} has an empty entry in {show(value)}; "
            "give a comma-separated list of DNS names.",
        )
    for entry in entries:
        if not is_dns_name(entry):
            return model.Deny(
                model.INVALID_ANNOTATION,
                f"Annotation {DNS_NAMES_ANNOTATION} holds {show(entry)}, which is not a valid "
                "DNS name (lowercase RFC 1123 labels joined by dots, no wildcards).",
            )
    if not policy.dns.allow_requested:
        return model.Deny(
            model.DNS_NAME_NOT_ALLOWED,
            f"Signer {policy.name} does not issue requested DNS names; remove the "
            f"{DNS_NAMES_ANNOTATION} annotation or ask for dnsNames.allowRequested in its policy.",
        )
    return RequestedNames(dns_names=tuple(dict.fromkeys(entries)))  # de-duplicated, in order
