"""The audit log's checkpoints and the one `verify`: the chain of line hashes, and JWTs signed by
an audit certificate that chain to the signer's trust roots.

See the package's docstring for why an audit certificate is what it is.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

import jwt
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import verification

from podcert.api.times import format_precise
from podcert.auditlog.lines import (
    CHECKPOINT_ALGORITHM,
    FORMAT,
    GENESIS,
    NewerFormatLine,
    _as_bytes,
    _entry_from_fields,
    line_hash,
    parse_line,
)
from podcert.persisted import FormatUnreadable, format_number

# The audit certificate's one extended key usage: "signs podcert audit log checkpoints". A UUID
# OID (ITU-T X.667, arc 2.25), so it is unique without a registry and no other issuer uses it.
AUDIT_SIGNING_EKU: Final = x509.ObjectIdentifier("2.25.46961606790924377956429846569332107455")
# The path of the audit certificate's SPIFFE ID; workload IDs are /ns/<namespace>/sa/<name>.
AUDIT_SPIFFE_PATH: Final = "/podcert/audit"
# How far past the verifier's `now` a checkpoint may be dated (signer and auditor clocks differ).
_MAX_CLOCK_SKEW: Final = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class Verification:
    """What `verify` found. `ok` is false as soon as there is one problem."""

    entries: int = 0
    checkpoints: int = 0
    # Entry lines after the last valid checkpoint: chained, but not yet vouched for by a signature;
    # and the time of the first of them (how long checkpointing has been behind).
    unsigned_tail: int = 0
    unsigned_since: dt.datetime | None = None
    # True when trust roots were given and every checkpoint (at least one) verified against them.
    anchored: bool = False
    # The newest checkpoint that verified: its number (`n` claim), when it was signed, and how many
    # entries precede it (entries 1..covered_entries are vouched for by its signature).
    last_checkpoint: int | None = None
    last_checkpoint_at: dt.datetime | None = None
    covered_entries: int = 0
    # SHA-256 (hex) of the trust roots the good checkpoints' chains lead to: whose log this is.
    anchors: frozenset[str] = frozenset()
    first_broken_line: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class _Checked:
    """One checkpoint's verdict: `problems` (it fails), else `unanchored` (good, but its chain
    does not reach the trust roots), else good: its number and signing time."""

    problems: list[str]
    unanchored: str | None = None
    number: int = 0
    signed_at: dt.datetime | None = None
    anchor: str | None = None  # sha256 hex of the trust root its chain leads to


def _check_checkpoint(
    line_no: int,
    token: object,
    head: str,
    trust_roots: Sequence[x509.Certificate] | None,
    now: dt.datetime,
    since: str,
) -> _Checked:
    """The verdict on the checkpoint on `line_no`, whose preceding line hashes to `head`."""
    where = f"line {line_no}: checkpoint"
    if not isinstance(token, str):
        return _Checked([f"{where} has no JWT"])
    try:
        x5c = jwt.get_unverified_header(token).get("x5c")
        if not isinstance(x5c, list) or not x5c or not all(isinstance(c, str) for c in x5c):
            return _Checked([f"{where} has no x5c certificate chain in its header"])
        chain = [x509.load_der_x509_certificate(base64.b64decode(c, validate=True)) for c in x5c]
    except (jwt.PyJWTError, binascii.Error, ValueError) as err:
        return _Checked([f"{where} has an unreadable header or x5c chain: {err}"])
    try:
        leaf_key = chain[0].public_key()
    except (ValueError, UnsupportedAlgorithm):
        return _Checked([f"{where} x5c leaf holds a key that cannot be decoded"])
    if not isinstance(leaf_key, ec.EllipticCurvePublicKey) or not isinstance(
        leaf_key.curve, ec.SECP256R1
    ):
        return _Checked([f"{where} x5c leaf does not hold an ECDSA P-256 key"])
    not_audit = audit_certificate_problem(chain[0])
    if not_audit is not None:
        # A workload's own key and chain are trusted for TLS, never for vouching for the log.
        return _Checked([f"{where} is not signed by an audit certificate: {not_audit}"])
    try:
        claims = jwt.decode(
            token,
            leaf_key,
            algorithms=[CHECKPOINT_ALGORITHM],
            # Times are judged against the injected `now` below, never the wall clock.
            options={"verify_exp": False, "verify_nbf": False, "verify_iat": False},
        )
    except jwt.PyJWTError as err:
        return _Checked([f"{where} signature invalid: {err}"])
    try:
        found = format_number(claims.get("format"), f"{where} claims")
    except FormatUnreadable as err:
        return _Checked([str(err)])
    if found > FORMAT:
        return _Checked([f"{where} is {NewerFormatLine(found)}"])
    claimed_head, claimed_lines = claims.get("head"), claims.get("lines")
    number, iat = claims.get("n"), claims.get("iat")
    if (
        not isinstance(claimed_head, str)
        or not isinstance(claimed_lines, int)
        or not isinstance(number, int)
        or isinstance(number, bool)
        or number < 1
        or not isinstance(iat, int)
    ):
        return _Checked([f"{where} claims are missing head, lines, n or iat"])

    problems = []
    # A good signature over another log: what precedes the checkpoint is not what it signed.
    if claimed_head != head:
        problems.append(
            f"{where} attests {claimed_lines} line(s) ending in {claimed_head[:12]}…, but the "
            f"log holds {line_no - 1} ending in {head[:12]}…: lines {since} were rewritten"
        )
    elif claimed_lines != line_no - 1:
        problems.append(
            f"{where} attests {claimed_lines} line(s), but {line_no - 1} precede it: "
            f"lines were removed from or added to lines {since}"
        )
    try:
        signed_at = dt.datetime.fromtimestamp(iat, dt.UTC)
    except (OverflowError, OSError, ValueError):  # which one depends on the platform
        return _Checked([*problems, f"{where} claims an iat that is not a date"])
    if signed_at > now + _MAX_CLOCK_SKEW:
        problems.append(f"{where} is dated {format_precise(signed_at)}, in the future")
    if problems:
        return _Checked(problems)
    if trust_roots is not None:
        # Web PKI rules for the CAs; the audit leaf's own extensions were checked above (its
        # KeyUsage, if any, must also allow signing). Validity is judged at signing time.
        ee_policy = verification.ExtensionPolicy.permit_all().may_be_present(
            x509.KeyUsage, verification.Criticality.AGNOSTIC, _allows_signing
        )
        verifier = (
            verification.PolicyBuilder()
            .store(verification.Store(list(trust_roots)))
            .time(signed_at)
            .extension_policies(
                ca_policy=verification.ExtensionPolicy.webpki_defaults_ca(), ee_policy=ee_policy
            )
            .build_client_verifier()
        )
        try:
            path = verifier.verify(chain[0], chain[1:])
        except verification.VerificationError as err:
            return _Checked(
                [],
                f"{where} x5c chain does not verify to the trust roots: {err}",
                number,
                signed_at,
            )
        root = path.chain[-1].fingerprint(hashes.SHA256()).hex()
        return _Checked([], None, number, signed_at, root)
    return _Checked([], None, number, signed_at)


def audit_certificate_problem(cert: x509.Certificate) -> str | None:
    """Why `cert` is not an audit certificate (None when it is): its one extended key usage must
    be AUDIT_SIGNING_EKU, its one name a spiffe:// URI with the path AUDIT_SPIFFE_PATH, and it
    may not be a CA."""
    try:
        usages = list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        return "it has no extended key usage"
    except ValueError as err:  # a malformed extension
        return f"its extended key usage cannot be read: {err}"
    if usages != [AUDIT_SIGNING_EKU]:
        shown = ", ".join(getattr(u, "_name", None) or u.dotted_string for u in usages)
        return f"its extended key usage is {shown or 'empty'}, not podcert audit signing only"
    try:
        names = list(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except x509.ExtensionNotFound:
        return "it has no subject alternative name"
    except ValueError as err:
        return f"its subject alternative name cannot be read: {err}"
    uris = [n.value for n in names if isinstance(n, x509.UniformResourceIdentifier)]
    if len(names) != 1 or len(uris) != 1:
        return "it must name exactly one SPIFFE ID and nothing else"
    scheme, _, rest = uris[0].partition("://")
    domain, slash, path = rest.partition("/")
    if scheme != "spiffe" or not domain or slash + path != AUDIT_SPIFFE_PATH:
        return f"its name {uris[0]!r} is not spiffe://<trust domain>{AUDIT_SPIFFE_PATH}"
    try:
        if cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca:
            return "it is a CA certificate"
    except x509.ExtensionNotFound:
        pass
    except ValueError as err:
        return f"its basic constraints cannot be read: {err}"
    return None


def _allows_signing(
    _policy: verification.Policy, _cert: x509.Certificate, usage: x509.KeyUsage | None
) -> None:
    if usage is not None and not usage.digital_signature:
        raise ValueError("the audit certificate's KeyUsage does not allow digitalSignature")


def verify(
    lines: Iterable[bytes | str],
    trust_roots: Sequence[x509.Certificate] | None,
    now: dt.datetime,
) -> Verification:
    """Check the chain and every checkpoint of a log. Pure: reads nothing but its arguments.

    Each problem names its line. `first_broken_line` is the first line the log cannot vouch for:
    an edited line, the line after a gap, a malformed line, or a checkpoint that fails.
    With `trust_roots=None` the checkpoint signatures are checked against their x5c leaf only.
    """
    if trust_roots is not None and not trust_roots:
        raise ValueError("trust_roots is empty; pass None to skip anchoring")
    problems: list[str] = []
    broken: list[int] = []
    entries = checkpoints = good_checkpoints = unsigned = 0
    prev_hash, prev_seq, after_bad = GENESIS, 0, False
    last_good = 0  # line number of the last checkpoint that verified
    # Checkpoints whose signature and claims hold but whose root is no longer trusted (a CA
    # rotation retired it). A later anchored checkpoint attests every line before it, these
    # included, so it vouches for them; any left at the end are problems.
    unanchored: list[tuple[int, str]] = []
    superseded = 0
    # Checkpoint numbers go 1, 2, 3...: a gap means checkpoints were taken out of a rewrite.
    last_number = 0
    last_good_number: int | None = None
    last_good_at: dt.datetime | None = None
    covered = 0
    anchors: set[str] = set()
    unsigned_since: dt.datetime | None = None

    for line_no, raw in enumerate(lines, start=1):
        data = _as_bytes(raw)
        digest = line_hash(data)
        try:
            line = parse_line(data)
            entry = _entry_from_fields(line.body) if line.kind == "entry" else None
        except NewerFormatLine as err:
            # Written by a newer release: nothing from here on can be judged by this one.
            problems.append(f"line {line_no}: {err}; lines {line_no}.. were not read")
            broken.append(line_no)
            break
        except ValueError as err:
            problems.append(f"line {line_no}: {err}")
            broken.append(line_no)
            # Report one bad line once: the next line's prev cannot be judged against it.
            prev_hash, prev_seq, after_bad = digest, prev_seq + 1, True
            continue

        if line.seq > prev_seq + 1:
            gap = line.seq - prev_seq - 1
            problems.append(
                f"line {line_no}: sequence jumps from {prev_seq} to {line.seq}: "
                f"{gap} line(s) removed before it"
            )
            broken.append(line_no)
        elif line.seq <= prev_seq:
            problems.append(
                f"line {line_no}: sequence number {line.seq} follows {prev_seq}: "
                "line(s) duplicated or reordered"
            )
            broken.append(line_no)
        elif line.prev != prev_hash and not after_bad:
            if line_no == 1:
                problems.append(f"line 1: prev is not {GENESIS[:12]}…: the log's start is missing")
                broken.append(1)
            else:
                # The link is cut: the line before is not what this line committed to.
                problems.append(
                    f"line {line_no}: prev does not match the hash of line {line_no - 1}: "
                    f"line {line_no - 1} was edited (or this line's prev was)"
                )
                broken.append(line_no - 1)

        if entry is not None:
            entries += 1
            unsigned += 1
            if unsigned == 1:
                unsigned_since = entry.time
        else:
            checkpoints += 1
            since = f"{last_good + 1}..{line_no - 1}"
            checked = _check_checkpoint(
                line_no, line.body.get("jwt"), prev_hash, trust_roots, now, since
            )
            number = checked.number
            if not checked.problems and number != last_number + 1:
                checked = _Checked(
                    [
                        f"line {line_no}: checkpoint number {number} follows {last_number}: "
                        "checkpoints were removed, or the log was spliced or cut short"
                    ]
                )
            last_number = number or last_number
            if checked.problems:
                problems.extend(checked.problems)
                broken.append(line_no)
            elif checked.unanchored is not None:
                unanchored.append((line_no, checked.unanchored))
            else:
                good_checkpoints += 1
                superseded += len(unanchored)
                unanchored.clear()
                last_good = line_no
                last_good_number, last_good_at = checked.number, checked.signed_at
                covered = entries
                if checked.anchor is not None:
                    anchors.add(checked.anchor)
                unsigned, unsigned_since = 0, None
        prev_hash, prev_seq, after_bad = digest, line.seq, False

    for line_no, reason in unanchored:
        problems.append(reason)
        broken.append(line_no)
    return Verification(
        entries=entries,
        checkpoints=checkpoints,
        unsigned_tail=unsigned,
        unsigned_since=unsigned_since,
        anchored=trust_roots is not None and 0 < good_checkpoints + superseded == checkpoints,
        last_checkpoint=last_good_number,
        last_checkpoint_at=last_good_at,
        covered_entries=covered,
        anchors=frozenset(anchors),
        first_broken_line=min(broken) if broken else None,
        problems=problems,
    )
