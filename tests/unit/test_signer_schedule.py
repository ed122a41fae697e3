"""The CA lifecycle: prepare well before the active CA gets short, activate after the overlap,
remove a retired root only after the last leaf it signed has expired."""

from __future__ import annotations

import datetime as dt

import pytest

from signer.authority import ca, schedule

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
SETTINGS = schedule.Settings(
    prepare_at=0.5,
    overlap=dt.timedelta(hours=1),
    max_leaf_lifetime=dt.timedelta(days=1),
    intermediate_lifetime=dt.timedelta(days=90),
)


@pytest.fixture(scope="module")
def bundles() -> list[ca.CABundle]:
    # The second is made when the schedule would prepare it: half-way through the first.
    return [
        ca.new_ca(
            f"gen{i}", T0 + dt.timedelta(days=45 * i), intermediate_lifetime=dt.timedelta(days=90)
        )
        for i in range(2)
    ]


def start(bundles: list[ca.CABundle]) -> list[schedule.Generation]:
    return schedule.apply([], schedule.Prepare(), T0, SETTINGS, bundles[0])


def test_the_first_ca_is_active_at_once(bundles: list[ca.CABundle]) -> None:
    gens = start(bundles)
    assert [g.state for g in gens] == ["active"]
    assert schedule.ca_schedule(gens, T0, SETTINGS) is None


@pytest.mark.parametrize(
    ("days", "expected"),
    [
        pytest.param(10, None, id="young active CA: nothing to do"),
        pytest.param(45, schedule.Prepare(), id="half of its life used: prepare the next"),
    ],
)
def test_prepare_at_half_life(
    bundles: list[ca.CABundle], days: int, expected: schedule.Step | None
) -> None:
    assert schedule.ca_schedule(start(bundles), T0 + dt.timedelta(days=days), SETTINGS) == expected


def test_a_prepared_ca_activates_only_after_the_overlap(bundles: list[ca.CABundle]) -> None:
    now = T0 + dt.timedelta(days=45)
    gens = schedule.apply(start(bundles), schedule.Prepare(), now, SETTINGS, bundles[1])
    assert [g.state for g in gens] == ["active", "prepared"]
    # Both roots are trusted while the new one is only prepared.
    assert len(schedule.trusted_roots(gens)) == 2
    assert schedule.ca_schedule(gens, now + dt.timedelta(minutes=59), SETTINGS) is None
    step = schedule.ca_schedule(gens, now + dt.timedelta(hours=1), SETTINGS)
    assert step == schedule.Activate(gens[1].id)


def test_activation_retires_the_old_ca_until_its_last_leaf_expires(
    bundles: list[ca.CABundle],
) -> None:
    now = T0 + dt.timedelta(days=45)
    gens = schedule.apply(start(bundles), schedule.Prepare(), now, SETTINGS, bundles[1])
    later = now + dt.timedelta(hours=1)
    gens = schedule.apply(gens, schedule.Activate(gens[1].id), later, SETTINGS)
    old, new = gens
    assert (old.state, new.state) == ("retired", "active")
    assert old.trusted_until == later + dt.timedelta(days=1)
    assert schedule.ca_schedule(gens, later + dt.timedelta(hours=23), SETTINGS) is None
    assert schedule.ca_schedule(gens, later + dt.timedelta(days=1), SETTINGS) == schedule.Remove(
        old.id
    )
    gens = schedule.apply(gens, schedule.Remove(old.id), later + dt.timedelta(days=1), SETTINGS)
    assert [g.state for g in gens] == ["active"]
    assert schedule.trusted_roots(gens) == [bundles[1].root]


@pytest.mark.parametrize(
    "step",
    [
        pytest.param(schedule.Activate("nope"), id="activating an unknown CA"),
        pytest.param(schedule.Remove("nope"), id="removing an unknown CA"),
    ],
)
def test_steps_that_do_not_apply_are_refused(
    bundles: list[ca.CABundle], step: schedule.Step
) -> None:
    with pytest.raises(schedule.RotationError):
        schedule.apply(start(bundles), step, T0, SETTINGS)


def test_the_secret_round_trips_and_mirrors_the_active_ca(bundles: list[ca.CABundle]) -> None:
    now = T0 + dt.timedelta(days=45)
    gens = schedule.apply(start(bundles), schedule.Prepare(), now, SETTINGS, bundles[1])
    data = schedule.to_secret(gens)
    assert data["tls.crt"] == ca.to_secret_data(bundles[0])["tls.crt"]
    assert data["ca.crt"].count(b"BEGIN CERTIFICATE") == 2
    back = schedule.from_secret(data, now)
    assert [(g.id, g.state) for g in back] == [(g.id, g.state) for g in gens]


def test_a_secret_without_an_index_is_an_operator_ca_that_never_rotates(
    bundles: list[ca.CABundle],
) -> None:
    gens = schedule.from_secret(ca.to_secret_data(bundles[0]), T0)
    assert [(g.id, g.state) for g in gens] == [("operator", "active")]


