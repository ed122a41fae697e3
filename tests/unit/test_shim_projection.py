"""The per-projection state machine: issuance, refresh, terminal answers, vanished requests."""

from __future__ import annotations

import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from bundles.formats import dump_private_key
from kubelet_shim.projection import (
    DEFAULT_SETTINGS,
    CreateRequest,
    Credential,
    CredentialWritten,
    Denied,
    Event,
    Failed,
    FoundOnDisk,
    Fresh,
    NotYetIssued,
    Pending,
    ProjectionState,
    RecordEvent,
    RequestCreated,
    RequestDenied,
    RequestFailed,
    RequestIssued,
    RequestPending,
    RequestVanished,
    Settings,
    State,
    Tick,
    WriteCredential,
    projection_state,
    served,
    step,
    wake_at,
)
from podcert.api import keys
from podcert.api.keys import PrivateKey

T0 = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)
HOUR = timedelta(hours=1)
CHAIN = b"-----BEGIN CERTIFICATE-----\nleaf\n-----END CERTIFICATE-----\n"


@pytest.fixture(scope="module")
def key1() -> PrivateKey:
    return keys.generate("ECDSAP256")


@pytest.fixture(scope="module")
def key2() -> PrivateKey:
    return keys.generate("ECDSAP256")


def run(
    state: State,
    event: Event,
    now: datetime,
    *,
    force_after: datetime | None = None,
    settings: Settings = DEFAULT_SETTINGS,
) -> tuple[State, list[object]]:
    new, actions = step(
        state, event, now=now, rng=random.Random(0), force_after=force_after, settings=settings
    )
    return new, list(actions)


def issued(name: str, at: datetime, *, hint: timedelta = 16 * HOUR) -> RequestIssued:
    return RequestIssued(name, CHAIN + name.encode(), at, at + 24 * HOUR, at + hint)


def holding(key: PrivateKey, at: datetime = T0, name: str = "pcr-1") -> Fresh:
    """A projection whose credential from request `name` was issued and written at `at`."""
    state, _ = run(NotYetIssued(), RequestCreated(name, key), at)
    state, _ = run(state, issued(name, at), at)
    state, _ = run(state, CredentialWritten(name), at)
    assert isinstance(state, Fresh)
    return state


# -- first issuance -----------------------------------------------------------------------


def test_a_new_projection_asks_for_its_first_certificate() -> None:
    assert run(NotYetIssued(), Tick(), T0) == (NotYetIssued(), [CreateRequest("initial")])


def test_created_request_is_pending_with_its_key(key1: PrivateKey) -> None:
    state, actions = run(NotYetIssued(), RequestCreated("pcr-1", key1), T0)
    assert state == Pending("pcr-1", key1, T0)
    assert actions == []
    assert run(state, Tick(), T0 + MIN) == (state, [])


def test_issuance_writes_the_pending_key_with_the_chain(key1: PrivateKey) -> None:
    pending = Pending("pcr-1", key1, T0)
    state, actions = run(pending, issued("pcr-1", T0 + MIN), T0 + MIN)
    assert actions == [WriteCredential("pcr-1", key1, CHAIN + b"pcr-1")]
    assert isinstance(state, Fresh)
    assert state.unwritten_key is key1
    assert state.on_disk is None  # nothing served until the write lands
    credential = state.credential
    assert credential.requested_at == T0  # when the key was made, not when it was issued
    hint = T0 + MIN + 16 * HOUR
    assert hint <= credential.refresh_at <= hint + 5 * MIN


def test_confirmed_write_drops_the_key_from_memory(key1: PrivateKey) -> None:
    state = holding(key1)
    assert state.unwritten_key is None
    assert state.on_disk == state.credential
    assert run(state, Tick(), T0 + HOUR) == (state, [])


def test_a_failed_write_is_retried_on_the_next_tick(key1: PrivateKey) -> None:
    state, _ = run(Pending("pcr-1", key1, T0), issued("pcr-1", T0), T0)
    again, actions = run(state, Tick(), T0 + MIN)
    assert again == state
    assert actions == [WriteCredential("pcr-1", key1, CHAIN + b"pcr-1")]


