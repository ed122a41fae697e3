"""Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it.

The decision is pure (`decide_lease`): whether to take the lease, renew it or wait, from the lease
as read, who we are, when we last saw its record change (our own monotonic clock, never the
holder's timestamps, so clock skew between replicas cannot steal a lease) and the settings. The
elector applies it with a resourceVersion-guarded write; a leader that cannot renew within the
renew deadline steps down at once and stops issuing.

A holder's lease is judged by the duration the holder wrote (`spec.leaseDurationSeconds`), as
client-go's `isLeaseValid` does, not by our own: during a rolling update that changes
--lease-duration, a standby with a shorter one would otherwise take the lease while the holder,
still inside its own renew deadline, leads. `honoured_duration` says what is honoured: the
holder's value when it is a whole number of seconds from 1 to `MAX_HONOURED`; our own when it is
missing, zero, negative or not a number (client-go would take such a lease at once: a holder
that wrote no duration is more likely a foreign writer than one that meant "take it now"); and
`MAX_HONOURED` for a larger one, so a dead holder's absurd claim (a day, a year) cannot keep
every replica from leading for that long. A released lease (no holder) is taken at once.

The holder also writes who it is for people reading the lease (`podcert status`, `podcert
version`): its podcert version and the signer names it serves, as annotations
(`VERSION_ANNOTATION`, `SIGNER_NAMES_ANNOTATION`), on every acquire and renew.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from podcert.api.times import format_micro_time
from podcert.client.rest import JSON, ApiError, Rest, path_of

log = logging.getLogger("podcert.signer.leader")

GV = "coordination.k8s.io/v1"
# What the holder says of itself on the lease: read by `signer.report`, never by an election.
VERSION_ANNOTATION: Final = "podcert.dev/version"
SIGNER_NAMES_ANNOTATION: Final = "podcert.dev/signer-names"  # comma-separated
MAX_HONOURED: Final = 3600.0  # seconds: the longest lease duration a holder is taken at
RECORD: Final = (
    "holderIdentity",
    "renewTime",
    "leaseTransitions",
    "leaseDurationSeconds",
    "acquireTime",
)


@dataclass(frozen=True)
class LeaseSettings:
    """Lease timings, in seconds. These defaults are the only ones: `podcert signer`'s
    --lease-duration, --renew-deadline and --retry-period read theirs from here."""

    duration: float = 15.0  # how long a lease is honoured without renewal
    renew_deadline: float = 10.0  # a leader that has not renewed within this steps down
    retry_period: float = 2.0  # how often to try to acquire or renew


Action = Literal["acquire", "renew", "wait"]


def honoured_duration(written: object, own: float) -> float:
    """How long a holder's lease lasts without renewal, from the `leaseDurationSeconds` it wrote
    (any JSON value, or None when absent) and our own duration."""
    if isinstance(written, bool) or not isinstance(written, int) or written <= 0:
        return own
    return min(float(written), MAX_HONOURED)


def decide_lease(
    holder: str | None,
    me: str,
    seen_change_at: float | None,
    now: float,
    settings: LeaseSettings,
    holder_duration: object = None,
) -> Action:
    """`holder` from the lease (None when absent or released); `seen_change_at` is when this
    process last observed the lease record change (monotonic seconds); `holder_duration` the
    lease's `spec.leaseDurationSeconds` as read (`honoured_duration`)."""
    if holder == me:
        return "renew"
    if not holder:
        return "acquire"
    duration = honoured_duration(holder_duration, settings.duration)
    if seen_change_at is None or now - seen_change_at >= duration:
        return "acquire"  # the holder stopped renewing
    return "wait"


class Elector:
    def __init__(
        self,
        rest: Rest,
        namespace: str,
        name: str,
        identity: str,
        settings: LeaseSettings,
        on_start: Callable[[], None],
        on_stop: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        self.rest = rest
        self.annotations = dict(annotations or {})
        self.namespace, self.name, self.identity = namespace, name, identity
        self.settings = settings
        self.on_start, self.on_stop = on_start, on_stop
        self.clock = clock
        self.leading = threading.Event()
        self._record: tuple[Any, ...] | None = None
        self._seen_change_at: float | None = None
        self._last_renew = 0.0

    @property
    def path(self) -> str:
        return path_of(GV, "leases", self.namespace, self.name)

    def _observe(self, lease: JSON | None) -> str | None:
        spec: Mapping[str, Any] = (lease or {}).get("spec") or {}
        # The whole record, as client-go compares it: any write of the holder's is a sign of life.
        record = tuple(spec.get(k) for k in RECORD)
        if record != self._record:
            self._record = record
            self._seen_change_at = self.clock()
        holder = spec.get("holderIdentity")
        return str(holder) if holder else None

    def _body(self, lease: JSON | None, transitions: int, acquired: bool) -> JSON:
        now = dt.datetime.now(dt.UTC)
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.settings.duration),
            "renewTime": format_micro_time(now),
            "leaseTransitions": transitions,
        }
        old_spec = (lease or {}).get("spec") or {}
        spec["acquireTime"] = (
            format_micro_time(now)
            if acquired
            else old_spec.get("acquireTime", format_micro_time(now))
        )
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if self.annotations:
            meta["annotations"] = self.annotations
        if lease is not None:
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        return {"apiVersion": GV, "kind": "Lease", "metadata": meta, "spec": spec}

    def try_once(self) -> tuple[bool, str | None]:
        """One acquire-or-renew round: (we hold the lease afterwards, the holder we saw)."""
        lease = self.rest.get(self.path)
        holder = self._observe(lease)
        spec = (lease or {}).get("spec") or {}
        action = decide_lease(
            holder,
            self.identity,
            self._seen_change_at,
            self.clock(),
            self.settings,
            spec.get("leaseDurationSeconds"),
        )
        if action == "wait":
            return False, holder
        transitions = int(((lease or {}).get("spec") or {}).get("leaseTransitions") or 0)
        if action == "acquire" and lease is not None:
            transitions += 1
        body = self._body(lease, transitions, acquired=action == "acquire")
        if lease is None:
            self.rest.request("POST", path_of(GV, "leases", self.namespace), body=body)
        else:
            self.rest.request("PUT", self.path, body=body)
        return True, self.identity

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            holder: str | None = None
            try:
                held, holder = self.try_once()
            except ApiError as err:
                held = False
                if err.status != 409:
                    log.warning("lease %s/%s: %s", self.namespace, self.name, err)
            now = self.clock()
            if held:
                self._last_renew = now
                if not self.leading.is_set():
                    log.info("became the leader (%s)", self.identity)
                    self.leading.set()
                    self.on_start()
            elif self.leading.is_set() and (
                (holder and holder != self.identity)
                or now - self._last_renew >= self.settings.renew_deadline
            ):
                log.warning("lost the lease (holder now %s): stopping at once", holder or "-")
                self.leading.clear()
                self.on_stop()
            stop.wait(self.settings.retry_period)
        if self.leading.is_set():
            self.leading.clear()
            self.on_stop()
            self._release()

    def _release(self) -> None:
        """Give the lease up on a clean shutdown, so a standby takes over without waiting."""
        try:
            lease = self.rest.get(self.path)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                body = self._body(lease, int(lease["spec"].get("leaseTransitions") or 0), False)
                body["spec"]["holderIdentity"] = ""
                body["spec"]["leaseDurationSeconds"] = 1
                self.rest.request("PUT", self.path, body=body)
        except ApiError as err:
            log.warning("could not release the lease: %s", err)
