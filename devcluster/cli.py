"""`podcert devcluster up | down | status | node-kubeconfig | build`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from devcluster import build, cluster, kube

DEFAULT_DIR = Path(".devcluster")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _up(args: argparse.Namespace) -> int:
    try:
        state = cluster.up(args.dir, progress=_say, timeout=args.timeout)
    except (cluster.ClusterError, build.BuildError) as err:
        _say(f"devcluster up failed: {err}")
        return 1
    print(cluster.Paths(args.dir.resolve()).admin_kubeconfig)
    _say(f"API server {state.server}")
    return 0


def _down(args: argparse.Namespace) -> int:
    try:
        cluster.down(args.dir)
    except cluster.ClusterError as err:
        _say(f"devcluster down failed: {err}")
        return 1
    _say("devcluster stopped")
    return 0


def _status(args: argparse.Namespace) -> int:
    state = cluster.running(cluster.Paths(args.dir.resolve()))
    if state is None:
        print("not running")
        return 1
    print(
        f"running: {state.server} (etcd pid {state.etcd_pid}, apiserver pid {state.apiserver_pid})"
    )
    return 0


def _node_kubeconfig(args: argparse.Namespace) -> int:
    print(kube.node_kubeconfig(args.dir, args.node))
    return 0


def _build(_args: argparse.Namespace) -> int:
    try:
        bins = build.ensure_binaries(_say)
    except build.BuildError as err:
        _say(str(err))
        return 1
    print(bins.kube_apiserver)
    print(bins.etcd)
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("devcluster", help="a real local etcd + kube-apiserver")
    sub = parser.add_subparsers(dest="devcluster_command", required=True, metavar="ACTION")

    def add(name: str, help_text: str, run: Any) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text)
        p.add_argument(
            "--dir", type=Path, default=DEFAULT_DIR, help="state folder (default: %(default)s)"
        )
        p.set_defaults(run=run)
        return p

    up = add("up", "build (once) and start etcd + kube-apiserver; wait for /readyz", _up)
    up.add_argument(
        "--timeout",
        type=float,
        default=cluster.READY_TIMEOUT,
        help="seconds to wait for /readyz (default: %(default)s)",
    )
    add("down", "stop everything `up` started", _down)
    add("status", "say whether the devcluster runs", _status)
    node = add(
        "node-kubeconfig",
        "create a Node and write a kubeconfig that authenticates as it",
        _node_kubeconfig,
    )
    node.add_argument("node", help="node name")
    b = sub.add_parser(
        "build", help="build kube-apiserver and etcd into the cache, print their paths"
    )
    b.set_defaults(run=_build)
