"""signer.authority.successor: when an upstream-signed intermediate needs its successor from the
operator, and each place that says so (`ca status`, `podcert status`, the signer's gauge, log
line and Event on the CA Secret through `rotator.SuccessorWarning`). Times are injected."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from typing import cast

import pytest

from signer.authority import ca, schedule, successor
from signer.authority.castatus import status_lines
from signer.authority.castore import CAStore
from signer.authority.rotator import SuccessorWarning
from signer.kube import SignerKube
from signer.report import status
from tests.ca_secrets import SecretKube
from tests.unit.test_signer_offline import (
    KEY,
    NOW,
    ROOT,
    ROOT_KEY,
    TD,
    _sign_csr,
    make_ca,
    pem_of,
)

START = NOW - dt.timedelta(hours=1)  # make_ca's default notBefore


def imported(
    gid: str = "g-upstream", days: float = 30, state: schedule.State = "active"
) -> schedule.Generation:
    """An upstream-signed generation: our intermediate under ROOT, no root key of ours."""
    cert = make_ca(
        "podcert intermediate", KEY, (ROOT, ROOT_KEY), not_after=START + dt.timedelta(days=days)
    )
    bundle = ca.CABundle(root=ROOT, intermediate=cert, intermediate_key=KEY, root_key=None)
    return schedule.Generation(gid, bundle, state, START)


def own(state: schedule.State = "active") -> schedule.Generation:
    """A generation of podcert's own root (its key held), as the schedule makes them."""
    bundle = ca.new_ca("podcert", START, intermediate_lifetime=dt.timedelta(days=30))
    return schedule.Generation("g-own", bundle, state, START)


def at(days: float) -> dt.datetime:
    return START + dt.timedelta(days=days)


def test_nothing_is_said_before_the_point_the_schedule_would_have_prepared_at() -> None:
    assert successor.successor_due([imported()], None, at(14.9)) is None


def test_from_half_its_life_the_operator_is_told_what_ends_when_and_what_to_run() -> None:
    due = successor.successor_due([imported()], None, at(15))

    assert due is not None and not due.urgent
    assert due.left == dt.timedelta(days=15)
    assert due.message() == (
        "imported intermediate g-upstream ends in 15d 0h (2027-01-04T11:00:00Z); prepare and "
        "import its successor: `podcert signer ca prepare --upstream offline`, have the "
        "upstream sign the CSR, then `podcert signer ca import`"
    )


def test_the_last_seven_days_are_urgent_and_an_ended_one_says_nothing_issues() -> None:
    due = successor.successor_due([imported()], None, at(23.5))
    assert due is not None and due.urgent and "ends in 6d 12h" in due.message()

    ended = successor.successor_due([imported()], None, at(31))
    assert ended is not None and ended.urgent
    assert "ended at 2027-01-04T11:00:00Z: nothing can be issued" in ended.message()


def test_an_intermediate_shorter_than_the_urgent_window_is_urgent_from_its_first_day() -> None:
    due = successor.successor_due([imported(days=3)], None, at(0.1))
    assert due is not None and due.urgent


def test_a_successor_awaiting_its_chain_is_named_with_its_import_command() -> None:
    due = successor.successor_due([imported()], "g2-upstream", at(20))
    assert due is not None
    assert due.message().endswith(
        "its successor g2-upstream awaits its signed chain: have the upstream sign it, then "
        "`podcert signer ca import --id g2-upstream --chain FILE`"
    )


@pytest.mark.parametrize(
    "generations",
    [
        pytest.param(lambda: [own()], id="own-root: the schedule prepares it itself"),
        pytest.param(
            lambda: [dataclasses.replace(imported(), id="operator")],
            id="an operator's CA: replaced by hand, its own runbook",
        ),
        pytest.param(
            lambda: [imported(), imported("g2-upstream", state="prepared")],
            id="a successor is prepared already",
        ),
        pytest.param(lambda: [imported(state="retired")], id="no active generation"),
    ],
)
def test_no_warning_where_a_successor_is_not_the_operators_to_bring(generations: object) -> None:
    gens = cast("list[schedule.Generation]", generations())  # type: ignore[operator]
    assert successor.successor_due(gens, None, at(29)) is None


