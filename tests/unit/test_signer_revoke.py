"""signer.authority.revoke: revoking the signing generation activates a fresh one at once (no
overlap) and keeps the revoked root trusted until its leaves are replaced, or drops it at once;
the signer never signs from a revoked generation; the revocations round-trip through the CA
Secret under a key older readers ignore, and a leaf is told apart by the intermediate that
signed it. The CA store applies a revoke to the Secret it keeps (`SecretKube`, in memory)."""

from __future__ import annotations

import datetime as dt
from typing import cast

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from signer import certs
from signer.authority import ca, revoke, schedule
from signer.authority.castore import CAStore
from signer.kube import SignerKube
from tests.ca_secrets import SecretKube

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
LATER = T0 + dt.timedelta(days=50)


@pytest.fixture(scope="module")
def bundles() -> list[ca.CABundle]:
    return [ca.new_ca(f"gen{i}", T0 + dt.timedelta(days=45 * i)) for i in range(3)]


def rotated(bundles: list[ca.CABundle]) -> list[schedule.Generation]:
    """gen0 retired, gen1 active."""
    gens = schedule.apply([], schedule.Prepare(), T0, schedule.DEFAULT_SETTINGS, bundles[0])
    now = T0 + dt.timedelta(days=45)
    gens = schedule.apply(gens, schedule.Prepare(), now, schedule.DEFAULT_SETTINGS, bundles[1])
    return schedule.apply(gens, schedule.Activate(gens[1].id), now + dt.timedelta(hours=1))


def leaf(bundle: ca.CABundle) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    ski = bundle.intermediate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "leaf")]))
        .issuer_name(bundle.intermediate.subject)
        .public_key(key.public_key())
        .serial_number(certs.random_serial())
        .not_valid_before(T0)
        .not_valid_after(T0 + dt.timedelta(days=1))
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski.value), False
        )
        .sign(bundle.intermediate_key, certs.signature_hash(bundle.intermediate_key))
    )


def test_revoking_the_signing_ca_activates_a_fresh_one_at_once(
    bundles: list[ca.CABundle],
) -> None:
    gens = rotated(bundles)
    signing = schedule.active(gens)
    assert signing is not None
    after, revoked = revoke.revoke(gens, signing.id, LATER, [], fresh=bundles[2])
    current = schedule.active(after)
    assert current is not None and current.bundle is bundles[2] and current.since == LATER
    assert next(g for g in after if g.id == signing.id).state == "retired"
    # Its root is still trusted (leaves are being replaced), and the signer may not use it.
    assert signing.root in schedule.trusted_roots(after)
    assert [r.id for r in revoked] == [signing.id] and not revoked[0].untrusted
    assert revoke.issuable(current, revoked)
    assert not revoke.issuable(signing, revoked)


def test_revoke_now_drops_the_root_from_the_bundles_at_once(bundles: list[ca.CABundle]) -> None:
    gens = rotated(bundles)
    signing = schedule.active(gens)
    assert signing is not None
    after, revoked = revoke.revoke(gens, signing.id, LATER, [], at_once=True, fresh=bundles[2])
    assert signing.root not in schedule.trusted_roots(after)
    assert revoked[0].untrusted


def test_a_prepared_ca_is_dropped_with_the_revoked_signing_one(
    bundles: list[ca.CABundle],
) -> None:
    gens = schedule.apply([], schedule.Prepare(), T0, schedule.DEFAULT_SETTINGS, bundles[0])
    gens = schedule.apply(gens, schedule.Prepare(), LATER, schedule.DEFAULT_SETTINGS, bundles[1])
    after, _ = revoke.revoke(gens, gens[0].id, LATER, [], fresh=bundles[2])
    assert [g.state for g in after] == ["retired", "active"]
    assert schedule.ca_schedule(after, LATER) is None  # no second rotation off the fresh CA


def test_revoking_a_retired_ca_only_marks_it(bundles: list[ca.CABundle]) -> None:
    gens = rotated(bundles)
    after, revoked = revoke.revoke(gens, gens[0].id, LATER, [])
    assert after == gens and [r.id for r in revoked] == [gens[0].id]


