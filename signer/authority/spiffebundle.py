"""The trust domain's SPIFFE bundle, and its sequence number, as pure functions.

What the bundle endpoint (`signer.federation.endpoint`) serves to other SPIFFE control planes
(SPIRE, go-spiffe's federation package): an RFC 7517 JWK Set, per the SPIFFE Trust Domain and Bundle
spec (section 4) and the X509-SVID spec (section 6.1):

    {"keys": [{"use": "x509-svid", "kty": ..., <the key's parameters>, "x5c": [<root DER>]}, ...],
     "spiffe_sequence": N, "spiffe_refresh_hint": S}

- one JWK per trusted root (prepared, active and retired: every root a peer must trust during a
  CA rotation), `x5c` holding exactly that one certificate, and no `kid` (the X509-SVID spec
  forbids it);
- `spiffe_sequence` MUST increase whenever the contents change. It lives in the CA Secret
  (`SEQUENCE_KEY`), written with each rotation step by `next_sequence`, so it never goes back
  across restarts or leader changes: every replica serves the value the Secret holds. A Secret
  without it (written before the key existed, or an operator's own CA) gets a value derived
  from what the Secret does hold (`fallback_sequence`);
- `spiffe_refresh_hint` says how often consumers should poll: well under the CA overlap, so a
  prepared root reaches them before it signs.

No clock reads, no I/O: `now` is an argument.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from signer.authority import schedule

# The Secret key holding the sequence number (ASCII decimal), beside the CA generations.
SEQUENCE_KEY: Final = "spiffe.sequence"
DEFAULT_REFRESH_HINT: Final = dt.timedelta(minutes=5)
X509_SVID_USE: Final = "x509-svid"

_CURVES: Final = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}


def _b64url(data: bytes) -> str:
    """base64url without padding (RFC 7515 section 2), as JWK parameters are written."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _uint(value: int, length: int = 0) -> str:
    """A JWK unsigned integer: big-endian, minimal unless a fixed `length` (RFC 7518 6.2, 6.3)."""
    size = length or max(1, (value.bit_length() + 7) // 8)
    return _b64url(value.to_bytes(size, "big"))


def jwk(root: x509.Certificate) -> dict[str, Any]:
    """One root as an `x509-svid` JWK: its key type and public parameters, and the certificate."""
    key = root.public_key()
    entry: dict[str, Any] = {"use": X509_SVID_USE}
    if isinstance(key, ec.EllipticCurvePublicKey):
        if key.curve.name not in _CURVES:
            raise ValueError(f"a CA on curve {key.curve.name} has no JWK form")
        numbers = key.public_numbers()
        size = (key.curve.key_size + 7) // 8  # coordinates are fixed-length (RFC 7518 6.2.1.2)
        entry |= {
            "kty": "EC",
            "crv": _CURVES[key.curve.name],
            "x": _uint(numbers.x, size),
            "y": _uint(numbers.y, size),
        }
    elif isinstance(key, rsa.RSAPublicKey):
        rsa_numbers = key.public_numbers()
        entry |= {"kty": "RSA", "n": _uint(rsa_numbers.n), "e": _uint(rsa_numbers.e)}
    elif isinstance(key, ed25519.Ed25519PublicKey):
        raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        entry |= {"kty": "OKP", "crv": "Ed25519", "x": _b64url(raw)}
    else:
        raise ValueError(f"a CA with a {type(key).__name__} has no JWK form")
    # x5c is plain base64 of the DER, not base64url (RFC 7517 section 4.7).
    der = root.public_bytes(serialization.Encoding.DER)
    entry["x5c"] = [base64.b64encode(der).decode("ascii")]
    return entry


def bundle_document(
    roots: Sequence[x509.Certificate], sequence: int, refresh_hint: dt.timedelta
) -> dict[str, Any]:
    """The SPIFFE bundle of a trust domain whose trusted roots are `roots`."""
    return {
        "keys": [jwk(root) for root in roots],
        "spiffe_sequence": sequence,
        "spiffe_refresh_hint": max(1, int(refresh_hint.total_seconds())),
    }


def bundle_body(
    roots: Sequence[x509.Certificate], sequence: int, refresh_hint: dt.timedelta
) -> bytes:
    """The document as the endpoint sends it (UTF-8 JSON)."""
    return json.dumps(bundle_document(roots, sequence, refresh_hint), indent=1).encode()


# --- the sequence number ---------------------------------------------------------------------


def _seconds(moment: dt.datetime) -> int:
    return int(moment.timestamp())


def read_sequence(data: Mapping[str, bytes]) -> int | None:
    """The sequence number a CA Secret holds, or None when it holds none (or garbage)."""
    raw = data.get(SEQUENCE_KEY)
    if raw is None:
        return None
    try:
        value = int(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return None
    return value if value >= 0 else None


def fallback_sequence(generations: Sequence[schedule.Generation]) -> int:
    """A sequence for a Secret that holds none, from what it does hold: the latest moment a
    generation entered its state (rotation steps write those), or for an operator's CA, whose
    Secret records no such moment, the newest root's notBefore (a new CA starts later)."""
    moments = [g.root.not_valid_before_utc if g.id == "operator" else g.since for g in generations]
    return _seconds(max(moments)) if moments else 0


def initial_sequence(now: dt.datetime) -> int:
    """The sequence of a new CA Secret: the time, so a re-created Secret never goes back."""
    return _seconds(now)


def next_sequence(
    previous: int,
    before: Sequence[x509.Certificate],
    after: Sequence[x509.Certificate],
    now: dt.datetime,
) -> int:
    """The sequence after a rotation step changed the trusted roots from `before` to `after`:
    unchanged when the bundle's contents are, otherwise past both `previous` and the time."""
    if _ders(before) == _ders(after):
        return previous
    return max(previous + 1, _seconds(now))


def _ders(roots: Sequence[x509.Certificate]) -> list[bytes]:
    return [r.public_bytes(serialization.Encoding.DER) for r in roots]
