"""Where projected files live: a small protocol, an in-memory twin, and the kubelet's atomic writer.

Pods read their credential while the shim rotates it, so a volume must change all at once: every
version is a complete hidden directory and the user-visible names reach it through one symlink
(`..data`) that is swapped by rename(2). A failed write leaves the previous version untouched.
The agent reconciles against what `read_volume` returns, which is also how it resumes after a
restart without asking for new certificates.

Nothing under the root is reached through a symbolic link (issue 18: a volume directory replaced
by a link to a folder elsewhere received the pod's new private key). Every call walks from the
root one directory at a time with openat(2) and O_NOFOLLOW and then works only through those
directory descriptors (`dir_fd=`), so a link planted anywhere on the way, or swapped in while a
call runs, is met as ELOOP instead of being followed: there is no check-then-use gap to race, as
there would be with lstat and paths. The only links are the writer's own: `..data` (and
`..data_tmp`) naming one of its `..<timestamp>` versions, and the visible names pointing into
`..data`; those it reads with readlink(2) and never follows itself.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Protocol

DATA_DIR: Final = "..data"
DATA_TMP: Final = "..data_tmp"
PLUGIN_DIR: Final = "kubernetes.io~projected"

# Directory layout is not secret; file modes are set exactly per file by the caller.
_DIR_MODE: Final = 0o755
# How often `read_volume` re-follows `..data` when a rotation removed the directory it was reading.
_READ_ATTEMPTS: Final = 5


class StorageError(Exception):
    """A volume could not be written or read; `path` names the file or directory involved."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


class UnsafePathError(StorageError):
    """A name that could escape the volume or collide with the writer's own `..` entries."""


