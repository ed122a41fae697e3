"""Where projected files live: a small protocol, an in-memory twin, and the kubelet's atomic writer.

Pods read their credential while the shim rotates it, so a volume must change all at once: every
version is a complete hidden directory and the user-visible names reach it through one symlink
(`..data`) that is swapped by rename(2). A failed write leaves the previous version untouched.
The agent reconciles against what `read_volume` returns, which is also how it resumes after a
restart without asking for new certificates.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
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
        self.writes = 0

    def fail_next_write(self, error: OSError) -> None:
        """Make the next write fail like a full disk would, leaving the old content."""
        self._fail_next = error

    def write_volume(
        self, pod_uid: str, volume: str, files: Mapping[str, FileSpec], owner: int | None
    ) -> None:
        _check_name("pod UID", pod_uid)
        _check_name("volume name", volume)
        _check_payload(files)
        if self._fail_next is not None:
            error, self._fail_next = self._fail_next, None
            raise StorageError(f"{pod_uid}/{volume}", f"write failed: {error}") from error
        self._volumes[pod_uid, volume] = dict(files)
        self._owners[pod_uid, volume] = owner
        self.writes += 1

    def read_volume(self, pod_uid: str, volume: str) -> Mapping[str, bytes] | None:
        files = self._volumes.get((pod_uid, volume))
        if files is None:
            return None
        return {path: spec.data for path, spec in files.items()}

    def recover_volume(self, pod_uid: str, volume: str) -> None:
        _check_name("pod UID", pod_uid)
        _check_name("volume name", volume)
        # Writes here are all or nothing: no crash leaves anything to finish.

    def files(self, pod_uid: str, volume: str) -> Mapping[str, FileSpec] | None:
        return self._volumes.get((pod_uid, volume))

    def owner(self, pod_uid: str, volume: str) -> int | None:
        return self._owners.get((pod_uid, volume))

    def remove_pod(self, pod_uid: str) -> None:
        for key in [key for key in self._volumes if key[0] == pod_uid]:
            del self._volumes[key]
            self._owners.pop(key, None)

    def list_pods(self) -> list[str]:
        return sorted({uid for uid, _ in self._volumes})

    def list_volumes(self, pod_uid: str) -> list[str]:
        return sorted(volume for uid, volume in self._volumes if uid == pod_uid)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class AtomicDirStorage:
    """Volumes under `root/pods/<uid>/volumes/kubernetes.io~projected/<volume>`, kubelet layout.

    One writer per volume at a time (the agent's per-pod queue guarantees it); any number of
    readers. The clock only names the hidden directories, as the kubelet does.
    """

    def __init__(self, root: Path, *, clock: Callable[[], datetime] = _utcnow) -> None:
        self.root = Path(root)
        self._clock = clock

    def _pod_dir(self, pod_uid: str) -> Path:
        _check_name("pod UID", pod_uid)
        return self.root / "pods" / pod_uid

    def volume_dir(self, pod_uid: str, volume: str) -> Path:
        _check_name("volume name", volume)
        return self._pod_dir(pod_uid) / "volumes" / PLUGIN_DIR / volume

    # -- writing ---------------------------------------------------------------------------

    def write_volume(
        self, pod_uid: str, volume: str, files: Mapping[str, FileSpec], owner: int | None
    ) -> None:
        _check_payload(files)
        target = self.volume_dir(pod_uid, volume)
        if owner is not None and os.geteuid() != 0:
            owner = None  # only root can give files away; unprivileged runs (tests) skip it
        try:
            target.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(str(target), f"cannot create volume directory: {exc}") from exc

        try:
            current = self._current_dir(target)
        except StorageError:
            current = None  # a damaged ..data is simply replaced by the rename below
        if current is None or not self._same_payload(target / current, files, owner):
            new_dir = self._publish(target, files, owner)
        else:
            new_dir = current
        # Runs even when the content was unchanged, so a write that crashed after the swap is
        # completed by the next one.
        try:
            self._link_user_visible(target, {_top_level(path) for path in files})
            self._remove_stale_dirs(target, keep=new_dir)
        except OSError as exc:
            raise StorageError(str(target), f"cannot update visible names: {exc}") from exc

    def _publish(self, target: Path, files: Mapping[str, FileSpec], owner: int | None) -> str:
        """Write a complete new version and swap `..data` to it; return its directory name."""
        prefix = self._clock().astimezone(UTC).strftime("..%Y_%m_%d_%H_%M_%S.")
        try:
            new_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=target))
        except OSError as exc:
            raise StorageError(str(target), f"cannot create version directory: {exc}") from exc
        failed_at = new_dir
        try:
            new_dir.chmod(_DIR_MODE)
            for path, spec in sorted(files.items()):
                failed_at = new_dir / path
                _write_file(new_dir, path, spec, owner)
            for directory in sorted(_dirs_of(files), key=len, reverse=True):
                failed_at = new_dir / directory
                _fsync_dir(new_dir / directory)
            failed_at = new_dir
            _fsync_dir(new_dir)
            failed_at = target / DATA_TMP
            with contextlib.suppress(FileNotFoundError):
                (target / DATA_TMP).unlink()  # left by a crash between symlink and rename
            (target / DATA_TMP).symlink_to(new_dir.name)
            failed_at = target / DATA_DIR
            (target / DATA_TMP).replace(target / DATA_DIR)
        except OSError as exc:
            with contextlib.suppress(FileNotFoundError):
                (target / DATA_TMP).unlink()
            shutil.rmtree(new_dir, ignore_errors=True)
            reason = "no space left on device" if exc.errno == errno.ENOSPC else str(exc)
            raise StorageError(
                str(failed_at), f"write failed, previous version kept: {reason}"
            ) from exc
        try:
            _fsync_dir(target)
        except OSError as exc:
            raise StorageError(str(target), f"cannot sync volume directory: {exc}") from exc
        return new_dir.name

    @staticmethod
    def _same_payload(current: Path, files: Mapping[str, FileSpec], owner: int | None) -> bool:
        """True when the live version already holds exactly `files` (the kubelet skips then)."""
        try:
            on_disk = dict(_walk(current))
            if set(on_disk) != set(files):
                return False
            for path, spec in files.items():
                info = on_disk[path]
                if stat.S_IMODE(info.st_mode) != spec.mode:
                    return False
                if owner is not None and info.st_uid != owner:
                    return False
                if info.st_size != len(spec.data) or (current / path).read_bytes() != spec.data:
                    return False
        except OSError:
            return False
        return True

    @staticmethod
    def _link_user_visible(target: Path, names: set[str]) -> None:
        for name in sorted(names):
            link = target / name
            wanted = f"{DATA_DIR}/{name}"
            with contextlib.suppress(OSError):
                if str(link.readlink()) == wanted:
                    continue
            if link.is_dir() and not link.is_symlink():
                shutil.rmtree(link)
            # Build the link aside and rename it in, so the name never disappears for readers.
            aside = target / f"{DATA_TMP}.{name}"
            with contextlib.suppress(FileNotFoundError):
                aside.unlink()
            aside.symlink_to(wanted)
            aside.replace(link)
        # Names from earlier versions that the new payload no longer has. Only our own links
        # are touched: anything else in the directory is not ours to delete.
        for entry in os.scandir(target):
            if entry.name.startswith("..") or entry.name in names or not entry.is_symlink():
                continue
            link = Path(entry.path)
            if str(link.readlink()) == f"{DATA_DIR}/{entry.name}":
                link.unlink()

    @staticmethod
    def _remove_stale_dirs(target: Path, keep: str) -> None:
        """Drop every hidden version directory but the live one (also crash leftovers)."""
        for entry in os.scandir(target):
            if entry.name in (DATA_DIR, DATA_TMP, keep) or not entry.name.startswith(".."):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            elif entry.is_symlink() and entry.name.startswith(DATA_TMP):
                Path(entry.path).unlink()

    # -- reading ---------------------------------------------------------------------------

    @staticmethod
    def _current_dir(target: Path) -> str | None:
        try:
            name = str((target / DATA_DIR).readlink())
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(str(target / DATA_DIR), f"unreadable: {exc}") from exc
        if "/" in name or not name.startswith(".."):
            raise StorageError(str(target / DATA_DIR), f"points outside the volume: {name!r}")
        return name

    def read_volume(self, pod_uid: str, volume: str) -> Mapping[str, bytes] | None:
        """One consistent version: every file comes from the directory `..data` named throughout.

        A rotation can delete the version being read (scandir then just lists fewer files), so
        the read only counts if `..data` still names the same directory afterwards: the writer
        deletes a version only after swapping `..data` away from it.
        """
        target = self.volume_dir(pod_uid, volume)
        for _ in range(_READ_ATTEMPTS):
            current = self._current_dir(target)
            if current is None:
                return None
            try:
                content = {
                    path: (target / current / path).read_bytes()
                    for path, _ in _walk(target / current)
                }
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise StorageError(str(target), f"unreadable: {exc}") from exc
            if self._current_dir(target) == current:
                return content
        raise StorageError(str(target), "content kept changing while being read")

    def recover_volume(self, pod_uid: str, volume: str) -> None:
        """Finish a write whose writer was killed after its swap: link the visible names of the
        version `..data` names (a first write shows no file until then) and remove the versions
        it replaced (one holds the previous private key). The content does not change, so an
        agent that finds it current after a restart need not write it again.
        """
        target = self.volume_dir(pod_uid, volume)
        current = self._current_dir(target)
        if current is None:
            return  # never written; a crash before the first swap left only hidden debris
        try:
            names = {entry.name for entry in os.scandir(target / current)}
            self._link_user_visible(target, names)
            self._remove_stale_dirs(target, keep=current)
        except OSError as exc:
            raise StorageError(str(target), f"cannot finish an interrupted write: {exc}") from exc

    def remove_pod(self, pod_uid: str) -> None:
        pod_dir = self._pod_dir(pod_uid)
        projected = pod_dir / "volumes" / PLUGIN_DIR
        try:
            shutil.rmtree(projected)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StorageError(str(projected), f"cannot remove: {exc}") from exc
        # Prune the parents only when empty: another plugin may share the pod directory.
        for parent in (projected.parent, pod_dir):
            try:
                parent.rmdir()
            except OSError:
                break

    def list_pods(self) -> list[str]:
        pods = self.root / "pods"
        try:
            entries = list(os.scandir(pods))
        except FileNotFoundError:
            return []
        return sorted(
            entry.name
            for entry in entries
            if entry.is_dir(follow_symlinks=False)
            and (Path(entry.path) / "volumes" / PLUGIN_DIR).is_dir()
        )

    def list_volumes(self, pod_uid: str) -> list[str]:
        projected = self._pod_dir(pod_uid) / "volumes" / PLUGIN_DIR
        try:
            return sorted(
                entry.name for entry in os.scandir(projected) if entry.is_dir(follow_symlinks=False)
            )
        except FileNotFoundError:
            return []


def _dirs_of(files: Mapping[str, FileSpec]) -> set[str]:
    dirs: set[str] = set()
    for path in files:
        parts = path.split("/")[:-1]
        dirs.update("/".join(parts[: depth + 1]) for depth in range(len(parts)))
    return dirs


def _write_file(base: Path, path: str, spec: FileSpec, owner: int | None) -> None:
    destination = base / path
    parent = base
    for part in path.split("/")[:-1]:
        parent = parent / part
        if not parent.is_dir():
            parent.mkdir(mode=_DIR_MODE)
            parent.chmod(_DIR_MODE)  # mkdir's mode is filtered by the umask
            if owner is not None:
                os.chown(parent, owner, -1)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    # Created owner-only and widened by fchmod, so a secret is never readable under a laxer mode.
    fd = os.open(destination, flags, 0o600)
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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _walk(base: Path) -> Iterator[tuple[str, os.stat_result]]:
    """Regular files under `base` as (relative path, lstat); symlinks are never followed."""
    stack = [""]
    while stack:
        prefix = stack.pop()
        for entry in os.scandir(base / prefix if prefix else base):
            relative = f"{prefix}/{entry.name}" if prefix else entry.name
            if entry.is_dir(follow_symlinks=False):
                stack.append(relative)
            elif entry.is_file(follow_symlinks=False):
                yield relative, entry.stat(follow_symlinks=False)