@pytest.mark.parametrize(
    "event",
    [
        pytest.param(issued("pcr-old", T0), id="issuance of a superseded request is ignored"),
        pytest.param(
            RequestDenied("pcr-old", "X", "y"), id="denial of a superseded request is ignored"
        ),
        pytest.param(
            RequestFailed("pcr-old", "X", "y"), id="failure of a superseded request is ignored"
        ),
        pytest.param(RequestVanished("pcr-old"), id="vanishing of a superseded request is ignored"),
    ],
)
def test_events_about_other_requests_change_nothing(key1: PrivateKey, event: Event) -> None:
    pending = Pending("pcr-1", key1, T0)
    assert run(pending, event, T0 + MIN) == (pending, [])


def test_write_confirmation_of_another_request_is_ignored(key1: PrivateKey) -> None:
    state, _ = run(Pending("pcr-1", key1, T0), issued("pcr-1", T0), T0)
    assert run(state, CredentialWritten("pcr-0"), T0) == (state, [])


# -- refresh ------------------------------------------------------------------------------


def test_nothing_happens_before_the_refresh_point(key1: PrivateKey) -> None:
    state = holding(key1)
    before = state.credential.refresh_at - timedelta(microseconds=1)
    assert run(state, Tick(), before) == (state, [])


def test_refresh_point_asks_for_a_new_certificate(key1: PrivateKey) -> None:
    state = holding(key1)
    assert run(state, Tick(), state.credential.refresh_at) == (state, [CreateRequest("refresh")])


def test_refresh_keeps_serving_the_old_credential_until_the_new_one_is_written(
    key1: PrivateKey, key2: PrivateKey
) -> None:
    old = holding(key1)
    now = old.credential.refresh_at
    pending, _ = run(old, RequestCreated("pcr-2", key2), now)
    assert pending == Pending("pcr-2", key2, now, previous=old.credential)
    assert projection_state(pending, now) is ProjectionState.FRESH

    got, _ = run(pending, issued("pcr-2", now), now)
    assert isinstance(got, Fresh)
    assert got.on_disk == old.credential  # issued but not yet written: files still hold the old one
    written, _ = run(got, CredentialWritten("pcr-2"), now)
    assert isinstance(written, Fresh)
    assert written.on_disk is not None
    assert written.on_disk.request_name == "pcr-2"


def test_refresh_writes_the_new_key_never_the_old_one(key1: PrivateKey, key2: PrivateKey) -> None:
    old = holding(key1)
    now = old.credential.refresh_at
    pending, _ = run(old, RequestCreated("pcr-2", key2), now)
    _, actions = run(pending, issued("pcr-2", now), now)
    [write] = actions
    assert isinstance(write, WriteCredential)
    assert write.key is key2


def test_a_newer_request_supersedes_an_open_one(key1: PrivateKey, key2: PrivateKey) -> None:
    old = holding(key1)
    first, _ = run(old, RequestCreated("pcr-2", key1), T0 + 20 * HOUR)
    second, _ = run(first, RequestCreated("pcr-3", key2), T0 + 21 * HOUR)
    assert second == Pending("pcr-3", key2, T0 + 21 * HOUR, previous=old.credential)


# -- terminal answers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("event", "terminal", "reason"),
    [
        pytest.param(
            RequestDenied("pcr-2", "UnsupportedKeyType", "use ECDSAP256"),
            Denied,
            "CertificateDenied",
            id="denied is terminal: no new request",
        ),
        pytest.param(
            RequestFailed("pcr-2", "SignerDown", "ca unavailable"),
            Failed,
            "CertificateFailed",
            id="failed is terminal: no new request",
        ),
    ],
)
def test_terminal_answers_stop_requests_and_keep_the_old_credential(
    key1: PrivateKey, key2: PrivateKey, event: Event, terminal: type, reason: str
) -> None:
    old = holding(key1)
    now = old.credential.refresh_at
    pending, _ = run(old, RequestCreated("pcr-2", key2), now)
    state, actions = run(pending, event, now)

    assert isinstance(state, terminal)
    assert isinstance(state, Denied | Failed)
    assert state.previous == old.credential
    [record] = actions
    assert isinstance(record, RecordEvent)
    assert (record.type, record.reason) == ("Warning", reason)
    assert "pcr-2" in record.message

    for later in (now + HOUR, old.credential.not_after + HOUR):
        assert run(state, Tick(), later) == (state, [])
    assert run(state, RequestCreated("pcr-9", key2), now) == (state, [])
    assert run(state, FoundOnDisk(CHAIN, T0, T0 + 24 * HOUR), now) == (state, [])

    expected = ProjectionState.DENIED if terminal is Denied else ProjectionState.FAILED
    assert projection_state(state, now) is expected
    # The agent still wakes to report the old credential turning overdue and expiring; then never.
    assert served(state) == old.credential
    overdue = old.credential.refresh_at + 10 * MIN + timedelta(microseconds=1)
    assert wake_at(state, now) == overdue
    assert wake_at(state, overdue) == old.credential.not_after
    assert wake_at(state, old.credential.not_after) is None


