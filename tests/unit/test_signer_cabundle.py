"""The caBundle the signer keeps on its own ValidatingWebhookConfiguration, decided
from the CA set, and when there is nothing to write."""

from __future__ import annotations

import base64
import copy
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from signer.admission import cabundle
from signer.authority import ca, schedule

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
MANIFEST = Path(__file__).resolve().parents[2] / "manifests" / "signer" / "admission-webhook.yaml"


def shipped() -> dict[str, Any]:
    """The configuration as `kubectl apply -k manifests/signer` stores it (no caBundle)."""
    config: dict[str, Any] = yaml.safe_load(MANIFEST.read_text())
    config["metadata"]["resourceVersion"] = "41"
    return config


def held(config: dict[str, Any], index: int = 0) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(
        base64.b64decode(config["webhooks"][index]["clientConfig"]["caBundle"])
    )


def test_the_shipped_configuration_gets_the_roots_and_nothing_else_changes() -> None:
    roots = [ca.new_ca("a", T0).root]
    config = shipped()
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    out = cabundle.updated(config, roots)
    assert out is not None
    assert held(out) == roots
    del out["webhooks"][0]["clientConfig"]["caBundle"]
    assert out == config  # the Service reference, rules, resourceVersion: as read
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]  # the input is not touched


def test_nothing_to_write_when_every_webhook_holds_the_roots_in_any_order() -> None:
    roots = [ca.new_ca("a", T0).root, ca.new_ca("b", T0).root]
    config = cabundle.updated(shipped(), roots)
    assert config is not None
    assert cabundle.updated(config, roots) is None
    assert cabundle.updated(config, list(reversed(roots))) is None
    assert cabundle.updated(config, [*roots, roots[0]]) is None  # duplicates count once


@pytest.mark.parametrize(
    "bundle",
    [
        pytest.param("not base64!", id="not base64"),
        pytest.param(base64.b64encode(b"no certificate here").decode(), id="no PEM in it"),
        pytest.param("", id="empty"),
    ],
)
def test_an_unreadable_bundle_is_replaced(bundle: str) -> None:
    roots = [ca.new_ca("a", T0).root]
    config = shipped()
    config["webhooks"][0]["clientConfig"]["caBundle"] = bundle
    out = cabundle.updated(config, roots)
    assert out is not None and held(out) == roots


def test_a_bundle_with_a_root_too_many_or_too_few_is_replaced() -> None:
    a, b = ca.new_ca("a", T0).root, ca.new_ca("b", T0).root
    both = cabundle.updated(shipped(), [a, b])
    assert both is not None
    out = cabundle.updated(both, [b])
    assert out is not None and held(out) == [b]
    out = cabundle.updated(cabundle.updated(shipped(), [a]) or {}, [a, b])
    assert out is not None and held(out) == [a, b]


def test_every_webhook_of_the_configuration_is_kept() -> None:
    roots = [ca.new_ca("a", T0).root]
    config = shipped()
    second = copy.deepcopy(config["webhooks"][0])
    second["name"] = "second.podcert.dev"
    config["webhooks"].append(second)
    config = cabundle.updated(config, roots) or {}
    assert held(config, 0) == held(config, 1) == roots
    config["webhooks"][1]["clientConfig"]["caBundle"] = ""
    out = cabundle.updated(config, roots)
    assert out is not None and held(out, 1) == roots


@pytest.mark.parametrize(
    "config",
    [
        pytest.param({"metadata": {"name": "x"}}, id="no webhooks"),
        pytest.param({"metadata": {"name": "x"}, "webhooks": []}, id="empty webhooks"),
        pytest.param(
            {"metadata": {"name": "x"}, "webhooks": ["odd"]}, id="a webhook not an object"
        ),
        pytest.param(
            {"metadata": {"name": "x"}, "webhooks": [{"clientConfig": "odd"}]},
            id="a clientConfig not an object",
        ),
    ],
)
def test_nothing_to_write_where_there_is_no_webhook_to_hold_a_bundle(
    config: dict[str, Any],
) -> None:
    assert cabundle.updated(config, [ca.new_ca("a", T0).root]) is None


def test_no_roots_is_no_decision() -> None:
    """Before a CA is loaded nothing is written (an empty bundle would fail every call)."""
    assert cabundle.updated(shipped(), []) is None


def test_through_a_rotation_the_bundle_trusts_the_serving_certificate_before_and_after() -> None:
    """The serving certificate is issued by the active CA, and re-issued by each replica when
    it sees another one activate: at every step, the bundle the leader wrote already trusts
    the CA that signs now and the one that signs next, and keeps trusting the one that signed
    before until it is removed."""
    settings = schedule.Settings()
    gens = schedule.apply([], schedule.Prepare(), T0, settings, ca.new_ca("g1", T0))
    first = gens[0].root

    def bundle_for(generations: list[schedule.Generation]) -> list[x509.Certificate]:
        config = cabundle.updated(shipped(), schedule.trusted_roots(generations))
        assert config is not None
        return held(config)

    assert bundle_for(gens) == [first]
    t1 = T0 + dt.timedelta(days=45)
    gens = schedule.apply(gens, schedule.Prepare(), t1, settings, ca.new_ca("g2", t1))
    second = next(g for g in gens if g.state == "prepared").root
    assert set(bundle_for(gens)) == {first, second}  # the next signer is trusted before it signs
    t2 = t1 + settings.overlap
    gens = schedule.apply(gens, schedule.Activate(gens[1].id), t2, settings)
    assert [g.root for g in gens if g.state == "active"] == [second]
    assert set(bundle_for(gens)) == {first, second}  # a lagging replica still serves from first
    retired = next(g for g in gens if g.state == "retired")
    gens = schedule.apply(
        gens, schedule.Remove(retired.id), t2 + settings.max_leaf_lifetime, settings
    )
    assert bundle_for(gens) == [second]