class UnsafeDirectoryError(StorageError):
    """A symbolic link or a non-directory where the way to a volume needs a directory, or a
    `..data` that does not name one of the writer's versions. Someone other than the writer
    changed the tree; the volume is refused (read and written alike) until it is put right, and
    nothing is written anywhere else."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(path, f"{what}; {_REFUSED}")
        self.what = what


_REFUSED: Final = "the shim follows no link under its root and leaves this volume alone"


@dataclass(frozen=True)
class FileSpec:
    data: bytes = field(repr=False)  # may hold a private key
    mode: int = 0o644


class Storage(Protocol):
    def write_volume(
        self, pod_uid: str, volume: str, files: Mapping[str, FileSpec], owner: int | None
    ) -> None:
        """Replace the whole content of one volume atomically; raises StorageError."""
        ...

    def read_volume(self, pod_uid: str, volume: str) -> Mapping[str, bytes] | None:
        """The current content (relative path -> bytes), or None when never written."""
        ...

    def recover_volume(self, pod_uid: str, volume: str) -> None:
        """Finish what a writer killed mid-write left (the live version's visible names, stray
        versions) without changing the content; raises StorageError."""
        ...

    def remove_pod(self, pod_uid: str) -> None: ...

    def list_pods(self) -> list[str]: ...

    def list_volumes(self, pod_uid: str) -> list[str]: ...


# The kubelet's atomic writer limits (maxPathLength, maxFileNameLength); no Linux file system
# takes longer names, and a volume whose write can never succeed would never be served.
MAX_PATH_BYTES: Final = 4096
MAX_NAME_BYTES: Final = 255
# Ours: the kubelet has no depth limit, but a tree thousands of levels deep cannot be removed by
# recursive clean-up (shutil.rmtree), so it would outlive its pod. No projection needs 128.
MAX_PATH_DEPTH: Final = 128


def path_problem(path: str) -> str | None:
    """Why `path` may not be used inside a volume, or None when it is safe.

    The kubelet's rules (relative, no `..` component, no leading `..`, at most 4096 bytes with
    names of at most 255) plus the ones a file tree needs: no empty or `.` components, no NUL,
    valid UTF-8, and no deeper nesting than clean-up can remove again.
    """
    if not path:
        return "must not be empty"
    if "\0" in path:
        return "must not contain NUL"
    if path.startswith("/"):
        return "must be a relative path"
    parts = path.split("/")
    if ".." in parts:
        return "must not contain '..'"
    if path.startswith(".."):
        return "must not start with '..'"
    if any(part in ("", ".") for part in parts):
        return "must not contain empty or '.' components"
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogates: no file system takes them
        return "must be valid UTF-8"
    if size > MAX_PATH_BYTES:
        return f"must be at most {MAX_PATH_BYTES} bytes long"
    if any(len(part.encode("utf-8")) > MAX_NAME_BYTES for part in parts):
        return f"must not have a name longer than {MAX_NAME_BYTES} bytes"
    if len(parts) > MAX_PATH_DEPTH:
        return f"must not nest more than {MAX_PATH_DEPTH} levels deep"
    return None


def _check_name(kind: str, name: str) -> None:
    """Pod UIDs and volume names become single directory names under the root."""
    if not name or "/" in name or "\0" in name or name in (".", "..") or name.startswith(".."):
        raise UnsafePathError(name, f"invalid {kind}")


def _check_payload(files: Mapping[str, FileSpec]) -> None:
    for path, spec in files.items():
        problem = path_problem(path)
        if problem is not None:
            raise UnsafePathError(path, problem)
        if not 0 <= spec.mode <= 0o777:
            raise StorageError(path, f"mode {spec.mode:#o} is not a permission mode")
    # A name cannot be both a file and the directory of another file.
    for path in files:
        parts = path.split("/")
        for depth in range(1, len(parts)):
            parent = "/".join(parts[:depth])
            if parent in files:
                raise UnsafePathError(path, f"conflicts with file {parent!r}")


def _top_level(path: str) -> str:
    return path.split("/", 1)[0]


class MemoryStorage:
    """The in-memory twin for agent tests; keeps modes and owners so tests can assert them."""

    def __init__(self) -> None:
        self._volumes: dict[tuple[str, str], dict[str, FileSpec]] = {}
        self._owners: dict[tuple[str, str], int | None] = {}
        self._fail_next: OSError | None = None
        self._linked: set[tuple[str, str]] = set()
        self.writes = 0

    def fail_next_write(self, error: OSError) -> None:
        """Make the next write fail like a full disk would, leaving the old content."""
        self._fail_next = error

    def plant_link(self, pod_uid: str, volume: str) -> None:
        """Make the volume's directory a symbolic link, as someone with access to the node could:
        reads and writes are refused as the real writer refuses them, until `remove_link` (or
        the pod's removal, which deletes the link and not what it points to)."""
        self._linked.add((pod_uid, volume))

    def remove_link(self, pod_uid: str, volume: str) -> None:
        self._linked.discard((pod_uid, volume))

    def _refuse_links(self, pod_uid: str, volume: str) -> None:
        if (pod_uid, volume) in self._linked:
            raise UnsafeDirectoryError(
                f"pods/{pod_uid}/volumes/{PLUGIN_DIR}/{volume}", "is a symbolic link"
            )

    def write_volume(
        self, pod_uid: str, volume: str, files: Mapping[str, FileSpec], owner: int | None
    ) -> None:
        _check_name("pod UID", pod_uid)
        _check_name("volume name", volume)
        _check_payload(files)
        self._refuse_links(pod_uid, volume)
        if self._fail_next is not None:
            error, self._fail_next = self._fail_next, None
            raise StorageError(f"{pod_uid}/{volume}", f"write failed: {error}") from error
        self._volumes[pod_uid, volume] = dict(files)
        self._owners[pod_uid, volume] = owner
        self.writes += 1

    def read_volume(self, pod_uid: str, volume: str) -> Mapping[str, bytes] | None:
        self._refuse_links(pod_uid, volume)
        files = self._volumes.get((pod_uid, volume))
        if files is None:
            return None
        return {path: spec.data for path, spec in files.items()}

    def recover_volume(self, pod_uid: str, volume: str) -> None:
        _check_name("pod UID", pod_uid)
        _check_name("volume name", volume)
        self._refuse_links(pod_uid, volume)
        # Writes here are all or nothing: no crash leaves anything to finish.

    def files(self, pod_uid: str, volume: str) -> Mapping[str, FileSpec] | None:
        return self._volumes.get((pod_uid, volume))

    def owner(self, pod_uid: str, volume: str) -> int | None:
        return self._owners.get((pod_uid, volume))

    def remove_pod(self, pod_uid: str) -> None:
        self._linked = {key for key in self._linked if key[0] != pod_uid}
        for key in [key for key in self._volumes if key[0] == pod_uid]:
            del self._volumes[key]
            self._owners.pop(key, None)

    def list_pods(self) -> list[str]:
        return sorted({uid for uid, _ in self._volumes})

    def list_volumes(self, pod_uid: str) -> list[str]:
        return sorted(volume for uid, volume in self._volumes if uid == pod_uid)


def _utcnow() -> datetime:
    return datetime.now(UTC)


# Directories are opened relative to their parent's descriptor and never through a link: on a
# symbolic link O_NOFOLLOW fails with ELOOP, on anything else O_DIRECTORY with ENOTDIR.
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in for a file must not hang the worker in open(2).
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_WRITE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# What the writer names its versions (the kubelet's format too): `..data` may point nowhere else.
_VERSION_NAME: Final = re.compile(r"\.\.\d{4}(?:_\d{2}){5}\.[A-Za-z0-9_]{1,64}")


class AtomicDirStorage:
    """Volumes under `root/pods/<uid>/volumes/kubernetes.io~projected/<volume>`, kubelet layout.

    One writer per volume at a time (the agent's per-pod queue guarantees it); any number of
    readers. The clock only names the hidden directories, as the kubelet does. The root itself
    may be reached through links (the operator chose it); nothing under it is.
    """

    def __init__(self, root: Path, *, clock: Callable[[], datetime] = _utcnow) -> None:
        self.root = Path(root)
        self._clock = clock

    def _pod_dir(self, pod_uid: str) -> Path:
        _check_name("pod UID", pod_uid)
        return self.root / "pods" / pod_uid

    def volume_dir(self, pod_uid: str, volume: str) -> Path:
        """Where the volume lives (for people and tests; the storage itself never opens a path
        below the root in one go)."""
        _check_name("volume name", volume)
        return self._pod_dir(pod_uid) / "volumes" / PLUGIN_DIR / volume

    # -- walking the tree --------------------------------------------------------------------

    def _open(self, parts: tuple[str, ...], *, create: bool = False) -> int:
        """A descriptor of root/parts..., each part opened inside the one before without
        following a link; created (mode 0755) when `create`. Raises FileNotFoundError when a part
        is missing and UnsafeDirectoryError when one is a link or not a directory."""
        if create:
            self.root.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return _walk_into(root, self.root, parts, create=create)

    def _create_volume(self, pod_uid: str, volume: str) -> int:
        target = self.volume_dir(pod_uid, volume)  # checks both names
        try:
            return self._open(("pods", pod_uid, "volumes", PLUGIN_DIR, volume), create=True)
        except OSError as exc:
            raise StorageError(str(target), f"cannot create volume directory: {exc}") from exc

    def _find_volume(self, pod_uid: str, volume: str) -> int | None:
        """The volume's directory descriptor, or None when it was never created."""
        target = self.volume_dir(pod_uid, volume)  # checks both names
        try:
            return self._open(("pods", pod_uid, "volumes", PLUGIN_DIR, volume))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(str(target), f"unreadable: {exc}") from exc

    # -- writing ---------------------------------------------------------------------------

    def write_volume(
        self, pod_uid: str, volume: str, files: Mapping[str, FileSpec], owner: int | None
    ) -> None:
        _check_payload(files)
        target = self.volume_dir(pod_uid, volume)
        if owner is not None and os.geteuid() != 0:
            owner = None  # only root can give files away; unprivileged runs (tests) skip it
        vol = self._create_volume(pod_uid, volume)
        try:
            try:
                current = _current_dir(vol, target)
            except UnsafeDirectoryError:
                raise
            except StorageError:
                current = None  # an unreadable ..data is simply replaced by the rename below
            if current is None or not _same_payload(vol, target, current, files, owner):
                new_dir = self._publish(vol, target, files, owner)
            else:
                new_dir = current
            # Runs even when the content was unchanged, so a write that crashed after the swap
            # is completed by the next one.
            try:
                _link_user_visible(vol, {_top_level(path) for path in files})
                _remove_stale_dirs(vol, keep=new_dir)
            except OSError as exc:
                raise StorageError(str(target), f"cannot update visible names: {exc}") from exc
        finally:
            os.close(vol)

    def _publish(
        self, vol: int, target: Path, files: Mapping[str, FileSpec], owner: int | None
    ) -> str:
        """Write a complete new version and swap `..data` to it; return its directory name."""
        prefix = self._clock().astimezone(UTC).strftime("..%Y_%m_%d_%H_%M_%S.")
        try:
            new_dir, new_fd = _make_version_dir(vol, prefix)
        except OSError as exc:
            raise StorageError(str(target), f"cannot create version directory: {exc}") from exc
        failed_at = target / new_dir
        try:
            tree = _Tree(new_fd, owner)
            try:
                os.fchmod(new_fd, _DIR_MODE)
                # Sorted by component, so each directory's files come together: it is synced
                # and closed when the writer leaves it.
                for path, spec in sorted(files.items(), key=lambda item: item[0].split("/")):
                    failed_at = target / new_dir / path
                    *parents, name = path.split("/")
                    _write_file(tree.enter(parents), name, spec, owner)
                failed_at = target / new_dir
                tree.close(sync=True)
                os.fsync(new_fd)
            finally:
                tree.close(sync=False)
                os.close(new_fd)
            failed_at = target / DATA_TMP
            with contextlib.suppress(FileNotFoundError):
                os.unlink(DATA_TMP, dir_fd=vol)  # left by a crash between symlink and rename
            os.symlink(new_dir, DATA_TMP, dir_fd=vol)
            failed_at = target / DATA_DIR
            os.replace(DATA_TMP, DATA_DIR, src_dir_fd=vol, dst_dir_fd=vol)
        except OSError as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(DATA_TMP, dir_fd=vol)
            shutil.rmtree(new_dir, dir_fd=vol, ignore_errors=True)
            reason = "no space left on device" if exc.errno == errno.ENOSPC else str(exc)
            raise StorageError(
                str(failed_at), f"write failed, previous version kept: {reason}"
            ) from exc
        try:
            os.fsync(vol)
        except OSError as exc:
            raise StorageError(str(target), f"cannot sync volume directory: {exc}") from exc
        return new_dir

    # -- reading ---------------------------------------------------------------------------

    def read_volume(self, pod_uid: str, volume: str) -> Mapping[str, bytes] | None:
        """One consistent version: every file comes from the directory `..data` named throughout.

        A rotation can delete the version being read (scandir then just lists fewer files), so
        the read only counts if `..data` still names the same directory afterwards: the writer
        deletes a version only after swapping `..data` away from it. Only plain files count
        (regular, one link): the writer makes nothing else inside a version.
        """
        target = self.volume_dir(pod_uid, volume)
        vol = self._find_volume(pod_uid, volume)
        if vol is None:
            return None
        try:
            for _ in range(_READ_ATTEMPTS):
                current = _current_dir(vol, target)
                if current is None:
                    return None
                try:
                    content = _read_version(vol, target, current)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise StorageError(str(target), f"unreadable: {exc}") from exc
                if _current_dir(vol, target) == current:
                    return content
            raise StorageError(str(target), "content kept changing while being read")
        finally:
            os.close(vol)

    def recover_volume(self, pod_uid: str, volume: str) -> None:
        """Finish a write whose writer was killed after its swap: link the visible names of the
        version `..data` names (a first write shows no file until then) and remove the versions
        it replaced (one holds the previous private key). The content does not change, so an
        agent that finds it current after a restart need not write it again.
        """
        target = self.volume_dir(pod_uid, volume)
        vol = self._find_volume(pod_uid, volume)
        if vol is None:
            return
        try:
            current = _current_dir(vol, target)
            if current is None:
                return  # never written; a crash before the first swap left only hidden debris
            try:
                version = _open_dir(vol, current, target / current)
                try:
                    names = {e.name for e in os.scandir(version) if not e.name.startswith("..")}
                finally:
                    os.close(version)
                _link_user_visible(vol, names)
                _remove_stale_dirs(vol, keep=current)
            except OSError as exc:
                raise StorageError(
                    str(target), f"cannot finish an interrupted write: {exc}"
                ) from exc
        finally:
            os.close(vol)

    def remove_pod(self, pod_uid: str) -> None:
        """Delete the pod's projected volumes. Refused when the way to them holds a link; below
        that, links are deleted as entries and never followed."""
        pod_dir = self._pod_dir(pod_uid)
        opened: list[int] = []  # pods, the pod, its volumes: kept to prune them when emptied
        try:
            opened.append(self._open(("pods",)))
            opened.append(_open_dir(opened[0], pod_uid, pod_dir))
            opened.append(_open_dir(opened[1], "volumes", pod_dir / "volumes"))
            if not stat.S_ISDIR(os.lstat(PLUGIN_DIR, dir_fd=opened[2]).st_mode):
                raise _not_a_directory(opened[2], PLUGIN_DIR, pod_dir / "volumes" / PLUGIN_DIR)
            # rmtree given a dir_fd walks by descriptors and refuses links (its safe variant).
            shutil.rmtree(PLUGIN_DIR, dir_fd=opened[2])
            # Prune the parents only when empty: another plugin may share the pod directory.
            with contextlib.suppress(OSError):
                os.rmdir("volumes", dir_fd=opened[1])
                os.rmdir(pod_uid, dir_fd=opened[0])
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StorageError(str(pod_dir), f"cannot remove: {exc}") from exc
        finally:
            for fd in opened:
                os.close(fd)

    def list_pods(self) -> list[str]:
        """Pods with a projected-volume directory, and pods whose way there holds a link (their
        clean-up reports it)."""
        try:
            pods = self._open(("pods",))
        except FileNotFoundError:
            return []
        found = []
        try:
            for entry in list(os.scandir(pods)):
                if not entry.is_symlink() and not entry.is_dir(follow_symlinks=False):
                    continue
                try:
                    parts = (entry.name, "volumes", PLUGIN_DIR)
                    os.close(_walk_into(os.dup(pods), self.root / "pods", parts))
                except FileNotFoundError:
                    continue
                except UnsafeDirectoryError:
                    pass
                found.append(entry.name)
        finally:
            os.close(pods)
        return sorted(found)

    def list_volumes(self, pod_uid: str) -> list[str]:
        self._pod_dir(pod_uid)  # checks the name
        try:
            projected = self._open(("pods", pod_uid, "volumes", PLUGIN_DIR))
        except FileNotFoundError:
            return []
        try:
            return sorted(
                entry.name
                for entry in list(os.scandir(projected))
                if entry.is_dir(follow_symlinks=False)
            )
        finally:
            os.close(projected)


# -- descriptor-relative helpers ------------------------------------------------------------------


def _open_dir(parent: int, name: str, shown: Path) -> int:
    """`name` inside the directory `parent`, opened as a directory and never through a link."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _not_a_directory(parent, name, shown) from exc
        raise


def _walk_into(fd: int, shown: Path, parts: tuple[str, ...], *, create: bool = False) -> int:
    """Descend from the directory `fd` (which this takes over and closes) through `parts`, one
    openat(2) at a time and never through a link; each part made first when `create`."""
    try:
        for part in parts:
            shown = shown / part
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, _DIR_MODE, dir_fd=fd)
            child = _open_dir(fd, part, shown)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _not_a_directory(parent: int, name: str, shown: Path) -> UnsafeDirectoryError:
    try:
        link = stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode)
    except OSError:
        link = False
    return UnsafeDirectoryError(str(shown), "is a symbolic link" if link else "is not a directory")


def _current_dir(vol: int, target: Path) -> str | None:
    """The version `..data` names, or None when there is none. A `..data` that is not a link to
    a writer-named sibling is somebody else's doing: refused, never followed."""
    try:
        name = os.readlink(DATA_DIR, dir_fd=vol)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise UnsafeDirectoryError(
                str(target / DATA_DIR), "is not a symbolic link to one of the writer's versions"
            ) from exc
        raise StorageError(str(target / DATA_DIR), f"unreadable: {exc}") from exc
    if not _VERSION_NAME.fullmatch(name):
        raise UnsafeDirectoryError(
            str(target / DATA_DIR), f"points outside the volume's versions ({name[:80]!r})"
        )
    return name


def _same_payload(
    vol: int, target: Path, current: str, files: Mapping[str, FileSpec], owner: int | None
) -> bool:
    """True when the live version already holds exactly `files` (the kubelet skips then)."""
    try:
        version = _open_dir(vol, current, target / current)
    except OSError:
        return False  # gone: a damaged `..data` is replaced by the write
    try:
        seen = set()
        with contextlib.closing(_files(version)) as found:
            for path, parent, name, info in found:
                spec = files.get(path)
                if (
                    spec is None
                    or stat.S_IMODE(info.st_mode) != spec.mode
                    or (owner is not None and info.st_uid != owner)
                    or info.st_size != len(spec.data)
                    or _read_plain(parent, name) != spec.data
                ):
                    return False
                seen.add(path)
        return seen == set(files)
    except OSError:
        return False
    finally:
        os.close(version)


def _read_version(vol: int, target: Path, current: str) -> dict[str, bytes]:
    version = _open_dir(vol, current, target / current)
    try:
        content = {}
        for path, parent, name, _ in _files(version):
            data = _read_plain(parent, name)
            if data is not None:
                content[path] = data
        return content
    finally:
        os.close(version)


def _files(
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
                child = os.open(entry.name, _DIR_FLAGS, dir_fd=base)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    continue  # swapped for something else since the listing: not ours
                raise
            try:
                yield from _files(child, f"{relative}/", depth + 1)
            finally:
                os.close(child)
        elif entry.is_file(follow_symlinks=False):
            info = entry.stat(follow_symlinks=False)
            if info.st_nlink == 1:
                yield relative, base, entry.name, info


def _read_plain(parent: int, name: str) -> bytes | None:
    """The bytes of a plain file, or None when `name` is a link, a special or hard-linked file."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=parent)
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


def _make_version_dir(vol: int, prefix: str) -> tuple[str, int]:
    """A new, empty version directory inside the volume: its name and descriptor."""
    for _ in range(100):
        name = prefix + os.urandom(5).hex()
        try:
            os.mkdir(name, 0o700, dir_fd=vol)
        except FileExistsError:
            continue
        return name, _open_dir(vol, name, Path(name))
    raise FileExistsError(errno.EEXIST, "no free version directory name", prefix)


class _Tree:
    """Descriptors of the directories on the way to the file being written in a new version.

    Files come sorted by path components, so once the writer leaves a directory it never comes
    back: the directory is synced and closed then, and at most one chain of descriptors (no
    deeper than MAX_PATH_DEPTH) is open at a time.
    """

    def __init__(self, base: int, owner: int | None) -> None:
        self._base, self._owner = base, owner
        self._open: list[tuple[str, int]] = []

    def enter(self, parts: list[str]) -> int:
        """The descriptor of base/parts, creating what is missing (0755, owned by `owner`)."""
        keep = 0
        while keep < min(len(parts), len(self._open)) and self._open[keep][0] == parts[keep]:
            keep += 1
        self._leave(keep, sync=True)
        for part in parts[keep:]:
            parent = self._open[-1][1] if self._open else self._base
            created = True
            try:
                os.mkdir(part, _DIR_MODE, dir_fd=parent)
            except FileExistsError:
                created = False
            fd = _open_dir(parent, part, Path(part))
            self._open.append((part, fd))
            if created:
                os.fchmod(fd, _DIR_MODE)  # mkdir's mode is filtered by the umask
                if self._owner is not None:
                    os.fchown(fd, self._owner, -1)
        return self._open[-1][1] if self._open else self._base

    def _leave(self, keep: int, *, sync: bool) -> None:
        while len(self._open) > keep:
            _, fd = self._open.pop()
            try:
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)

    def close(self, *, sync: bool) -> None:
        self._leave(0, sync=sync)


def _write_file(parent: int, name: str, spec: FileSpec, owner: int | None) -> None:
    # Created owner-only and widened by fchmod, so a secret is never readable under a laxer mode;
    # O_EXCL|O_NOFOLLOW: never through anything already at that name.
    fd = os.open(name, _WRITE_FLAGS, 0o600, dir_fd=parent)
    try:
        view = memoryview(spec.data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if owner is not None:
            os.fchown(fd, owner, -1)
        os.fchmod(fd, spec.mode)  # exact bits, whatever the umask
        os.fsync(fd)
    finally:
        os.close(fd)


def _link_user_visible(vol: int, names: set[str]) -> None:
    for name in sorted(names):
        wanted = f"{DATA_DIR}/{name}"
        with contextlib.suppress(OSError):
            if os.readlink(name, dir_fd=vol) == wanted:
                continue
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.lstat(name, dir_fd=vol).st_mode):
                shutil.rmtree(name, dir_fd=vol)
        # Build the link aside and rename it in, so the name never disappears for readers; the
        # rename replaces whatever was at the name (a link included) without following it.
        aside = f"{DATA_TMP}.{name}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(aside, dir_fd=vol)
        os.symlink(wanted, aside, dir_fd=vol)
        os.replace(aside, name, src_dir_fd=vol, dst_dir_fd=vol)
    # Names from earlier versions that the new payload no longer has. Only our own links are
    # touched: anything else in the directory is not ours to delete.
    for entry in list(os.scandir(vol)):
        if entry.name.startswith("..") or entry.name in names or not entry.is_symlink():
            continue
        if os.readlink(entry.name, dir_fd=vol) == f"{DATA_DIR}/{entry.name}":
            os.unlink(entry.name, dir_fd=vol)


def _remove_stale_dirs(vol: int, keep: str) -> None:
    """Drop every hidden version directory but the live one (also crash leftovers)."""
    for entry in list(os.scandir(vol)):
        if entry.name in (DATA_DIR, DATA_TMP, keep) or not entry.name.startswith(".."):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.name, dir_fd=vol, ignore_errors=True)
        elif entry.is_symlink() and entry.name.startswith(DATA_TMP):
            os.unlink(entry.name, dir_fd=vol)