def test_denial_before_any_credential_leaves_nothing_to_serve(key1: PrivateKey) -> None:
    state, _ = run(Pending("pcr-1", key1, T0), RequestDenied("pcr-1", "Policy", "no"), T0)
    assert state == Denied("pcr-1", "Policy", "no", previous=None)
    assert wake_at(state, T0) is None


def test_an_issued_status_with_impossible_times_fails_the_projection(key1: PrivateKey) -> None:
    bogus = RequestIssued("pcr-1", CHAIN, T0, T0, T0)
    state, actions = run(Pending("pcr-1", key1, T0), bogus, T0)
    assert isinstance(state, Failed)
    assert state.reason == "InvalidIssuedStatus"
    assert [type(a) for a in actions] == [RecordEvent]


# -- vanished and unanswered requests ------------------------------------------------------


def test_vanished_request_is_abandoned_after_ten_minutes_and_replaced(key1: PrivateKey) -> None:
    state, _ = run(Pending("pcr-1", key1, T0), RequestVanished("pcr-1"), T0 + MIN)
    assert isinstance(state, Pending)
    assert state.vanished_at == T0 + MIN
    # Seen missing again: the clock keeps running from the first time.
    state, _ = run(state, RequestVanished("pcr-1"), T0 + 5 * MIN)
    assert isinstance(state, Pending)
    assert state.vanished_at == T0 + MIN
    assert wake_at(state, T0 + 5 * MIN) == T0 + 5 * MIN  # unanswered report is due too

    state, _ = run(state, Tick(), T0 + 5 * MIN)  # the unanswered report
    assert run(state, Tick(), T0 + 11 * MIN - timedelta(microseconds=1)) == (state, [])

    after, actions = run(state, Tick(), T0 + 11 * MIN)
    assert after == NotYetIssued()
    assert [type(a) for a in actions] == [RecordEvent, CreateRequest]
    assert actions[-1] == CreateRequest("replace_abandoned")


def test_abandoning_during_refresh_keeps_serving_the_old_credential(
    key1: PrivateKey, key2: PrivateKey
) -> None:
    old = holding(key1)
    now = old.credential.refresh_at
    pending, _ = run(old, RequestCreated("pcr-2", key2), now)
    pending, _ = run(pending, RequestVanished("pcr-2"), now)
    after, actions = run(pending, Tick(), now + 10 * MIN)
    assert after == Fresh(old.credential)
    assert CreateRequest("replace_abandoned") in actions


def test_a_request_seen_again_is_not_abandoned(key1: PrivateKey) -> None:
    settings = Settings(unanswered_after=HOUR)
    state, _ = run(Pending("pcr-1", key1, T0), RequestVanished("pcr-1"), T0)
    state, _ = run(state, RequestPending("pcr-1"), T0 + 2 * MIN, settings=settings)
    assert run(state, Tick(), T0 + 30 * MIN, settings=settings) == (state, [])


def test_a_vanished_request_issued_within_the_timeout_is_accepted(key1: PrivateKey) -> None:
    state, _ = run(Pending("pcr-1", key1, T0), RequestVanished("pcr-1"), T0)
    state, actions = run(state, issued("pcr-1", T0 + 3 * MIN), T0 + 3 * MIN)
    assert isinstance(state, Fresh)
    assert [type(a) for a in actions] == [WriteCredential]


def test_abandon_timeout_is_injectable(key1: PrivateKey) -> None:
    settings = Settings(abandon_after=2 * MIN, unanswered_after=HOUR)
    state, _ = run(Pending("pcr-1", key1, T0), RequestVanished("pcr-1"), T0)
    assert run(state, Tick(), T0 + MIN, settings=settings) == (state, [])
    after, _ = run(state, Tick(), T0 + 2 * MIN, settings=settings)
    assert after == NotYetIssued()


