"""What the admission webhook answers, decided without I/O: is a body an AdmissionReview we answer
at all, and is the PodCertificateRequest in it admitted.

NodeRestriction binds nodes only; any other user with RBAC `create` on podcertificaterequests could
ask for any pod's identity, and the signer cannot see who created a request. The API server can:
it tells the webhook the creator. Requests for other signer names are always allowed (and the
registration's matchConditions keep them from reaching us at all).

The webhook port is reachable by more than the API server unless a NetworkPolicy says otherwise,
and nothing proves a caller is the API server: `userInfo` is whatever the body says. So the
answer is written for an unauthenticated caller:

1. Only a well-formed AdmissionReview about a PodCertificateRequest, within size and nesting
   bounds, gets a verdict; anything else is a typed `MalformedReview` (HTTP 400, or 413 when too
   big). Nesting is measured before parsing, so no input reaches the parser's recursion limit.
2. A verdict says allowed or denied and why, in terms of what the caller sent. Every failure of
   the pod/node/service-account binding (pod missing, UID differs, on another node, finishing,
   node missing, ...) is one message naming only the caller's own fields: whether a pod exists,
   and its UIDs, stay unknown to whoever does not already know all three UIDs. The precise reason
   goes to the signer's log. A final check drops any message holding a UID-shaped string the
   caller did not send.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from podcert.api.requests import PodCertificateRequest, invalid, read_request
from podcert.errors import show
from signer import model
from signer.issue.decide import decide
from signer.policy import Policy

# The AdmissionReview of one PodCertificateRequest is a few KiB: the stub CSR (at most ~1.3 KiB
# for RSA 4096), names and UIDs, managedFields. Its only large parts are the two annotation maps,
# which the API server caps at 256 KiB each, so 1 MiB holds any request with both full of plain
# text. etcd stores at most ~1.5 MiB per object, so a review above 1 MiB can only be a contrived
# one (annotations of characters JSON escapes six-fold) or not from the API server at all; being
# refused it is a failed webhook call, which `failurePolicy: Fail` turns into a refusal.
MAX_BODY_BYTES: Final = 1024 * 1024
# The deepest legitimate nesting is about 12 (managedFields' fieldsV1 under request.object).
MAX_DEPTH: Final = 32
# Kubernetes UIDs are 36 characters; the response echoes this one, so it is bounded.
MAX_UID_LENGTH: Final = 128

REVIEW_API_VERSION: Final = "admission.k8s.io/v1"
GROUP: Final = "certificates.k8s.io"
KIND: Final = "PodCertificateRequest"
RESOURCE: Final = "podcertificaterequests"
OPERATIONS: Final = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})

# Malformed-input reasons (the 400 body's `reason`).
ReviewProblem = Literal[
    "TooLarge",
    "TooSlow",
    "TooDeep",
    "NotJSON",
    "NotAdmissionReview",
    "MissingField",
    "WrongType",
    "WrongResource",
]
TOO_LARGE: Final[ReviewProblem] = "TooLarge"
TOO_SLOW: Final[ReviewProblem] = "TooSlow"
TOO_DEEP: Final[ReviewProblem] = "TooDeep"
NOT_JSON: Final[ReviewProblem] = "NotJSON"
NOT_ADMISSION_REVIEW: Final[ReviewProblem] = "NotAdmissionReview"
MISSING_FIELD: Final[ReviewProblem] = "MissingField"
WRONG_TYPE: Final[ReviewProblem] = "WrongType"
WRONG_RESOURCE: Final[ReviewProblem] = "WrongResource"

# A verdict's reason: the signer's own Denied reasons, one reason for every binding failure
# (see 2. above), the creator check, or none (allowed, or the check itself broke).
VerdictReason = Literal[model.DenyReason, "PodBindingMismatch", "CreatorNotNode", ""]
BINDING_MISMATCH: Final[VerdictReason] = "PodBindingMismatch"
CREATOR_NOT_NODE: Final[VerdictReason] = "CreatorNotNode"
# No facts at all: the pre-check that turns away malformed requests before any API read.
_NO_FACTS: Final = model.Facts(pod=None, node=None, service_account=None)
_UID_SHAPED: Final = re.compile(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
# A JSON string, or the unterminated rest of one: matching an unterminated string to the end
# keeps the substitution linear (a failed match per quote would make it quadratic).
_JSON_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")


class MalformedReview(Exception):
    """A body the webhook gives no verdict on: `reason` and `message` are the 400 (or 413) body.
    Messages are fixed text: nothing of the caller's input is echoed or logged."""

    def __init__(self, reason: ReviewProblem, message: str, status: int = 400) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason, self.message, self.status = reason, message, status


