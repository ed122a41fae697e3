"""kubelet_shim.atomic, the shim's writer on disk: the kubelet atomic-writer layout, rewrites and
their clean-up, disk-full and crash failure modes, readers racing a rotation, unsafe names, and
links planted under the root, which are refused and never followed. (The contract it shares with
the memory twin is test_shim_storage.py's.)"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kubelet_shim import atomic
from kubelet_shim.atomic import AtomicDirStorage
from kubelet_shim.storage import (
    FileSpec,
    StorageError,
    UnsafeDirectoryError,
    UnsafePathError,
)
from tests.objects import KEY_MODE, PUBLIC_MODE, volume_contents, volume_payload

UID = "0b7c6a1e-6f5e-4a57-9a3c-2d7b0c1f9e11"
CLOCK = datetime(2026, 11, 29, 20, 1, 2, 123456, tzinfo=UTC)


@pytest.fixture
def disk(tmp_path: Path) -> AtomicDirStorage:
    return AtomicDirStorage(tmp_path, clock=lambda: CLOCK)


@pytest.fixture(autouse=True)
def strict_umask() -> Iterator[None]:
    """Modes must be exact whatever the process umask; a strict one proves it."""
    old = os.umask(0o077)
    yield
    os.umask(old)


def vol(disk: AtomicDirStorage, volume: str = "identity") -> Path:
    return disk.volume_dir(UID, volume)


def hidden_dirs(directory: Path) -> list[str]:
    return sorted(
        p.name
        for p in directory.iterdir()
        if p.name.startswith("..") and p.is_dir() and not p.is_symlink()
    )


def link(path: Path) -> str:
    return str(path.readlink())


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- layout ----------------------------------------------------------------------------------------


def test_layout_is_the_kubelet_atomic_writer_layout(disk: AtomicDirStorage, tmp_path: Path) -> None:
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    target = tmp_path / "pods" / UID / "volumes" / "kubernetes.io~projected" / "identity"
    assert target == vol(disk)

    [version] = hidden_dirs(target)
    assert version.startswith("..2026_11_29_20_01_02.")
    assert sorted(p.name for p in target.iterdir()) == sorted(
        ["..data", version, "credential.pem", "ca"]
    )
    assert link(target / "..data") == version  # relative, not absolute
    assert link(target / "credential.pem") == "..data/credential.pem"
    assert link(target / "ca") == "..data/ca"  # nested paths link their top-level entry
    assert (target / "ca").is_symlink()

    assert mode(target / version) == 0o755
    assert mode(target / version / "ca") == 0o755
    assert mode(target / version / "credential.pem") == KEY_MODE
    assert mode(target / version / "ca" / "trust.pem") == PUBLIC_MODE
    assert (target / "credential.pem").read_bytes() == b"KEY one\nCERT one"
    assert (target / "ca" / "trust.pem").read_bytes() == b"CA one"


def test_rewrite_swaps_data_to_the_new_version_and_removes_the_old(disk: AtomicDirStorage) -> None:
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    [first] = hidden_dirs(vol(disk))
    disk.write_volume(UID, "identity", volume_payload("two"), owner=None)
    [second] = hidden_dirs(vol(disk))
    assert second != first
    assert link(vol(disk) / "..data") == second
    assert (vol(disk) / "credential.pem").read_bytes() == b"KEY two\nCERT two"
    assert not (vol(disk) / "..data_tmp").exists()


def test_unchanged_content_is_not_rewritten(disk: AtomicDirStorage) -> None:
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    before = hidden_dirs(vol(disk))
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    assert hidden_dirs(vol(disk)) == before


def test_a_mode_change_alone_is_rewritten(disk: AtomicDirStorage) -> None:
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    files = volume_payload("one")
    files["ca/trust.pem"] = FileSpec(files["ca/trust.pem"].data, 0o640)
    disk.write_volume(UID, "identity", files, owner=None)
    assert mode(vol(disk) / "ca" / "trust.pem") == 0o640


def test_names_no_longer_in_the_payload_disappear(disk: AtomicDirStorage) -> None:
    disk.write_volume(UID, "identity", volume_payload("one", **{"extra.pem": b"x"}), owner=None)
    assert (vol(disk) / "extra.pem").exists()
    disk.write_volume(UID, "identity", {"only.pem": FileSpec(b"y", 0o644)}, owner=None)
    assert sorted(p.name for p in vol(disk).iterdir() if not p.name.startswith("..")) == [
        "only.pem"
    ]
    assert disk.read_volume(UID, "identity") == {"only.pem": b"y"}


def test_foreign_files_in_the_volume_are_left_alone(disk: AtomicDirStorage) -> None:
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    (vol(disk) / "not-ours").write_bytes(b"mine")
    disk.write_volume(UID, "identity", volume_payload("two"), owner=None)
    assert (vol(disk) / "not-ours").read_bytes() == b"mine"


def test_a_regular_file_squatting_a_visible_name_is_replaced(disk: AtomicDirStorage) -> None:
    vol(disk).mkdir(parents=True)
    (vol(disk) / "credential.pem").write_bytes(b"stale")
    (vol(disk) / "ca").mkdir()
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    assert link(vol(disk) / "credential.pem") == "..data/credential.pem"
    assert link(vol(disk) / "ca") == "..data/ca"


def test_crash_leftovers_are_cleaned_by_the_next_write(disk: AtomicDirStorage) -> None:
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    orphan = vol(disk) / "..2020_01_01_00_00_00.123"
    orphan.mkdir()
    (orphan / "credential.pem").write_bytes(b"half")
    (vol(disk) / "..data_tmp").symlink_to(orphan.name)
    disk.write_volume(UID, "identity", volume_payload("two"), owner=None)
    assert not orphan.exists()
    assert not os.path.lexists(vol(disk) / "..data_tmp")
    assert len(hidden_dirs(vol(disk))) == 1


def test_a_crash_after_the_swap_is_completed_by_the_next_write(disk: AtomicDirStorage) -> None:
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    (vol(disk) / "credential.pem").unlink()  # as if the writer died before linking names
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    assert (vol(disk) / "credential.pem").read_bytes() == b"KEY one\nCERT one"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_files_are_owned_by_the_requested_user(disk: AtomicDirStorage) -> None:
    disk.write_volume(UID, "identity", volume_payload("one"), owner=4242)
    assert (vol(disk) / "credential.pem").stat().st_uid == 4242
    assert (vol(disk) / "ca" / "trust.pem").stat().st_uid == 4242


def test_ownership_is_skipped_when_not_root(
    disk: AtomicDirStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "fchown", _must_not_be_called)
    disk.write_volume(UID, "identity", volume_payload("one"), owner=4242)
    assert (vol(disk) / "credential.pem").exists()


def _must_not_be_called(*args: object) -> None:
    raise AssertionError("fchown called without root")


# -- failures --------------------------------------------------------------------------------------


def failing_write(after: int) -> Callable[[int, object], int]:
    """os.write that fills the disk after `after` successful calls."""
    real = os.write
    calls = 0

    def write(fd: int, data: object) -> int:
        nonlocal calls
        calls += 1
        if calls > after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)  # type: ignore[arg-type]

    return write


@pytest.mark.parametrize(
    "after",
    [
        pytest.param(0, id="disk full on the first file keeps the old version"),
        pytest.param(1, id="disk full mid-payload keeps the old version"),
    ],
)
def test_disk_full_keeps_the_previous_version(
    disk: AtomicDirStorage, monkeypatch: pytest.MonkeyPatch, after: int
) -> None:
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    listing = sorted(p.name for p in vol(disk).iterdir())

    monkeypatch.setattr(os, "write", failing_write(after))
    with pytest.raises(StorageError) as caught:
        disk.write_volume(UID, "identity", volume_payload("two"), owner=None)
    monkeypatch.undo()

    error = caught.value
    assert isinstance(error.__cause__, OSError)
    assert error.__cause__.errno == errno.ENOSPC
    assert "no space left" in str(error)
    assert error.path.startswith(str(vol(disk) / "..2026_11_29_20_01_02."))  # the file it was at
    assert sorted(p.name for p in vol(disk).iterdir()) == listing  # partial version removed
    assert disk.read_volume(UID, "identity") == {
        "credential.pem": b"KEY one\nCERT one",
        "ca/trust.pem": b"CA one",
    }
    assert (vol(disk) / "credential.pem").read_bytes() == b"KEY one\nCERT one"


def test_disk_full_on_the_first_write_leaves_no_volume(
    disk: AtomicDirStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "write", failing_write(0))
    with pytest.raises(StorageError):
        disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    monkeypatch.undo()
    assert disk.read_volume(UID, "identity") is None
    assert list(vol(disk).iterdir()) == []


def test_a_failed_swap_keeps_the_previous_version(
    disk: AtomicDirStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(StorageError, match="I/O error") as caught:
        disk.write_volume(UID, "identity", volume_payload("two"), owner=None)
    monkeypatch.undo()
    assert caught.value.path == str(vol(disk) / "..data")
    assert len(hidden_dirs(vol(disk))) == 1
    assert not os.path.lexists(vol(disk) / "..data_tmp")
    assert (vol(disk) / "credential.pem").read_bytes() == b"KEY one\nCERT one"


# -- concurrent readers ----------------------------------------------------------------------------


def test_readers_never_see_a_torn_or_mixed_bundle(disk: AtomicDirStorage) -> None:
    """200 rotations under a reader looping on the user-visible path: each read is one version."""
    pad = b"x" * 65536  # large enough that a non-atomic rewrite would be caught half-way

    def files(n: int) -> dict[str, FileSpec]:
        tag = f"{n:04d}".encode()
        bundle = b"KEY " + tag + b"\n" + pad + b"\nCERT " + tag + b"\n"
        return {
            "credential.pem": FileSpec(bundle, KEY_MODE),
            "key.pem": FileSpec(b"KEY " + tag, KEY_MODE),
            "chain.pem": FileSpec(b"CERT " + tag, PUBLIC_MODE),
        }

    disk.write_volume(UID, "identity", files(0), owner=None)
    bundle = vol(disk) / "credential.pem"
    stop = threading.Event()
    seen: set[bytes] = set()
    problems: list[str] = []

    def read_bundle() -> None:
        while not stop.is_set():
            try:
                data = bundle.read_bytes()
            except FileNotFoundError:
                # The lookup raced the removal of the version it had just resolved: the caller
                # retries. What must never happen is a read of a mixed or partial file.
                continue
            head, _, rest = data.partition(b"\n")
            body, _, tail = rest.rpartition(b"\nCERT ")
            if head[4:] != tail.rstrip(b"\n") or body != pad or not head.startswith(b"KEY "):
                problems.append(f"torn read: {data[:12]!r}...{data[-12:]!r} ({len(data)} bytes)")
            seen.add(head[4:])

    def read_volume() -> None:
        while not stop.is_set():
            content = disk.read_volume(UID, "identity")
            assert content is not None
            if content["key.pem"][4:] != content["chain.pem"][5:]:
                problems.append("read_volume mixed two versions")

    def guarded(read: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                read()
            except Exception as exc:  # a reader crash must fail the test, not just warn
                problems.append(f"{read.__name__} raised {exc!r}")
                stop.set()

        return run

    readers = [threading.Thread(target=guarded(f)) for f in (read_bundle, read_volume)]
    for reader in readers:
        reader.start()
    try:
        for n in range(1, 201):
            if stop.is_set():
                break
            disk.write_volume(UID, "identity", files(n), owner=None)
    finally:
        stop.set()
        for reader in readers:
            reader.join(timeout=30)
    assert problems == []
    assert len(seen) > 1  # the reader did overlap with rotations
    assert bundle.read_bytes().startswith(b"KEY 0200")
    assert len(hidden_dirs(vol(disk))) == 1


# -- path safety -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("../escape.pem", id="parent component"),
        pytest.param("ca/../../escape.pem", id="parent component in the middle"),
        pytest.param("/etc/passwd", id="absolute path"),
        pytest.param("..data", id="the writer's own data link"),
        pytest.param("..hidden/x.pem", id="leading double dot"),
        pytest.param("a//b.pem", id="empty component"),
        pytest.param("./a.pem", id="dot component"),
        pytest.param("", id="empty path"),
        pytest.param("a\0b", id="NUL byte"),
    ],
)
def test_unsafe_paths_are_rejected_before_touching_disk(
    disk: AtomicDirStorage, tmp_path: Path, path: str
) -> None:
    with pytest.raises(UnsafePathError):
        disk.write_volume(UID, "identity", {path: FileSpec(b"x", 0o644)}, owner=None)
    assert not (tmp_path / "pods").exists()


@pytest.mark.parametrize(
    ("pod_uid", "volume"),
    [
        pytest.param("..", "identity", id="pod UID that climbs"),
        pytest.param("a/b", "identity", id="pod UID with a slash"),
        pytest.param(UID, "../other", id="volume name that climbs"),
        pytest.param(UID, "..data", id="volume name with leading double dot"),
        pytest.param(UID, "", id="empty volume name"),
    ],
)
def test_unsafe_pod_and_volume_names_are_rejected(
    disk: AtomicDirStorage, tmp_path: Path, pod_uid: str, volume: str
) -> None:
    with pytest.raises(UnsafePathError):
        disk.write_volume(pod_uid, volume, volume_payload("one"), owner=None)
    assert not (tmp_path / "pods").exists()


def test_a_file_cannot_also_be_a_directory(disk: AtomicDirStorage) -> None:
    files = {"ca": FileSpec(b"x", 0o644), "ca/trust.pem": FileSpec(b"y", 0o644)}
    with pytest.raises(UnsafePathError, match="conflicts"):
        disk.write_volume(UID, "identity", files, owner=None)


def test_modes_beyond_permission_bits_are_rejected(disk: AtomicDirStorage) -> None:
    with pytest.raises(StorageError, match="mode"):
        disk.write_volume(UID, "identity", {"a": FileSpec(b"x", 0o4755)}, owner=None)


# -- links planted under the root ------------------------------------------------------------------
#
# Each test plants, where the writer expects a directory, a link to a folder outside that holds
# a complete copy of the rest of the way (so following it would succeed), and checks that the
# storage refuses instead: nothing outside is read, written or removed.

PROJECTED = "kubernetes.io~projected"
WAY = ("pods", UID, "volumes", PROJECTED, "identity")


@pytest.fixture
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("outside")


def snapshot(folder: Path) -> dict[str, str]:
    """Everything under `folder`: files with their content, directories, links with targets."""
    seen = {}
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        if path.is_symlink():
            seen[name] = f"link -> {path.readlink()}"
        elif path.is_dir():
            seen[name] = "dir"
        else:
            seen[name] = path.read_bytes().decode(errors="replace")
    return seen


def plant(root: Path, depth: int, outside: Path, *, as_file: bool = False) -> Path:
    """Write a volume, then replace the directory WAY[:depth] by a link to `outside`, which
    gets a copy of everything below it (or by a regular file when `as_file`)."""
    storage = AtomicDirStorage(root, clock=lambda: CLOCK)
    storage.write_volume(UID, "identity", volume_payload("one"), owner=None)
    spot = root.joinpath(*WAY[:depth])
    copy = outside / "copy"
    shutil.copytree(spot, copy, symlinks=True)
    shutil.rmtree(spot)
    if as_file:
        spot.write_bytes(b"a file where a directory should be")
    else:
        spot.symlink_to(copy, target_is_directory=True)
    return copy


PLACES = [
    pytest.param(1, id="the pods directory"),
    pytest.param(2, id="the pod directory"),
    pytest.param(3, id="the volumes directory"),
    pytest.param(4, id="the projected plugin directory"),
    pytest.param(5, id="the volume directory itself"),
]


@pytest.mark.parametrize("depth", PLACES)
def test_a_link_on_the_way_to_a_volume_is_refused_and_nothing_outside_changes(
    disk: AtomicDirStorage, tmp_path: Path, outside: Path, depth: int
) -> None:
    plant(tmp_path, depth, outside)
    before = snapshot(outside)
    shown = str(tmp_path.joinpath(*WAY[:depth]))

    with pytest.raises(UnsafeDirectoryError, match="is a symbolic link") as caught:
        disk.write_volume(UID, "identity", volume_payload("two"), owner=None)
    assert caught.value.path == shown
    with pytest.raises(UnsafeDirectoryError):
        disk.read_volume(UID, "identity")
    with pytest.raises(UnsafeDirectoryError):
        disk.recover_volume(UID, "identity")
    if depth < len(WAY):
        with pytest.raises(UnsafeDirectoryError):
            disk.remove_pod(UID)
    if depth == 1:
        with pytest.raises(UnsafeDirectoryError):
            disk.list_pods()
    else:
        assert disk.list_pods() == [UID]  # listed, so that its clean-up reports the link
    assert snapshot(outside) == before
    assert "two" not in str(before)
    if depth == len(WAY):
        # Inside the projected directory the clean-up deletes the link itself, not its target.
        disk.remove_pod(UID)
        assert not os.path.lexists(vol(disk))
        assert snapshot(outside) == before


@pytest.mark.parametrize("depth", PLACES)
def test_a_file_where_a_directory_should_be_is_refused(
    disk: AtomicDirStorage, tmp_path: Path, outside: Path, depth: int
) -> None:
    plant(tmp_path, depth, outside, as_file=True)
    with pytest.raises(UnsafeDirectoryError, match="is not a directory"):
        disk.write_volume(UID, "identity", volume_payload("two"), owner=None)
    with pytest.raises(UnsafeDirectoryError, match="is not a directory"):
        disk.read_volume(UID, "identity")


def test_the_volume_is_served_again_once_the_link_is_gone(
    disk: AtomicDirStorage, tmp_path: Path, outside: Path
) -> None:
    plant(tmp_path, 5, outside)
    with pytest.raises(UnsafeDirectoryError):
        disk.write_volume(UID, "identity", volume_payload("two"), owner=None)
    vol(disk).unlink()
    disk.write_volume(UID, "identity", volume_payload("two"), owner=None)
    assert disk.read_volume(UID, "identity") == volume_contents(volume_payload("two"))


def test_other_volumes_and_pods_are_still_served(
    disk: AtomicDirStorage, tmp_path: Path, outside: Path
) -> None:
    disk.write_volume(UID, "trust", {"ca.pem": FileSpec(b"CA", 0o644)}, owner=None)
    plant(tmp_path, 5, outside)
    disk.write_volume(UID, "trust", {"ca.pem": FileSpec(b"CA2", 0o644)}, owner=None)
    disk.write_volume("other-pod", "identity", volume_payload("two"), owner=None)
    assert disk.read_volume(UID, "trust") == {"ca.pem": b"CA2"}
    assert disk.read_volume("other-pod", "identity") == volume_contents(volume_payload("two"))


def test_a_link_swapped_in_mid_write_is_not_followed(
    disk: AtomicDirStorage, tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race a check-then-open defence loses: the volume directory is moved away and a link
    put in its place after the writer reached it. The writer keeps working in the directory it
    holds (wherever that now is) and never through the link."""
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    moved = tmp_path / "moved-away"
    real_walk = atomic.walk_into

    def walk_then_swap(*args: Any, **kwargs: Any) -> int:
        fd = real_walk(*args, **kwargs)
        if vol(disk).is_dir() and not vol(disk).is_symlink():
            vol(disk).rename(moved)
            vol(disk).symlink_to(outside, target_is_directory=True)
        return fd

    monkeypatch.setattr(atomic, "walk_into", walk_then_swap)
    disk.write_volume(UID, "identity", volume_payload("two"), owner=None)
    monkeypatch.undo()
    assert snapshot(outside) == {}
    assert (moved / "credential.pem").read_bytes() == b"KEY two\nCERT two"


