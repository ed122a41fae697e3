"""signer.build: a signer process's pieces, wired. `build` gives every piece the one registry and
the loaded CA; readiness waits for a writable audit log; without leader election this replica
leads at once; the webhook's caBundle is kept only when a configuration is named; and a change of
the CA set, or of leadership, reaches every piece that follows it. Nothing is started: the API is
never reached, the CA Secret is held in memory (`SecretKube`) and the clock is fixed."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any, cast

import pytest

from podcert.auditlog import verify
from podcert.reconcile.runtime import Runtime
from podcert.reconcile.workqueue import WorkQueue
from signer import build
from signer.authority import schedule
from signer.authority.castore import CAStore
from signer.kube import SignerKube
from signer.policy import default_policy
from tests.auditlog_world import entry, read_lines
from tests.ca_secrets import SecretKube

SIGNER = "example.com/podcert"
NOW = dt.datetime(2026, 12, 1, 17, 0, tzinfo=dt.UTC)
UNREACHABLE = cast(SignerKube, object())  # nothing built here may call the API


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's clock, as `build` hands it to the pieces."""
    monkeypatch.setattr(build, "utcnow", lambda: NOW)


def config(**fields: Any) -> build.Config:
    defaults: dict[str, Any] = {
        "signer_names": (SIGNER,),
        "policy": default_policy([SIGNER], "td.test"),
        "namespace": "podcert",
        "leader_elect": False,
    }
    return build.Config(**{**defaults, **fields})


def built(**fields: Any) -> tuple[build.Signer, Runtime]:
    cas = CAStore(cast(SignerKube, SecretKube(None)), "podcert", "podcert-ca", lambda: NOW)
    assert cas.load() is not None
    runtime = Runtime("signer")
    return build.build(config(**fields), UNREACHABLE, cas, runtime), runtime


def sample(signer: build.Signer, name: str, **labels: str) -> float | None:
    return signer.metrics.registry.get_sample_value(name, labels or None)


def test_the_metrics_start_from_the_loaded_ca() -> None:
    signer, _ = built()

    bundle = signer.cas.bundle
    assert bundle is not None
    expiry = sample(signer, "podcert_signer_ca_not_after_timestamp_seconds")
    assert expiry == bundle.not_after.timestamp()
    assert sample(signer, "podcert_signer_ca_generations", state="active") == 1
    assert sample(signer, "podcert_signer_ca_generations", state="prepared") == 0


def test_the_audit_log_is_opened_where_configured_its_folder_made(tmp_path: Path) -> None:
    path = tmp_path / "not" / "there" / "audit.jsonl"

    signer, _ = built(audit_log=path)

    assert signer.audit is not None and signer.trail.enabled
    assert signer.audit.path == path and path.exists()
    signer.audit.close()
    assert not built()[0].trail.enabled  # no path, no log


def test_readiness_is_withdrawn_while_the_audit_log_refuses_writes(tmp_path: Path) -> None:
    signer, runtime = built(audit_log=tmp_path / "audit.jsonl")
    assert signer.audit is not None
    assert runtime.ready()

    signer.audit.close()  # every write is refused from here on

    assert not signer.trail.record(entry(1))
    assert not runtime.ready()


def test_without_leader_election_this_replica_leads_from_the_start() -> None:
    assert built(leader_elect=False)[0].leading.is_set()
    assert not built(leader_elect=True)[0].leading.is_set()


def test_the_webhooks_ca_bundle_is_kept_only_when_a_configuration_is_named() -> None:
    assert built()[0].injector is None
    named = built(webhook_configuration="podcert-signer")[0].injector
    assert named is not None and named.name == "podcert-signer"


def drained(queue: WorkQueue[str]) -> list[str]:
    """The keys `queue` held, taken and done with."""
    keys = []
    while (key := queue.get(timeout=0)) is not None:
        queue.done(key)
        keys.append(key)
    return keys


def test_a_new_active_ca_reaches_the_metrics_the_audit_trail_and_the_publishers(
    tmp_path: Path,
) -> None:
    signer, _ = built(audit_log=tmp_path / "audit.jsonl", webhook_configuration="podcert-signer")
    assert signer.audit is not None and signer.injector is not None
    prepared = signer.cas.step(schedule.Prepare())[-1]
    assert drained(signer.publisher.queue) == [SIGNER]  # both roots into the trust bundles
    assert drained(signer.injector.queue) == ["podcert-signer"]

    signer.cas.step(schedule.Activate(prepared.id))

    assert sample(signer, "podcert_signer_ca_generations", state="retired") == 1
    assert sample(signer, "podcert_signer_ca_generations", state="active") == 1
    # The trail re-keyed under the new CA: a checkpoint that chains to the new root.
    result = verify(read_lines(signer.audit.path), [prepared.root], NOW)
    assert result.ok and result.anchored, result.problems
    assert drained(signer.publisher.queue) == [SIGNER]
    assert drained(signer.injector.queue) == ["podcert-signer"]
    signer.audit.close()


def test_leading_is_exported_and_starts_the_publishers() -> None:
    signer, _ = built(webhook_configuration="podcert-signer")
    assert signer.injector is not None

    signer.started_leading()
    assert sample(signer, "podcert_signer_leader") == 1
    assert drained(signer.publisher.queue) == [SIGNER]
    assert drained(signer.injector.queue) == ["podcert-signer"]

    signer.stopped_leading()
    assert sample(signer, "podcert_signer_leader") == 0
