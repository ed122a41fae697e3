"""One reading of a PodCertificateRequest, for the signer, the node shim, the audit and the tests.

`parse_request` turns the API's JSON into a frozen `PodCertificateRequest` (metadata, spec and
status as typed values) or raises `RequestError` naming the field; whatever the object holds,
nothing else escapes. Fields the API server always sets read as "" when absent: whether a
missing one matters is the reader's call (`missing_field` says which one is missing; the signer
denies such a request, the audit joins what it has). `outcome` is the tolerant one-liner for
caches and filters: it never raises, and reads a status of the wrong shape as "not settled".

The node proves it holds the subject key in one of two forms (`KeyForm`): a stub PKCS#10 request
(v1; v1beta1 from 1.36) or the key with a proof of possession (v1beta1 only; the only form 1.35
has). `subject_key` reads which one a request carries, under the API server's "exactly one"
rule; `key_fields` writes one. Pure: no I/O, no clock.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, cast, get_args

from cryptography import x509

from podcert.api import keys
from podcert.api.lifetimes import DEFAULT_MAX_EXPIRATION_SECONDS
from podcert.api.times import TimeFieldError, parse_time, require_time

Outcome = Literal["Issued", "Denied", "Failed"]
"""The condition a settled request carries (exactly one, and terminal). The one such type: the
signer writes it, and the node shim, the audit and the tests read it."""
OUTCOMES: Final[frozenset[str]] = frozenset(get_args(Outcome))


class RequestError(ValueError):
    """A PodCertificateRequest field has the wrong type or cannot be decoded; `field` is its
    path (`spec.podUID`, `status.conditions[0]`). Messages never quote key or CSR bytes."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class Spec:
    """spec: immutable after creation."""

    signer_name: str = ""
    pod_name: str = ""
    pod_uid: str = ""
    service_account_name: str = ""
    service_account_uid: str = ""
    node_name: str = ""
    node_uid: str = ""
    max_expiration_seconds: int = DEFAULT_MAX_EXPIRATION_SECONDS
    # DER PKCS#10 made by the node with the subject key (v1, and v1beta1 from 1.36); empty when
    # absent, and then a v1beta1 object carries the key as DER SubjectPublicKeyInfo instead.
    stub_pkcs10_request: bytes = field(default=b"", repr=False)
    pkix_public_key: bytes = field(default=b"", repr=False)
    proof_of_possession: bytes = field(default=b"", repr=False)
    unverified_user_annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Status:
    """status: written by the signer; immutable once a terminal condition is set."""

    condition: Outcome | None = None  # the Issued/Denied/Failed condition with status "True"
    reason: str = ""
    message: str = ""
    certificate_chain: str = field(default="", repr=False)  # PEM, leaf first
    not_before: dt.datetime | None = None
    not_after: dt.datetime | None = None
    begin_refresh_at: dt.datetime | None = None
    issued_at: dt.datetime | None = None  # the Issued condition's lastTransitionTime

    @property
    def outcome(self) -> Outcome | None:
        """The terminal condition; a chain without one counts as Issued (it is immutable once
        written, so the request is settled either way)."""
        if self.condition is None and self.certificate_chain:
            return "Issued"
        return self.condition


@dataclass(frozen=True)
class PodCertificateRequest:
    namespace: str
    name: str
    uid: str
    created: dt.datetime | None  # metadata.creationTimestamp; None when unreadable
    spec: Spec
    status: Status


def parse_request(obj: object) -> PodCertificateRequest:
    """The request in an API object. Raises RequestError naming the first bad field."""
    if not isinstance(obj, Mapping):
        raise RequestError("object", "expected an object")
    meta = _object(obj.get("metadata"), "metadata", required=True)
    return PodCertificateRequest(
        namespace=_string(meta, "namespace", "metadata"),
        name=_string(meta, "name", "metadata"),
        uid=_string(meta, "uid", "metadata"),
        # Set by the API server; an unreadable one is "unknown", never a reason to refuse.
        created=parse_time(meta.get("creationTimestamp")),
        spec=_spec(_object(obj.get("spec"), "spec", required=True)),
        status=parse_status(obj.get("status")),
    )


