"""One staleness rule: for the same credential at the same time, the shim's metric state and the
audit's state are the API's `credential_state`, named each component's way.

They drifted once: with no beginRefreshAt the audit called a credential overdue at
half its life while the shim refreshed at 80%. Both sides are driven through their public faces
here: the shim's projection state machine, and `audit_findings` over a node volume (and the
request, when the signer's hint is still known).
"""

from __future__ import annotations

import datetime as dt
import random

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from audit import Snapshot, VolumeFiles, audit_findings
from bundles import formats
from kubelet_shim import projection
from kubelet_shim.projection import ProjectionState
from podcert.api.credentials import CredentialState, credential_state, refresh_point
from podcert.api.requests import Read, parse_request
from podcert.api.times import format_time
from signer import certs, model
from signer.authority import ca

NB = dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)
LIFETIME = dt.timedelta(hours=24)
NA = NB + LIFETIME
HINT = NB + dt.timedelta(hours=12)
FALLBACK = NB + LIFETIME * 0.8  # no hint known: the API's estimate
MIN = dt.timedelta(minutes=1)
UID = "uid-web-0"
SIGNER = "example.com/podcert"

# Each component's name for the API's states: the audit reports "refresh due", the shim (like
# the kubelet's gauge) has no such label and keeps a credential "fresh" until it is overdue.
AS_NAMED: dict[CredentialState, tuple[str, ProjectionState]] = {
    "fresh": ("fresh", ProjectionState.FRESH),
    "refresh_due": ("refresh due", ProjectionState.FRESH),
    "overdue_for_refresh": ("overdue", ProjectionState.OVERDUE_FOR_REFRESH),
    "expired": ("expired", ProjectionState.EXPIRED),
}


@pytest.fixture(scope="module")
def credential() -> formats.Credential:
    authority = ca.new_ca("rule", NB - dt.timedelta(days=1))
    key = ec.generate_private_key(ec.SECP256R1())
    plan = model.LeafPlan(
        public_key=key.public_key(),
        spiffe_id="spiffe://td.example/ns/shop/sa/web",
        dns_names=(),
        not_before=NB,
        not_after=NA,
        begin_refresh_at=HINT,
    )
    pem = certs.sign_leaf(plan, ca.issuing_ca(authority), certs.random_serial())
    return formats.Credential(key, tuple(x509.load_pem_x509_certificates(pem.encode())))


def shim_state(
    credential: formats.Credential, hint: dt.datetime | None, now: dt.datetime
) -> ProjectionState:
    """What the shim's gauge says at `now`. With a hint, the shim saw the request issued; without
    one, it adopted the credential from disk after a restart. Either happened soon after
    issuance, before the refresh point, as when the shim is running. No jitter, so the shim's
    refresh point is the signer's (the jitter only delays when a node acts)."""
    settings = projection.Settings(jitter=dt.timedelta(0))
    chain_pem = formats.dump_certificates(credential.chain)
    seen_at, rng = NB + MIN, random.Random(0)
    state: projection.State
    if hint is None:
        state, _ = projection.step(
            projection.NotYetIssued(),
            projection.FoundOnDisk(chain_pem, NB, NA, None),
            now=seen_at,
            rng=rng,
            settings=settings,
        )
    else:
        pending = projection.Pending("req-1", credential.key, created_at=NB)
        state, _ = projection.step(
            pending,
            projection.RequestIssued("req-1", chain_pem, NB, NA, hint),
            now=seen_at,
            rng=rng,
            settings=settings,
        )
        state, _ = projection.step(
            state, projection.CredentialWritten("req-1"), now=seen_at, rng=rng, settings=settings
        )
    assert isinstance(state, projection.Fresh)
    return projection.projection_state(state, now, settings=settings)


def audit_state(credential: formats.Credential, hint: dt.datetime | None, now: dt.datetime) -> str:
    """What `podcert audit` says at `now` of the credential on the node, joined with its request
    when the signer's hint is still known (the cleaner deletes requests after 15 minutes)."""
    requests: tuple[Read, ...] | None = None
    if hint is not None:
        status = {
            "conditions": [{"type": "Issued", "status": "True", "reason": "Issued"}],
            "certificateChain": formats.dump_certificates(credential.chain).decode(),
            "notBefore": format_time(NB),
            "notAfter": format_time(NA),
            "beginRefreshAt": format_time(hint),
        }
        requests = (
            parse_request(
                {
                    "metadata": {"namespace": "shop", "name": "req-1", "uid": "pcr-1"},
                    "spec": {"signerName": SIGNER, "podName": "web-0", "podUID": UID},
                    "status": status,
                }
            ),
        )
    files = {"credentialbundle.pem": formats.dump_credential(credential)}
    snapshot = Snapshot(requests=requests, volumes=(VolumeFiles(UID, "identity", files),))
    (found,) = audit_findings(snapshot, now).projections
    return found.state


@pytest.mark.parametrize(
    ("hint", "now", "expected"),
    [
        pytest.param(HINT, HINT - MIN, "fresh", id="fresh before the signer's refresh point"),
        pytest.param(
            HINT, HINT + 5 * MIN, "refresh_due", id="refresh due within ten minutes of it"
        ),
        pytest.param(HINT, HINT + 10 * MIN, "refresh_due", id="still due exactly ten minutes late"),
        pytest.param(HINT, HINT + 11 * MIN, "overdue_for_refresh", id="overdue after ten minutes"),
        pytest.param(HINT, NA, "expired", id="expired at notAfter"),
        pytest.param(
            None,
            NB + LIFETIME * 0.7,
            "fresh",
            id="without a hint fresh at 70% of the life (the audit once said overdue)",
        ),
        pytest.param(None, FALLBACK + MIN, "refresh_due", id="without a hint refresh due from 80%"),
        pytest.param(
            None,
            FALLBACK + 11 * MIN,
            "overdue_for_refresh",
            id="without a hint overdue ten minutes after 80%",
        ),
        pytest.param(None, NA, "expired", id="without a hint expired at notAfter"),
    ],
)
def test_the_shim_and_the_audit_judge_a_credential_by_the_one_rule(
    credential: formats.Credential,
    hint: dt.datetime | None,
    now: dt.datetime,
    expected: CredentialState,
) -> None:
    assert credential_state(NB, NA, refresh_point(NB, NA, hint), now) == expected
    audit_name, shim_label = AS_NAMED[expected]
    assert audit_state(credential, hint, now) == audit_name
    assert shim_state(credential, hint, now) is shim_label


@pytest.mark.parametrize(
    ("not_after", "hint", "expected"),
    [
        pytest.param(NA, HINT, HINT, id="the signer's hint when it lies in the lifetime"),
        pytest.param(NA, None, FALLBACK, id="80% of the lifetime without one"),
        pytest.param(NA, NA + MIN, FALLBACK, id="80% when the hint is after notAfter"),
        pytest.param(NA, NB - MIN, FALLBACK, id="80% when the hint is before notBefore"),
        pytest.param(
            NB + 30 * MIN, None, NB + 20 * MIN, id="inside the API's window for short lifetimes"
        ),
    ],
)
def test_the_refresh_point(
    not_after: dt.datetime, hint: dt.datetime | None, expected: dt.datetime
) -> None:
    assert refresh_point(NB, not_after, hint) == expected
