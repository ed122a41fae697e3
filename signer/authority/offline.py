"""An offline (any) upstream CA: a CSR for our next intermediate out, its signed chain in.

The operator has the CSR signed by whatever CA their organisation runs (openssl, Vault, AD CS,
...) and hands back the signed intermediate followed by the upstream's chain up to and including
its self-signed root. `check_signed_chain` accepts that chain only if podcert can sign with it
for as long as the schedule needs: the intermediate carries our key, may sign certificates, names
no trust domain but ours, is valid now and for at least the longest leaf lifetime plus the
overlap, and every link verifies up to a self-signed root. Each refusal is one `ChainError` line
naming the certificate (`chain[N]`) and the field at fault. Pure: times are arguments, nothing
here reads the clock or the disk, and no message ever quotes key material.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bundles.formats import dump_private_key
from podcert.api import keys
from podcert.api.times import format_time, parse_time
from signer import certs
from signer.authority import ca, schedule, successor

# The trust domain's own SPIFFE ID, as SPIRE's downstream (intermediate) CAs carry it.
SPIFFE_SCHEME: Final = "spiffe://"


class ChainError(ValueError):
    """A signed chain that cannot be imported; the message names the certificate and field."""


@dataclass(frozen=True)
class SignedChain:
    """A checked chain: our intermediate, the upstream's intermediates (nearest first), and
    the upstream's self-signed root."""

    intermediate: x509.Certificate
    upstream: tuple[x509.Certificate, ...]
    root: x509.Certificate


def intermediate_csr(
    key: keys.PrivateKey, trust_domain: str, common_name: str
) -> x509.CertificateSigningRequest:
    """A PKCS#10 request for an intermediate CA that signs leaves only: CA:TRUE pathlen 0,
    keyCertSign and cRLSign, and the trust domain's URI SAN. An upstream may copy or replace
    these requested extensions; `check_signed_chain` judges what it actually signed."""
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(f"{SPIFFE_SCHEME}{trust_domain}")]
            ),
            critical=False,
        )
        .sign(key, certs.signature_hash(key))
    )


def csr_pem(csr: x509.CertificateSigningRequest) -> bytes:
    return csr.public_bytes(serialization.Encoding.PEM)


def parse_chain(pem: bytes) -> list[x509.Certificate]:
    """The certificates of a PEM chain file, in order; ChainError for anything else."""
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise ChainError("chain: holds no certificate (expected PEM, our intermediate first)")
    try:
        found = x509.load_pem_x509_certificates(pem)
    except Exception as exc:  # cryptography's parse errors vary in type; all mean "garbage"
        raise ChainError(f"chain: not PEM certificates ({exc or type(exc).__name__})") from exc
    if not found:
        raise ChainError("chain: holds no certificate")
    return found


def check_signed_chain(
    chain: Sequence[x509.Certificate],
    key: keys.PrivateKey,
    trust_domain: str,
    now: dt.datetime,
    must_cover: dt.timedelta,
) -> SignedChain:
    """`chain` (our intermediate first, the upstream's root last) checked for import.

    `must_cover` is how long from `now` every certificate of the chain must stay valid: the
    schedule's minimum, the longest leaf lifetime plus the overlap.
    """
    if not chain:
        raise ChainError("chain: holds no certificate")
    ours = chain[0]
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if ours.public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        raise ChainError(
            "chain[0].subjectPublicKeyInfo: the certificate does not carry this generation's "
            "key (was it signed from this generation's CSR?)"
        )
    _check_trust_domain(ours, trust_domain)
    for n, cert in enumerate(chain):
        _check_ca(cert, n)
        _check_valid(cert, n, now, must_cover)
    for n in range(len(chain) - 1):
        _check_issued_by(chain[n], chain[n + 1], n)
    root = chain[-1]
    if root.issuer != root.subject or not _verifies(root, root):
        raise ChainError(
            f"chain[{len(chain) - 1}]: {_name(root)!r} is not a self-signed root; append the "
            "upstream's chain up to and including its root"
        )
    return SignedChain(intermediate=ours, upstream=tuple(chain[1:-1]), root=root)


