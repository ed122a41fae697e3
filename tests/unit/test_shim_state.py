"""kubelet_shim.state: a pod object read into what the agent serves (`pod_from`: its UID, the
rotate-now annotation, whether it still runs), and the small records one reconcile keeps: the
earliest wake a `Requeue` was asked for, one-off notes a pod's `Memory` says once, the files a
`VolumePlan` gathers."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import pytest

from kubelet_shim.kube import ROTATE_ANNOTATION, PodRef
from kubelet_shim.state import Memory, Requeue, VolumePlan, log_context, pod_from
from podcert.api import keys
from podcert.api.pods import WorkKey
from tests.objects import pod_object

UID = "0b7c6a1e-6f5e-4a57-9a3c-2d7b0c1f9e11"
T0 = dt.datetime(2026, 11, 29, 20, 0, tzinfo=dt.UTC)
CERT = {
    "name": "identity",
    "projected": {
        "sources": [
            {
                "podCertificate": {
                    "signerName": "example.com/podcert",
                    "keyType": "ECDSAP256",
                    "credentialBundlePath": "bundle.pem",
                }
            }
        ]
    },
}
TRUST = {
    "name": "trust",
    "projected": {"sources": [{"clusterTrustBundle": {"name": "roots", "path": "ca.pem"}}]},
}


def pod(volumes: list[Any] | None = None, **changes: Any) -> dict[str, Any]:
    return pod_object(
        "web", [CERT] if volumes is None else volumes, namespace="prod", uid=UID, **changes
    )


# --- pod_from -------------------------------------------------------------------------------------


def test_a_pod_reads_as_its_reference_and_volumes() -> None:
    read = pod_from(pod())
    assert read is not None
    assert read.ref == PodRef("prod", "web", UID)
    assert [volume.name for volume in read.volumes.volumes] == ["identity"]
    assert (read.force_after, read.terminal) == (None, False)


def test_a_pod_without_a_uid_is_nothing_to_serve() -> None:
    obj = pod()
    del obj["metadata"]["uid"]
    assert pod_from(obj) is None


@pytest.mark.parametrize(
    ("stamp", "force_after"),
    [
        pytest.param("2026-11-29T20:00:30Z", T0 + dt.timedelta(seconds=30), id="whole seconds"),
        pytest.param(
            "2026-11-29T21:00:00.5+01:00",
            T0 + dt.timedelta(milliseconds=500),
            id="an offset and a fraction",
        ),
    ],
)
def test_the_rotate_annotation_is_the_instant_credentials_must_be_newer_than(
    stamp: str, force_after: dt.datetime
) -> None:
    read = pod_from(pod(annotations={ROTATE_ANNOTATION: stamp}))
    assert read is not None and read.force_after == force_after


def test_a_rotate_annotation_that_is_no_time_is_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, "podcert.shim"):
        read = pod_from(pod(annotations={ROTATE_ANNOTATION: "yesterday"}))
    assert read is not None and read.force_after is None
    [record] = caplog.records
    assert ROTATE_ANNOTATION in record.getMessage() and "'yesterday'" in record.getMessage()
    assert (record.namespace, record.pod) == ("prod", "web")  # type: ignore[attr-defined]


def test_annotations_of_the_wrong_shape_are_no_rotation() -> None:
    obj = pod()
    obj["metadata"]["annotations"] = ["not", "a", "map"]
    read = pod_from(obj)
    assert read is not None and read.force_after is None


@pytest.mark.parametrize(
    ("phase", "terminal"),
    [
        ("Pending", False),
        ("Running", False),
        ("Succeeded", True),
        ("Failed", True),
        ("Unknown", False),
        (None, False),
    ],
)
def test_only_a_finished_pod_is_terminal(phase: str | None, terminal: bool) -> None:
    read = pod_from(pod(phase=phase))
    assert read is not None and read.terminal is terminal


@pytest.mark.parametrize(
    ("volumes", "has_trust"),
    [
        pytest.param([CERT], False, id="a certificate only"),
        pytest.param([CERT, TRUST], True, id="a trust bundle too"),
        pytest.param([], False, id="no projected volume"),
    ],
)
def test_a_pod_says_whether_it_has_trust_sources(volumes: list[Any], has_trust: bool) -> None:
    read = pod_from(pod(volumes))
    assert read is not None and read.has_trust_sources is has_trust


# --- what one reconcile keeps ---------------------------------------------------------------------


def test_a_requeue_keeps_the_earliest_wake_asked_for() -> None:
    requeue = Requeue()
    requeue.wake(None)
    assert requeue.wake_at is None
    requeue.wake(T0 + dt.timedelta(hours=2))
    requeue.wake(T0 + dt.timedelta(hours=1))
    requeue.wake(None)
    requeue.wake(T0 + dt.timedelta(hours=3))
    assert requeue.wake_at == T0 + dt.timedelta(hours=1)
    assert requeue.retry is False


def test_a_note_is_first_once_until_it_is_dropped() -> None:
    memory = Memory()
    note = ("unsafe-volume", "identity")
    assert memory.first(note)
    assert not memory.first(note)
    assert memory.first(("unsafe-volume", "trust")), "another note is its own"
    memory.noted.discard(note)
    assert memory.first(note)


def test_a_memory_leaves_the_keys_it_holds_out_of_its_repr() -> None:
    memory = Memory()
    memory.unanswered[WorkKey(UID, "identity", 0)] = keys.generate("ECDSAP256")
    assert "unanswered" not in repr(memory) and "PrivateKey" not in repr(memory)


def test_a_volume_plan_keeps_the_last_data_and_mode_put_at_a_path() -> None:
    plan = VolumePlan()
    plan.put("bundle.pem", b"old", 0o600)
    plan.put("ca.pem", b"roots", 0o644)
    plan.put("bundle.pem", b"new", 0o400)
    assert plan.files == {"bundle.pem": b"new", "ca.pem": b"roots"}
    assert plan.modes == {"bundle.pem": 0o400, "ca.pem": 0o644}


def test_log_context_names_the_pod_and_the_volume_when_there_is_one() -> None:
    read = pod_from(pod())
    assert read is not None
    assert log_context(read, None) == {"namespace": "prod", "pod": "web"}
    assert log_context(read, "identity") == {
        "namespace": "prod",
        "pod": "web",
        "volume": "identity",
    }