def test_an_unanswered_request_is_reported_once(key1: PrivateKey) -> None:
    pending = Pending("pcr-1", key1, T0)
    assert run(pending, Tick(), T0 + 4 * MIN) == (pending, [])
    reported, actions = run(pending, Tick(), T0 + 5 * MIN)
    [record] = actions
    assert isinstance(record, RecordEvent)
    assert record.reason == "CertificateRequestUnanswered"
    assert "5 min" in record.message
    assert run(reported, Tick(), T0 + 9 * MIN) == (reported, [])


# -- emergency rotation -------------------------------------------------------------------


def test_force_after_makes_an_older_credential_due_now(key1: PrivateKey) -> None:
    state = holding(key1)
    force = T0 + 2 * HOUR
    now = force + MIN
    assert run(state, Tick(), now, force_after=force) == (state, [CreateRequest("forced")])
    assert wake_at(state, now, force_after=force) == now


def test_force_after_spares_a_credential_issued_after_it(key1: PrivateKey) -> None:
    state = holding(key1, at=T0 + 3 * HOUR)
    assert run(state, Tick(), T0 + 4 * HOUR, force_after=T0 + 2 * HOUR) == (state, [])


def test_force_after_replaces_a_key_requested_before_it_and_issued_after_it(
    key1: PrivateKey, key2: PrivateKey
) -> None:
    force = T0 + 2 * MIN  # asked while the request was pending (a slow or absent signer)
    pending = Pending("pcr-1", key1, T0)
    state, _ = run(pending, issued("pcr-1", T0 + 5 * MIN), T0 + 5 * MIN, force_after=force)
    state, _ = run(state, CredentialWritten("pcr-1"), T0 + 5 * MIN, force_after=force)
    now = T0 + 6 * MIN
    assert run(state, Tick(), now, force_after=force) == (state, [CreateRequest("forced")])
    # The replacement's key is made after the instant: rotated once, no loop.
    state, _ = run(state, RequestCreated("pcr-2", key2), now, force_after=force)
    state, _ = run(state, issued("pcr-2", now), now, force_after=force)
    state, _ = run(state, CredentialWritten("pcr-2"), now, force_after=force)
    assert run(state, Tick(), now + MIN, force_after=force) == (state, [])


def test_force_after_in_the_future_schedules_the_rotation(key1: PrivateKey) -> None:
    state = holding(key1)
    force = T0 + 5 * HOUR
    assert run(state, Tick(), T0 + HOUR, force_after=force) == (state, [])
    assert wake_at(state, T0 + HOUR, force_after=force) == force
    assert run(state, Tick(), force, force_after=force) == (state, [CreateRequest("forced")])


def test_force_after_later_than_the_refresh_point_is_a_plain_refresh(key1: PrivateKey) -> None:
    state = holding(key1)
    at = state.credential.refresh_at
    assert run(state, Tick(), at, force_after=at + HOUR) == (state, [CreateRequest("refresh")])


# -- restart ------------------------------------------------------------------------------


def test_restart_adopts_a_fresh_credential_without_a_new_request() -> None:
    now = T0 + HOUR
    state, actions = run(NotYetIssued(), FoundOnDisk(CHAIN, T0, T0 + 24 * HOUR), now)
    assert actions == []
    assert isinstance(state, Fresh)
    assert state.on_disk == state.credential
    assert state.credential.request_name is None
    assert run(state, Tick(), now) == (state, [])
    # Without the signer's hint, refresh falls back to 80% of the lifetime.
    fallback = T0 + 24 * HOUR * 0.8
    assert fallback <= state.credential.refresh_at <= fallback + 5 * MIN


def test_restart_uses_the_hint_when_the_agent_found_one() -> None:
    found = FoundOnDisk(CHAIN, T0, T0 + 24 * HOUR, begin_refresh_at=T0 + 12 * HOUR)
    state, _ = run(NotYetIssued(), found, T0 + HOUR)
    assert isinstance(state, Fresh)
    assert T0 + 12 * HOUR <= state.credential.refresh_at <= T0 + 12 * HOUR + 5 * MIN