def _check_trust_domain(cert: x509.Certificate, trust_domain: str) -> None:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return  # an upstream may leave the SAN out; it then names no other trust domain either
    except Exception as exc:
        raise ChainError(f"chain[0].subjectAltName: cannot be read ({exc})") from exc
    want = f"{SPIFFE_SCHEME}{trust_domain}"
    for uri in san.get_values_for_type(x509.UniformResourceIdentifier):
        if uri.lower().startswith(SPIFFE_SCHEME) and uri.rstrip("/") != want:
            raise ChainError(
                f"chain[0].subjectAltName: names {uri!r}; an intermediate of trust domain "
                f"{trust_domain!r} may carry {want!r} only"
            )


def _check_ca(cert: x509.Certificate, n: int) -> None:
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    except Exception as exc:
        raise ChainError(f"chain[{n}].basicConstraints: cannot be read ({exc})") from exc
    if constraints is None or not constraints.ca:
        raise ChainError(f"chain[{n}].basicConstraints: {_name(cert)!r} is not a CA (CA:TRUE)")
    # chain[n] has n CAs below it (chain[0..n-1]) before the leaves.
    if constraints.path_length is not None and constraints.path_length < n:
        raise ChainError(
            f"chain[{n}].basicConstraints: pathlen {constraints.path_length} allows fewer "
            f"than the {n} CA(s) below it"
        )
    try:
        usage: x509.KeyUsage | None = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        usage = None  # RFC 5280 allows a CA without keyUsage (all uses) above ours
    except Exception as exc:
        raise ChainError(f"chain[{n}].keyUsage: cannot be read ({exc})") from exc
    if (usage is None and n == 0) or (usage is not None and not usage.key_cert_sign):
        raise ChainError(f"chain[{n}].keyUsage: {_name(cert)!r} lacks keyCertSign")


def _check_valid(
    cert: x509.Certificate, n: int, now: dt.datetime, must_cover: dt.timedelta
) -> None:
    if now < cert.not_valid_before_utc:
        raise ChainError(
            f"chain[{n}].notBefore: {_name(cert)!r} is not valid before "
            f"{cert.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ}"
        )
    if cert.not_valid_after_utc < now + must_cover:
        raise ChainError(
            f"chain[{n}].notAfter: {_name(cert)!r} ends "
            f"{cert.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ}, before "
            f"{now + must_cover:%Y-%m-%dT%H:%M:%SZ} (now plus the longest leaf lifetime and "
            "the overlap)"
        )


def _check_issued_by(cert: x509.Certificate, issuer: x509.Certificate, n: int) -> None:
    if cert.issuer != issuer.subject or not _verifies(cert, issuer):
        raise ChainError(
            f"chain[{n}].signature: {_name(cert)!r} is not signed by chain[{n + 1}] "
            f"({_name(issuer)!r}); order the chain from our intermediate up to the root"
        )


