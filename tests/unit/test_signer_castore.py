"""signer.authority.castore: where the signer's CAs live, one Secret every replica follows. The
first replica creates a CA and one that loses that race reads the winner's; a missing or unusable
Secret is an error naming it, never a silent new CA; a rotation step is written against the
version read and adopted at once; listeners hear of a new version only; and an operator's own CA
is never rotated. The Secret is held in memory (`SecretKube`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import cast

import pytest
from cryptography.hazmat.primitives import serialization

from podcert.client.rest import ApiError
from signer.authority import ca, schedule
from signer.authority.castore import FORMAT_KEY, CAStore
from signer.kube import SignerKube
from tests.ca_secrets import SecretKube, secret_event

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)


def store(kube: SecretKube, *, create: bool = True) -> CAStore:
    return CAStore(
        cast(SignerKube, kube), "podcert-system", "podcert-ca", lambda: NOW, create=create
    )


def der(store: CAStore) -> list[bytes]:
    return [r.public_bytes(serialization.Encoding.DER) for r in store.trusted_roots()]


class LosingKube(SecretKube):
    """Another replica creates the Secret between this one's read and its create."""

    def __init__(self, winner: Mapping[str, bytes]) -> None:
        super().__init__(None)
        self.winner = dict(winner)

    def create_secret(
        self, namespace: str, name: str, data: Mapping[str, bytes], labels: Mapping[str, str]
    ) -> bool:
        self.data = dict(self.winner)
        return False


class ConflictKube(SecretKube):
    """Someone else wrote the Secret since it was read."""

    def replace_secret(self, *args: object, **kwargs: object) -> str:
        raise ApiError(409, "Conflict", "the object has been modified")


def test_the_first_replica_creates_a_ca_and_signs_with_it() -> None:
    kube = SecretKube(None)
    cas = store(kube)

    gens = cas.load()

    assert gens is not None and [g.state for g in gens] == ["active"]
    assert kube.writes == 1 and kube.data is not None and kube.data[FORMAT_KEY] == b"1"
    issuing = cas.issuing()
    assert issuing is not None and issuing.certificate == gens[0].bundle.intermediate
    roots, sequence = cas.spiffe_bundle()
    assert roots == [gens[0].root] and sequence > 0


def test_a_replica_that_loses_the_race_to_create_signs_with_the_winners_ca() -> None:
    winner = SecretKube(None)
    first = store(winner)
    first.load()
    assert winner.data is not None
    kube = LosingKube(winner.data)

    cas = store(kube)

    assert cas.load() is not None
    assert der(cas) == der(first)
    issuing, winners = cas.issuing(), first.issuing()
    assert issuing is not None and winners is not None
    assert issuing.certificate == winners.certificate
    assert kube.data == winner.data  # what it made itself was never stored


def test_without_leave_to_create_a_missing_secret_is_an_error_not_a_new_ca() -> None:
    kube = SecretKube(None)
    cas = store(kube, create=False)

    assert cas.load() is None

    assert cas.error == "CA Secret podcert-system/podcert-ca does not exist"
    assert kube.writes == 0 and cas.issuing() is None


def test_unusable_material_is_an_error_naming_the_secret_and_signs_nothing() -> None:
    cas = store(SecretKube({"ca.crt": b"not a certificate", "tls.crt": b"", "tls.key": b""}))

    assert cas.load() is None

    assert cas.error is not None and cas.error.startswith("CA Secret podcert-system/podcert-ca: ")
    assert cas.issuing() is None


def test_listeners_hear_of_a_new_version_of_the_secret_only() -> None:
    kube = SecretKube(None)
    cas = store(kube)
    heard: list[int] = []
    cas.on_change(lambda: heard.append(len(cas.generations)))
    cas.load()
    assert kube.data is not None
    assert heard == [1]

    cas.on_secret(secret_event(kube.data, str(kube.version)))  # the watch brings what was read
    assert heard == [1]

    cas.step(schedule.Prepare())
    assert heard == [1, 2]


def test_a_step_is_written_against_the_version_read_and_adopted_at_once() -> None:
    kube = SecretKube(None)
    cas = store(kube)
    cas.load()
    _, before = cas.spiffe_bundle()

    after = cas.step(schedule.Prepare())

    assert [g.state for g in after] == ["active", "prepared"]
    assert [(g.id, g.state) for g in cas.generations] == [(g.id, g.state) for g in after]
    assert kube.writes == 2 and kube.version == 2  # SecretKube checks the version it was sent
    roots, sequence = cas.spiffe_bundle()
    assert len(roots) == 2 and sequence > before  # the bundle changed: a higher number


def test_a_step_that_meets_a_newer_secret_fails_and_leaves_the_ca_set_as_it_was() -> None:
    created = SecretKube(None)
    store(created).load()
    assert created.data is not None
    cas = store(ConflictKube(created.data))
    before = cas.load()

    with pytest.raises(ApiError) as caught:
        cas.step(schedule.Prepare())

    assert caught.value.status == 409
    assert before is not None
    assert [(g.id, g.state) for g in cas.generations] == [(g.id, g.state) for g in before]


def test_an_operator_provided_ca_is_used_but_never_rotated() -> None:
    bundle = ca.new_ca("operator", NOW - dt.timedelta(days=300))  # well into its life
    cas = store(SecretKube(ca.to_secret_data(bundle)))

    gens = cas.load()

    assert gens is not None and [(g.id, g.state) for g in gens] == [("operator", "active")]
    assert cas.issuing() is not None
    assert cas.due() is None
    with pytest.raises(schedule.RotationError, match="operator-provided CA"):
        cas.step(schedule.Prepare())