@pytest.mark.parametrize(
    ("gid", "already", "message"),
    [
        pytest.param("nope", False, "no CA generation 'nope'", id="unknown generation"),
        pytest.param(None, True, "already revoked", id="revoked twice"),
    ],
)
def test_a_revoke_that_does_not_apply_says_why(
    bundles: list[ca.CABundle], gid: str | None, already: bool, message: str
) -> None:
    gens = rotated(bundles)
    target = gid or gens[0].id
    before = [revoke.record(gens[0], T0, untrusted=False)] if already else []
    with pytest.raises(schedule.RotationError, match=message):
        revoke.revoke(gens, target, LATER, before)


def test_revoking_the_signing_ca_without_a_fresh_one_is_refused(
    bundles: list[ca.CABundle],
) -> None:
    gens = rotated(bundles)
    with pytest.raises(schedule.RotationError, match="fresh"):
        revoke.revoke(gens, gens[1].id, LATER, [])


def test_untrust_removes_the_revoked_root(bundles: list[ca.CABundle]) -> None:
    gens = rotated(bundles)
    after, revoked = revoke.revoke(gens, gens[0].id, LATER, [])
    after, revoked = revoke.untrust(after, revoked, gens[0].id)
    assert gens[0].root not in schedule.trusted_roots(after) and revoked[0].untrusted
    with pytest.raises(schedule.RotationError, match="not revoked"):
        revoke.untrust(after, [], gens[1].id)


def test_a_leaf_chains_to_the_generation_that_signed_it(bundles: list[ca.CABundle]) -> None:
    gens = rotated(bundles)
    old = revoke.record(gens[0], T0, untrusted=False)
    assert revoke.chains_to([leaf(bundles[0])], old)  # by its authority key id alone
    assert revoke.chains_to([leaf(bundles[0]), bundles[0].intermediate], old)
    assert not revoke.chains_to([leaf(bundles[1]), bundles[1].intermediate], old)
    assert not revoke.chains_to([], old)


def test_revocations_round_trip_through_the_secret(bundles: list[ca.CABundle]) -> None:
    gens = rotated(bundles)
    revoked = [revoke.record(gens[0], T0, untrusted=True)]
    assert revoke.from_secret(revoke.to_secret(revoked)) == revoked
    assert revoke.to_secret([]) == {} and revoke.from_secret({}) == []


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        pytest.param(b"{", "not valid JSON", id="not JSON"),
        pytest.param(b"{}", "expected a list", id="not a list"),
        pytest.param(b'[{"id": 1}]', r"\[0\]\.id", id="id not a string"),
        pytest.param(
            b'[{"id": "a", "revokedAt": "x", "root": "", "intermediate": "",'
            b' "intermediateKeyId": ""}]',
            "revokedAt",
            id="time not RFC 3339",
        ),
    ],
)
def test_a_damaged_revocation_list_names_the_field(raw: bytes, field: str) -> None:
    with pytest.raises(ca.CAError, match=field):
        revoke.from_secret({revoke.REVOKED_KEY: raw})


def test_the_store_revokes_and_stops_signing_from_the_revoked_ca() -> None:
    kube = SecretKube(None)
    store = CAStore(cast(SignerKube, kube), "podcert-system", "podcert-ca", lambda: T0)
    gens = store.load()
    assert gens is not None
    first = gens[0]
    after = store.revoke_generation(first.id, at_once=False)
    issuing = store.issuing()
    assert issuing is not None and issuing.certificate != first.bundle.intermediate
    assert [r.id for r in store.revoked] == [first.id]
    assert first.root in store.trusted_roots()
    # A later rotation step keeps the revocation in the Secret.
    store.step(schedule.Prepare())
    assert [r.id for r in store.revoked] == [first.id]
    store.untrust(first.id)
    assert first.root not in store.trusted_roots()
    assert store.revoked[0].untrusted
    assert len(after) == 2
