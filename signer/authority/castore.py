"""Where the signer's CAs live: one Secret in its own namespace that every replica follows.

On first start with no Secret, one replica creates a root and an intermediate and stores them;
a replica that loses that race reads the winner's. An operator may instead point the signer at a
Secret holding their own CA (tls.crt, tls.key, ca.crt). Every replica watches the Secret, so a
rotation step taken by the leader or by `podcert signer ca ...` reaches all of them within
seconds, without a restart. Steps are written with the Secret's resourceVersion: two writers never
silently overwrite each other. Key material is held in memory only, never logged.

Each step also writes the SPIFFE bundle's sequence number into the Secret
(`signer.authority.spiffebundle`), so every replica's bundle endpoint serves the same,
never-decreasing number.

The Secret carries its format (`FORMAT_KEY`, see `podcert.persisted`); one without it (0.1.0's,
or an operator's own) is format 1. A Secret in a newer format than `FORMAT` is never written:
`load` reports it (the signer does not start, so never leads on it), a watch event bringing one
stops this replica from signing (`issuing` is None) and from rotating (`step` refuses), and the
CA it held stays as it was until a Secret it reads comes back.

A generation an upstream signed (`ca import`) is format 1 too: its certificates and index entry
are a generation's as any other's, with no root key and its intermediate key under a name of its
own (`schedule.UPSTREAM_TLS_KEY`). Every release that checks the format reads it; 0.1.0, which
does not check it, refuses such a Secret for lack of `<id>.tls.key` instead of misreading it
(docs/upstream-ca.md, "The CA Secret").
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Final, Protocol

from cryptography import x509

from podcert.api import keys
from podcert.client.rest import JSON, ApiError
from podcert.persisted import FormatTooNew, FormatUnreadable, check_readable, format_number
from podcert.reconcile.reflector import Reflector
from signer import model
from signer.authority import ca, downstream, offline, revoke, schedule, spiffebundle
from signer.kube import SignerKube

log = logging.getLogger("podcert.signer.ca")

MANAGED_LABEL = {"app.kubernetes.io/managed-by": "podcert-signer"}
# The Secret's format: what this release writes, and the newest it reads. Format 1 is 0.1.0's
# Secret (0.1.0 ignores this key, so it reads and rotates a Secret this release wrote).
FORMAT_KEY: Final = "podcert.format"
FORMAT: Final = 1


class KeySource(Protocol):
    """Where the CA keys live when not in the Secret (`signer.authority.tokenkeys.TokenKeys`)."""

    def new_key(self, name: str) -> ca.CAKey: ...

    def resolve(self, reference: str, field: str) -> ca.CAKey: ...


class CAStore:
    def __init__(
        self,
        kube: SignerKube,
        namespace: str,
        secret_name: str,
        clock: Callable[[], dt.datetime],
        *,
        create: bool = True,
        settings: schedule.Settings = schedule.DEFAULT_SETTINGS,
        keys: KeySource | None = None,
        first_ca: Callable[[], tuple[ca.CABundle, dict[str, bytes]]] | None = None,
    ) -> None:
        self.kube = kube
        # Makes the first CA when the Secret is absent (SPIRE's intermediate, and the Secret
        # data that goes with it), instead of a root of our own.
        self.first_ca = first_ca
        # With an upstream that signs by itself (SPIRE), the schedule never prepares a CA: the
        # upstream's loop adds each new generation; activating and retiring stay the schedule's.
        self.upstream_prepares = first_ca is not None
        # The intermediates' keys are made in, and found again in, this source when given.
        self.keys = keys
        self.namespace = namespace
        self.secret_name = secret_name
        self.clock = clock
        self.create = create
        self.settings = settings
        self._lock = threading.Lock()
        self._generations: list[schedule.Generation] = []
        # The active generation as the signer signs with it: made once per CA set, not per leaf.
        self._issuing: model.IssuingCA | None = None
        self._version = ""
        self._sequence = 0
        self._revoked: list[revoke.Revocation] = []
        # The id of a generation prepared offline, awaiting its signed chain (None: none).
        self._awaiting: str | None = None
        # SPIRE as the upstream (`signer.authority.downstream`): its X.509 authorities, and when
        # an operator last asked for a new intermediate.
        self._upstream: list[x509.Certificate] = []
        self._renewal_requested: dt.datetime | None = None
        self.error: str | None = None
        # Set while the Secret is in a format this release cannot read (cleared by one it can).
        self.too_new: FormatTooNew | None = None
        self._listeners: list[Callable[[], None]] = []

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.secret_name}"

    @property
    def generations(self) -> list[schedule.Generation]:
        with self._lock:
            return list(self._generations)

    @property
    def revoked(self) -> list[revoke.Revocation]:
        with self._lock:
            return list(self._revoked)

    @property
    def awaiting(self) -> str | None:
        """The generation prepared offline that awaits its signed chain, as last read."""
        with self._lock:
            return self._awaiting

    @property
    def bundle(self) -> ca.CABundle | None:
        current = schedule.active(self.generations)
        return current.bundle if current else None

    def issuing(self) -> model.IssuingCA | None:
        """The CA that signs now; None while there is none, or while the Secret is in a newer
        format (a newer release may have moved on from the CA this replica last read)."""
        if self.too_new is not None:
            return None
        return self._issuing

    @property
    def upstream_authorities(self) -> list[x509.Certificate]:
        """SPIRE's X.509 authorities as last stored (none unless SPIRE is the upstream)."""
        with self._lock:
            return list(self._upstream)

    @property
    def renewal_requested(self) -> dt.datetime | None:
        with self._lock:
            return self._renewal_requested

    def trusted_roots(self) -> list[x509.Certificate]:
        """Every generation's root, and the upstream's other authorities (SPIRE's)."""
        with self._lock:
            gens, upstream = self._generations, self._upstream
        return downstream.merged_roots(schedule.trusted_roots(gens), upstream)

    def live_roots(self) -> list[x509.Certificate]:
        """The trusted roots but those of a CA still in preview: what the live bundles hold."""
        with self._lock:
            gens, upstream = self._generations, self._upstream
        return downstream.merged_roots(schedule.live_roots(gens), upstream)

    def spiffe_bundle(self) -> tuple[list[x509.Certificate], int]:
        """The trusted roots and the SPIFFE bundle's sequence number, read together."""
        with self._lock:
            own = schedule.trusted_roots(self._generations)
            return downstream.merged_roots(own, self._upstream), self._sequence

    def on_change(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def _new_ca(self) -> ca.CABundle:
        now = self.clock()
        # Named by time and a random part: two generations made in one second still differ.
        label = f"{now:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"
        key = root_key = None
        if self.keys is not None:
            # Both made in the token: no private key of this CA is ever in memory or the Secret.
            key, root_key = self.keys.new_key(label), self.keys.new_key(f"root-{label}")
        # Each generation's names differ, so peers and humans can tell old roots from new.
        return ca.new_ca(
            f"podcert {now:%Y-%m-%dT%H:%M:%SZ}",
            now,
            root_lifetime=self.settings.root_lifetime,
            intermediate_lifetime=self.settings.intermediate_lifetime,
            intermediate_key=key,
            root_key=root_key,
        )

    def _resolve(self) -> ca.KeyResolver | None:
        return self.keys.resolve if self.keys is not None else None

    def load(self) -> list[schedule.Generation] | None:
        """Read the Secret (creating it when allowed and absent). Transient errors raise
        ApiError; unusable material is recorded in `error` and yields None."""
        found = self.kube.read_secret(self.namespace, self.secret_name)
        if found is None:
            if not self.create:
                self.error = f"CA Secret {self.ref} does not exist"
                return None
            now = self.clock()
            extra: dict[str, bytes] = {}
            if self.first_ca is not None:
                first, extra = self.first_ca()
            else:
                first = self._new_ca()
            gens = schedule.apply([], schedule.Prepare(), now, self.settings, first)
            data = schedule.to_secret(gens)
            data.update(extra)
            data[FORMAT_KEY] = str(FORMAT).encode()
            data[spiffebundle.SEQUENCE_KEY] = str(spiffebundle.initial_sequence(now)).encode()
            if self.kube.create_secret(self.namespace, self.secret_name, data, MANAGED_LABEL):
                made = (
                    "an upstream's intermediate" if self.first_ca else "a new root and intermediate"
                )
                log.info("created %s CA in Secret %s", made, self.ref)
            found = self.kube.read_secret(self.namespace, self.secret_name)
            if found is None:
                raise ApiError(404, "NotFound", f"CA Secret {self.ref} vanished after creation")
        return self._adopt(*found)

    def _adopt(self, data: dict[str, bytes], version: str) -> list[schedule.Generation] | None:
        try:
            self._check_format(data)
        except FormatTooNew as err:
            if self.too_new is None or self.too_new.found != err.found:
                log.error("%s", err)
            self.too_new, self.error = err, str(err)
            return None
        except FormatUnreadable as err:
            self.error = str(err)
            log.error("cannot use the CA: %s", self.error)
            return None
        try:
            gens = schedule.from_secret(data, self.clock(), self._resolve())
            revoked = revoke.from_secret(data)
            upstream = downstream.authorities_from_secret(data)
        except ca.CAError as err:
            self.error = f"CA Secret {self.ref}: {err}"
            log.error("cannot use the CA: %s", self.error)
            return None
        if self.too_new is not None:
            log.warning("CA Secret %s is in format %d again: signing resumes", self.ref, FORMAT)
            self.too_new = None
        sequence = _sequence(data, gens)
        try:
            waiting = offline.pending_from_secret(data)
        except ca.CAError:
            waiting = None  # `ca status` and `ca import` name what is wrong with it
        current = schedule.active(gens)
        issuing = None
        if current is not None and revoke.issuable(current, revoked):
            issuing = ca.issuing_ca(current.bundle)
        with self._lock:
            changed = version != self._version
            self._generations, self._version, self.error = gens, version, None
            self._revoked, self._awaiting = revoked, waiting.id if waiting else None
            self._upstream = upstream
            self._renewal_requested = downstream.requested_from_secret(data)
            self._sequence, self._issuing = sequence, issuing
        if changed:
            for listener in self._listeners:
                listener()
        return gens

    def follow(self, stop: threading.Event) -> Reflector:
        """The watch that keeps this replica on the Secret's current CA set, leader or not
        (so a standby is ready to sign)."""
        return Reflector(
            "ca-secret",
            lambda: self.kube.list_secret(self.namespace, self.secret_name),
            lambda rv: self.kube.watch_secret(self.namespace, self.secret_name, rv),
            self._on_secret_list,
            self._on_secret_event,
            stop,
        )

    def _on_secret_list(self, items: list[JSON]) -> None:
        for item in items:
            self.on_secret(item)

    def _on_secret_event(self, kind: str, obj: JSON) -> None:
        if kind != "DELETED":
            self.on_secret(obj)

    def on_secret(self, obj: JSON) -> None:
        """A watch event for the Secret: adopt what it now holds."""
        raw = obj.get("data") or {}
        data = {k: base64.b64decode(v) for k, v in raw.items() if isinstance(v, str)}
        version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        if version and version != self._version and self._adopt(data, version) is not None:
            log.info("CA set changed: %s", describe(self.generations))

    def step(self, step: schedule.Step) -> list[schedule.Generation]:
        """Apply one rotation step to the Secret (409 when someone else wrote it first)."""
        data, version, gens = self._read_for_write()
        fresh = self._new_ca() if isinstance(step, schedule.Prepare) else None
        after = schedule.apply(gens, step, self.clock(), self.settings, fresh)
        return self._write(
            data, version, gens, after, revoke.from_secret(data), type(step).__name__
        )

    def revoke_generation(self, gid: str, *, at_once: bool) -> list[schedule.Generation]:
        """Revoke generation `gid` (see `signer.authority.revoke`); 409 when someone else wrote
        the Secret first."""
        data, version, gens = self._read_for_write()
        revoked = revoke.from_secret(data)
        fresh = self._new_ca() if any(g.id == gid and g.state == "active" for g in gens) else None
        after, revoked = revoke.revoke(
            gens, gid, self.clock(), revoked, at_once=at_once, fresh=fresh, settings=self.settings
        )
        return self._write(data, version, gens, after, revoked, "Revoke")

    def untrust(self, gid: str) -> list[schedule.Generation]:
        """Drop revoked generation `gid`'s root from every trust bundle."""
        data, version, gens = self._read_for_write()
        after, revoked = revoke.untrust(gens, revoke.from_secret(data), gid)
        return self._write(data, version, gens, after, revoked, "Untrust")

    def _write(
        self,
        data: dict[str, bytes],
        version: str,
        gens: list[schedule.Generation],
        after: list[schedule.Generation],
        revoked: list[revoke.Revocation],
        what: str,
    ) -> list[schedule.Generation]:
        now = self.clock()
        written = schedule.to_secret(after)
        written.update(offline.carried_over(data))  # a generation awaiting its chain stays
        written.update(downstream.carried_over(data))  # and SPIRE's authorities
        written.update(revoke.to_secret(revoked))
        written[FORMAT_KEY] = str(FORMAT).encode()
        upstream = downstream.authorities_from_secret(data)
        sequence = spiffebundle.next_sequence(
            _sequence(data, gens),
            downstream.merged_roots(schedule.trusted_roots(gens), upstream),
            downstream.merged_roots(schedule.trusted_roots(after), upstream),
            now,
        )
        written[spiffebundle.SEQUENCE_KEY] = str(sequence).encode()
        new_version = self.kube.replace_secret(
            self.namespace, self.secret_name, written, version, MANAGED_LABEL
        )
        self._adopt(written, new_version)
        log.info("CA rotation step %s applied: %s", what, describe(after))
        return after

    def due(self) -> schedule.Step | None:
        gens = self.generations
        if self.too_new is not None or not gens or any(g.id == "operator" for g in gens):
            return None
        step = schedule.ca_schedule(gens, self.clock(), self.settings)
        current = schedule.active(gens)
        if isinstance(step, schedule.Prepare) and (
            self.upstream_prepares or (current and current.bundle.root_key is None)
        ):
            # An upstream signs our intermediates: the next one comes from SPIRE's loop, or from
            # the operator (`ca prepare --upstream offline`, then `ca import`), never from a root
            # of our own.
            return None
        return step

    def prepare_offline(self, trust_domain: str) -> offline.Pending:
        """Make the next generation's key and its CSR, stored as awaiting a signed chain."""
        now = self.clock()
        data, version, gens = self._read_for_write()
        if (waiting := offline.pending_from_secret(data)) is not None:
            raise schedule.RotationError(
                f"generation {waiting.id} already awaits its signed chain (its CSR is "
                f"{offline.PENDING_PREFIX}{waiting.id}.csr in {self.ref}); import it first"
            )
        if any(g.state == "prepared" for g in gens):
            raise schedule.RotationError("a prepared CA already exists; activate it first")
        # Its own suffix: the schedule names generations by time alone and cannot see this one.
        gid = f"{schedule.generation_id(now, gens)}-upstream"
        # In the token when there is one (its CSR signed there), as every CA key of ours.
        key = (
            self.keys.new_key(f"{gid}-{secrets.token_hex(3)}")
            if self.keys is not None
            else keys.generate("ECDSAP256")
        )
        csr = offline.intermediate_csr(
            key, trust_domain, f"podcert {trust_domain} intermediate {now:%Y-%m-%dT%H:%M:%SZ}"
        )
        pending = offline.Pending(gid, trust_domain, now, key, csr)
        written = dict(data)
        written.update(offline.pending_to_secret(pending))
        new_version = self.kube.replace_secret(
            self.namespace, self.secret_name, written, version, MANAGED_LABEL
        )
        self._adopt(written, new_version)
        log.info("generation %s awaits its signed chain (CSR written)", gid)
        return pending

    def pending(self) -> offline.Pending | None:
        found = self.kube.read_secret(self.namespace, self.secret_name)
        return offline.pending_from_secret(found[0]) if found else None

    def import_chain(self, gid: str, chain_pem: bytes) -> list[schedule.Generation]:
        """Check the signed chain for the awaiting generation `gid` and add it as prepared (or
        active, when nothing signs yet); offline.ChainError names what is wrong with it."""
        now = self.clock()
        data, version, gens = self._read_for_write()
        pending = offline.pending_from_secret(data)
        if pending is None or pending.id != gid:
            raise schedule.RotationError(f"no generation {gid} awaits a signed chain")
        if any(g.id == gid for g in gens):
            raise schedule.RotationError(f"a generation {gid} exists already")
        chain = offline.check_signed_chain(
            offline.parse_chain(chain_pem),
            pending.key,
            pending.trust_domain,
            now,
            self.settings.max_leaf_lifetime + self.settings.overlap,
        )
        bundle = offline.imported_bundle(pending, chain)
        after = schedule.apply(gens, schedule.Prepare(), now, self.settings, bundle)
        # The generation keeps the id its CSR was made under.
        after = [replace(g, id=gid) if g.bundle is bundle else g for g in after]
        written = schedule.to_secret(after)
        written.update(revoke.to_secret(revoke.from_secret(data)))  # revocations stay
        written.update(downstream.carried_over(data))
        written[FORMAT_KEY] = str(FORMAT).encode()
        sequence = spiffebundle.next_sequence(
            _sequence(data, gens), schedule.trusted_roots(gens), schedule.trusted_roots(after), now
        )
        written[spiffebundle.SEQUENCE_KEY] = str(sequence).encode()
        new_version = self.kube.replace_secret(
            self.namespace, self.secret_name, written, version, MANAGED_LABEL
        )
        self._adopt(written, new_version)
        log.info("generation %s imported from its upstream: %s", gid, describe(after))
        return after

    def rewrite(self, change: downstream.Change) -> list[schedule.Generation]:
        """Write what `change` makes of the Secret's data and CA set (SPIRE's authorities, a
        generation it signed: `signer.authority.downstream`); 409 when someone else wrote the
        Secret first. The SPIFFE bundle's sequence follows the trusted roots."""
        data, version, gens = self._read_for_write()
        written, after = change(data, gens, self.clock(), self.settings)
        written[FORMAT_KEY] = str(FORMAT).encode()
        before = downstream.merged_roots(
            schedule.trusted_roots(gens), downstream.authorities_from_secret(data)
        )
        roots = downstream.merged_roots(
            schedule.trusted_roots(after), downstream.authorities_from_secret(written)
        )
        sequence = spiffebundle.next_sequence(_sequence(data, gens), before, roots, self.clock())
        written[spiffebundle.SEQUENCE_KEY] = str(sequence).encode()
        new_version = self.kube.replace_secret(
            self.namespace, self.secret_name, written, version, MANAGED_LABEL
        )
        self._adopt(written, new_version)
        return after

    def _read_for_write(self) -> tuple[dict[str, bytes], str, list[schedule.Generation]]:
        found = self.kube.read_secret(self.namespace, self.secret_name)
        if found is None:
            raise ApiError(404, "NotFound", f"CA Secret {self.ref} does not exist")
        data, version = found
        try:
            self._check_format(data)
        except (FormatTooNew, FormatUnreadable) as err:
            raise schedule.RotationError(str(err)) from None
        gens = schedule.from_secret(data, self.clock(), self._resolve())
        if any(g.id == "operator" for g in gens):
            raise schedule.RotationError(
                f"{self.ref} holds an operator-provided CA; rotate it by replacing the Secret"
            )
        return data, version, gens

    def _check_format(self, data: Mapping[str, bytes]) -> None:
        """Raise FormatTooNew (or FormatUnreadable) unless this release reads the Secret."""
        what = f"CA Secret {self.ref}"
        check_readable(format_number(data.get(FORMAT_KEY), what), FORMAT, what)


def _sequence(data: dict[str, bytes], generations: list[schedule.Generation]) -> int:
    stored = spiffebundle.read_sequence(data)
    return stored if stored is not None else spiffebundle.fallback_sequence(generations)


def describe(generations: list[schedule.Generation]) -> str:
    return ", ".join(
        f"{g.id}={g.state}{' (preview)' if g.preview else ''} "
        f"(root {g.root.not_valid_after_utc:%Y-%m-%d})"
        for g in generations
    )
