"""signer.auditlog.trail: the signer's side of its audit log. Keyed under the CA that signs and
checkpointed at once, re-keyed when another CA signs; a refused write withdraws readiness (and
issuance) until a write succeeds, found by a forced checkpoint every second; without a log,
nothing to do. The log is the real writer's; a full disk is a stand-in that refuses appends, and
the timer's waits are counted, never slept."""

from __future__ import annotations

import base64
import datetime as dt
import errno
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
from cryptography import x509

from podcert.auditlog import audit_certificate_problem, verify
from signer import certs, model
from signer.auditlog import writer
from signer.auditlog.trail import AUDIT_CERT_LIFETIME, PROBE_INTERVAL, AuditTrail
from signer.authority import ca
from signer.metrics import Metrics
from tests.auditlog_world import T0, entry, read_lines

LATER = T0 + dt.timedelta(hours=1)  # when the auditor reads the log


class Disk:
    """The real writer, behind a disk that refuses every write while `full`."""

    def __init__(self, log: writer.AuditLog) -> None:
        self.log = log
        self.full = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.log, name)

    def _refuse(self) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")

    def append(self, item: writer.Entry) -> str:
        self._refuse()
        return self.log.append(item)

    def checkpoint(self, *args: object, **kwargs: object) -> str | None:
        self._refuse()
        return self.log.checkpoint(*args, **kwargs)  # type: ignore[arg-type]


class Ticks(threading.Event):
    """A stop event whose waits return at once: not stopped for the first `turns` of them."""

    def __init__(self, turns: int) -> None:
        super().__init__()
        self.turns = turns
        self.waited: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waited.append(timeout)
        return len(self.waited) > self.turns


@pytest.fixture(scope="module")
def first() -> ca.CABundle:
    return ca.new_ca("first", T0 - dt.timedelta(days=1))


@pytest.fixture(scope="module")
def second() -> ca.CABundle:
    return ca.new_ca("second", T0 - dt.timedelta(days=1))


@pytest.fixture
def log(tmp_path: Path) -> Iterator[writer.AuditLog]:
    with writer.AuditLog(tmp_path / "audit.jsonl", fsync="never") as opened:
        yield opened


def trail_for(
    audit: writer.AuditLog | Disk | None, signing: list[ca.CABundle], metrics: Metrics
) -> AuditTrail:
    """A trail whose signing CA is the last of `signing`."""
    return AuditTrail(
        audit,  # type: ignore[arg-type]
        metrics,
        lambda: ca.issuing_ca(signing[-1]) if signing else None,
        "td.example",
        clock=lambda: T0,
    )


def sample(metrics: Metrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)


def test_start_keys_the_trail_under_the_signing_ca_and_vouches_for_an_empty_log(
    log: writer.AuditLog, first: ca.CABundle
) -> None:
    metrics = Metrics()

    trail_for(log, [first], metrics).start()

    result = verify(read_lines(log.path), [first.root], LATER)
    assert result.ok and result.anchored, result.problems
    assert (result.entries, result.last_checkpoint) == (0, 1)
    assert sample(metrics, "podcert_signer_audit_checkpoint") == 1


def test_with_no_signing_ca_there_is_no_key_and_no_checkpoint(log: writer.AuditLog) -> None:
    trail = trail_for(log, [], Metrics())

    trail.start()
    trail.checkpoint(force=True)

    assert log.lines == 0


def test_a_new_signing_ca_rekeys_the_audit_certificate_under_it(
    log: writer.AuditLog, first: ca.CABundle, second: ca.CABundle
) -> None:
    signing = [first]
    trail = trail_for(log, signing, Metrics())
    trail.start()
    assert trail.record(entry(1))
    trail.on_ca_change()  # the same CA: nothing to do
    assert log.lines == 2

    signing.append(second)
    trail.on_ca_change()

    lines = read_lines(log.path)
    assert len(lines) == 3
    # The new checkpoint's certificate is the second CA's, and it vouches for the whole log once
    # the first root is retired.
    result = verify(lines, [second.root], LATER)
    assert result.ok and result.anchored, result.problems
    assert result.last_checkpoint == 2
    assert not verify(lines, [first.root], LATER).ok


