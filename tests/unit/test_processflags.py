"""podcert.processflags: the flags the signer and the shim both take, written once. Each component
passes its own defaults, which parsing with no flag gives back; `problem` names the first flag out
of range (workers 1 to 64, a port 0 to 65535 with 0 for a free one, a start-up timeout that is
not negative, and not NaN either), and says nothing of values in range. (Each command's one line
and exit 2 for a bad value is test_cli_errors.py's.)"""

from __future__ import annotations

import argparse

import pytest

from podcert import processflags
from podcert.processflags import MAX_PORT, MAX_WORKERS, port_problem, problem


def parser(
    *,
    metrics_host: str = "127.0.0.1",
    metrics_port: int = 9091,
    startup_timeout: float = 120.0,
    workers: int = 16,
) -> argparse.ArgumentParser:
    made = argparse.ArgumentParser()
    processflags.add(
        made,
        metrics_host=metrics_host,
        metrics_port=metrics_port,
        startup_timeout=startup_timeout,
        workers=workers,
        workers_help="pods reconciled at once",
    )
    return made


def test_no_flag_gives_the_components_own_defaults() -> None:
    args = parser(metrics_host="10.0.0.5", metrics_port=9090, startup_timeout=0, workers=4)
    parsed = args.parse_args([])
    assert (parsed.metrics_host, parsed.metrics_port) == ("10.0.0.5", 9090)
    assert (parsed.startup_timeout, parsed.workers, parsed.log_level) == (0.0, 4, "INFO")
    assert problem(parsed) is None
    assert "pods reconciled at once" in args.format_help()


def test_flags_are_read_with_their_types() -> None:
    parsed = parser().parse_args(
        [
            "--workers=8",
            "--metrics-port=0",
            "--metrics-host=::",
            "--startup-timeout=2.5",
            "--log-level=debug",
        ]
    )
    assert (parsed.workers, parsed.metrics_port, parsed.metrics_host) == (8, 0, "::")
    assert (parsed.startup_timeout, parsed.log_level) == (2.5, "DEBUG")


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        pytest.param(["--workers=1"], None, id="one worker"),
        pytest.param([f"--workers={MAX_WORKERS}"], None, id="the most workers"),
        pytest.param(["--workers=0"], "--workers must be between 1 and 64, got 0", id="none"),
        pytest.param(
            [f"--workers={MAX_WORKERS + 1}"], "--workers must be between 1 and 64, got 65", id="65"
        ),
        pytest.param(["--metrics-port=0"], None, id="a free port"),
        pytest.param([f"--metrics-port={MAX_PORT}"], None, id="the last port"),
        pytest.param(
            ["--metrics-port=-1"], "--metrics-port must be between 0 and 65535, got -1", id="-1"
        ),
        pytest.param(
            [f"--metrics-port={MAX_PORT + 1}"],
            "--metrics-port must be between 0 and 65535, got 65536",
            id="65536",
        ),
        pytest.param(["--startup-timeout=0"], None, id="wait forever"),
        pytest.param(
            ["--startup-timeout=-0.5"],
            "--startup-timeout must not be negative, got -0.5",
            id="negative",
        ),
        pytest.param(
            ["--startup-timeout=nan"], "--startup-timeout must not be negative, got nan", id="NaN"
        ),
        pytest.param(
            ["--workers=0", "--metrics-port=-1"],
            "--workers must be between 1 and 64, got 0",
            id="the first problem only",
        ),
    ],
)
def test_a_value_out_of_range_is_named(flags: list[str], said: str | None) -> None:
    assert problem(parser().parse_args(flags)) == said


def test_a_port_problem_names_the_flag_it_is_for() -> None:
    assert port_problem("--webhook-port", 8443) is None
    assert port_problem("--webhook-port", 70000) == (
        "--webhook-port must be between 0 and 65535, got 70000"
    )