def parse_status(status: object) -> Status:
    """A request's `status` (absent: not settled). Raises RequestError naming the field."""
    body = _object(status, "status", required=False)
    conditions = body.get("conditions")
    if conditions is None:
        conditions = []
    if not isinstance(conditions, list):
        raise RequestError("status.conditions", f"expected a list, got {_kind(conditions)}")
    terminal: tuple[Outcome, str, str, dt.datetime | None] | None = None
    for index, raw in enumerate(conditions):
        where = f"status.conditions[{index}]"
        cond = _object(raw, where, required=True)
        kind, state = _string(cond, "type", where), _string(cond, "status", where)
        reason, message = _string(cond, "reason", where), _string(cond, "message", where)
        changed = _time(cond, "lastTransitionTime", where)
        if terminal is None and state == "True" and kind in OUTCOMES:
            terminal = (cast(Outcome, kind), reason, message, changed)
    condition, reason, message, changed = terminal or (None, "", "", None)
    return Status(
        condition=condition,
        reason=reason,
        message=message,
        certificate_chain=_string(body, "certificateChain", "status"),
        not_before=_time(body, "notBefore", "status"),
        not_after=_time(body, "notAfter", "status"),
        begin_refresh_at=_time(body, "beginRefreshAt", "status"),
        issued_at=changed if condition == "Issued" else None,
    )


# --- the subject key's two forms ---------------------------------------------------------------

KeyForm = Literal["stubPKCS10Request", "proofOfPossession"]
STUB_CSR: Final[KeyForm] = "stubPKCS10Request"
PROOF_OF_POSSESSION: Final[KeyForm] = "proofOfPossession"


@dataclass(frozen=True)
class StubCSR:
    """The key in a DER PKCS#10 request it signed (empty subject)."""

    der: bytes = field(repr=False)


@dataclass(frozen=True)
class ProvenKey:
    """The key as DER SubjectPublicKeyInfo, with its signature over the pod UID
    (`keys.proof_verifies` checks it)."""

    pkix_public_key: bytes = field(repr=False)
    proof_of_possession: bytes = field(repr=False)


def subject_key(stub_csr: bytes, pkix_public_key: bytes, proof: bytes) -> StubCSR | ProvenKey:
    """Which form the spec's key fields (decoded) take: exactly one of stubPKCS10Request or
    (pkixPublicKey and proofOfPossession), as the API server requires from 1.36 (1.35 has only
    the second). Raises RequestError naming the field that breaks the rule."""
    if stub_csr:
        for name, value in (("pkixPublicKey", pkix_public_key), ("proofOfPossession", proof)):
            if value:
                raise RequestError(f"spec.{name}", "must be empty when stubPKCS10Request is set")
        return StubCSR(stub_csr)
    if pkix_public_key and proof:
        return ProvenKey(pkix_public_key, proof)
    if pkix_public_key:
        raise RequestError("spec.proofOfPossession", "is required with pkixPublicKey")
    if proof:
        raise RequestError("spec.pkixPublicKey", "is required with proofOfPossession")
    raise RequestError(
        "spec.stubPKCS10Request", "is required (or pkixPublicKey with proofOfPossession)"
    )


_KEY_FIELDS: Final = ("stubPKCS10Request", "pkixPublicKey", "proofOfPossession")


def holds_key(pcr: Mapping[str, object]) -> bool:
    """Whether the request's spec carries any of its key fields (tolerant, never raises). A view
    without one is either a broken request or, at v1 on a 1.37 server, a 1.35 node's request
    whose pkixPublicKey that version cannot show (`podcert.api.versions.key_fallback`)."""
    spec = pcr.get("spec")
    if not isinstance(spec, Mapping):
        return False
    # Each issuance asks this once: the common answer (a stub CSR) in the first look.
    stub, key, proof = _KEY_FIELDS
    return bool(spec.get(stub) or spec.get(key) or spec.get(proof))


def key_fields(form: KeyForm, key: keys.PrivateKey, pod_uid: str) -> dict[str, str]:
    """The spec fields (base64, as JSON carries bytes) that carry `key` in `form`, for a request
    about the pod with UID `pod_uid`. The private key itself is never among them."""
    if form == STUB_CSR:
        return {"stubPKCS10Request": _b64(keys.stub_csr(key))}
    return {
        "pkixPublicKey": _b64(keys.public_der(key)),
        "proofOfPossession": _b64(keys.sign_proof(key, pod_uid)),
    }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def missing_field(request: PodCertificateRequest) -> str | None:
    """The path of the first field the API server always sets that `request` lacks, or None."""
    for name in ("namespace", "name", "uid"):
        if not getattr(request, name):
            return f"metadata.{name}"
    for api_name, attr in _SPEC_FIELDS.items():
        if not getattr(request.spec, attr):
            return f"spec.{api_name}"
    return None


