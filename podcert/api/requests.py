"""One PodCertificateRequest, typed, for the signer, the node shim, the audit and the tests.

A msgspec Struct of the API object under its wire names: list pages, watch events and reads
decode straight into it (`decode_request`, `podcert.client.rest.REQUESTS`), dicts convert into
it (`parse_request`). An object of another shape never raises out of the wire: it is
`Unreadable`, holding what of it reads as strings and the `RequestError` naming its first bad
field, so the signer denies it by name and goes on with the page. Whether a request can be
decided on at all is `invalid`'s call. `outcome` reads a dict's status tolerantly, never raising.

The node proves it holds the subject key in one of two forms (`KeyForm`): a stub PKCS#10 request
(v1; v1beta1 from 1.36) or the key with a proof of possession (v1beta1 only, 1.35's one form);
`subject_key` reads which one a request carries ("exactly one"), `key_fields` writes one. The
status a signer PUTs is built by `signer.issue.settle`. Pure: no I/O, no clock.
"""

from __future__ import annotations

import base64
import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal, cast, get_args

import msgspec
from cryptography import x509

from podcert.api import keys, validation
from podcert.api.validation import DEFAULT_MAX_EXPIRATION_SECONDS, DNS_LABEL, DNS_NAME
from podcert.errors import show

Outcome = Literal["Issued", "Denied", "Failed"]
"""The condition a settled request carries (exactly one, terminal): the signer writes it."""
OUTCOMES: Final[frozenset[str]] = frozenset(get_args(Outcome))


