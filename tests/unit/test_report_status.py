"""`podcert status`'s model: who leads, the CA's next step, trust bundles, pending and stuck
requests and recent denials, each judged from objects as fetched and an injected `now`."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from podcert.api.times import format_micro_time, format_time
from signer.authority import ca, schedule
from signer.leader import SIGNER_NAMES_ANNOTATION, VERSION_ANNOTATION
from signer.report.status import (
    StatusInputs,
    authority,
    build_status,
    leadership,
    requests,
    trust_bundle,
)

NOW = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)
SIGNER = "podcert.dev/workload"


def lease(
    holder: str = "signer-0", renewed: dt.datetime = NOW, duration: int = 15
) -> dict[str, Any]:
    return {
        "metadata": {
            "annotations": {VERSION_ANNOTATION: "0.2.0", SIGNER_NAMES_ANNOTATION: SIGNER},
        },
        "spec": {
            "holderIdentity": holder,
            "renewTime": format_micro_time(renewed),
            "leaseDurationSeconds": duration,
            "leaseTransitions": 2,
        },
    }


def pcr(
    name: str,
    created: dt.datetime,
    condition: tuple[str, str, dt.datetime] | None = None,
    signer: str = SIGNER,
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if condition is not None:
        kind, reason, at = condition
        status["conditions"] = [
            {
                "type": kind,
                "status": "True",
                "reason": reason,
                "message": "m",
                "lastTransitionTime": format_time(at),
            }
        ]
    return {
        "metadata": {"namespace": "shop", "name": name, "creationTimestamp": format_time(created)},
        "spec": {"signerName": signer, "podName": "api", "nodeName": "node-a"},
        "status": status,
    }


@pytest.mark.parametrize(
    ("renewed", "duration", "live"),
    [
        pytest.param(NOW - dt.timedelta(seconds=5), 15, True, id="renewed inside its duration"),
        pytest.param(NOW - dt.timedelta(seconds=20), 15, False, id="not renewed for too long"),
        pytest.param(
            NOW - dt.timedelta(seconds=20), 60, True, id="the holder's own longer duration"
        ),
    ],
)
def test_a_lease_is_live_while_its_holder_renews_within_its_duration(
    renewed: dt.datetime, duration: int, live: bool
) -> None:
    judged = leadership(lease(renewed=renewed, duration=duration), "ns/l", NOW)

    assert judged.live is live
    assert judged.holder == "signer-0"
    assert judged.version == "0.2.0"
    assert judged.signer_names == (SIGNER,)


def test_no_lease_and_a_released_lease_have_no_leader() -> None:
    assert leadership(None, "ns/l", NOW).live is False
    assert leadership(None, "ns/l", NOW).found is False
    released = leadership(lease(holder=""), "ns/l", NOW)
    assert released.found and not released.live and released.holder is None


def test_pending_requests_older_than_the_threshold_are_stuck_oldest_first() -> None:
    items = [
        pcr("young", NOW - dt.timedelta(seconds=30)),
        pcr("old", NOW - dt.timedelta(minutes=6)),
        pcr("done", NOW - dt.timedelta(minutes=9), ("Issued", "Issued", NOW)),
    ]

    judged = requests(items, NOW, stuck_after=dt.timedelta(minutes=5))

    assert [p.name for p in judged.pending] == ["old", "young"]
    assert [p.name for p in judged.stuck] == ["old"]
    assert judged.issued == 1 and judged.seen == 3


def test_denials_are_counted_by_reason_inside_the_window_only() -> None:
    items = [
        pcr("a", NOW, ("Denied", "PolicyDenied", NOW - dt.timedelta(minutes=5))),
        pcr("b", NOW, ("Denied", "PolicyDenied", NOW - dt.timedelta(minutes=50))),
        pcr("c", NOW, ("Denied", "UnsupportedKeyType", NOW - dt.timedelta(minutes=1))),
        pcr("d", NOW, ("Denied", "PolicyDenied", NOW - dt.timedelta(minutes=61))),
        pcr("e", NOW, ("Failed", "SignerMisconfigured", NOW)),
    ]

    judged = requests(items, NOW, window=dt.timedelta(hours=1))

    assert judged.denials == {"PolicyDenied": 2, "UnsupportedKeyType": 1}
    assert judged.failures == {"SignerMisconfigured": 1}
    assert judged.denied == 4 and not judged.pending


def _gens(created: dt.datetime) -> list[schedule.Generation]:
    bundle = ca.new_ca("test", created)
    return schedule.apply([], schedule.Prepare(), created, new_bundle=bundle)


def test_the_cas_next_step_is_the_schedules() -> None:
    fresh = authority(schedule.to_secret(_gens(NOW)), "ns/ca", NOW)
    assert fresh.problem is None and fresh.rotates
    assert [(g.state, g.root) for g in fresh.generations] == [("active", fresh.generations[0].root)]
    assert fresh.next_step is None
    # Past the prepare point (half of the intermediate's 90 days): prepare the next one.
    later = authority(schedule.to_secret(_gens(NOW)), "ns/ca", NOW + dt.timedelta(days=50))
    assert later.next_step is not None and later.next_step.startswith("prepare")


def test_an_unreadable_ca_says_why_and_an_operators_ca_never_rotates() -> None:
    assert authority("not readable by this identity (403 Forbidden)", "ns/ca", NOW).problem == (
        "not readable by this identity (403 Forbidden)"
    )
    bad = authority({"generations.json": b"[{"}, "ns/ca", NOW)
    assert bad.problem is not None and "generations.json" in bad.problem
    bundle = _gens(NOW)[0].bundle
    operator = authority(ca.to_secret_data(bundle), "ns/ca", NOW + dt.timedelta(days=80))
    assert operator.rotates is False and operator.next_step is None


def test_a_trust_bundle_is_compared_with_the_cas_trusted_roots() -> None:
    gens = _gens(NOW)
    judged = authority(schedule.to_secret(gens), "ns/ca", NOW)
    root_pem = gens[0].root.public_bytes(serialization.Encoding.PEM).decode()
    other_pem = _gens(NOW)[0].root.public_bytes(serialization.Encoding.PEM).decode()

    def ctb(pem: str) -> dict[str, Any]:
        return {"metadata": {"name": "x"}, "spec": {"signerName": SIGNER, "trustBundle": pem}}

    assert trust_bundle(ctb(root_pem), judged.roots).matches_ca is True
    assert trust_bundle(ctb(other_pem), judged.roots).matches_ca is False
    assert trust_bundle(ctb(root_pem), None).matches_ca is None
    assert trust_bundle(ctb("junk"), None).roots == 0


def _inputs(**overrides: Any) -> StatusInputs:
    values: dict[str, Any] = {
        "namespace": "podcert-system",
        "lease_name": "podcert-signer",
        "ca_secret": "podcert-ca",
        "lease": lease(),
        "deployment": None,
        "secret": "the Secret does not exist",
        "trust_bundles": [],
        "requests": [
            pcr("mine", NOW - dt.timedelta(minutes=10)),
            pcr("other", NOW - dt.timedelta(minutes=10), signer="other.dev/x"),
            pcr("builtin", NOW, signer="kubernetes.io/kube-apiserver-client-pod"),
        ],
    }
    values.update(overrides)
    return StatusInputs(**values)


@pytest.mark.parametrize(
    ("overrides", "names", "source"),
    [
        pytest.param({"signer_names": ("other.dev/x",)}, ("other.dev/x",), "flag", id="asked for"),
        pytest.param({}, (SIGNER,), "lease", id="what the leader serves"),
        pytest.param(
            {"lease": None},
            ("other.dev/x", SIGNER),
            "cluster",
            id="every non-kubernetes signer seen",
        ),
    ],
)
def test_the_signer_names_come_from_the_flag_then_the_lease_then_the_cluster(
    overrides: dict[str, Any], names: tuple[str, ...], source: str
) -> None:
    status = build_status(_inputs(**overrides), NOW)

    assert status.signer_names == names
    assert status.names_from == source
    assert status.requests.seen == len(names)


def test_healthy_needs_a_live_leader_and_nothing_stuck() -> None:
    assert not build_status(_inputs(), NOW).healthy  # "mine" waits 10 minutes
    assert build_status(_inputs(requests=[]), NOW).healthy
    assert not build_status(_inputs(requests=[], lease=None), NOW).healthy


def test_the_json_names_every_section() -> None:
    doc = build_status(_inputs(), NOW).as_json()

    assert doc["leader"]["holder"] == "signer-0"
    assert doc["ca"]["readable"] is False
    assert doc["requests"]["stuck"] == 1
    assert doc["healthy"] is False
    assert set(doc) == {
        "time", "namespace", "signerNames", "signerNamesFrom", "healthy", "leader", "replicas",
        "ca", "trustBundles", "requests", "revocations", "stuckAfterSeconds", "windowSeconds",
    }  # fmt: skip


def test_a_ca_whose_keys_are_in_a_token_is_shown_without_the_token() -> None:
    data = schedule.to_secret(_gens(NOW))
    for name in [n for n in data if n.endswith(("tls.key", "ca.key"))]:
        del data[name]
        data[f"{name}-uri"] = b"pkcs11:token=podcert;object=" + name.encode()
    assert not [n for n in data if n.endswith(".key")]
    shown = authority(data, "ns/ca", NOW)
    assert shown.problem is None, shown.problem
    assert [g.state for g in shown.generations] == ["active"]
