"""Walking and reading below the shim's root by directory descriptor, never through a link.

Every call walks from the root one directory at a time with openat(2) and O_NOFOLLOW and then
works only through those descriptors (`dir_fd=`), so a link planted anywhere on the way, or
swapped in while a call runs, is met as ELOOP instead of being followed: there is no
check-then-use gap to race, as there would be with lstat and paths.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Generator
from pathlib import Path
from typing import Final

from kubelet_shim.storage import UnsafeDirectoryError
from podcert.api.volumes import MAX_PATH_DEPTH

# Directory layout is not secret; file modes are set exactly per file by the caller.
DIR_MODE: Final = 0o755
# Directories are opened relative to their parent's descriptor and never through a link: on a
# symbolic link O_NOFOLLOW fails with ELOOP, on anything else O_DIRECTORY with ENOTDIR.
DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in for a file must not hang the worker in open(2).
READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def open_dir(parent: int, name: str, shown: Path) -> int:
    """`name` inside the directory `parent`, opened as a directory and never through a link."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise not_a_directory(parent, name, shown) from exc
        raise


def walk_into(fd: int, shown: Path, parts: tuple[str, ...], *, create: bool = False) -> int:
    """Descend from the directory `fd` (which this takes over and closes) through `parts`, one
    openat(2) at a time and never through a link; each part made first when `create`."""
    try:
        for part in parts:
            shown = shown / part
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, DIR_MODE, dir_fd=fd)
            child = open_dir(fd, part, shown)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def not_a_directory(parent: int, name: str, shown: Path) -> UnsafeDirectoryError:
    try:
        link = stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode)
    except OSError:
        link = False
    return UnsafeDirectoryError(str(shown), "is a symbolic link" if link else "is not a directory")


def plain_files(
    base: int, prefix: str = "", depth: int = 1
) -> Generator[tuple[str, int, str, os.stat_result], None, None]:
    """Plain files under the directory `base` as (relative path, parent descriptor, name, lstat):
    regular files with one link, found without following a link. Parent descriptors stay open
    while their files are being yielded."""
    for entry in list(os.scandir(base)):
        relative = f"{prefix}{entry.name}"
        if entry.is_dir(follow_symlinks=False):
            if depth >= MAX_PATH_DEPTH:
                continue  # deeper than the writer ever goes
            try:
                child = os.open(entry.name, DIR_FLAGS, dir_fd=base)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    continue  # swapped for something else since the listing: not ours
                raise
            try:
                yield from plain_files(child, f"{relative}/", depth + 1)
            finally:
                os.close(child)
        elif entry.is_file(follow_symlinks=False):
            info = entry.stat(follow_symlinks=False)
            if info.st_nlink == 1:
                yield relative, base, entry.name, info


def read_plain(parent: int, name: str) -> bytes | None:
    """The bytes of a plain file, or None when `name` is a link, a special or hard-linked file."""
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):
            return None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            return None
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