class RequestError(ValueError):
    """A PodCertificateRequest field has the wrong type or cannot be decoded; `field` is its
    path (`spec.podUID`, `status.conditions[0]`). Messages never quote key or CSR bytes."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


# Times the API server writes: RFC 3339 with a zone (a naive datetime compares with nothing).
Time = Annotated[dt.datetime, msgspec.Meta(tz=True)]


class Metadata(msgspec.Struct, frozen=True, gc=False):
    """metadata: the request's key, its version (the status write's guard), its generation (the
    conditions' observedGeneration) and its creation (the latency histogram). The rest is
    skipped unread: managedFields alone are as large as the spec."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = msgspec.field(default="", name="resourceVersion")
    generation: int | None = None
    # Null where the object is not stored yet (Go's zero time, as an admission review may hold).
    creation_timestamp: Time | None = msgspec.field(default=None, name="creationTimestamp")


class Spec(msgspec.Struct, frozen=True, gc=False):
    """spec: immutable after creation. Bytes fields are base64 on the wire, decoded here."""

    signer_name: str = msgspec.field(default="", name="signerName")
    pod_name: str = msgspec.field(default="", name="podName")
    pod_uid: str = msgspec.field(default="", name="podUID")
    service_account_name: str = msgspec.field(default="", name="serviceAccountName")
    service_account_uid: str = msgspec.field(default="", name="serviceAccountUID")
    node_name: str = msgspec.field(default="", name="nodeName")
    node_uid: str = msgspec.field(default="", name="nodeUID")
    max_expiration_seconds: int = msgspec.field(
        default=DEFAULT_MAX_EXPIRATION_SECONDS, name="maxExpirationSeconds"
    )
    # The key's two forms (`subject_key`), DER. v1beta1 writes the form it does not use as null,
    # so None is as common as b"": typed so, these objects decode in one pass like the others.
    stub_pkcs10_request: bytes | None = msgspec.field(default=None, name="stubPKCS10Request")
    pkix_public_key: bytes | None = msgspec.field(default=None, name="pkixPublicKey")
    proof_of_possession: bytes | None = msgspec.field(default=None, name="proofOfPossession")
    unverified_user_annotations: dict[str, str] | None = msgspec.field(
        default=None, name="unverifiedUserAnnotations"
    )

    @property
    def holds_key(self) -> bool:
        """Whether any of the key fields is set. A view without one is either a broken request
        or, at v1 on a 1.37 server, a 1.35 node's request whose pkixPublicKey that version
        cannot show (`podcert.api.versions.key_fallback`)."""
        return bool(self.stub_pkcs10_request or self.pkix_public_key or self.proof_of_possession)


class Condition(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""
    last_transition_time: Time | None = msgspec.field(default=None, name="lastTransitionTime")
    observed_generation: int | None = msgspec.field(default=None, name="observedGeneration")


class Status(msgspec.Struct, frozen=True, gc=False, omit_defaults=True):
    """status: written by the signer (`signer.issue.settle` builds it, msgspec encodes it, unset
    fields left out); immutable once a terminal condition is set."""

    conditions: tuple[Condition, ...] = ()
    certificate_chain: str = msgspec.field(default="", name="certificateChain")  # PEM, leaf first
    not_before: Time | None = msgspec.field(default=None, name="notBefore")
    not_after: Time | None = msgspec.field(default=None, name="notAfter")
    begin_refresh_at: Time | None = msgspec.field(default=None, name="beginRefreshAt")

    @property
    def terminal(self) -> Condition | None:
        """The first Issued/Denied/Failed condition with status "True"."""
        for cond in self.conditions:
            if cond.status == "True" and cond.type in OUTCOMES:
                return cond
        return None

    @property
    def condition(self) -> Outcome | None:
        """The terminal condition's type."""
        terminal = self.terminal
        return cast(Outcome, terminal.type) if terminal is not None else None

    @property
    def outcome(self) -> Outcome | None:
        """The terminal condition; a chain without one counts as Issued (it is immutable once
        written, so the request is settled either way)."""
        condition = self.condition
        if condition is None and self.certificate_chain:
            return "Issued"
        return condition

    @property
    def reason(self) -> str:
        terminal = self.terminal
        return terminal.reason if terminal is not None else ""

    @property
    def message(self) -> str:
        terminal = self.terminal
        return terminal.message if terminal is not None else ""

    @property
    def issued_at(self) -> dt.datetime | None:
        """The Issued condition's lastTransitionTime."""
        terminal = self.terminal
        if terminal is None or terminal.type != "Issued":
            return None
        return terminal.last_transition_time


class PodCertificateRequest(msgspec.Struct, frozen=True, gc=False):
    metadata: Metadata = Metadata()
    spec: Spec = Spec()
    status: Status = Status()

    @property
    def namespace(self) -> str:
        return self.metadata.namespace

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def uid(self) -> str:
        return self.metadata.uid

    @property
    def created(self) -> dt.datetime | None:
        """metadata.creationTimestamp; None where the object is not stored yet."""
        return self.metadata.creation_timestamp


@dataclass(frozen=True)
class Unreadable:
    """An object read where a request was expected that does not decode as one: what of its
    metadata and spec reads as strings (its key, status write and audit entry), whether it is
    settled (as tolerantly as `outcome` reads a dict), and `problem`, its first broken field.
    Never decided on: a pending one is denied InvalidRequest with `problem` as the message."""

    metadata: Metadata
    spec: Spec
    problem: RequestError
    status: Status = field(default_factory=Status)

    @property
    def namespace(self) -> str:
        return self.metadata.namespace

    @property
    def name(self) -> str:
        return self.metadata.name


Read = PodCertificateRequest | Unreadable
"""A request as the signer reads it off the wire."""


def key_of(request: Read) -> tuple[str, str] | None:
    """(namespace, name) of a request as read; None without both (no work item can name it)."""
    meta = request.metadata
    return (meta.namespace, meta.name) if meta.namespace and meta.name else None


# --- decoding ---------------------------------------------------------------------------------

_DECODER: Final = msgspec.json.Decoder(PodCertificateRequest)
_ANY: Final = msgspec.json.Decoder(Any)


def decode_request(data: bytes) -> Read:
    """The request in one object's JSON, or `Unreadable` when it is not one. Raises
    msgspec.DecodeError only for bytes that are not JSON at all (a broken answer)."""
    try:
        return _DECODER.decode(data)
    except msgspec.ValidationError:
        return read_misfit(data)


def read_misfit(data: bytes) -> Read:
    """JSON the typed decoder refused, read without its nulls (`parse_request`), else
    `Unreadable`: `decode_request`'s fallback, and a list page's (`pages.Lenient`)."""
    obj = _ANY.decode(data)
    try:
        return _without_nulls_converted(obj)
    except RequestError as err:
        return unreadable(obj, err)


def parse_request(obj: object) -> PodCertificateRequest:
    """The request in an API object as a dict. Raises RequestError naming the first bad field.

    A field given as null reads as absent, as Go's JSON decoding reads it (the zero value):
    the API server writes a nil slice or time as null where a field has no omitempty, as
    v1beta1's pkixPublicKey in an admission review. Objects without nulls, the common case,
    are converted once."""
    try:
        return msgspec.convert(obj, PodCertificateRequest)
    except msgspec.ValidationError:
        return _without_nulls_converted(obj)


def _without_nulls_converted(obj: object) -> PodCertificateRequest:
    try:
        return msgspec.convert(_without_nulls(obj), PodCertificateRequest)
    except msgspec.ValidationError as err:
        raise _problem(err) from None


def read_request(obj: object) -> Read:
    """`parse_request`, with an object of the wrong shape `Unreadable` instead of raised."""
    try:
        return parse_request(obj)
    except RequestError as err:
        return unreadable(obj, err)


def parse_status(status: object) -> Status:
    """A request's `status` as a dict (absent: not settled). Raises RequestError naming the
    field."""
    if status is None:
        return Status()
    try:
        return msgspec.convert(_status_without_nulls(status), Status)
    except msgspec.ValidationError as err:
        raise _problem(err, "status") from None


def _without_nulls(obj: object) -> object:
    """`obj` with its null members left out where a request's fields are: at its top, in
    metadata, spec and status, and in each condition. Nowhere deeper (no field of a request
    is), so a hostile nesting costs no recursion."""
    if not isinstance(obj, Mapping):
        return obj
    out = _present(obj)
    for part in ("metadata", "spec"):
        if isinstance(out.get(part), Mapping):
            out[part] = _present(out[part])
    if "status" in out:
        out["status"] = _status_without_nulls(out["status"])
    return out


def _status_without_nulls(status: object) -> object:
    if not isinstance(status, Mapping):
        return status
    out = _present(status)
    conditions = out.get("conditions")
    if isinstance(conditions, list):
        out["conditions"] = [_present(c) if isinstance(c, Mapping) else c for c in conditions]
    return out


def _present(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if v is not None}


def unreadable(obj: object, problem: RequestError) -> Unreadable:
    """What of `obj` reads as strings, kept with the problem that made it unreadable."""
    meta = _loose(obj, "metadata")
    spec = _loose(obj, "spec")
    settled = outcome(obj) if isinstance(obj, Mapping) else None
    generation = meta.get("generation")
    return Unreadable(
        metadata=Metadata(
            name=_text(meta, "name"),
            namespace=_text(meta, "namespace"),
            uid=_text(meta, "uid"),
            resource_version=_text(meta, "resourceVersion"),
            generation=generation if type(generation) is int else None,
        ),
        spec=Spec(
            signer_name=_text(spec, "signerName"),
            pod_name=_text(spec, "podName"),
            service_account_name=_text(spec, "serviceAccountName"),
            node_name=_text(spec, "nodeName"),
        ),
        problem=problem,
        status=Status(conditions=(Condition(settled, "True"),)) if settled else Status(),
    )


def _loose(obj: object, name: str) -> Mapping[str, Any]:
    part = obj.get(name) if isinstance(obj, Mapping) else None
    return part if isinstance(part, Mapping) else {}


def _text(obj: Mapping[str, Any], name: str) -> str:
    value = obj.get(name)
    return value if isinstance(value, str) else ""


_AT: Final = re.compile(r"(?s)(.*) - at `\$(.*)`")
_WORDING: Final = (
    (re.compile(r"Expected `(\w+)`, got `(\w+)`"), r"expected \1, got \2"),
    (re.compile(r"Invalid base64 encoded string"), "not valid base64"),
    (re.compile(r"Expected `datetime` with a timezone component"), "expected an RFC 3339 time"),
    (re.compile(r"Invalid RFC3339 encoded datetime"), "expected an RFC 3339 time"),
)


def _problem(err: msgspec.ValidationError, prefix: str = "") -> RequestError:
    """msgspec's "Expected `str`, got `int` - at `$.spec.podUID`" as a RequestError naming
    spec.podUID. msgspec never quotes the value it refused."""
    text = str(err)
    found = _AT.fullmatch(text)
    problem, path = (found[1], found[2].lstrip(".")) if found else (text, "")
    for pattern, wording in _WORDING:
        problem = pattern.sub(wording, problem)
    where = ".".join(part for part in (prefix, path) if part) or "object"
    return RequestError(where, problem)


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


def invalid(request: Read) -> RequestError | None:
    """Why `request` cannot be decided on: it did not decode as a request, it lacks a field the
    API server always sets, or a field holds what the API server would not admit (names reach
    messages, namespace and service account a SPIFFE ID's path). Checked per decision, not per
    decode (most decoded requests are a signer's own writes coming back); the signer denies it
    InvalidRequest with this as the message."""
    if isinstance(request, Unreadable):
        return request.problem
    meta, spec = request.metadata, request.spec
    for name in ("namespace", "name", "uid"):
        if not getattr(meta, name):
            return RequestError(f"metadata.{name}", "expected a non-empty string")
    if DNS_LABEL.fullmatch(meta.namespace) is None:
        return RequestError("metadata.namespace", f"{show(meta.namespace)} {_NOT_A_NAME}")
    for api_name, (attr, rule) in _SPEC_FIELDS.items():
        value = getattr(spec, attr)
        if not value:
            return RequestError(f"spec.{api_name}", "expected a non-empty string")
        if rule is not None and rule.fullmatch(value) is None:
            return RequestError(f"spec.{api_name}", f"{show(value)} {_NOT_A_NAME}")
    if (seconds := spec.max_expiration_seconds) not in _LIFETIMES:
        return RequestError("spec.maxExpirationSeconds", f"{seconds} is not in {_LIFETIMES_SHOWN}")
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


def _terminal(status: object) -> tuple[Outcome, str, str] | None:
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
    condition = _terminal(status)
    if condition is not None:
        return condition[0]
    if isinstance(status, Mapping) and status.get("certificateChain"):
        return "Issued"
    return None


# --- fields -----------------------------------------------------------------------------------

_LIFETIMES: Final = range(
    validation.MIN_MAX_EXPIRATION_SECONDS, validation.MAX_MAX_EXPIRATION_SECONDS + 1
)
_LIFETIMES_SHOWN: Final = f"[{_LIFETIMES.start}, {_LIFETIMES.stop - 1}]"
_NOT_A_NAME: Final = "is not a lowercase RFC 1123 name"
# The spec's string fields (API name -> attribute, and the rule a name must follow); the API
# server requires every one of them.
_SPEC_FIELDS: Final[Mapping[str, tuple[str, re.Pattern[str] | None]]] = {
    "signerName": ("signer_name", None),
    "podName": ("pod_name", DNS_NAME),
    "podUID": ("pod_uid", None),
    "serviceAccountName": ("service_account_name", DNS_NAME),
    "serviceAccountUID": ("service_account_uid", None),
    "nodeName": ("node_name", DNS_NAME),
    "nodeUID": ("node_uid", None),
}