@pytest.mark.parametrize(
    "target",
    [
        pytest.param("OUTSIDE", id="an absolute path outside"),
        pytest.param("../../../../../..", id="a relative path that climbs"),
        pytest.param("..", id="the parent directory"),
        pytest.param("../trust/..data", id="another volume's data"),
        pytest.param("..data", id="itself"),
        pytest.param("ca", id="a visible name"),
    ],
)
def test_a_data_link_pointing_anywhere_but_a_version_is_refused(
    disk: AtomicDirStorage, outside: Path, target: str
) -> None:
    (outside / "credential.pem").write_bytes(b"PLANTED")
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    (vol(disk) / "..data").unlink()
    (vol(disk) / "..data").symlink_to(str(outside) if target == "OUTSIDE" else target)
    before = snapshot(outside)
    with pytest.raises(UnsafeDirectoryError, match="points outside"):
        disk.read_volume(UID, "identity")
    with pytest.raises(UnsafeDirectoryError, match="points outside"):
        disk.write_volume(UID, "identity", volume_payload("two"), owner=None)
    with pytest.raises(UnsafeDirectoryError):
        disk.recover_volume(UID, "identity")
    assert snapshot(outside) == before


def test_a_data_link_to_a_version_name_that_is_a_link_is_refused(
    disk: AtomicDirStorage, outside: Path
) -> None:
    (outside / "credential.pem").write_bytes(b"PLANTED")
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    [version] = hidden_dirs(vol(disk))
    shutil.rmtree(vol(disk) / version)
    (vol(disk) / version).symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafeDirectoryError, match="is a symbolic link"):
        disk.read_volume(UID, "identity")
    with pytest.raises(UnsafeDirectoryError, match="is a symbolic link"):
        disk.write_volume(UID, "identity", volume_payload("two"), owner=None)
    assert snapshot(outside) == {"credential.pem": "PLANTED"}


