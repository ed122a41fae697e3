"""What a request asks for beyond its identity: the unverifiedUserAnnotations the signer reads.

Only `podcert.dev/dns-names`, a comma-separated list of DNS names; whether the pod is entitled to
them is decided against the Services that select it (`signer.issue.decide`), and whether they are
honoured at all is policy (`dnsNames.allowRequested`). Unknown keys are denied rather than
ignored: a key we do not understand may be a request the user believes is honoured. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from podcert.api.names import is_dns_name
from podcert.errors import show
from signer import model
from signer.policy import SignerPolicy

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
    """The names a request's unverifiedUserAnnotations ask for, or the Deny they deserve.

    Unknown keys are denied rather than ignored: a key we do not understand may be a request
    the user believes is honoured.
    """
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