def certificates(status: Status) -> tuple[x509.Certificate, ...]:
    """The status's certificate chain, leaf first. Raises RequestError when there is none or
    it does not parse (the API server checks it on write; a broken one is a broken status)."""
    if not status.certificate_chain:
        raise RequestError("status.certificateChain", "is empty")
    try:
        chain = x509.load_pem_x509_certificates(status.certificate_chain.encode())
    except (ValueError, UnicodeEncodeError) as exc:
        raise RequestError(
            "status.certificateChain", f"not a PEM certificate chain ({exc})"
        ) from None
    return tuple(chain)


def terminal_condition(status: object) -> tuple[Outcome, str, str] | None:
    """(type, reason, message) of the status's Issued/Denied/Failed condition, if any. Tolerant:
    entries of the wrong shape are skipped, never raised about."""
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for cond in conditions if isinstance(conditions, list) else ():
        if not isinstance(cond, Mapping) or cond.get("status") != "True":
            continue
        kind = cond.get("type")
        if kind in OUTCOMES:
            reason, message = cond.get("reason") or "", cond.get("message") or ""
            return cast(Outcome, kind), str(reason), str(message)
    return None


def outcome(pcr: Mapping[str, object]) -> Outcome | None:
    """ "Issued", "Denied" or "Failed" when the request is settled, else None; never raises.
    A chain without a condition counts as Issued, as in `Status.outcome`."""
    status = pcr.get("status")
    condition = terminal_condition(status)
    if condition is not None:
        return condition[0]
    if isinstance(status, Mapping) and status.get("certificateChain"):
        return "Issued"
    return None


# --- fields -----------------------------------------------------------------------------------

# The spec's string fields (API name -> attribute); the API server requires every one of them.
_SPEC_FIELDS: Final[Mapping[str, str]] = {
    "signerName": "signer_name",
    "podName": "pod_name",
    "podUID": "pod_uid",
    "serviceAccountName": "service_account_name",
    "serviceAccountUID": "service_account_uid",
    "nodeName": "node_name",
    "nodeUID": "node_uid",
}


def _spec(spec: Mapping[str, object]) -> Spec:
    strings = {attr: _string(spec, api_name, "spec") for api_name, attr in _SPEC_FIELDS.items()}
    max_expiration = spec.get("maxExpirationSeconds")
    if max_expiration is None:
        max_expiration = DEFAULT_MAX_EXPIRATION_SECONDS
    if not isinstance(max_expiration, int) or isinstance(max_expiration, bool):
        raise RequestError(
            "spec.maxExpirationSeconds", f"expected an integer, got {_kind(max_expiration)}"
        )
    annotations = spec.get("unverifiedUserAnnotations") or {}
    if not isinstance(annotations, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in annotations.items()
    ):
        raise RequestError("spec.unverifiedUserAnnotations", "expected a map of strings")
    return Spec(
        **strings,
        max_expiration_seconds=max_expiration,
        stub_pkcs10_request=_base64(spec, "stubPKCS10Request"),
        pkix_public_key=_base64(spec, "pkixPublicKey"),
        proof_of_possession=_base64(spec, "proofOfPossession"),
        unverified_user_annotations=dict(annotations),
    )


def _object(value: object, where: str, *, required: bool) -> Mapping[str, object]:
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        raise RequestError(where, f"expected an object, got {_kind(value)}")
    return value


def _string(obj: Mapping[str, object], key: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RequestError(f"{where}.{key}", f"expected a string, got {_kind(value)}")
    return value


def _base64(spec: Mapping[str, object], key: str) -> bytes:
    value = spec.get(key)
    if value in (None, ""):
        return b""
    if not isinstance(value, str):
        raise RequestError(f"spec.{key}", "expected base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError(f"spec.{key}", "not valid base64") from None


def _time(obj: Mapping[str, object], key: str, where: str) -> dt.datetime | None:
    value = obj.get(key)
    if value in (None, ""):
        return None
    try:
        return require_time(value, f"{where}.{key}")
    except TimeFieldError as exc:
        raise RequestError(exc.field, exc.problem) from None


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__
