"""kubelet_shim.storage: the contract both storages keep, the kubelet's atomic writer on disk
(`kubelet_shim.atomic`, whose own layout and failure modes are test_shim_atomic.py's) and the memory
twin the agent's tests run on: round trips, recovery, refused traversal and linked volumes alike;
and the twin's own failed write."""

from __future__ import annotations

import errno
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kubelet_shim.atomic import AtomicDirStorage
from kubelet_shim.storage import (
    FileSpec,
    MemoryStorage,
    Storage,
    StorageError,
    UnsafeDirectoryError,
    UnsafePathError,
)
from tests.objects import KEY_MODE, volume_contents, volume_payload

UID = "0b7c6a1e-6f5e-4a57-9a3c-2d7b0c1f9e11"
CLOCK = datetime(2026, 11, 29, 20, 1, 2, 123456, tzinfo=UTC)


@pytest.fixture(params=["memory", "disk"])
def any_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "memory":
        return MemoryStorage()
    return AtomicDirStorage(tmp_path, clock=lambda: CLOCK)


def test_contract_round_trip(any_storage: Storage) -> None:
    assert any_storage.read_volume(UID, "identity") is None
    any_storage.write_volume(UID, "identity", volume_payload("one"), owner=None)
    any_storage.write_volume(UID, "identity", volume_payload("two"), owner=None)
    assert any_storage.read_volume(UID, "identity") == volume_contents(volume_payload("two"))
    assert any_storage.list_pods() == [UID]
    assert any_storage.list_volumes(UID) == ["identity"]
    any_storage.remove_pod(UID)
    assert any_storage.list_pods() == []
    assert any_storage.read_volume(UID, "identity") is None


def test_contract_recover_leaves_content_and_unwritten_volumes_alone(
    any_storage: Storage,
) -> None:
    any_storage.recover_volume(UID, "identity")
    assert any_storage.read_volume(UID, "identity") is None
    assert any_storage.list_pods() == []
    any_storage.write_volume(UID, "identity", volume_payload("one"), owner=None)
    any_storage.recover_volume(UID, "identity")
    assert any_storage.read_volume(UID, "identity") == volume_contents(volume_payload("one"))
    with pytest.raises(UnsafePathError):
        any_storage.recover_volume(UID, "..")


def test_contract_rejects_traversal(any_storage: Storage) -> None:
    with pytest.raises(UnsafePathError):
        any_storage.write_volume(UID, "identity", {"../x": FileSpec(b"x")}, owner=None)
    assert any_storage.list_pods() == []


def test_memory_twin_simulates_a_failed_write() -> None:
    memory = MemoryStorage()
    memory.write_volume(UID, "identity", volume_payload("one"), owner=1000)
    memory.fail_next_write(OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(StorageError, match="No space left"):
        memory.write_volume(UID, "identity", volume_payload("two"), owner=1000)
    assert memory.read_volume(UID, "identity") == volume_contents(volume_payload("one"))
    # Only the next write fails.
    memory.write_volume(UID, "identity", volume_payload("two"), owner=1000)
    assert memory.writes == 2
    assert memory.owner(UID, "identity") == 1000
    files = memory.files(UID, "identity")
    assert files is not None
    assert files["credential.pem"].mode == KEY_MODE


def test_file_specs_keep_their_data_out_of_reprs() -> None:
    assert "SECRET" not in repr(FileSpec(b"SECRET", 0o600))


def plant_link(any_storage: Storage, volume: str) -> None:
    """Replace the volume's directory by a link elsewhere, in either implementation."""
    if isinstance(any_storage, MemoryStorage):
        any_storage.plant_link(UID, volume)
        return
    assert isinstance(any_storage, AtomicDirStorage)
    target = any_storage.volume_dir(UID, volume)
    shutil.rmtree(target)
    target.symlink_to(any_storage.root, target_is_directory=True)


def test_contract_a_linked_volume_is_refused_and_its_neighbours_served(
    any_storage: Storage,
) -> None:
    any_storage.write_volume(UID, "identity", volume_payload("one"), owner=None)
    any_storage.write_volume(UID, "trust", volume_payload("one"), owner=None)
    plant_link(any_storage, "identity")
    with pytest.raises(UnsafeDirectoryError):
        any_storage.write_volume(UID, "identity", volume_payload("two"), owner=None)
    with pytest.raises(UnsafeDirectoryError):
        any_storage.read_volume(UID, "identity")
    with pytest.raises(UnsafeDirectoryError):
        any_storage.recover_volume(UID, "identity")
    any_storage.write_volume(UID, "trust", volume_payload("two"), owner=None)
    assert any_storage.read_volume(UID, "trust") == volume_contents(volume_payload("two"))
    any_storage.remove_pod(UID)  # removes the link, not what it points to
    assert any_storage.list_pods() == []
