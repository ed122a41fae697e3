"""podcert.api.volumes: the kubelet's projected-volume layout and its atomic writer's names
(where a volume lives, what a version directory and a visible link are called), which paths a
volume may hold (`path_problem`), and `read_consistently`, the one way to read a version that a
rotation may remove mid-read: kept only when `..data` still names it after the read, read again
when it went away, given up on when it never holds still."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from podcert.api.volumes import (
    DATA_DIR,
    MAX_NAME_BYTES,
    MAX_PATH_BYTES,
    MAX_PATH_DEPTH,
    READ_ATTEMPTS,
    VERSION_NAME,
    VolumeChangingError,
    path_problem,
    projected_dir,
    read_consistently,
    version_prefix,
    visible_link,
    volume_dir,
)

UID = "0b7c6a1e-6f5e-4a57-9a3c-2d7b0c1f9e11"


# --- the layout -----------------------------------------------------------------------------------


def test_a_volume_lives_where_the_kubelet_keeps_projected_volumes() -> None:
    root = Path("/var/lib/kubelet")
    projected = root / "pods" / UID / "volumes" / "kubernetes.io~projected"
    assert projected_dir(root, UID) == projected
    assert volume_dir(root, UID, "identity") == projected / "identity"


def test_a_version_is_named_after_its_write_in_utc_and_visible_names_link_into_data() -> None:
    moment = dt.datetime(2026, 11, 29, 21, 1, 2, 999, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    prefix = version_prefix(moment)
    assert prefix == "..2026_11_29_20_01_02."
    assert VERSION_NAME.fullmatch(prefix + "0a1b2c3d4e")
    assert visible_link("credentialbundle.pem") == f"{DATA_DIR}/credentialbundle.pem"


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(DATA_DIR, id="..data itself"),
        pytest.param("..data_tmp", id="..data_tmp"),
        pytest.param("..2026_11_29_20_01_02.", id="no random part"),
        pytest.param("..2026_11_29_20_01.abc", id="a short time"),
        pytest.param("..2026_11_29_20_01_02.a/b", id="a path"),
        pytest.param("../2026_11_29_20_01_02.abc", id="a way out"),
        pytest.param("/tmp/..2026_11_29_20_01_02.abc", id="absolute"),
    ],
)
def test_only_a_writer_named_version_matches(name: str) -> None:
    assert VERSION_NAME.fullmatch(name) is None


# --- which paths a volume may hold ----------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "credentialbundle.pem",
        "tls/tls.key",
        "a-name-ending-in-dots..",
        "a..b/c",
        "n" * MAX_NAME_BYTES,
        "/".join(["d"] * MAX_PATH_DEPTH),
        "é" * (MAX_NAME_BYTES // 2),
    ],
)
def test_safe_paths_have_no_problem(path: str) -> None:
    assert path_problem(path) is None


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("", "must not be empty"),
        ("a\0b", "must not contain NUL"),
        ("/etc/passwd", "must be a relative path"),
        ("a/../../b", "must not contain '..'"),
        ("..", "must not contain '..'"),
        ("..data", "must not start with '..'"),
        ("a//b", "must not contain empty or '.' components"),
        ("a/./b", "must not contain empty or '.' components"),
        ("a/", "must not contain empty or '.' components"),
        ("\udc80", "must be valid UTF-8"),
        ("/".join(["n" * 200] * 21), f"must be at most {MAX_PATH_BYTES} bytes long"),
        ("n" * (MAX_NAME_BYTES + 1), f"must not have a name longer than {MAX_NAME_BYTES} bytes"),
        (
            "é" * (MAX_NAME_BYTES // 2 + 1),
            f"must not have a name longer than {MAX_NAME_BYTES} bytes",
        ),
        (
            "/".join(["d"] * (MAX_PATH_DEPTH + 1)),
            f"must not nest more than {MAX_PATH_DEPTH} levels",
        ),
    ],
)
def test_unsafe_paths_are_refused_saying_why(path: str, problem: str) -> None:
    said = path_problem(path)
    assert said is not None and said.startswith(problem)


# --- reading one version --------------------------------------------------------------------------


class Volume:
    """`..data` as a sequence of what it names at each look; `read` records what it read."""

    def __init__(self, *names: str | None, gone: set[str] | None = None) -> None:
        self.names = list(names)
        self.looks = 0
        self.gone = gone or set()
        self.read: list[str] = []

    def current(self) -> str | None:
        name = self.names[min(self.looks, len(self.names) - 1)]
        self.looks += 1
        return name

    def read_version(self, version: str) -> str:
        self.read.append(version)
        if version in self.gone:
            raise FileNotFoundError(version)
        return f"content of {version}"


def test_a_version_that_held_still_is_read_once() -> None:
    volume = Volume("v1")
    assert read_consistently(volume.current, volume.read_version) == "content of v1"
    assert (volume.read, volume.looks) == (["v1"], 2)


def test_a_volume_never_written_reads_as_none() -> None:
    volume = Volume(None)
    assert read_consistently(volume.current, volume.read_version) is None
    assert volume.read == []


def test_a_read_across_a_swap_is_thrown_away_and_done_again() -> None:
    # v1 read, then ..data names v2: the read may mix the two, so v2 is read afresh.
    volume = Volume("v1", "v2", "v2", "v2")
    assert read_consistently(volume.current, volume.read_version) == "content of v2"
    assert volume.read == ["v1", "v2"]


def test_a_version_removed_mid_read_is_followed_to_the_next() -> None:
    volume = Volume("v1", "v2", "v2", gone={"v1"})
    assert read_consistently(volume.current, volume.read_version) == "content of v2"
    assert volume.read == ["v1", "v2"]


def test_a_volume_that_never_holds_still_is_given_up_on() -> None:
    swapping = Volume(*[f"v{i}" for i in range(2 * READ_ATTEMPTS + 2)])
    with pytest.raises(VolumeChangingError, match=r"\.\.data kept changing"):
        read_consistently(swapping.current, swapping.read_version)
    assert len(swapping.read) == READ_ATTEMPTS
    always_gone = Volume("v1", gone={"v1"})
    with pytest.raises(VolumeChangingError):
        read_consistently(always_gone.current, always_gone.read_version)
    assert len(always_gone.read) == READ_ATTEMPTS


def test_other_errors_of_a_read_pass_through() -> None:
    def broken(version: str) -> str:
        raise PermissionError(version)

    with pytest.raises(PermissionError):
        read_consistently(lambda: "v1", broken)
