"""The flags every long-running podcert process takes (the signer and the shim), written once
with their checks: where /metrics, /healthz and /readyz listen, how long start-up waits for a
reachable API server, the log level, how many workers. Each component passes its own defaults
(its `build.Config`'s), so the help shows what that component does.
"""

from __future__ import annotations

import argparse
from typing import Final

from podcert import logs

MAX_PORT: Final = 65535
MAX_WORKERS: Final = 64


def add(
    parser: argparse.ArgumentParser,
    *,
    metrics_host: str,
    metrics_port: int,
    startup_timeout: float,
    workers: int,
    workers_help: str,
) -> None:
    parser.add_argument("--workers", type=int, default=workers, help=workers_help)
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=metrics_port,
        help="port for /metrics, /healthz and /readyz (0 picks a free one)",
    )
    parser.add_argument(
        "--metrics-host", default=metrics_host, help="address the metrics server binds"
    )
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=startup_timeout,
        help="seconds to wait for a reachable API server at start before exiting 1 (0: forever)",
    )
    parser.add_argument("--log-level", type=logs.level_name, default="INFO", help="log level")


def port_problem(flag: str, port: int) -> str | None:
    """Why `port` cannot be listened on as `flag` asks, or None (0 picks a free one)."""
    if not 0 <= port <= MAX_PORT:
        return f"{flag} must be between 0 and {MAX_PORT}, got {port}"
    return None


def problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags `add` defined, or None."""
    if not 1 <= args.workers <= MAX_WORKERS:
        return f"--workers must be between 1 and {MAX_WORKERS}, got {args.workers}"
    if said := port_problem("--metrics-port", args.metrics_port):
        return said
    if not args.startup_timeout >= 0:
        return f"--startup-timeout must not be negative, got {args.startup_timeout}"
    return None