def test_a_refused_write_withdraws_readiness_until_a_write_succeeds(
    log: writer.AuditLog, first: ca.CABundle
) -> None:
    metrics, disk = Metrics(), Disk(log)
    trail = trail_for(disk, [first], metrics)
    trail.start()

    disk.full = True
    assert trail.record(entry(1)) is False
    assert trail.record(entry(2)) is False

    assert not trail.writable()
    assert sample(metrics, "podcert_signer_audit_log_writable") == 0
    assert sample(metrics, "podcert_signer_audit_log_errors_total") == 2
    disk.full = False
    assert trail.record(entry(3))
    assert trail.writable()
    assert sample(metrics, "podcert_signer_audit_log_writable") == 1
    assert [e.name for e in writer.iter_entries(read_lines(log.path))] == ["web-3-pcr"]


def test_while_the_log_refuses_writes_the_timer_probes_it_every_second_with_a_checkpoint(
    log: writer.AuditLog, first: ca.CABundle
) -> None:
    disk = Disk(log)
    trail = trail_for(disk, [first], Metrics())
    trail.start()
    disk.full = True
    trail.record(entry(1))
    disk.full = False  # space is back; only a write finds out
    ticks = Ticks(turns=1)

    trail.run(ticks)

    # One probe a second while unwritable; once it took a checkpoint, the normal interval.
    assert ticks.waited == [PROBE_INTERVAL, trail.checkpoint_interval]
    assert trail.writable()
    result = verify(read_lines(log.path), [first.root], LATER)
    assert result.ok and result.last_checkpoint == 2  # the probe was forced: nothing was new


def test_without_a_log_every_call_is_a_no_op_and_the_trail_stays_writable(
    first: ca.CABundle,
) -> None:
    trail = trail_for(None, [first], Metrics())

    trail.start()
    trail.on_ca_change()
    trail.checkpoint(force=True)

    assert not trail.enabled
    assert trail.record(entry(1))
    assert trail.writable()


def test_the_audit_certificate_is_an_audit_certificate_backdated_like_a_leaf(
    log: writer.AuditLog, first: ca.CABundle
) -> None:
    trail_for(log, [first], Metrics()).start()

    (checkpoint,) = read_lines(log.path)
    x5c = jwt.get_unverified_header(json.loads(checkpoint)["jwt"])["x5c"]
    certificate = x509.load_der_x509_certificate(base64.b64decode(x5c[0]))
    assert audit_certificate_problem(certificate) is None
    assert certificate.not_valid_before_utc == T0 - certs.DEFAULT_LEAF_BACKDATE
    assert certificate.not_valid_after_utc == T0 - certs.DEFAULT_LEAF_BACKDATE + AUDIT_CERT_LIFETIME


def test_an_audit_certificate_the_cas_token_refuses_is_retried_each_probe_and_counted(
    log: writer.AuditLog, first: ca.CABundle, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = Metrics()
    trail = trail_for(log, [first], metrics)
    sign = certs.sign_audit_certificate

    def refused(*args: object) -> str:
        raise model.KeyUnavailable("token 't' refused a signature")

    monkeypatch.setattr(certs, "sign_audit_certificate", refused)
    trail.start()
    assert log.lines == 0  # no key, so no checkpoint yet, and no crash
    assert sample(metrics, "podcert_signer_token_errors_total") == 1

    monkeypatch.setattr(certs, "sign_audit_certificate", sign)
    ticks = Ticks(turns=1)
    trail.run(ticks)

    assert ticks.waited[0] == PROBE_INTERVAL  # a pending re-key is probed every second
    result = verify(read_lines(log.path), [first.root], LATER)
    assert result.ok and result.anchored, result.problems
    assert result.last_checkpoint >= 1