@pytest.mark.parametrize(
    "make", [pytest.param("file", id="a regular file"), pytest.param("dir", id="a directory")]
)
def test_a_data_entry_that_is_not_a_link_is_refused(disk: AtomicDirStorage, make: str) -> None:
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    (vol(disk) / "..data").unlink()
    if make == "file":
        (vol(disk) / "..data").write_bytes(b"x")
    else:
        (vol(disk) / "..data").mkdir()
    with pytest.raises(UnsafeDirectoryError, match="is not a symbolic link"):
        disk.read_volume(UID, "identity")
    with pytest.raises(UnsafeDirectoryError, match="is not a symbolic link"):
        disk.write_volume(UID, "identity", volume_payload("two"), owner=None)


def test_a_dangling_data_link_to_a_version_name_is_repaired(disk: AtomicDirStorage) -> None:
    vol(disk).mkdir(parents=True)
    (vol(disk) / "..data").symlink_to("..2020_01_01_00_00_00.gone")
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    assert disk.read_volume(UID, "identity") == volume_contents(volume_payload("one"))


def test_a_visible_name_planted_as_a_link_is_replaced_not_written_through(
    disk: AtomicDirStorage, outside: Path
) -> None:
    (outside / "credential.pem").write_bytes(b"PLANTED")
    (outside / "ca").mkdir()
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    for name in ("credential.pem", "ca"):
        (vol(disk) / name).unlink()
        (vol(disk) / name).symlink_to(outside / name)
    disk.write_volume(UID, "identity", volume_payload("two"), owner=None)
    assert link(vol(disk) / "credential.pem") == "..data/credential.pem"
    assert link(vol(disk) / "ca") == "..data/ca"
    assert (vol(disk) / "credential.pem").read_bytes() == b"KEY two\nCERT two"
    assert snapshot(outside) == {"ca": "dir", "credential.pem": "PLANTED"}


