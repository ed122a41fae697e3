"""Where the kubelet keeps projected volumes, and how its atomic writer names what it writes.

    ROOT/pods/<pod UID>/volumes/kubernetes.io~projected/<volume>/
        ..2026_11_29_20_01_02.<random>/<files>   one complete version
        ..data -> ..2026_11_29_20_01_02.<random>  swapped by rename(2) from ..data_tmp
        <file> -> ..data/<file>                    what the pod opens

The shim's writer produces this layout, the audit and the benches read it, and `read_consistently`
is the one way to read a version that a rotation may remove mid-read. Pure: the caller hands in
its own readlink and read functions (by descriptor in the shim, by path in the audit).
`path_problem` says which paths a volume may hold: the pod spec's reading refuses the others and
the writer never writes them.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar

PODS_DIR: Final = "pods"
VOLUMES_DIR: Final = "volumes"
PLUGIN_DIR: Final = "kubernetes.io~projected"
DATA_DIR: Final = "..data"
DATA_TMP: Final = "..data_tmp"
# A version directory's name: `..` + the write's UTC time + `.` + a random part.
VERSION_NAME: Final = re.compile(r"\.\.\d{4}(?:_\d{2}){5}\.[A-Za-z0-9_]{1,64}")
# How often a read follows `..data` again when a rotation removed the version it was reading.
READ_ATTEMPTS: Final = 5
# The kubelet's atomic writer limits (maxPathLength, maxFileNameLength); no Linux file system
# takes longer names, and a volume whose write can never succeed would never be served.
MAX_PATH_BYTES: Final = 4096
MAX_NAME_BYTES: Final = 255
# Ours: the kubelet has no depth limit, but a tree thousands of levels deep cannot be removed by
# recursive clean-up (shutil.rmtree), so it would outlive its pod. No projection needs 128.
MAX_PATH_DEPTH: Final = 128

T = TypeVar("T")


class VolumeChangingError(Exception):
    """`..data` moved on every attempt: the volume is being rewritten faster than it is read."""


def projected_parts(pod_uid: str) -> tuple[str, ...]:
    """The directories from the kubelet root to a pod's projected volumes, one name each."""
    return (PODS_DIR, pod_uid, VOLUMES_DIR, PLUGIN_DIR)


def volume_parts(pod_uid: str, volume: str) -> tuple[str, ...]:
    """The directories from the kubelet root to a volume, one name each."""
    return (*projected_parts(pod_uid), volume)


def projected_dir(root: Path, pod_uid: str) -> Path:
    """Where a pod's projected volumes live under a kubelet root."""
    return root.joinpath(*projected_parts(pod_uid))


def volume_dir(root: Path, pod_uid: str, volume: str) -> Path:
    return root.joinpath(*volume_parts(pod_uid, volume))


def version_prefix(moment: dt.datetime) -> str:
    """The start of a version directory's name written at `moment`; a random part follows."""
    return moment.astimezone(dt.UTC).strftime("..%Y_%m_%d_%H_%M_%S.")


def visible_link(name: str) -> str:
    """What a user-visible name points to: its entry in the live version."""
    return f"{DATA_DIR}/{name}"


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


def read_consistently(
    current: Callable[[], str | None],
    read: Callable[[str], T],
    *,
    attempts: int = READ_ATTEMPTS,
) -> T | None:
    """One consistent version of a volume: `read(version)` of the version `..data` names, kept
    only if `..data` still names it afterwards (the writer deletes a version only after swapping
    `..data` away from it, so the read saw one whole version).

    `current()` returns what `..data` names, or None when there is no `..data` (then so is the
    result). A `read` that meets FileNotFoundError (the version went away) is tried again, up
    to `attempts` times, then VolumeChangingError. Anything else either raises passes through.
    """
    for _ in range(attempts):
        version = current()
        if version is None:
            return None
        try:
            content = read(version)
        except FileNotFoundError:
            continue
        if current() == version:
            return content
    raise VolumeChangingError(f"{DATA_DIR} kept changing while the volume was read")
