"""The CA lifecycle and its schedule, as pure functions of the CA set and `now`.

A CA generation (a root and its intermediate) moves through:

    prepared  - published in the trust bundles, not signing yet (pods learn the new root)
    active    - signing; exactly one at a time
    retired   - no longer signing, still trusted until the last leaf it signed has expired
    (removed) - dropped from the Secret and from every trust bundle

`ca_schedule(generations, now, settings)` says which single step is due next; the CA store applies
it to the Secret (optimistic concurrency), and operators can take the same steps by hand
(`podcert signer ca prepare | activate | retire`). Leaf lifetimes are clamped to the issuing
intermediate, so no leaf outlives its issuer, and a retired root is kept until
min(intermediate expiry, retirement + the longest leaf lifetime) has passed.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from podcert.api.times import format_time, parse_time
from signer.authority import ca

State = Literal["prepared", "active", "retired"]
STATES: Final[tuple[State, ...]] = ("prepared", "active", "retired")

INDEX_KEY: Final = "generations.json"


class RotationError(ValueError):
    """A step that does not apply to the current CA set (the message says why)."""


@dataclass(frozen=True)
class Generation:
    id: str
    bundle: ca.CABundle
    state: State
    since: dt.datetime  # when it entered `state`
    # For a retired generation: when its last leaf has surely expired.
    trusted_until: dt.datetime | None = None

    @property
    def root(self) -> x509.Certificate:
        return self.bundle.root


@dataclass(frozen=True)
class Settings:
    """The CA schedule. These defaults are the only ones: `podcert signer`'s --ca-* flags
    read theirs from `DEFAULT_SETTINGS`."""

    # Prepare the next CA once the active intermediate has used this fraction of its life.
    prepare_at: float = 0.5
    # Keep a prepared CA published this long before it signs (trust must reach every pod).
    overlap: dt.timedelta = dt.timedelta(hours=1)
    # The longest leaf lifetime any policy allows (bounds how long a retired root stays).
    max_leaf_lifetime: dt.timedelta = dt.timedelta(days=1)
    root_lifetime: dt.timedelta = dt.timedelta(days=365)
    intermediate_lifetime: dt.timedelta = dt.timedelta(days=90)


DEFAULT_SETTINGS: Final = Settings()


@dataclass(frozen=True)
class Prepare:
    """Create a new generation in state prepared."""


@dataclass(frozen=True)
class Activate:
    id: str  # the prepared generation that starts signing; the active one retires


@dataclass(frozen=True)
class Remove:
    id: str  # a retired generation whose last leaf has expired


Step = Prepare | Activate | Remove


def active(generations: Sequence[Generation]) -> Generation | None:
    return next((g for g in generations if g.state == "active"), None)


def trusted_roots(generations: Sequence[Generation]) -> list[x509.Certificate]:
    """Every root a peer must trust now: prepared, active and retired, deduplicated, in order."""
    seen: set[bytes] = set()
    roots = []
    for gen in sorted(generations, key=lambda g: (STATES.index(g.state), g.since)):
        der = gen.root.public_bytes(serialization.Encoding.DER)
        if der not in seen:
            seen.add(der)
            roots.append(gen.root)
    return roots


def ca_schedule(
    generations: Sequence[Generation], now: dt.datetime, settings: Settings = DEFAULT_SETTINGS
) -> Step | None:
    """The next step due, or None. One step at a time: apply it, then ask again."""
    for gen in generations:
        if gen.state == "retired" and gen.trusted_until is not None and now >= gen.trusted_until:
            return Remove(gen.id)
    current = active(generations)
    prepared = [g for g in generations if g.state == "prepared"]
    if current is None:
        if prepared:
            return Activate(prepared[0].id)  # nothing signs: no overlap worth waiting for
        return Prepare()
    intermediate = current.bundle.intermediate
    life = intermediate.not_valid_after_utc - intermediate.not_valid_before_utc
    prepare_from = intermediate.not_valid_before_utc + life * settings.prepare_at
    if not prepared:
        return Prepare() if now >= prepare_from else None
    ready = prepared[0]
    if now >= ready.since + settings.overlap:
        return Activate(ready.id)
    return None


def apply(
    generations: Sequence[Generation],
    step: Step,
    now: dt.datetime,
    settings: Settings = DEFAULT_SETTINGS,
    new_bundle: ca.CABundle | None = None,
) -> list[Generation]:
    """The CA set after `step`. `new_bundle` is the fresh CA for Prepare (made by the caller,
    since key generation is not a pure function)."""
    gens = list(generations)
    if isinstance(step, Prepare):
        if any(g.state == "prepared" for g in gens):
            raise RotationError("a prepared CA already exists; activate it first")
        if new_bundle is None:
            raise RotationError("Prepare needs the new CA")
        state: State = "prepared" if active(gens) is not None else "active"
        gens.append(Generation(generation_id(now, gens), new_bundle, state, now))
        return gens
    if isinstance(step, Activate):
        target = next((g for g in gens if g.id == step.id), None)
        if target is None or target.state != "prepared":
            raise RotationError(f"CA {step.id} is not prepared")
        out = []
        for gen in gens:
            if gen.state == "active":
                until = min(
                    gen.bundle.intermediate.not_valid_after_utc, now + settings.max_leaf_lifetime
                )
                out.append(replace(gen, state="retired", since=now, trusted_until=until))
            elif gen.id == step.id:
                out.append(replace(gen, state="active", since=now))
            else:
                out.append(gen)
        return out
    target = next((g for g in gens if g.id == step.id), None)
    if target is None or target.state != "retired":
        raise RotationError(f"CA {step.id} is not retired")
    return [g for g in gens if g.id != step.id]


def generation_id(now: dt.datetime, existing: Sequence[Generation]) -> str:
    base = now.astimezone(dt.UTC).strftime("%Y%m%dt%H%M%S")
    taken = {g.id for g in existing}
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        candidate = f"{base}-{n}"
    return candidate


# --- the Secret's shape ----------------------------------------------------------------------


def _time(value: object, field: str) -> dt.datetime:
    if not isinstance(value, str):
        raise ca.CAError(f"{INDEX_KEY}: {field}: expected an RFC 3339 time")
    parsed = parse_time(value)
    if parsed is None:
        raise ca.CAError(f"{INDEX_KEY}: {field}: {value!r} is not an RFC 3339 time")
    return parsed


def from_secret(data: Mapping[str, bytes], now: dt.datetime) -> list[Generation]:
    """The CA set in a Secret. A Secret without an index (an operator's own CA, or one written
    before rotation existed) is one active generation that never rotates by itself."""
    if INDEX_KEY not in data:
        return [Generation("operator", ca.from_secret_data(data), "active", now)]
    try:
        index = json.loads(data[INDEX_KEY])
    except ValueError:
        raise ca.CAError(f"{INDEX_KEY}: not valid JSON") from None
    if not isinstance(index, list):
        raise ca.CAError(f"{INDEX_KEY}: expected a list of generations")
    gens = []
    for n, item in enumerate(index):
        where = f"[{n}]"
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            raise ca.CAError(f"{INDEX_KEY}: {where}.id: expected a string")
        gid = item["id"]
        state = item.get("state")
        if state not in STATES:
            raise ca.CAError(f"{INDEX_KEY}: {where}.state: expected one of {', '.join(STATES)}")
        fields = {
            ca.TLS_CRT: data.get(f"{gid}.tls.crt", b""),
            ca.TLS_KEY: data.get(f"{gid}.tls.key", b""),
            ca.CA_CRT: data.get(f"{gid}.ca.crt", b""),
        }
        if f"{gid}.ca.key" in data:
            fields[ca.CA_KEY] = data[f"{gid}.ca.key"]
        try:
            bundle = ca.from_secret_data(fields)
        except ca.CAError as err:
            raise ca.CAError(f"generation {gid}: {err}") from None
        until = item.get("trustedUntil")
        gens.append(
            Generation(
                gid,
                bundle,
                state,
                _time(item.get("since"), f"{where}.since"),
                _time(until, f"{where}.trustedUntil") if until is not None else None,
            )
        )
    if sum(1 for g in gens if g.state == "active") > 1:
        raise ca.CAError(f"{INDEX_KEY}: more than one active generation")
    return gens


def to_secret(generations: Sequence[Generation]) -> dict[str, bytes]:
    """Every generation's material under `<id>.*`, the index, and the active one mirrored as
    tls.crt/tls.key with ca.crt = every trusted root (what other tools expect to find)."""
    data: dict[str, bytes] = {}
    index = []
    for gen in generations:
        for name, value in ca.to_secret_data(gen.bundle).items():
            data[f"{gen.id}.{name}"] = value
        entry: dict[str, str] = {"id": gen.id, "state": gen.state, "since": format_time(gen.since)}
        if gen.trusted_until is not None:
            entry["trustedUntil"] = format_time(gen.trusted_until)
        index.append(entry)
    data[INDEX_KEY] = json.dumps(index, indent=1).encode()
    current = active(generations)
    if current is not None:
        mirror = ca.to_secret_data(current.bundle)
        data[ca.TLS_CRT], data[ca.TLS_KEY] = mirror[ca.TLS_CRT], mirror[ca.TLS_KEY]
    data[ca.CA_CRT] = b"".join(
        r.public_bytes(serialization.Encoding.PEM) for r in trusted_roots(generations)
    )
    return data
