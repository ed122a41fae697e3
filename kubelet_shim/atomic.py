"""The kubelet's atomic writer, on disk: every version of a volume is a complete hidden
directory, and the user-visible names reach it through one symlink (`..data`) swapped by rename(2).

Nothing under the root is reached through a symbolic link (a volume directory replaced by a
link to a folder elsewhere would otherwise receive the pod's new private key): every path is
walked by descriptor (`kubelet_shim.dirfd`). The only links are the writer's own: `..data` (and
`..data_tmp`) naming one of its `..<timestamp>` versions, and the visible names pointing into
`..data`; those it reads with readlink(2) and never follows itself.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from kubelet_shim.dirfd import (
    DIR_MODE,
    not_a_directory,
    open_dir,
    plain_files,
    read_plain,
    walk_into,
)
from kubelet_shim.storage import (
    FileSpec,
    StorageError,
    UnsafeDirectoryError,
    check_name,
    check_payload,
    top_level,
)
from podcert.api.volumes import (
    DATA_DIR,
    DATA_TMP,
    PLUGIN_DIR,
    PODS_DIR,
    VERSION_NAME,
    VOLUMES_DIR,
    VolumeChangingError,
    projected_parts,
    read_consistently,
    version_prefix,
    visible_link,
    volume_parts,
)


def _utcnow() -> datetime:
    return datetime.now(UTC)


# O_EXCL|O_NOFOLLOW: a file is created new, never opened through whatever is at its name.
_WRITE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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
        check_name("pod UID", pod_uid)
        return self.root / PODS_DIR / pod_uid

    def volume_dir(self, pod_uid: str, volume: str) -> Path:
        """Where the volume lives (for people and tests; the storage itself never opens a path
        below the root in one go)."""
        check_name("pod UID", pod_uid)
        check_name("volume name", volume)
        return self.root.joinpath(*volume_parts(pod_uid, volume))

    # -- walking the tree --------------------------------------------------------------------

    def _open(self, parts: tuple[str, ...], *, create: bool = False) -> int:
        """A descriptor of root/parts..., each part opened inside the one before without
        following a link; created (mode 0755) when `create`. Raises FileNotFoundError when a part
        is missing and UnsafeDirectoryError when one is a link or not a directory."""
        if create:
            self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        return walk_into(root, self.root, parts, create=create)

    def _create_volume(self, pod_uid: str, volume: str) -> int:
        target = self.volume_dir(pod_uid, volume)  # checks both names
        try:
            return self._open(volume_parts(pod_uid, volume), create=True)
        except OSError as exc:
            raise StorageError(str(target), f"cannot create volume directory: {exc}") from exc

    def _find_volume(self, pod_uid: str, volume: str) -> int | None:
        """The volume's directory descriptor, or None when it was never created."""
        target = self.volume_dir(pod_uid, volume)  # checks both names
        try:
            return self._open(volume_parts(pod_uid, volume))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(str(target), f"unreadable: {exc}") from exc

    # -- writing ---------------------------------------------------------------------------

    def write_volume(
        self, pod_uid: str, volume: str, files: Mapping[str, FileSpec], owner: int | None
    ) -> None:
        check_payload(files)
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
                _link_user_visible(vol, {top_level(path) for path in files})
                _remove_stale_dirs(vol, keep=new_dir)
            except OSError as exc:
                raise StorageError(str(target), f"cannot update visible names: {exc}") from exc
        finally:
            os.close(vol)

    def _publish(
        self, vol: int, target: Path, files: Mapping[str, FileSpec], owner: int | None
    ) -> str:
        """Write a complete new version and swap `..data` to it; return its directory name."""
        prefix = version_prefix(self._clock())
        try:
            new_dir, new_fd = _make_version_dir(vol, prefix)
        except OSError as exc:
            raise StorageError(str(target), f"cannot create version directory: {exc}") from exc
        failed_at = target / new_dir
        try:
            tree = _Tree(new_fd, owner)
            try:
                os.fchmod(new_fd, DIR_MODE)
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

        def read(version: str) -> dict[str, bytes]:
            try:
                return _read_version(vol, target, version)
            except FileNotFoundError:
                raise  # removed by a rotation: read_consistently follows `..data` again
            except OSError as exc:
                raise StorageError(str(target), f"unreadable: {exc}") from exc

        try:
            return read_consistently(lambda: _current_dir(vol, target), read)
        except VolumeChangingError:
            raise StorageError(str(target), "content kept changing while being read") from None
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
                version = open_dir(vol, current, target / current)
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
            opened.append(self._open((PODS_DIR,)))
            opened.append(open_dir(opened[0], pod_uid, pod_dir))
            opened.append(open_dir(opened[1], VOLUMES_DIR, pod_dir / VOLUMES_DIR))
            if not stat.S_ISDIR(os.lstat(PLUGIN_DIR, dir_fd=opened[2]).st_mode):
                raise not_a_directory(opened[2], PLUGIN_DIR, pod_dir / VOLUMES_DIR / PLUGIN_DIR)
            # rmtree given a dir_fd walks by descriptors and refuses links (its safe variant).
            shutil.rmtree(PLUGIN_DIR, dir_fd=opened[2])
            # Prune the parents only when empty: another plugin may share the pod directory.
            with contextlib.suppress(OSError):
                os.rmdir(VOLUMES_DIR, dir_fd=opened[1])
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
            pods = self._open((PODS_DIR,))
        except FileNotFoundError:
            return []
        found = []
        try:
            for entry in list(os.scandir(pods)):
                if not entry.is_symlink() and not entry.is_dir(follow_symlinks=False):
                    continue
                try:
                    parts = projected_parts(entry.name)[1:]
                    os.close(walk_into(os.dup(pods), self.root / PODS_DIR, parts))
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
            projected = self._open(projected_parts(pod_uid))
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
    if not VERSION_NAME.fullmatch(name):
        raise UnsafeDirectoryError(
            str(target / DATA_DIR), f"points outside the volume's versions ({name[:80]!r})"
        )
    return name