def _verifies(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _name(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    value = names[0].value if names else cert.subject.rfc4514_string()
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


# --- a generation awaiting its signed chain, in the CA Secret --------------------------------

# Outside the generations' index, so the schedule never sees (nor activates) it before its
# chain is imported; the CA store carries these keys over every step it writes.
PENDING_PREFIX: Final = "offline."
PENDING_INDEX: Final = "offline.pending.json"


@dataclass(frozen=True)
class Pending:
    """The next generation's key and CSR, waiting for the operator's signed chain."""

    id: str
    trust_domain: str
    since: dt.datetime
    key: keys.PrivateKey = field(repr=False)
    csr: x509.CertificateSigningRequest


def pending_to_secret(pending: Pending) -> dict[str, bytes]:
    index = {
        "id": pending.id,
        "trustDomain": pending.trust_domain,
        "since": format_time(pending.since),
    }
    key: object = pending.key
    if isinstance(key, ca.KeyReference):  # made in a PKCS#11 token: its URI, never the key
        stored = {f"{PENDING_PREFIX}{pending.id}.{ca.TLS_KEY_URI}": key.key_uri.encode()}
    else:
        stored = {f"{PENDING_PREFIX}{pending.id}.tls.key": dump_private_key(pending.key)}
    return {
        PENDING_INDEX: json.dumps(index).encode(),
        **stored,
        f"{PENDING_PREFIX}{pending.id}.csr": csr_pem(pending.csr),
    }


def pending_from_secret(data: Mapping[str, bytes]) -> Pending | None:
    """The generation awaiting its chain, or None; CAError naming the key if unreadable."""
    raw = data.get(PENDING_INDEX)
    if raw is None:
        return None
    try:
        index = json.loads(raw)
    except ValueError:
        raise ca.CAError(f"{PENDING_INDEX}: not valid JSON") from None
    if not isinstance(index, dict):
        raise ca.CAError(f"{PENDING_INDEX}: expected an object")
    gid, td, since = index.get("id"), index.get("trustDomain"), index.get("since")
    if not isinstance(gid, str) or not isinstance(td, str) or not isinstance(since, str):
        raise ca.CAError(f"{PENDING_INDEX}: expected id, trustDomain and since as strings")
    when = parse_time(since)
    if when is None:
        raise ca.CAError(f"{PENDING_INDEX}: since: {since!r} is not an RFC 3339 time")
    csr_name = f"{PENDING_PREFIX}{gid}.csr"
    try:
        csr = x509.load_pem_x509_csr(data.get(csr_name, b""))
    except Exception as exc:
        raise ca.CAError(f"{csr_name}: not a PEM certificate request") from exc
    uri_name = f"{PENDING_PREFIX}{gid}.{ca.TLS_KEY_URI}"
    if uri_name not in data:
        return Pending(
            gid, td, when, ca.load_private_key(data, f"{PENDING_PREFIX}{gid}.tls.key"), csr
        )
    # A key in a token: named by its URI, its public half the CSR's (it signed the CSR). It is
    # only stored again, by that URI, once the chain is imported; the signer opens it then.
    public = csr.public_key()
    if not isinstance(public, ec.EllipticCurvePublicKey):
        raise ca.CAError(f"{csr_name}: a key in a token is an EC key; the request's is not")
    return Pending(gid, td, when, ca.Unopened(public, data[uri_name].decode()), csr)


def carried_over(data: Mapping[str, bytes]) -> dict[str, bytes]:
    """The pending generation's keys of a Secret, to keep through a rotation step."""
    return {k: v for k, v in data.items() if k.startswith(PENDING_PREFIX)}


def imported_bundle(pending: Pending, chain: SignedChain) -> ca.CABundle:
    """The generation a checked chain makes: no root key of ours, the upstream's root."""
    return ca.CABundle(
        root=chain.root,
        intermediate=chain.intermediate,
        intermediate_key=pending.key,
        root_key=None,
        upstream=chain.upstream,
    )


def next_step(
    secret: Mapping[str, bytes],
    gens: Sequence[schedule.Generation],
    now: dt.datetime,
    settings: schedule.Settings,
) -> str | None:
    """The schedule's step in words, but for an offline upstream: an upstream-signed
    intermediate whose end approaches with no successor (`successor.SuccessorDue`'s message),
    a generation awaiting its signed chain, or an upstream-signed CA whose next intermediate
    only the operator brings."""
    try:
        waiting = pending_from_secret(secret)
    except ca.CAError as err:
        return f"the generation awaiting its signed chain is unreadable: {err}"
    due = successor.successor_due(gens, waiting.id if waiting else None, now, settings)
    if due is not None:
        return due.message()
    if waiting is not None:
        return (
            f"{waiting.id} awaiting signed chain since {waiting.since:%Y-%m-%dT%H:%M:%SZ} "
            f"(`podcert signer ca import --id {waiting.id} --chain FILE`)"
        )
    step = schedule.ca_schedule(gens, now, settings)
    current = schedule.active(gens)
    if isinstance(step, schedule.Prepare) and current and current.bundle.root_key is None:
        return "have the upstream sign the next intermediate (`ca prepare --upstream offline`)"
    return schedule.describe_step(step)
