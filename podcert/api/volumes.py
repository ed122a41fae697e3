"""Where the kubelet keeps projected volumes, and how its atomic writer names what it writes.

    ROOT/pods/<pod UID>/volumes/kubernetes.io~projected/<volume>/
        ..2026_11_29_20_01_02.<random>/<files>   one complete version
        ..data -> ..2026_11_29_20_01_02.<random>  swapped by rename(2) from ..data_tmp
        <file> -> ..data/<file>                    what the pod opens

The shim's writer produces this layout, the audit and the benches read it, and `read_consistently`
is the one way to read a version that a rotation may remove mid-read. Pure: the caller hands in
its own readlink and read functions (by descriptor in the shim, by path in the audit).
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
