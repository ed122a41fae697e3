"""The CA lifecycle and its schedule, as pure functions of the CA set and `now`.

A CA generation (a root and its intermediate) moves through:

    prepared  - published in the trust bundles, not signing yet (pods learn the new root);
                one prepared with `preview` is published in the `preview` bundles only (pods
                selecting `k8s.spiffe.io/canarying: preview` hold it first) until `Promote`
                makes it live, and the schedule never activates it before then (it promotes
                it itself only when the active CA would otherwise run out)
    active    - signing; exactly one at a time
    retired   - no longer signing, still trusted until the last leaf it signed has expired
    (removed) - dropped from the Secret and from every trust bundle

`ca_schedule(generations, now, settings)` says which single step is due next; the CA store applies
it to the Secret (optimistic concurrency), and operators can take the same steps by hand
(`podcert signer ca prepare [--preview] | promote | activate | retire`). Leaf lifetimes are
clamped to the issuing intermediate, so no leaf outlives its issuer, and a retired root is kept
until min(intermediate expiry, retirement + the longest leaf lifetime) has passed.
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
# An upstream-signed generation's intermediate key is `<id>.upstream.tls.key`, never
# `<id>.tls.key`: 0.1.0 ignores the Secret's format number but requires `<id>.tls.key`, so it
# refuses a Secret holding such a generation ("tls.key: missing or empty") rather than signing
# from it and, at half its life, rotating to a root of its own, out of the upstream's trust.
UPSTREAM_TLS_KEY: Final = "upstream.tls.key"


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
    # A prepared generation published to preview pods only (until promoted).
    preview: bool = False

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
    """Create a new generation in state prepared (`preview`: in the preview bundles only)."""

    preview: bool = False


@dataclass(frozen=True)
class Promote:
    id: str  # a preview-only prepared generation, published live from now on


@dataclass(frozen=True)
class Activate:
    id: str  # the prepared generation that starts signing; the active one retires


@dataclass(frozen=True)
class Remove:
    id: str  # a retired generation whose last leaf has expired


Step = Prepare | Promote | Activate | Remove


def active(generations: Sequence[Generation]) -> Generation | None:
    return next((g for g in generations if g.state == "active"), None)


def trusted_roots(generations: Sequence[Generation]) -> list[x509.Certificate]:
    """Every root a peer must trust now: prepared (preview too), active and retired,
    deduplicated, in order: what the `preview` bundles, the CA Secret's ca.crt and the SPIFFE
    bundle hold."""
    return _roots(generations)


def live_roots(generations: Sequence[Generation]) -> list[x509.Certificate]:
    """The roots the whole fleet holds (the `live` bundles): every trusted root but those of
    generations still in preview."""
    return _roots([g for g in generations if not g.preview])


def _roots(generations: Sequence[Generation]) -> list[x509.Certificate]:
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
    if ready.preview:
        # A person judges the preview pods and promotes it; unless nobody has by the time the
        # active CA would otherwise run out: then live it goes, the overlap still ahead of it.
        promote_by = intermediate.not_valid_after_utc - settings.max_leaf_lifetime
        return Promote(ready.id) if now >= promote_by - settings.overlap else None
    # `since` is when it went live (prepared, or promoted): the fleet has had the overlap.
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
        if active(gens) is None:
            if step.preview:
                raise RotationError("no CA signs yet: the first one is live at once, not preview")
            gens.append(Generation(generation_id(now, gens), new_bundle, "active", now))
        else:
            gen = Generation(generation_id(now, gens), new_bundle, "prepared", now)
            gens.append(replace(gen, preview=step.preview))
        return gens
    if isinstance(step, Promote):
        target = next((g for g in gens if g.id == step.id), None)
        if target is None or target.state != "prepared" or not target.preview:
            raise RotationError(f"CA {step.id} is not a prepared CA in preview")
        # Live from now: the overlap before it may sign counts from here.
        return [replace(g, preview=False, since=now) if g is target else g for g in gens]
    if isinstance(step, Activate):
        target = next((g for g in gens if g.id == step.id), None)
        if target is None or target.state != "prepared":
            raise RotationError(f"CA {step.id} is not prepared")
        if target.preview:
            raise RotationError(
                f"CA {step.id} is in preview only: promote it first (`podcert signer ca "
                "promote`), so every pod holds its root before it signs"
            )
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


def describe_step(step: Step | None) -> str | None:
    """A step in words, for `podcert status`."""
    if isinstance(step, Prepare):
        preview = " to preview pods only" if step.preview else ""
        return f"prepare a new CA generation (published{preview} before it signs)"
    if isinstance(step, Promote):
        return f"promote {step.id} (every pod gets its root; it may sign after the overlap)"
    if isinstance(step, Activate):
        return f"activate {step.id} (it starts signing; the active one retires)"
    if isinstance(step, Remove):
        return f"remove {step.id} (its last leaf has expired)"
    return None


ACTIONS: Final = ("prepare", "promote", "activate", "retire")  # `podcert signer ca ACTION`


def manual_step(
    action: str,
    generations: Sequence[Generation],
    now: dt.datetime,
    *,
    target: str | None = None,
    preview: bool = False,
    force: bool = False,
) -> Step:
    """The step `podcert signer ca ACTION [--id TARGET]` takes, or RotationError saying why
    none applies. `prepare --preview` publishes the new root to preview pods only; `promote`
    makes it live (the schedule then activates it after the overlap); `retire` removes a
    retired CA, before its last leaf expired only with `force`."""
    if action == "prepare":
        return Prepare(preview)

    def pick(state: State, *, in_preview: bool | None = None) -> Generation | None:
        return next(
            (
                g
                for g in generations
                if g.state == state and target in (None, g.id) and in_preview in (None, g.preview)
            ),
            None,
        )

    if action == "promote":
        if (gen := pick("prepared", in_preview=True)) is None:
            raise RotationError("no CA in preview to promote (run `ca prepare --preview` first)")
        return Promote(gen.id)
    if action == "activate":
        if (gen := pick("prepared")) is None:
            raise RotationError("no prepared CA to activate (run `ca prepare` first)")
        return Activate(gen.id)
    if action != "retire":
        raise RotationError(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")
    if (gen := pick("retired")) is None:
        raise RotationError("no retired CA (activate a new one first)")
    if not force and gen.trusted_until and now < gen.trusted_until:
        raise RotationError(
            f"leaves signed by {gen.id} may be valid until "
            f"{gen.trusted_until:%Y-%m-%dT%H:%M:%SZ}; re-issue them and use --force"
        )
    return Remove(gen.id)


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


def from_secret(
    data: Mapping[str, bytes],
    now: dt.datetime,
    resolve: ca.KeyResolver | None = None,
    *,
    unopened: bool = False,
) -> list[Generation]:
    """The CA set in a Secret. A Secret without an index (an operator's own CA, or one written
    before rotation existed) is one active generation that never rotates by itself. `resolve`
    finds the keys the Secret names by URI, or `unopened` leaves them so (`ca.from_secret_data`)."""
    if INDEX_KEY not in data:
        bundle = ca.from_secret_data(data, resolve, unopened=unopened)
        return [Generation("operator", bundle, "active", now)]
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
        preview = item.get("preview", False)
        if not isinstance(preview, bool) or (preview and state != "prepared"):
            raise ca.CAError(f"{INDEX_KEY}: {where}.preview: true only for a prepared CA")
        upstream_key = f"{gid}.{UPSTREAM_TLS_KEY}"
        if upstream_key in data and f"{gid}.{ca.TLS_KEY}" in data:
            raise ca.CAError(f"{upstream_key}: given with {gid}.{ca.TLS_KEY}; a key lives once")
        fields = {
            ca.TLS_CRT: data.get(f"{gid}.tls.crt", b""),
            ca.TLS_KEY: data.get(upstream_key, data.get(f"{gid}.tls.key", b"")),
            ca.CA_CRT: data.get(f"{gid}.ca.crt", b""),
        }
        if f"{gid}.ca.key" in data:
            fields[ca.CA_KEY] = data[f"{gid}.ca.key"]
        if f"{gid}.{ca.CA_KEY_URI}" in data:
            fields[ca.CA_KEY_URI] = data[f"{gid}.{ca.CA_KEY_URI}"]
        if f"{gid}.{ca.TLS_KEY_URI}" in data:
            fields[ca.TLS_KEY_URI] = data[f"{gid}.{ca.TLS_KEY_URI}"]
            del fields[ca.TLS_KEY]
        try:
            bundle = ca.from_secret_data(fields, resolve, unopened=unopened)
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
                preview,
            )
        )
    if sum(1 for g in gens if g.state == "active") > 1:
        raise ca.CAError(f"{INDEX_KEY}: more than one active generation")
    return gens


def to_secret(generations: Sequence[Generation]) -> dict[str, bytes]:
    """Every generation's material under `<id>.*` (an upstream-signed one's key as
    `<id>.upstream.tls.key`), the index, and the active one mirrored as tls.crt/tls.key with
    ca.crt = every trusted root (what other tools expect to find)."""
    data: dict[str, bytes] = {}
    index = []
    for gen in generations:
        for name, value in ca.to_secret_data(gen.bundle).items():
            if name == ca.TLS_KEY and gen.bundle.root_key is None:
                name = UPSTREAM_TLS_KEY  # an upstream signed it (see UPSTREAM_TLS_KEY)
            data[f"{gen.id}.{name}"] = value
        entry: dict[str, str | bool] = {
            "id": gen.id,
            "state": gen.state,
            "since": format_time(gen.since),
        }
        if gen.trusted_until is not None:
            entry["trustedUntil"] = format_time(gen.trusted_until)
        if gen.preview:
            entry["preview"] = True
        index.append(entry)
    data[INDEX_KEY] = json.dumps(index, indent=1).encode()
    current = active(generations)
    if current is not None:
        mirror = ca.to_secret_data(current.bundle)
        for name in (ca.TLS_CRT, ca.TLS_KEY, ca.TLS_KEY_URI):
            if name in mirror:
                data[name] = mirror[name]
    data[ca.CA_CRT] = b"".join(
        r.public_bytes(serialization.Encoding.PEM) for r in trusted_roots(generations)
    )
    return data