@pytest.mark.parametrize(
    "plant_in_version",
    [
        pytest.param("symlink", id="a file in the live version replaced by a link"),
        pytest.param("hardlink", id="a file in the live version replaced by a hard link"),
        pytest.param("directory", id="a directory in the live version replaced by a link"),
        pytest.param("fifo", id="a file in the live version replaced by a FIFO"),
    ],
)
def test_what_is_planted_inside_a_version_is_never_read_and_is_replaced(
    disk: AtomicDirStorage, tmp_path: Path, outside: Path, plant_in_version: str
) -> None:
    secret = tmp_path / "secret.pem"  # same file system, so a hard link is possible
    secret.write_bytes(b"PLANTED")
    (outside / "trust.pem").write_bytes(b"PLANTED")
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    version = vol(disk) / link(vol(disk) / "..data")
    if plant_in_version == "directory":
        shutil.rmtree(version / "ca")
        (version / "ca").symlink_to(outside, target_is_directory=True)
        missing = "ca/trust.pem"
    else:
        (version / "credential.pem").unlink()
        if plant_in_version == "symlink":
            (version / "credential.pem").symlink_to(secret)
        elif plant_in_version == "hardlink":
            os.link(secret, version / "credential.pem")
        else:
            os.mkfifo(version / "credential.pem")
        missing = "credential.pem"
    before = snapshot(outside)

    content = disk.read_volume(UID, "identity")
    assert content is not None
    assert missing not in content
    assert b"PLANTED" not in b"".join(content.values())
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)  # same payload: rewritten
    assert disk.read_volume(UID, "identity") == volume_contents(volume_payload("one"))
    assert snapshot(outside) == before
    assert secret.read_bytes() == b"PLANTED"


