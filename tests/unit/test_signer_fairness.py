"""The signer's share of its workers: requests queue by node, then namespace, and a node over the
policy's per-node rate waits for its turn to be issued (never a denial). No API server: the
controller's kube is a bare object; facts and decide are stubbed, and the one writer (`apply`)
records the settlements instead of writing them."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import cast

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from podcert.api import requests
from podcert.reconcile.ratelimit import Rate
from signer import model
from signer.authority import ca
from signer.authority.castore import CAStore
from signer.issue import controller as controller_module
from signer.issue.controller import Controller, Key, Settings, utcnow
from signer.issue.settle import Settlement
from signer.kube import SignerKube
from signer.metrics import Metrics
from signer.policy import Policy, SignerPolicy

SIGNER = "podcert.dev/test"
NOW = dt.datetime(2026, 5, 1, 12, tzinfo=dt.UTC)
ISSUER = ca.issuing_ca(ca.new_ca("fairness", NOW - dt.timedelta(days=1)))


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def controller(
    rate: Rate | None = None, *, fair: bool = True, clock: Clock | None = None
) -> Controller:
    kube = cast(SignerKube, object())
    return Controller(
        kube,
        [SIGNER],
        Policy({SIGNER: SignerPolicy(SIGNER, "cluster.local", rate_per_node=rate)}),
        CAStore(kube, "podcert-system", "podcert-ca", utcnow),
        Metrics(),
        settings=Settings(fair_queue=fair),
        monotonic=clock or Clock(),
    )


def pcr(namespace: str, name: str, node: str) -> requests.Read:
    return requests.read_request(
        {
            "metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"},
            "spec": {
                "signerName": SIGNER,
                "podName": "web",
                "podUID": "pod-uid",
                "serviceAccountName": "default",
                "serviceAccountUID": "sa-uid",
                "nodeName": node,
                "nodeUID": f"{node}-uid",
                "stubPKCS10Request": "c3R1Yg==",  # not a CSR: denied InvalidRequest
            },
        }
    )


def seen(ctrl: Controller, *objs: requests.Read) -> list[Key]:
    """Feed requests as the PCR watch would: into the store, then the queue."""
    for obj in objs:
        ctrl._on_pcr_event("ADDED", obj)
    return [(o.namespace, o.name) for o in objs]


def test_a_nodes_flood_does_not_queue_ahead_of_another_nodes_request() -> None:
    ctrl = controller()
    seen(ctrl, *(pcr("ns", f"flood-{i}", "node-a") for i in range(1500)))
    (lone,) = seen(ctrl, pcr("ns", "lone", "node-b"))
    assert lone in [ctrl.queue.get(timeout=0), ctrl.queue.get(timeout=0)]


def test_without_the_fair_queue_the_flood_goes_first() -> None:
    ctrl = controller(fair=False)
    seen(ctrl, *(pcr("ns", f"flood-{i}", "node-a") for i in range(100)))
    seen(ctrl, pcr("ns", "lone", "node-b"))
    served = [ctrl.queue.get(timeout=0) for _ in range(101)]
    assert served[-1] == ("ns", "lone")


@pytest.mark.parametrize(
    ("stored", "flow"),
    [
        pytest.param(pcr("ns", "r", "node-a"), ("node-a", "ns"), id="node, then namespace"),
        pytest.param(None, ("", "ns"), id="a request not in the store shares the default node"),
        pytest.param(
            requests.read_request({"metadata": {"namespace": "ns", "name": "r"}, "spec": "junk"}),
            ("", "ns"),
            id="a spec that is not a mapping",
        ),
        pytest.param(
            requests.read_request(
                {"metadata": {"namespace": "ns", "name": "r"}, "spec": {"nodeName": 7}}
            ),
            ("", "ns"),
            id="a node name that is not a string",
        ),
    ],
)
def test_flow_of_a_request(stored: requests.Read | None, flow: tuple[str, str]) -> None:
    ctrl = controller()
    if stored is not None:
        ctrl._store[("ns", "r")] = stored
    assert ctrl._flow(("ns", "r")) == flow


@dataclass
class Outcomes:
    """What reconcile did, with facts and decide stubbed out and nothing written."""

    issued: list[str] = field(default_factory=list)
    settled: list[str] = field(default_factory=list)


def deciding(
    ctrl: Controller, monkeypatch: pytest.MonkeyPatch, decision: model.Decision
) -> Outcomes:
    """Every request gets `decision`; its settlement is recorded, not written."""
    out = Outcomes()
    monkeypatch.setattr(
        ctrl, "facts", lambda request, seen_at, **_: model.Facts(None, None, None, ca=ISSUER)
    )
    monkeypatch.setattr(controller_module, "decide", lambda *args, **kwargs: decision)

    def apply(settlement: Settlement) -> None:
        name = settlement.key[1]
        (out.issued if settlement.outcome == "Issued" else out.settled).append(name)

    monkeypatch.setattr(ctrl, "apply", apply)
    return out


ISSUE = model.Issue(
    model.LeafPlan(
        public_key=ec.generate_private_key(ec.SECP256R1()).public_key(),
        spiffe_id="spiffe://cluster.local/ns/ns/sa/default",
        dns_names=(),
        not_before=NOW - dt.timedelta(minutes=1),
        not_after=NOW + dt.timedelta(hours=1),
        begin_refresh_at=NOW + dt.timedelta(minutes=30),
    )
)


def test_a_node_over_its_rate_is_held_back_not_denied(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    ctrl = controller(Rate(per_second=10.0, burst=2), clock=clock)
    out = deciding(ctrl, monkeypatch, ISSUE)
    keys = seen(ctrl, *(pcr("ns", f"r{i}", "node-a") for i in range(5)))
    with caplog.at_level(logging.WARNING, logger="podcert.signer"):
        waits = [ctrl.reconcile(key) for key in keys]
    assert out.issued == ["r0", "r1"]  # the burst
    assert waits[:2] == [None, None]
    assert waits[2:] == pytest.approx([0.1, 0.2, 0.3])  # requeued for their turns
    assert out.settled == [], "nothing denied"
    held = ctrl.metrics.registry.get_sample_value(
        "podcert_signer_rate_limited_total", {"signer_name": SIGNER, "reason": "NodeRateLimit"}
    )
    assert held == 3
    # Logged rarely: one line for the three, naming the node.
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "node node-a is over its rate limit" in lines[0]
    # Each keeps its place: back on time, it is issued.
    clock.now += 0.1
    assert ctrl.reconcile(keys[2]) is None
    assert out.issued[-1] == "r2"


def test_another_node_is_not_held_back_by_a_flooding_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctrl = controller(Rate(per_second=1.0, burst=1), clock=Clock())
    out = deciding(ctrl, monkeypatch, ISSUE)
    for key in seen(ctrl, *(pcr("ns", f"r{i}", "node-a") for i in range(3))):
        ctrl.reconcile(key)
    (other,) = seen(ctrl, pcr("ns", "other", "node-b"))
    assert ctrl.reconcile(other) is None
    assert out.issued == ["r0", "other"]


def test_denials_spend_no_tokens_so_naming_a_node_cannot_drain_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Anyone allowed to create requests may put any node in spec.nodeName; such requests
    are denied (the pod is not on that node) and must not use up the node's rate."""
    ctrl = controller(Rate(per_second=1.0, burst=1), clock=Clock())
    out = deciding(ctrl, monkeypatch, model.Deny(model.POD_NOT_ON_NODE, "not here"))
    for key in seen(ctrl, *(pcr("ns", f"spoof{i}", "node-b") for i in range(20))):
        assert ctrl.reconcile(key) is None
    assert len(out.settled) == 20
    out = deciding(ctrl, monkeypatch, ISSUE)
    (real,) = seen(ctrl, pcr("web", "real", "node-b"))
    assert ctrl.reconcile(real) is None
    assert out.issued == ["real"]


def test_without_a_rate_limit_nothing_is_held_back(monkeypatch: pytest.MonkeyPatch) -> None:
    ctrl = controller()
    out = deciding(ctrl, monkeypatch, ISSUE)
    keys = seen(ctrl, *(pcr("ns", f"r{i}", "node-a") for i in range(50)))
    assert ctrl._node_rates == {}
    assert [ctrl.reconcile(key) for key in keys] == [None] * 50
    assert len(out.issued) == 50
