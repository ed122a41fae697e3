"""Two leader electors on the real API server's Lease, started with different
--lease-duration values (as two signer replicas are during a rolling update that changes it),
never lead at once. The holder (long duration, long renew deadline) is cut off from the API
server; it keeps leading until its renew deadline passes, and the standby (short duration) must
wait out the holder's duration as written in the Lease, not its own, before taking over. Judged
by its own 2 s, the standby took the lease while the holder still led."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from devcluster.testing import DevCluster, eventually
from podcert.client.rest import ApiError, Rest, path_of
from signer.leader import GV, Elector, LeaseSettings

HOLDER = LeaseSettings(duration=6, renew_deadline=4, retry_period=0.5)
STANDBY = LeaseSettings(duration=2, renew_deadline=1.5, retry_period=0.5)


class Partitioned(Rest):
    """A real client that can be cut off from the API server: while `cut` is set every call
    fails as an unreachable server does (status 0), before anything is sent."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.cut = threading.Event()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if self.cut.is_set():
            raise ApiError(0, "Unavailable", "cannot reach the API server (cut off by the test)")
        return super().request(method, path, **kwargs)


@dataclass
class Tenures:
    """Each elector's leaderships as [start, end] on one monotonic clock (end inf: leading)."""

    spans: list[tuple[str, list[float]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def started(self, who: str) -> None:
        with self.lock:
            self.spans.append((who, [time.monotonic(), math.inf]))

    def stopped(self, who: str) -> None:
        with self.lock:
            [span for name, span in self.spans if name == who][-1][1] = time.monotonic()

    def overlaps(self) -> list[str]:
        with self.lock:
            spans = [(who, tuple(span)) for who, span in self.spans]
        return [
            f"{a} {sa} overlaps {b} {sb}"
            for i, (a, sa) in enumerate(spans)
            for b, sb in spans[i + 1 :]
            if a != b and sa[0] < sb[1] and sb[0] < sa[1]
        ]


@pytest.fixture
def lease(devcluster: DevCluster) -> tuple[str, str]:
    return devcluster.namespace("lease"), "podcert-signer"


def elector(
    rest: Rest, lease: tuple[str, str], who: str, settings: LeaseSettings, tenures: Tenures
) -> Elector:
    return Elector(
        rest,
        *lease,
        who,
        settings,
        on_start=lambda: tenures.started(who),
        on_stop=lambda: tenures.stopped(who),
    )


def test_a_standby_with_a_shorter_lease_duration_waits_out_the_holders(
    devcluster: DevCluster, lease: tuple[str, str]
) -> None:
    tenures = Tenures()
    holder_rest = Partitioned(devcluster.admin)
    holder = elector(holder_rest, lease, "replica-old", HOLDER, tenures)
    standby = elector(Rest(devcluster.admin), lease, "replica-new", STANDBY, tenures)
    stop_holder, stop_standby = threading.Event(), threading.Event()
    threads = [
        threading.Thread(target=holder.run, args=(stop_holder,), daemon=True),
        threading.Thread(target=standby.run, args=(stop_standby,), daemon=True),
    ]
    threads[0].start()
    try:
        assert holder.leading.wait(10), "the first replica never led"
        threads[1].start()
        lease_path = path_of(GV, "leases", *lease)
        admin = Rest(devcluster.admin)
        written = (admin.get(lease_path) or {})["spec"]["leaseDurationSeconds"]
        assert written == 6

        holder_rest.cut.set()
        cut_at = time.monotonic()
        assert standby.leading.wait(HOLDER.duration + 10), "the standby never took over"
        took = time.monotonic() - cut_at
        assert eventually(lambda: not holder.leading.is_set(), timeout=10)

        assert tenures.overlaps() == [], tenures.spans
        spec = (admin.get(lease_path) or {})["spec"]
        assert (spec["holderIdentity"], spec["leaseDurationSeconds"]) == ("replica-new", 2)
        assert spec["leaseTransitions"] == 1
        # Not before the holder's own duration since it last renewed (at most a retry before
        # the cut), whatever the standby's own says.
        assert took >= HOLDER.duration - HOLDER.retry_period - 0.1, took
    finally:
        stop_holder.set()
        stop_standby.set()
        for thread in threads:
            if thread.is_alive():
                thread.join(10)
    assert tenures.overlaps() == [], tenures.spans
