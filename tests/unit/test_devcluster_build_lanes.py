"""`podcert devcluster build` runs its two lanes of Go builds at once (devcluster.cli._lanes):
each lane runs while the other does, and a lane's error is raised only once every lane ended, so
a failed Kubernetes build never leaves a SPIRE build half written behind the command's exit."""

from __future__ import annotations

import threading

import pytest

from devcluster.build import BuildError
from devcluster.cli import _labelled, _lanes

DEADLINE = 10.0  # seconds; each lane needs the other only for a moment


def test_the_lanes_run_at_once() -> None:
    first, second = threading.Event(), threading.Event()
    met: list[str] = []

    def lane_a() -> None:
        first.set()
        assert second.wait(DEADLINE), "lane b never ran beside lane a"
        met.append("a")

    def lane_b() -> None:
        second.set()
        assert first.wait(DEADLINE), "lane a never ran beside lane b"
        met.append("b")

    _lanes(lane_a, lane_b)
    assert sorted(met) == ["a", "b"]


def test_a_lanes_error_is_raised_once_the_other_lane_ended() -> None:
    failed = threading.Event()
    ended: list[str] = []

    def failing() -> None:
        failed.set()
        raise BuildError("kube-apiserver: go build failed")

    def slower() -> None:
        assert failed.wait(DEADLINE)
        ended.append("tools")

    with pytest.raises(BuildError, match="kube-apiserver"):
        _lanes(failing, slower)
    assert ended == ["tools"]


def test_a_lanes_lines_are_marked_with_it(capsys: pytest.CaptureFixture[str]) -> None:
    _labelled("tools")("building helm v3.22.0")
    assert capsys.readouterr().err == "tools | building helm v3.22.0\n"
