"""kubelet_shim.sync: one pod's volumes brought in line with the agent's caches by `PodSync`,
driven directly over the memory storage and the agent tests' fake API. What it decides about
volumes rather than certificates: a trust file kept while its required bundle is missing, and told
about once; a volume with nothing to serve left alone, an unchanged one not rewritten, an
unreadable one replaced, a failed write retried; a pod spec's problems told once; and a deleted
pod's clean-up, retried where a retry can help and left to the operator where a link is in the
way. (The certificates' side, and the agent around it, are test_shim_agent.py's.)"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping

import pytest

from kubelet_shim import projection, trust
from kubelet_shim.metrics import Metrics
from kubelet_shim.state import Caches, Tracked, pod_from
from kubelet_shim.storage import FileSpec, MemoryStorage, StorageError, UnsafeDirectoryError
from kubelet_shim.sync import PodSync
from podcert.api.pods import WorkKey
from podcert.api.requests import read_request
from podcert.client.rest import JSON, ApiError
from tests.unit.test_bundles_formats import Authority
from tests.unit.test_shim_agent import NS, UID, Clock, FakeKube, make_pod

ROOTS = Authority("sync test root")
OTHER = Authority("sync test other root")


class Storage(MemoryStorage):
    """The memory twin, with a failure to raise for each of the calls a sync makes."""

    def __init__(self) -> None:
        super().__init__()
        self.fail: dict[str, StorageError] = {}

    def recover_volume(self, pod_uid: str, volume: str) -> None:
        if "recover" in self.fail:
            raise self.fail["recover"]
        super().recover_volume(pod_uid, volume)

    def read_volume(self, pod_uid: str, volume: str) -> Mapping[str, bytes] | None:
        if "read" in self.fail:
            raise self.fail["read"]
        return super().read_volume(pod_uid, volume)

    def remove_pod(self, pod_uid: str) -> None:
        if "remove" in self.fail:
            raise self.fail["remove"]
        super().remove_pod(pod_uid)


class Rig:
    def __init__(self) -> None:
        self.kube = FakeKube()
        self.storage = Storage()
        self.caches = Caches()
        self.metrics = Metrics()
        self.sync = PodSync(
            self.kube,  # type: ignore[arg-type]
            self.storage,
            self.caches,
            self.metrics,
            settings=projection.Settings(),
            clock=Clock(),
            rng=random.Random(7),
        )

    def has_pod(self, obj: JSON) -> None:
        pod = pod_from(obj)
        assert pod is not None
        self.caches.pods[pod.ref.uid] = pod

    def has_bundle(self, name: str, *roots: Authority) -> None:
        pem = b"".join(root.pem for root in roots)
        parsed = trust.parse_bundle(
            {"metadata": {"name": name}, "spec": {"trustBundle": pem.decode()}}
        )
        assert parsed is not None
        self.caches.bundles[name] = parsed

    def has_request(self, name: str, status: JSON | None = None) -> None:
        obj = {
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
            "spec": {"podUID": UID},
            "status": status or {},
        }
        self.caches.pcrs[NS, name] = read_request(obj)
        self.caches.pcrs_by_pod.setdefault(UID, set()).add((NS, name))

    def files(self, volume: str = "trust") -> dict[str, bytes]:
        return dict(self.storage.read_volume(UID, volume) or {})

    def count(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return value or 0.0


@pytest.fixture
def rig() -> Rig:
    return Rig()


def trust_volume(*sources: JSON, name: str = "trust") -> JSON:
    return {
        "name": name,
        "projected": {"sources": [{"clusterTrustBundle": source} for source in sources]},
    }


# --- trust files ----------------------------------------------------------------------------------


def test_a_missing_required_bundle_keeps_the_pods_file_and_is_told_once_per_absence(
    rig: Rig,
) -> None:
    rig.has_pod(make_pod([trust_volume({"name": "roots", "path": "ca.pem"})]))
    rig.has_bundle("roots", ROOTS)
    rig.sync.reconcile(UID)
    assert rig.files() == {"ca.pem": ROOTS.pem}

    del rig.caches.bundles["roots"]
    for _ in range(3):
        requeue = rig.sync.reconcile(UID)
        assert not requeue.retry, "a new bundle event brings the pod back, not a retry"
    assert rig.files() == {"ca.pem": ROOTS.pem}, "the pod keeps the roots it had"
    assert rig.kube.reasons() == ["TrustBundleUnavailable"]
    assert "ClusterTrustBundle 'roots' not found" in rig.kube.events[0][3]

    rig.has_bundle("roots", OTHER)
    rig.sync.reconcile(UID)
    assert rig.files() == {"ca.pem": OTHER.pem}
    del rig.caches.bundles["roots"]
    rig.sync.reconcile(UID)
    assert rig.kube.reasons() == ["TrustBundleUnavailable"] * 2, "a new absence is told again"


def test_a_missing_required_bundle_writes_nothing_where_there_was_nothing(rig: Rig) -> None:
    rig.has_pod(make_pod([trust_volume({"name": "roots", "path": "ca.pem"})]))
    rig.sync.reconcile(UID)
    assert rig.storage.writes == 0
    assert rig.storage.read_volume(UID, "trust") is None


def test_an_unchanged_volume_is_not_written_again(rig: Rig) -> None:
    rig.has_pod(make_pod([trust_volume({"name": "roots", "path": "ca.pem"})]))
    rig.has_bundle("roots", ROOTS)
    rig.sync.reconcile(UID)
    rig.sync.reconcile(UID)
    rig.has_bundle("unrelated", OTHER)
    rig.sync.reconcile(UID)
    assert rig.storage.writes == 1
    assert rig.count("podcert_shim_volume_writes_total", result="ok") == 1


def test_a_volume_with_no_source_the_shim_serves_is_left_alone(rig: Rig) -> None:
    config_map = {"name": "settings", "projected": {"sources": [{"configMap": {"name": "cm"}}]}}
    rig.has_pod(make_pod([config_map]))
    requeue = rig.sync.reconcile(UID)
    assert (requeue.retry, requeue.wake_at) == (False, None)
    assert rig.storage.list_pods() == []


# --- the disk misbehaving -------------------------------------------------------------------------


def test_a_failed_write_is_retried_and_counted(rig: Rig) -> None:
    rig.has_pod(make_pod([trust_volume({"name": "roots", "path": "ca.pem"})]))
    rig.has_bundle("roots", ROOTS)
    rig.storage.fail_next_write(OSError(28, "No space left on device"))
    assert rig.sync.reconcile(UID).retry
    assert rig.count("podcert_shim_volume_writes_total", result="error") == 1
    assert not rig.sync.reconcile(UID).retry
    assert rig.files() == {"ca.pem": ROOTS.pem}


def test_an_unreadable_volume_is_replaced(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    rig.storage.write_volume(UID, "trust", {"ca.pem": FileSpec(b"old", 0o644)}, None)
    rig.storage.fail["read"] = StorageError("trust", "unreadable: I/O error")
    rig.has_pod(make_pod([trust_volume({"name": "roots", "path": "ca.pem"})]))
    rig.has_bundle("roots", ROOTS)
    with caplog.at_level(logging.WARNING, "podcert.shim"):
        assert not rig.sync.reconcile(UID).retry
    del rig.storage.fail["read"]
    assert rig.files() == {"ca.pem": ROOTS.pem}
    assert "volume unreadable, will replace it" in caplog.text


def test_an_interrupted_write_that_cannot_be_finished_does_not_stop_the_sync(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.storage.fail["recover"] = StorageError("trust", "cannot finish an interrupted write")
    rig.has_pod(make_pod([trust_volume({"name": "roots", "path": "ca.pem"})]))
    rig.has_bundle("roots", ROOTS)
    with caplog.at_level(logging.WARNING, "podcert.shim"):
        assert not rig.sync.reconcile(UID).retry
    assert rig.files() == {"ca.pem": ROOTS.pem}
    assert "cannot finish an interrupted write" in caplog.text


# --- the pod spec's problems ----------------------------------------------------------------------


def test_a_pod_specs_problems_are_told_once_and_the_rest_is_served(rig: Rig) -> None:
    broken = {
        "name": "identity",
        "projected": {
            "sources": [{"podCertificate": {"signerName": "example.com/x", "keyType": "DSA"}}]
        },
    }
    rig.has_pod(make_pod([broken, trust_volume({"name": "roots", "path": "ca.pem"})]))
    rig.has_bundle("roots", ROOTS)
    rig.sync.reconcile(UID)
    rig.sync.reconcile(UID)
    assert rig.kube.reasons() == ["InvalidProjectedVolume"]
    assert "keyType" in rig.kube.events[0][3]
    assert rig.files() == {"ca.pem": ROOTS.pem}


# --- a deleted pod --------------------------------------------------------------------------------


def deleted_pod_with_requests(rig: Rig) -> None:
    """A pod the sync served, gone from the caches, with one request still pending and one
    answered."""
    rig.has_pod(make_pod([trust_volume({"name": "roots", "path": "ca.pem"})]))
    rig.has_bundle("roots", ROOTS)
    rig.sync.reconcile(UID)
    rig.has_request("pending")
    rig.has_request("answered", {"conditions": [{"type": "Denied", "status": "True"}]})
    del rig.caches.pods[UID]


def test_a_deleted_pods_files_go_and_only_its_pending_requests_are_deleted(rig: Rig) -> None:
    deleted_pod_with_requests(rig)
    requeue = rig.sync.reconcile(UID)
    assert not requeue.retry
    assert rig.storage.list_pods() == []
    assert rig.kube.deleted == ["pending"]
    assert UID not in rig.sync.memory


def test_requests_a_node_may_not_delete_are_left_to_the_collector(rig: Rig) -> None:
    deleted_pod_with_requests(rig)
    rig.kube.may_delete = False
    assert not rig.sync.reconcile(UID).retry
    assert rig.kube.deleted == []


def test_a_request_that_cannot_be_deleted_now_is_retried(rig: Rig) -> None:
    deleted_pod_with_requests(rig)

    def unavailable(namespace: str, name: str, uid: str) -> bool:
        raise ApiError(503, "ServiceUnavailable", "etcd")

    rig.kube.delete_pcr = unavailable  # type: ignore[method-assign]
    assert rig.sync.reconcile(UID).retry
    assert rig.count("podcert_shim_api_errors_total", operation="delete_request") == 1


@pytest.mark.parametrize(
    ("error", "retry"),
    [
        pytest.param(StorageError("pods/x", "cannot remove: I/O error"), True, id="a disk error"),
        pytest.param(
            UnsafeDirectoryError("pods/x", "is a symbolic link"), False, id="a link in the way"
        ),
    ],
)
def test_files_that_cannot_be_removed_are_retried_unless_a_link_is_in_the_way(
    rig: Rig, error: StorageError, retry: bool, caplog: pytest.LogCaptureFixture
) -> None:
    deleted_pod_with_requests(rig)
    rig.storage.fail["remove"] = error
    with caplog.at_level(logging.ERROR, "podcert.shim"):
        assert rig.sync.reconcile(UID).retry is retry
    assert str(error) in caplog.text
    assert rig.kube.deleted == ["pending"], "the requests go whatever happened to the files"
    assert UID not in rig.sync.memory


def test_a_deleted_pods_projections_are_forgotten_and_no_other_pods(rig: Rig) -> None:
    deleted_pod_with_requests(rig)
    state = Tracked("example.com/podcert", projection.NotYetIssued(), None)
    mine, other = WorkKey(UID, "identity", 0), WorkKey("other-uid", "identity", 0)
    rig.caches.tracked.update({mine: state, other: state})
    rig.sync.reconcile(UID)
    assert rig.caches.tracked == {other: state}