@dataclass(frozen=True)
class Review:
    """The fields of a well-formed AdmissionReview request the verdict depends on."""

    uid: str
    operation: str
    username: str
    object: Mapping[str, Any] = field(repr=False)
    # The version the request was made at, when the API server converted the object to
    # another one for us (matchPolicy Equivalent, a rule not naming that version); else "".
    converted_from: str = ""


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    message: str = ""  # what the caller is told
    reason: VerdictReason = ""
    detail: str = ""  # what the signer's log says (may hold facts the caller is not told)


def too_deep(body: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether JSON text nests arrays and objects deeper than `limit`, found without parsing (and
    so without recursion): brackets inside strings do not count."""
    skeleton = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if skeleton.count(b"[") + skeleton.count(b"{") <= limit:
        return False
    depth = 0
    for byte in skeleton:
        if byte in b"[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def parse_review(body: bytes) -> Review:
    """The review in `body`, or MalformedReview saying what is wrong with it."""
    if len(body) > MAX_BODY_BYTES:
        raise MalformedReview(TOO_LARGE, f"the body exceeds {MAX_BODY_BYTES} bytes", 413)
    if too_deep(body):
        raise MalformedReview(TOO_DEEP, f"JSON nested deeper than {MAX_DEPTH} levels")
    try:
        review = json.loads(body)
    except RecursionError:  # not reached after too_deep; kept so no input can raise it
        raise MalformedReview(TOO_DEEP, f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:  # includes invalid UTF-8 and over-long integers
        raise MalformedReview(NOT_JSON, "the body is not JSON") from None
    if not isinstance(review, dict):
        raise MalformedReview(NOT_ADMISSION_REVIEW, "the body is not a JSON object")
    if review.get("apiVersion") != REVIEW_API_VERSION or review.get("kind") != "AdmissionReview":
        raise MalformedReview(
            NOT_ADMISSION_REVIEW, f"expected apiVersion {REVIEW_API_VERSION}, kind AdmissionReview"
        )
    request = _field(review, "request", dict)
    uid = _field(request, "uid", str, "request")
    if not uid or len(uid) > MAX_UID_LENGTH:
        raise MalformedReview(
            WRONG_TYPE, f"request.uid must be 1 to {MAX_UID_LENGTH} characters long"
        )
    kind = _field(request, "kind", dict, "request")
    resource = _field(request, "resource", dict, "request")
    if (
        kind.get("group") != GROUP
        or kind.get("kind") != KIND
        or not isinstance(kind.get("version"), str)
        or resource.get("group") != GROUP
        or resource.get("resource") != RESOURCE
        or request.get("subResource") not in (None, "")
    ):
        raise MalformedReview(
            WRONG_RESOURCE, f"this webhook reviews {GROUP} {KIND} ({RESOURCE}) only"
        )
    operation = _field(request, "operation", str, "request")
    if operation not in OPERATIONS:
        raise MalformedReview(WRONG_TYPE, f"request.operation must be one of {sorted(OPERATIONS)}")
    user_info = _field(request, "userInfo", dict, "request")
    username = _field(user_info, "username", str, "request.userInfo")
    obj = request.get("object")
    if operation == "CREATE" or obj is not None:
        obj = _field(request, "object", dict, "request")
    made = request.get("requestKind")
    made_at = made.get("version") if isinstance(made, dict) else None
    converted = made_at if isinstance(made_at, str) and made_at != kind["version"] else ""
    return Review(uid, operation, username, obj or {}, converted_from=converted[:MAX_UID_LENGTH])


def _field(parent: Mapping[str, Any], name: str, kind: type, where: str = "") -> Any:
    path = f"{where}.{name}" if where else name
    value = parent.get(name)
    if value is None:
        raise MalformedReview(MISSING_FIELD, f"{path} is missing")
    if not isinstance(value, kind):
        expected = "an object" if kind is dict else "a string"
        raise MalformedReview(WRONG_TYPE, f"{path} must be {expected}")
    return value


def admit(
    username: str,
    operation: str,
    pcr: Mapping[str, Any],
    served: Sequence[str],
    facts: Callable[[PodCertificateRequest], model.Facts],
    policy: Policy,
    now: dt.datetime,
    *,
    converted_from: str = "",
) -> Verdict:
    """The answer for one admission request. `facts` is only called for our own signer names,
    and only for requests that are well-formed (an unauthenticated caller cannot make the
    signer read the API with names the checks would refuse anyway). `converted_from`: the
    version the request was made at, when the object came converted (`Review`)."""
    verdict = _verdict(username, operation, pcr, served, facts, policy, now, converted_from)
    if verdict.allowed or not _leaks(verdict.message, pcr):
        return verdict
    return Verdict(
        False,
        f"{verdict.reason}: the request was refused (the signer's log says why)",
        verdict.reason,
        verdict.detail or verdict.message,
    )


def _verdict(
    username: str,
    operation: str,
    pcr: Mapping[str, Any],
    served: Sequence[str],
    facts: Callable[[PodCertificateRequest], model.Facts],
    policy: Policy,
    now: dt.datetime,
    converted_from: str,
) -> Verdict:
    # Read once, leniently: a request of the wrong shape is refused by name below, after the
    # checks that need only its signer and node names.
    meta = pcr.get("metadata")
    meta = dict(meta) if isinstance(meta, Mapping) else {}
    meta.setdefault("name", meta.get("generateName", "") or "pending")
    meta.setdefault("uid", "pending")
    read = read_request({**pcr, "metadata": meta})
    spec = read.spec
    if operation != "CREATE" or spec.signer_name not in served:
        return Verdict(True)
    if converted_from and not spec.holds_key:
        # A 1.35 node's request made at v1beta1, sent to us as v1, which drops its key: the
        # registration must name every version (apiVersions ["*"], as shipped).
        return Verdict(False, _KEY_DROPPED.format(show(converted_from)), model.KEY_NOT_SERVED)
    if username != f"system:node:{spec.node_name}":
        return Verdict(
            False,
            f"only the node the pod runs on may request its certificate: "
            f"spec.nodeName is {show(spec.node_name)} but the request comes from {show(username)}",
            CREATOR_NOT_NODE,
        )
    problem = invalid(read)
    if problem is not None:
        return Verdict(False, f"malformed request: {problem}", model.INVALID_REQUEST)
    assert isinstance(read, PodCertificateRequest)  # `invalid` says why any other is not
    request = read
    signer_policy = policy.for_signer(request.spec.signer_name)
    # The same checks the signer makes at issuance, minus the CA: fail fast instead of a
    # request that can only end Denied. First without facts, which stops at the request's own
    # faults (spec, key) before any API read.
    decision = decide(request, _NO_FACTS, signer_policy, now)
    if not isinstance(decision, model.Deny) or decision.reason == model.POD_NOT_FOUND:
        decision = decide(request, facts(request), signer_policy, now)
    if not isinstance(decision, model.Deny):
        return Verdict(True)
    detail = f"{decision.reason}: {decision.message}"
    if decision.reason in model.BINDING_REASONS:
        return Verdict(False, _binding_message(request), BINDING_MISMATCH, detail)
    return Verdict(False, detail, decision.reason, detail)


_KEY_DROPPED: Final = (
    "KeyNotServed: the API server sent this webhook the request converted from {} to a version "
    "that cannot hold its spec.pkixPublicKey and spec.proofOfPossession, so its key cannot be "
    "checked: register the webhook for every version of podcertificaterequests "
    '(rules[].apiVersions: ["*"], as manifests/signer/admission-webhook.yaml does)'
)


def _binding_message(request: PodCertificateRequest) -> str:
    """The same words whichever part of the binding failed, built from the request alone (its
    names are Kubernetes names: `invalid` refused the request otherwise)."""
    spec = request.spec
    return (
        f"{BINDING_MISMATCH}: no running pod {request.namespace}/{spec.pod_name} on node "
        f"{spec.node_name} as service account {spec.service_account_name} matches the "
        "podUID, nodeUID and serviceAccountUID of the request (for a pod just created or "
        "replaced, request again; the signer's log says which part differs)"
    )


def _leaks(message: str, pcr: Mapping[str, Any]) -> bool:
    """Whether `message` holds a UID-shaped string that is nowhere in what the caller sent."""
    found = _UID_SHAPED.findall(message)
    if not found:
        return False
    sent = json.dumps(pcr)
    return any(uid not in sent for uid in found)


def review_response(uid: str, verdict: Verdict) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": verdict.message}
    return {"apiVersion": REVIEW_API_VERSION, "kind": "AdmissionReview", "response": response}