@pytest.mark.parametrize(
    "found",
    [
        pytest.param(FoundOnDisk(CHAIN, T0 - 48 * HOUR, T0 - 24 * HOUR), id="expired on disk"),
        pytest.param(FoundOnDisk(CHAIN, T0, T0 - HOUR), id="impossible times on disk"),
    ],
)
def test_restart_ignores_unusable_disk_content(found: FoundOnDisk) -> None:
    state, _ = run(NotYetIssued(), found, T0)
    assert run(state, Tick(), T0) == (NotYetIssued(), [CreateRequest("initial")])


def test_disk_content_is_only_adopted_on_a_cold_start(key1: PrivateKey) -> None:
    pending = Pending("pcr-1", key1, T0)
    assert run(pending, FoundOnDisk(CHAIN, T0, T0 + 24 * HOUR), T0) == (pending, [])


# -- what the outside sees ----------------------------------------------------------------


def test_projection_state_over_a_credential_lifetime(key1: PrivateKey) -> None:
    state = holding(key1)
    credential = state.credential
    assert projection_state(NotYetIssued(), T0) is ProjectionState.NOT_YET_ISSUED
    assert projection_state(Pending("pcr-1", key1, T0), T0) is ProjectionState.NOT_YET_ISSUED
    assert projection_state(state, T0) is ProjectionState.FRESH
    overdue = credential.refresh_at + 10 * MIN + timedelta(seconds=1)
    assert projection_state(state, overdue) is ProjectionState.OVERDUE_FOR_REFRESH
    assert projection_state(state, credential.not_after) is ProjectionState.EXPIRED


def test_forced_rotation_that_does_not_happen_turns_overdue(key1: PrivateKey) -> None:
    state = holding(key1)
    force = T0 + HOUR
    assert projection_state(state, force + 11 * MIN, force_after=force) is (
        ProjectionState.OVERDUE_FOR_REFRESH
    )


def test_wake_up_times(key1: PrivateKey) -> None:
    assert wake_at(NotYetIssued(), T0) == T0
    state = holding(key1)
    credential = state.credential
    assert wake_at(state, T0) == credential.refresh_at
    # Past the refresh point (request creation failing): due now, and the agent's backoff rules.
    late = credential.refresh_at + MIN
    assert wake_at(state, late) == late
    pending = Pending("pcr-2", key1, late, previous=credential)
    # Next instants: the unanswered report, then overdue, then expiry.
    assert wake_at(pending, late) == late + 5 * MIN
    reported = Pending("pcr-2", key1, late, previous=credential, reported_unanswered=True)
    overdue = credential.refresh_at + 10 * MIN + timedelta(microseconds=1)
    assert wake_at(reported, late) == overdue
    assert wake_at(reported, overdue) == credential.not_after


def test_an_unwritten_credential_wants_a_tick_now(key1: PrivateKey) -> None:
    state, _ = run(Pending("pcr-1", key1, T0), issued("pcr-1", T0), T0)
    assert wake_at(state, T0 + MIN) == T0 + MIN


# -- secrets ------------------------------------------------------------------------------


def test_keys_and_chains_stay_out_of_reprs(key1: PrivateKey) -> None:
    pending = Pending("pcr-1", key1, T0)
    fresh, actions = run(pending, issued("pcr-1", T0), T0)
    pem = dump_private_key(key1).decode()
    for thing in (
        pending,
        fresh,
        *actions,
        RequestCreated("pcr-1", key1),
        issued("pcr-1", T0),
        FoundOnDisk(CHAIN, T0, T0 + HOUR),
    ):
        text = repr(thing)
        assert "PrivateKey" not in text, text
        assert "BEGIN" not in text, text
        assert pem not in text
    assert "pcr-1" in repr(pending)


def test_credential_due_time_without_force_is_the_refresh_point() -> None:
    credential = Credential(None, CHAIN, T0, T0 + HOUR, None, T0 + 48 * MIN, T0)
    assert credential.due_at(None) == T0 + 48 * MIN
    assert credential.due_at(T0) == T0 + 48 * MIN  # issued at the force instant: not before it


def test_pure_shim_modules_import_neither_kubernetes_nor_aiohttp() -> None:
    probe = (
        "import sys\n"
        "import kubelet_shim.projection, kubelet_shim.refresh, kubelet_shim.storage\n"
        "import podcert.api.pods\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'aiohttp')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
