"""Revoking a CA generation known compromised, as pure functions of the CA set and `now`.

`revoke(generations, id, now, ...)` says what the CA set becomes:

- the active generation revoked: a fresh generation (made by the caller) is active at once, with
  no overlap (the compromised key must stop signing now), and the revoked one is retired; any
  prepared generation is dropped too (it sat in the same Secret as the leaked key and never
  signed), so the schedule does not rotate again off the fresh one;
- a retired generation revoked: only marked;
- a prepared generation revoked: removed (it never signed, nothing chains to it).

The revoked root stays in the trust bundles (a retired generation) until no live leaf chains to
it, when the caller removes it; with `at_once` it leaves them now, and mutual TLS between pods
not yet re-keyed fails until they are.

The revocations are kept in the CA Secret under `REVOKED_KEY`, a key readers before it ignore:
they still never sign from a retired generation. The signer never issues from a generation named
there (`issuable`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from podcert.api.times import format_time, parse_time
from signer.authority import ca, schedule

REVOKED_KEY: Final = "revoked.json"


@dataclass(frozen=True)
class Revocation:
    id: str
    revoked_at: dt.datetime
    # SHA-256 of the DER of the generation's root and intermediate (hex, lower case).
    root_sha256: str
    intermediate_sha256: str
    # The intermediate's subject key id (hex): a leaf's authority key id names it.
    intermediate_key_id: str
    # True once the root has left every trust bundle.
    untrusted: bool = False


def fingerprint(cert: x509.Certificate) -> str:
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def _key_id(cert: x509.Certificate) -> str:
    try:
        return bytes(
            cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
        ).hex()
    except x509.ExtensionNotFound:
        return ""


def record(gen: schedule.Generation, now: dt.datetime, *, untrusted: bool) -> Revocation:
    return Revocation(
        gen.id,
        now,
        fingerprint(gen.root),
        fingerprint(gen.bundle.intermediate),
        _key_id(gen.bundle.intermediate),
        untrusted,
    )


def revoke(
    generations: Sequence[schedule.Generation],
    gid: str,
    now: dt.datetime,
    revoked: Sequence[Revocation],
    *,
    at_once: bool = False,
    fresh: ca.CABundle | None = None,
    settings: schedule.Settings = schedule.DEFAULT_SETTINGS,
) -> tuple[list[schedule.Generation], list[Revocation]]:
    """The CA set and the revocations after revoking `gid`; RotationError when it cannot be.
    `fresh` (a new CA made by the caller) is needed when `gid` is the active generation."""
    target = next((g for g in generations if g.id == gid), None)
    if target is None:
        known = ", ".join(g.id for g in generations) or "none"
        raise schedule.RotationError(f"no CA generation {gid!r} (known: {known})")
    if target.id == "operator":
        raise schedule.RotationError(
            "an operator-provided CA is revoked by replacing its Secret with a new CA"
        )
    if any(r.id == gid for r in revoked):
        raise schedule.RotationError(f"CA {gid} is already revoked")
    gens = list(generations)
    if target.state == "prepared":
        # Never signed: nothing chains to it, so it leaves the bundles now.
        after = [g for g in gens if g.id != gid]
        return after, [*revoked, record(target, now, untrusted=True)]
    if target.state == "active":
        if fresh is None:
            raise schedule.RotationError("revoking the active CA needs a fresh one")
        retired = replace(
            target,
            state="retired",
            since=now,
            trusted_until=min(target.bundle.not_after, now + settings.max_leaf_lifetime),
        )
        kept = [retired if g is target else g for g in gens if g.state != "prepared"]
        newcomer = schedule.Generation(schedule.generation_id(now, gens), fresh, "active", now)
        gens = [*kept, newcomer]
    if at_once:
        gens = [g for g in gens if g.id != gid]
    return gens, [*revoked, record(target, now, untrusted=at_once)]


def untrust(
    generations: Sequence[schedule.Generation], revoked: Sequence[Revocation], gid: str
) -> tuple[list[schedule.Generation], list[Revocation]]:
    """Drop revoked generation `gid`'s root from the bundles (no live leaf chains to it)."""
    if not any(r.id == gid for r in revoked):
        raise schedule.RotationError(f"CA {gid} is not revoked")
    return (
        [g for g in generations if g.id != gid],
        [replace(r, untrusted=True) if r.id == gid else r for r in revoked],
    )


def issuable(active: schedule.Generation | None, revoked: Sequence[Revocation]) -> bool:
    """Whether the signer may sign with `active`: never with a revoked generation."""
    return active is not None and all(r.id != active.id for r in revoked)


def chains_to(chain: Sequence[x509.Certificate], revocation: Revocation) -> bool:
    """Whether a leaf's chain (leaf first) was signed by the revoked generation: its
    intermediate is in the chain, or the leaf's authority key id names that intermediate."""
    if not chain:
        return False
    if any(fingerprint(c) == revocation.intermediate_sha256 for c in chain[1:]):
        return True
    if not revocation.intermediate_key_id:
        return False
    try:
        aki = chain[0].extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    except x509.ExtensionNotFound:
        return False
    return aki.key_identifier is not None and (
        bytes(aki.key_identifier).hex() == revocation.intermediate_key_id
    )


# --- the Secret's shape ----------------------------------------------------------------------


def from_secret(data: Mapping[str, bytes]) -> list[Revocation]:
    """The revocations in a CA Secret (none when the key is absent); CAError names the field."""
    raw = data.get(REVOKED_KEY)
    if raw is None:
        return []
    try:
        items = json.loads(raw)
    except ValueError:
        raise ca.CAError(f"{REVOKED_KEY}: not valid JSON") from None
    if not isinstance(items, list):
        raise ca.CAError(f"{REVOKED_KEY}: expected a list of revocations")
    out = []
    for n, item in enumerate(items):
        where = f"{REVOKED_KEY}: [{n}]"
        if not isinstance(item, dict):
            raise ca.CAError(f"{where}: expected an object")
        texts = {}
        for name in ("id", "revokedAt", "root", "intermediate", "intermediateKeyId"):
            value = item.get(name)
            if not isinstance(value, str):
                raise ca.CAError(f"{where}.{name}: expected a string")
            texts[name] = value
        at = parse_time(texts["revokedAt"])
        if at is None:
            raise ca.CAError(f"{where}.revokedAt: not an RFC 3339 time")
        untrusted = item.get("untrusted", False)
        if not isinstance(untrusted, bool):
            raise ca.CAError(f"{where}.untrusted: expected true or false")
        out.append(
            Revocation(
                texts["id"],
                at,
                texts["root"],
                texts["intermediate"],
                texts["intermediateKeyId"],
                untrusted,
            )
        )
    return out


def to_secret(revoked: Sequence[Revocation]) -> dict[str, bytes]:
    """The revocations as CA Secret data (nothing when there are none)."""
    if not revoked:
        return {}
    items = [
        {
            "id": r.id,
            "revokedAt": format_time(r.revoked_at),
            "root": r.root_sha256,
            "intermediate": r.intermediate_sha256,
            "intermediateKeyId": r.intermediate_key_id,
            "untrusted": r.untrusted,
        }
        for r in revoked
    ]
    return {REVOKED_KEY: json.dumps(items, indent=1).encode()}