@pytest.mark.parametrize(
    ("left", "shown"),
    [
        (dt.timedelta(days=12, hours=3, minutes=59), "12d 3h"),
        (dt.timedelta(hours=5, minutes=10, seconds=59), "5h 10m"),
        (dt.timedelta(minutes=40), "40m"),
        (dt.timedelta(seconds=-5), "0m"),
    ],
)
def test_time_left_reads_as_a_deadline_rounded_down(left: dt.timedelta, shown: str) -> None:
    assert successor.format_left(left) == shown


# --- where it is said ----------------------------------------------------------------------


def imported_store(clock: list[dt.datetime]) -> tuple[CAStore, SecretKube]:
    """A CA store whose active generation was imported from ROOT, its own root retired."""
    kube = SecretKube(None)
    cas = CAStore(cast(SignerKube, kube), "podcert-system", "podcert-ca", lambda: clock[0])
    assert cas.load() is not None
    pending = cas.prepare_offline(TD)
    cas.import_chain(pending.id, pem_of(_sign_csr(pending.csr), ROOT))
    cas.step(schedule.Activate(pending.id))
    cas.step(schedule.Remove(next(g.id for g in cas.generations if g.state == "retired")))
    return cas, kube


def test_ca_status_and_podcert_status_say_it_and_name_a_successor_awaiting_its_chain() -> None:
    clock = [NOW]
    cas, kube = imported_store(clock)
    [gen] = cas.generations
    clock[0] = gen.bundle.not_after - dt.timedelta(days=10)
    assert kube.data is not None

    shown = status.authority(kube.data, "podcert-system/podcert-ca", clock[0])
    assert shown.next_step is not None
    assert shown.next_step.startswith(f"imported intermediate {gen.id} ends in 10d 0h")
    due = successor.successor_due(cas.generations, None, clock[0])
    lines = status_lines(cas.generations, None, cas.due(), [], due)
    assert lines[-1].startswith(f"warning: imported intermediate {gen.id} ends in 10d 0h")

    waiting = cas.prepare_offline(TD)
    assert cas.awaiting == waiting.id
    shown = status.authority(kube.data, "podcert-system/podcert-ca", clock[0])
    assert shown.next_step is not None and f"{waiting.id} awaits its signed chain" in (
        shown.next_step
    )


class Events:
    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, str, str]] = []

    def record_secret_event(
        self, namespace: str, name: str, reason: str, message: str, now: dt.datetime
    ) -> None:
        self.recorded.append((namespace, name, reason, message))


def test_the_signer_sets_its_gauge_every_look_and_logs_and_records_each_change_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = [NOW]
    cas, _ = imported_store(clock)
    [gen] = cas.generations
    gauge: list[float] = []
    events, leading = Events(), [False]
    warning = SuccessorWarning(cas, gauge.append, events, lambda: leading[0])

    assert warning.check() is None and gauge == [0.0]

    clock[0] = gen.bundle.not_after - dt.timedelta(days=10)
    with caplog.at_level(logging.WARNING, "podcert.signer"):
        for _ in range(3):
            assert warning.check() is not None
    assert gauge[1:] == [1.0, 1.0, 1.0]
    said = [r.getMessage() for r in caplog.records if "imported intermediate" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"imported intermediate {gen.id} ends in")
    assert events.recorded == []  # a replica that does not lead records no Event

    leading[0] = True
    warning.check()
    warning.check()
    clock[0] = gen.bundle.not_after - dt.timedelta(days=6)  # now urgent: said again, once
    warning.check()
    warning.check()
    assert [(e[0], e[1], e[2]) for e in events.recorded] == [
        ("podcert-system", "podcert-ca", "UpstreamCASuccessorDue")
    ] * 2
    assert "ends in 10d 0h" in events.recorded[0][3]
    assert "ends in 6d 0h" in events.recorded[1][3]


def test_an_imported_successor_clears_the_warning() -> None:
    clock = [NOW]
    cas, _ = imported_store(clock)
    [gen] = cas.generations
    clock[0] = gen.bundle.not_after - dt.timedelta(days=10)
    gauge: list[float] = []
    warning = SuccessorWarning(cas, gauge.append, Events(), lambda: True)
    assert warning.check() is not None

    nxt = cas.prepare_offline(TD)
    assert warning.check() is not None  # awaiting its chain: still due
    cert = _sign_csr(nxt.csr)
    cas.import_chain(nxt.id, pem_of(cert, ROOT))

    assert warning.check() is None and gauge[-1] == 0.0
    assert [g.state for g in cas.generations] == ["active", "prepared"]