def _same_payload(
    vol: int, target: Path, current: str, files: Mapping[str, FileSpec], owner: int | None
) -> bool:
    """True when the live version already holds exactly `files` (the kubelet skips then)."""
    try:
        version = open_dir(vol, current, target / current)
    except OSError:
        return False  # gone: a damaged `..data` is replaced by the write
    try:
        seen = set()
        with contextlib.closing(plain_files(version)) as found:
            for path, parent, name, info in found:
                spec = files.get(path)
                if (
                    spec is None
                    or stat.S_IMODE(info.st_mode) != spec.mode
                    or (owner is not None and info.st_uid != owner)
                    or info.st_size != len(spec.data)
                    or read_plain(parent, name) != spec.data
                ):
                    return False
                seen.add(path)
        return seen == set(files)
    except OSError:
        return False
    finally:
        os.close(version)


def _read_version(vol: int, target: Path, current: str) -> dict[str, bytes]:
    version = open_dir(vol, current, target / current)
    try:
        content = {}
        for path, parent, name, _ in plain_files(version):
            data = read_plain(parent, name)
            if data is not None:
                content[path] = data
        return content
    finally:
        os.close(version)


def _make_version_dir(vol: int, prefix: str) -> tuple[str, int]:
    """A new, empty version directory inside the volume: its name and descriptor."""
    for _ in range(100):
        name = prefix + os.urandom(5).hex()
        try:
            os.mkdir(name, 0o700, dir_fd=vol)
        except FileExistsError:
            continue
        return name, open_dir(vol, name, Path(name))
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
                os.mkdir(part, DIR_MODE, dir_fd=parent)
            except FileExistsError:
                created = False
            fd = open_dir(parent, part, Path(part))
            self._open.append((part, fd))
            if created:
                os.fchmod(fd, DIR_MODE)  # mkdir's mode is filtered by the umask
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
        wanted = visible_link(name)
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
        if os.readlink(entry.name, dir_fd=vol) == visible_link(entry.name):
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