@pytest.mark.parametrize(
    ("index", "named"),
    [
        pytest.param(b"not json", "not valid JSON", id="index not JSON"),
        pytest.param(b'[{"id": "x", "state": "dancing"}]', "state", id="unknown state"),
        pytest.param(b'[{"state": "active"}]', "id", id="missing id"),
        pytest.param(
            b'[{"id": "x", "state": "active", "since": "2026-01-01T00:00:00Z", "preview": true}]',
            "preview",
            id="preview on an active CA",
        ),
    ],
)
def test_a_broken_index_names_the_field(index: bytes, named: str) -> None:
    with pytest.raises(ca.CAError, match=named):
        schedule.from_secret({schedule.INDEX_KEY: index}, T0)


# --- preview: a new root for the pods selecting canarying=preview first ---------------------------


def preview(bundles: list[ca.CABundle]) -> tuple[list[schedule.Generation], dt.datetime]:
    now = T0 + dt.timedelta(days=45)
    step = schedule.manual_step("prepare", start(bundles), now, preview=True)
    return schedule.apply(start(bundles), step, now, SETTINGS, bundles[1]), now


def test_a_preview_root_reaches_the_preview_bundles_only(bundles: list[ca.CABundle]) -> None:
    gens, _ = preview(bundles)
    assert [(g.state, g.preview) for g in gens] == [("active", False), ("prepared", True)]
    assert schedule.live_roots(gens) == [bundles[0].root]
    assert set(schedule.trusted_roots(gens)) == {bundles[0].root, bundles[1].root}


def test_a_preview_ca_never_signs_until_promoted_and_then_after_the_overlap(
    bundles: list[ca.CABundle],
) -> None:
    gens, prepared_at = preview(bundles)
    new = gens[1].id
    far = prepared_at + dt.timedelta(days=30)
    assert schedule.ca_schedule(gens, far, SETTINGS) is None  # no Activate, no second Prepare
    with pytest.raises(schedule.RotationError, match="promote it first"):
        schedule.apply(gens, schedule.Activate(new), far, SETTINGS)

    promoted = schedule.apply(gens, schedule.manual_step("promote", gens, far), far, SETTINGS)
    assert schedule.live_roots(promoted) == schedule.trusted_roots(promoted)
    assert schedule.ca_schedule(promoted, far + SETTINGS.overlap / 2, SETTINGS) is None
    assert schedule.ca_schedule(promoted, far + SETTINGS.overlap, SETTINGS) == (
        schedule.Activate(new)
    )


def test_a_preview_nobody_promoted_goes_live_before_the_active_ca_runs_out(
    bundles: list[ca.CABundle],
) -> None:
    gens, _ = preview(bundles)
    expiry = bundles[0].intermediate.not_valid_after_utc
    last_call = expiry - SETTINGS.max_leaf_lifetime - SETTINGS.overlap
    assert schedule.ca_schedule(gens, last_call - dt.timedelta(seconds=1), SETTINGS) is None
    assert schedule.ca_schedule(gens, last_call, SETTINGS) == schedule.Promote(gens[1].id)


def test_the_preview_flag_round_trips_through_the_secret(bundles: list[ca.CABundle]) -> None:
    gens, now = preview(bundles)

    def shape(generations: list[schedule.Generation]) -> list[tuple[object, ...]]:
        return [(g.id, g.state, g.since, g.preview, g.root) for g in generations]

    assert shape(schedule.from_secret(schedule.to_secret(gens), now)) == shape(gens)


@pytest.mark.parametrize(
    ("action", "message"),
    [
        pytest.param("promote", "no CA in preview", id="promote with no preview CA"),
        pytest.param("activate", "no prepared CA", id="activate with none prepared"),
        pytest.param("retire", "no retired CA", id="retire with none retired"),
        pytest.param("rotate", "unknown action", id="an unknown action"),
    ],
)
def test_a_manual_step_that_does_not_apply_says_why(
    bundles: list[ca.CABundle], action: str, message: str
) -> None:
    with pytest.raises(schedule.RotationError, match=message):
        schedule.manual_step(action, start(bundles), T0)


def test_the_first_ca_cannot_be_a_preview(bundles: list[ca.CABundle]) -> None:
    with pytest.raises(schedule.RotationError, match="live at once"):
        schedule.apply([], schedule.Prepare(preview=True), T0, SETTINGS, bundles[0])


def test_retiring_early_needs_force(bundles: list[ca.CABundle]) -> None:
    now = T0 + dt.timedelta(days=45)
    gens = schedule.apply(start(bundles), schedule.Prepare(), now, SETTINGS, bundles[1])
    gens = schedule.apply(gens, schedule.Activate(gens[1].id), now, SETTINGS)
    with pytest.raises(schedule.RotationError, match="use --force"):
        schedule.manual_step("retire", gens, now)
    assert schedule.manual_step("retire", gens, now, force=True) == schedule.Remove(gens[0].id)


def test_steps_are_described_for_the_status_report() -> None:
    assert "preview pods only" in str(schedule.describe_step(schedule.Prepare(preview=True)))
    assert "promote g1" in str(schedule.describe_step(schedule.Promote("g1")))
    assert schedule.describe_step(None) is None