# -- recovery and housekeeping ---------------------------------------------------------------------


def test_a_new_instance_recovers_what_is_on_disk(disk: AtomicDirStorage, tmp_path: Path) -> None:
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    disk.write_volume(UID, "trust", {"ca.pem": FileSpec(b"CA", 0o644)}, owner=None)
    disk.write_volume("other-pod", "identity", volume_payload("two"), owner=None)

    restarted = AtomicDirStorage(tmp_path)
    assert restarted.list_pods() == sorted([UID, "other-pod"])
    assert restarted.list_volumes(UID) == ["identity", "trust"]
    assert restarted.read_volume(UID, "identity") == {
        "credential.pem": b"KEY one\nCERT one",
        "ca/trust.pem": b"CA one",
    }


def test_recover_finishes_a_write_killed_after_its_swap(
    disk: AtomicDirStorage, tmp_path: Path
) -> None:
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    disk.write_volume(UID, "identity", volume_payload("two"), owner=None)
    # What a writer killed right after the swap leaves: the replaced version (with its key)
    # still there, a visible name not linked yet, a link being made aside.
    replaced = vol(disk) / "..2020_01_01_00_00_00.123"
    replaced.mkdir()
    (replaced / "credential.pem").write_bytes(b"KEY one\nCERT one")
    (vol(disk) / "credential.pem").unlink()
    (vol(disk) / "..data_tmp.credential.pem").symlink_to("..data/credential.pem")

    AtomicDirStorage(tmp_path).recover_volume(UID, "identity")
    assert link(vol(disk) / "credential.pem") == "..data/credential.pem"
    assert (vol(disk) / "credential.pem").read_bytes() == b"KEY two\nCERT two"
    assert link(vol(disk) / "ca") == "..data/ca"
    assert not replaced.exists()
    assert not os.path.lexists(vol(disk) / "..data_tmp.credential.pem")
    assert hidden_dirs(vol(disk)) == [link(vol(disk) / "..data")]
    assert disk.read_volume(UID, "identity") == volume_contents(volume_payload("two"))


def test_recover_changes_nothing_in_a_whole_volume(disk: AtomicDirStorage) -> None:
    def entries() -> list[tuple[str, str]]:
        return sorted((p.name, link(p) if p.is_symlink() else "") for p in vol(disk).iterdir())

    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    before = entries()
    disk.recover_volume(UID, "identity")
    assert entries() == before


def test_remove_pod_keeps_other_plugins_volumes(disk: AtomicDirStorage, tmp_path: Path) -> None:
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    other_plugin = tmp_path / "pods" / UID / "volumes" / "kubernetes.io~secret"
    other_plugin.mkdir()
    disk.remove_pod(UID)
    assert disk.list_pods() == []
    assert other_plugin.is_dir()
    disk.remove_pod(UID)  # idempotent


def test_remove_pod_prunes_empty_parents(disk: AtomicDirStorage, tmp_path: Path) -> None:
    disk.write_volume(UID, "identity", volume_payload("one"), owner=None)
    disk.remove_pod(UID)
    assert not (tmp_path / "pods" / UID).exists()


def test_empty_root_lists_nothing(disk: AtomicDirStorage) -> None:
    assert disk.list_pods() == []
    assert disk.list_volumes(UID) == []
    assert disk.read_volume(UID, "identity") is None
