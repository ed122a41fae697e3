"""kubelet_shim.dirfd: walking and reading below the shim's root by directory descriptor. A link
or a file where a directory should be is refused by name, never followed; only plain files
(regular, one link) are listed and read; a FIFO does not block a reader; no descriptor is left
open by a walk that fails."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubelet_shim.dirfd import open_dir, plain_files, read_plain, walk_into
from kubelet_shim.storage import UnsafeDirectoryError
from podcert.api.volumes import MAX_PATH_DEPTH


@pytest.fixture
def root(tmp_path: Path) -> Iterator[int]:
    """A descriptor of an empty directory (tmp_path/root), closed afterwards."""
    folder = tmp_path / "root"
    folder.mkdir()
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def open_fds() -> int:
    return sum(1 for _ in Path("/proc/self/fd").iterdir())


def listed(base: int) -> dict[str, bytes | None]:
    """What `plain_files` yields under `base`, each path with what `read_plain` reads there."""
    return {path: read_plain(parent, name) for path, parent, name, _ in plain_files(base)}


# --- opening and walking ------------------------------------------------------------------------


def test_a_directory_opens_and_a_missing_one_is_not_found(root: int, tmp_path: Path) -> None:
    (tmp_path / "root" / "a").mkdir()
    fd = open_dir(root, "a", tmp_path / "root" / "a")
    try:
        assert [entry.name for entry in os.scandir(fd)] == []
    finally:
        os.close(fd)
    with pytest.raises(FileNotFoundError):
        open_dir(root, "b", tmp_path / "root" / "b")


@pytest.mark.parametrize(
    ("make", "what"),
    [
        pytest.param("link", "is a symbolic link", id="a link to a directory"),
        pytest.param("file", "is not a directory", id="a regular file"),
    ],
)
def test_what_is_not_a_directory_is_refused_naming_the_path(
    root: int, tmp_path: Path, make: str, what: str
) -> None:
    spot = tmp_path / "root" / "a"
    if make == "link":
        (tmp_path / "elsewhere").mkdir()
        spot.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    else:
        spot.write_bytes(b"x")
    with pytest.raises(UnsafeDirectoryError) as refused:
        open_dir(root, "a", Path("shown/a"))
    assert refused.value.path == "shown/a"
    assert refused.value.what == what


def test_a_walk_creates_what_is_missing_when_asked(root: int, tmp_path: Path) -> None:
    top = tmp_path / "root"
    with pytest.raises(FileNotFoundError):
        walk_into(os.dup(root), top, ("a", "b", "c"))
    assert list(top.iterdir()) == []
    fd = walk_into(os.dup(root), top, ("a", "b", "c"), create=True)
    os.close(fd)
    assert (top / "a" / "b" / "c").is_dir()
    fd = walk_into(os.dup(root), top, ("a", "b", "c"))  # there now, found without creating
    os.close(fd)


def test_a_walk_meeting_a_link_names_where_and_creates_nothing_beyond(
    root: int, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "root" / "a").mkdir()
    (tmp_path / "root" / "a" / "b").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(UnsafeDirectoryError) as refused:
        walk_into(os.dup(root), Path("/shown"), ("a", "b", "c"), create=True)
    assert refused.value.path == "/shown/a/b"
    assert "symbolic link" in str(refused.value)
    assert list(elsewhere.iterdir()) == [], "nothing made through the link"


def test_a_failed_walk_closes_every_descriptor_it_held(root: int, tmp_path: Path) -> None:
    (tmp_path / "root" / "a").mkdir()
    (tmp_path / "root" / "a" / "file").write_bytes(b"x")
    before = open_fds()
    for parts in (("a", "file", "b"), ("a", "missing")):
        with pytest.raises((UnsafeDirectoryError, FileNotFoundError)):
            walk_into(os.dup(root), tmp_path / "root", parts)
    assert open_fds() == before


# --- listing and reading plain files ------------------------------------------------------------


def test_only_plain_files_are_listed_and_read(root: int, tmp_path: Path) -> None:
    top = tmp_path / "root"
    (top / "key.pem").write_bytes(b"KEY")
    (top / "ca").mkdir()
    (top / "ca" / "trust.pem").write_bytes(b"CA")
    (top / "link.pem").symlink_to(top / "key.pem")
    (top / "linked-dir").symlink_to(top / "ca", target_is_directory=True)
    (top / "hard.pem").write_bytes(b"HARD")
    os.link(top / "hard.pem", tmp_path / "second-name")
    os.mkfifo(top / "fifo")
    assert listed(root) == {"key.pem": b"KEY", "ca/trust.pem": b"CA"}


def test_read_plain_refuses_links_fifos_and_hard_links_without_blocking(
    root: int, tmp_path: Path
) -> None:
    top = tmp_path / "root"
    (top / "plain").write_bytes(b"data")
    (top / "link").symlink_to(top / "plain")
    os.mkfifo(top / "fifo")  # no writer: a blocking open would wait for one forever
    (top / "hard").write_bytes(b"data")
    os.link(top / "hard", top / "hard-too")
    assert read_plain(root, "plain") == b"data"
    assert [read_plain(root, name) for name in ("link", "fifo", "hard", "hard-too")] == [None] * 4
    with pytest.raises(FileNotFoundError):
        read_plain(root, "missing")


def test_a_file_larger_than_one_read_is_read_whole(root: int, tmp_path: Path) -> None:
    data = os.urandom(3 * (1 << 20) + 5)
    (tmp_path / "root" / "big").write_bytes(data)
    assert read_plain(root, "big") == data


def test_files_deeper_than_any_volume_path_are_not_listed(root: int, tmp_path: Path) -> None:
    """A volume's paths have at most MAX_PATH_DEPTH components: what lies deeper was not written
    by the writer, and the listing does not go there."""
    deepest = tmp_path.joinpath("root", *["d"] * (MAX_PATH_DEPTH - 1))
    deepest.mkdir(parents=True)
    (deepest / "last.pem").write_bytes(b"in")
    (deepest / "d").mkdir()
    (deepest / "d" / "beyond.pem").write_bytes(b"out")
    found = listed(root)
    assert list(found.values()) == [b"in"]
    [path] = found
    assert len(path.split("/")) == MAX_PATH_DEPTH
