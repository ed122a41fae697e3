"""Where projected files live: a small protocol, the rules every implementation shares, and an
in-memory twin.

Pods read their credential while the shim rotates it, so a volume must change all at once; a
failed write leaves the previous version untouched. The agent reconciles against what
`read_volume` returns, which is also how it resumes after a restart without asking for new
certificates. `kubelet_shim.atomic` is the real one, the kubelet's atomic writer on disk; the
twin here shares its validation (names, paths, modes) so agent tests see the same refusals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from podcert.api.volumes import path_problem, volume_parts


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


def check_name(kind: str, name: str) -> None:
    """Pod UIDs and volume names become single directory names under the root."""
    if not name or "/" in name or "\0" in name or name in (".", "..") or name.startswith(".."):
        raise UnsafePathError(name, f"invalid {kind}")


def check_payload(files: Mapping[str, FileSpec]) -> None:
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


def top_level(path: str) -> str:
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
                "/".join(volume_parts(pod_uid, volume)), "is a symbolic link"
            )

    def write_volume(
        self, pod_uid: str, volume: str, files: Mapping[str, FileSpec], owner: int | None
    ) -> None:
        check_name("pod UID", pod_uid)
        check_name("volume name", volume)
        check_payload(files)
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
        check_name("pod UID", pod_uid)
        check_name("volume name", volume)
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
