"""signer.authority.downstream: when SPIRE is asked for a new intermediate, what of its answer
is accepted, how failures back off, and what the trust bundles hold."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from signer.authority import ca, downstream, offline, schedule
from tests.unit.test_signer_offline import make_ca

NOW = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)
TD = "spire.test"
SETTINGS = downstream.RenewalSettings(
    fraction=0.5, max_leaf_lifetime=dt.timedelta(hours=24), overlap=dt.timedelta(hours=1)
)
KEY = ec.generate_private_key(ec.SECP256R1())
SPIRE_KEY = ec.generate_private_key(ec.SECP256R1())
# SPIRE without an upstream of its own: each X.509 authority is a self-signed root.
SPIRE_CA = make_ca("spire ca", SPIRE_KEY, uris=(f"spiffe://{TD}",))
NEXT_KEY = ec.generate_private_key(ec.SECP256R1())
SPIRE_NEXT = make_ca("spire next ca", NEXT_KEY, uris=(f"spiffe://{TD}",))


def der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def downstream_ca(
    days: float = 5,
    uris: tuple[str, ...] = (f"spiffe://{TD}",),
    key: ec.EllipticCurvePrivateKey = KEY,
) -> x509.Certificate:
    return make_ca(
        "DOWNSTREAM-1",
        key,
        (SPIRE_CA, SPIRE_KEY),
        uris=uris,
        not_after=NOW + dt.timedelta(days=days),
    )


def lasting(start: dt.datetime, hours: float) -> x509.Certificate:
    return make_ca(
        "ours",
        KEY,
        (SPIRE_CA, SPIRE_KEY),
        not_before=start,
        not_after=start + dt.timedelta(hours=hours),
    )


@pytest.mark.parametrize(
    ("hours", "expected_after_start"),
    [
        pytest.param(240, dt.timedelta(hours=120), id="a long intermediate: at half its life"),
        pytest.param(
            40, dt.timedelta(hours=15), id="a short one: no later than end minus leaf and overlap"
        ),
        pytest.param(20, dt.timedelta(0), id="one shorter than a leaf: at once, not before start"),
    ],
)
def test_renewal_point(hours: float, expected_after_start: dt.timedelta) -> None:
    cert = lasting(NOW, hours)
    assert downstream.renew_at(cert, SETTINGS) == cert.not_valid_before_utc + expected_after_start


def test_renew_by_is_the_end_less_the_longest_leaf_and_the_overlap() -> None:
    cert = lasting(NOW, 100)
    assert downstream.renew_by(cert, SETTINGS) == NOW + dt.timedelta(hours=75)


def generation(
    gid: str, cert: x509.Certificate, state: schedule.State, since: dt.datetime, own: bool = False
) -> schedule.Generation:
    bundle = ca.CABundle(
        root=SPIRE_CA,
        intermediate=cert,
        intermediate_key=KEY,
        root_key=SPIRE_KEY if own else None,
    )
    return schedule.Generation(gid, bundle, state, since)


ACTIVE = generation("g1", lasting(NOW, 100), "active", NOW)


@pytest.mark.parametrize(
    ("gens", "authorities", "requested", "at", "due"),
    [
        pytest.param([ACTIVE], [SPIRE_CA], None, NOW, None, id="fresh SPIRE intermediate: not due"),
        pytest.param(
            [ACTIVE], [SPIRE_CA], None, NOW + dt.timedelta(hours=50), "renewal point", id="at half"
        ),
        pytest.param([], [SPIRE_CA], None, NOW, "no CA signs", id="nothing signs: due"),
        pytest.param(
            [generation("g0", lasting(NOW, 100), "active", NOW, own=True)],
            [SPIRE_CA],
            None,
            NOW,
            "not signed by SPIRE",
            id="our own root signs (moving under SPIRE): due",
        ),
        pytest.param(
            [ACTIVE], [SPIRE_NEXT], None, NOW, "not signed by SPIRE", id="root not SPIRE's: due"
        ),
        pytest.param(
            [ACTIVE, generation("g2", lasting(NOW, 100), "prepared", NOW)],
            [SPIRE_CA],
            None,
            NOW + dt.timedelta(hours=90),
            None,
            id="one prepared already: the schedule activates it, nothing more asked",
        ),
        pytest.param(
            [ACTIVE],
            [SPIRE_CA],
            NOW + dt.timedelta(minutes=1),
            NOW + dt.timedelta(minutes=2),
            "renewal requested",
            id="operator asked after it became active: due",
        ),
        pytest.param(
            [ACTIVE],
            [SPIRE_CA],
            NOW - dt.timedelta(minutes=1),
            NOW + dt.timedelta(minutes=2),
            None,
            id="a request older than the active CA is spent",
        ),
        pytest.param(
            [schedule.Generation("operator", ACTIVE.bundle, "active", NOW)],
            [],
            None,
            NOW + dt.timedelta(hours=99),
            None,
            id="an operator's own CA Secret is never replaced",
        ),
    ],
)
def test_renewal_due(
    gens: list[schedule.Generation],
    authorities: list[x509.Certificate],
    requested: dt.datetime | None,
    at: dt.datetime,
    due: str | None,
) -> None:
    why = downstream.renewal_due(gens, authorities, requested, at, SETTINGS)
    if due is None:
        assert why is None
    else:
        assert why is not None and due in why


def test_retries_double_up_to_the_cap_and_jitter_only_shortens() -> None:
    s = downstream.RenewalSettings(
        retry_min=dt.timedelta(seconds=5), retry_max=dt.timedelta(seconds=60)
    )
    waits = [downstream.retry_delay(n, s, 0.0).total_seconds() for n in range(1, 7)]
    assert waits == [5, 10, 20, 40, 60, 60]
    assert downstream.retry_delay(0, s, 0.5) == dt.timedelta(0)
    assert downstream.retry_delay(3, s, 0.999).total_seconds() == pytest.approx(16.004)
    assert downstream.retry_delay(10_000, s, 0.0) == dt.timedelta(seconds=60)


def test_split_ders_reads_concatenated_certificates_back() -> None:
    small = b"\x30\x03\x02\x01\x05"  # a short-form length; certificates have long forms
    blob = der(SPIRE_CA) + small + der(SPIRE_NEXT)
    assert downstream.split_ders(blob) == [der(SPIRE_CA), small, der(SPIRE_NEXT)]
    assert downstream.split_ders(b"") == []


@pytest.mark.parametrize(
    "blob",
    [
        pytest.param(b"\x04\x01a", id="not a SEQUENCE"),
        pytest.param(der(SPIRE_CA)[:-1], id="cut short"),
        pytest.param(b"\x30\x85\x00\x00\x00\x00\x01", id="a length wider than four bytes"),
        pytest.param(b"\x30", id="a lone tag"),
    ],
)
def test_split_ders_refuses_what_is_not_whole_der(blob: bytes) -> None:
    with pytest.raises(ValueError, match="byte 0"):
        downstream.split_ders(blob)


def answer(cert: x509.Certificate, authorities: list[x509.Certificate]) -> downstream.Answer:
    return downstream.check_answer(
        [der(cert)], [der(a) for a in authorities], KEY, TD, NOW, SETTINGS
    )


def test_an_answer_becomes_a_generation_under_the_authority_that_signed_it() -> None:
    cert = downstream_ca()
    got = answer(cert, [SPIRE_NEXT, SPIRE_CA])
    assert got.chain.root == SPIRE_CA and got.chain.upstream == ()
    assert got.authorities == (SPIRE_NEXT, SPIRE_CA)
    bundle = downstream.bundle_of(got, KEY)
    assert bundle.root_key is None and bundle.root == SPIRE_CA
    assert bundle.intermediate == cert and bundle.intermediate_key is KEY


@pytest.mark.parametrize(
    ("cert", "authorities", "message"),
    [
        pytest.param(
            downstream_ca(), [SPIRE_NEXT], r"ca_cert_chain\[0\]: signed by none", id="unknown root"
        ),
        pytest.param(
            downstream_ca(key=SPIRE_KEY),
            [SPIRE_CA],
            r"chain\[0\]\.subjectPublicKeyInfo",
            id="not our key",
        ),
        pytest.param(downstream_ca(days=1), [SPIRE_CA], r"chain\[0\]\.notAfter", id="too short"),
        pytest.param(
            downstream_ca(uris=("spiffe://other.test",)),
            [SPIRE_CA],
            r"chain\[0\]\.subjectAltName",
            id="another trust domain",
        ),
        pytest.param(downstream_ca(), [], r"x509_authorities: empty", id="no authorities"),
    ],
)
def test_an_answer_is_refused_naming_the_field(
    cert: x509.Certificate, authorities: list[x509.Certificate], message: str
) -> None:
    with pytest.raises(offline.ChainError, match=message):
        answer(cert, authorities)


def test_garbage_in_an_answer_names_the_repeated_field() -> None:
    with pytest.raises(offline.ChainError, match=r"x509_authorities\[1\]: not a DER"):
        downstream.check_answer(
            [der(downstream_ca())], [der(SPIRE_CA), b"junk"], KEY, TD, NOW, SETTINGS
        )
    with pytest.raises(offline.ChainError, match="ca_cert_chain: empty"):
        downstream.check_answer([], [der(SPIRE_CA)], KEY, TD, NOW, SETTINGS)


def test_trust_bundles_hold_our_roots_then_spires_each_once() -> None:
    merged = downstream.merged_roots([SPIRE_CA], [SPIRE_NEXT, SPIRE_CA])
    assert merged == [SPIRE_CA, SPIRE_NEXT]
    assert downstream.same_set([SPIRE_CA, SPIRE_NEXT], [SPIRE_NEXT, SPIRE_CA])
    assert not downstream.same_set([SPIRE_CA], [SPIRE_CA, SPIRE_NEXT])


def test_the_secrets_keys_round_trip_and_are_carried_over() -> None:
    data = {
        **downstream.authorities_to_secret([SPIRE_CA, SPIRE_NEXT]),
        **downstream.request_to_secret(NOW),
        "other": b"x",
    }
    assert downstream.authorities_from_secret(data) == [SPIRE_CA, SPIRE_NEXT]
    assert downstream.requested_from_secret(data) == NOW
    assert set(downstream.carried_over(data)) == {
        downstream.AUTHORITIES_KEY,
        downstream.RENEW_REQUEST_KEY,
    }
    assert downstream.authorities_from_secret({}) == []
    assert downstream.requested_from_secret({downstream.RENEW_REQUEST_KEY: b"soon"}) is None
    with pytest.raises(ca.CAError, match=downstream.AUTHORITIES_KEY):
        downstream.authorities_from_secret({downstream.AUTHORITIES_KEY: b"-----BEGIN CERT"})


def test_status_counts_spires_authorities_as_the_cas_roots_and_names_its_renewal() -> None:
    from signer.report import status

    gen = generation("g1", lasting(NOW - dt.timedelta(hours=60), 100), "active", NOW)
    secret = {
        **schedule.to_secret([gen]),
        **downstream.authorities_to_secret([SPIRE_CA, SPIRE_NEXT]),
    }
    view = status.authority(secret, "podcert-system/podcert-ca", NOW, schedule.Settings())
    assert view.problem is None
    assert set(view.roots) == {der(SPIRE_CA), der(SPIRE_NEXT)}  # what the bundles publish
    assert view.next_step is not None and "--upstream spire" in view.next_step
    bare = status.authority(schedule.to_secret([gen]), "x", NOW, schedule.Settings())
    assert bare.next_step is not None and "--upstream offline" in bare.next_step
