"""`podcert devcluster up | upgrade | down | status | kubelet | node-kubeconfig | build | deps |
image`. A refused version change (`devcluster.skew`) is one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devcluster import (
    build,
    cluster,
    examplebuild,
    host,
    imagebuild,
    kube,
    nodes,
    nodestate,
    planestate,
    release,
    releasebuild,
    skew,
    tools,
    upgrade,
)
from devcluster.identities import Paths
from devcluster.spire import ensure_spire
from devcluster.supervise import ClusterError, NodeError

DEFAULT_DIR = Path(".devcluster")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _up(args: argparse.Namespace) -> int:
    try:
        state = cluster.up(
            args.dir, kube_version=args.kube_version, progress=_say, timeout=args.timeout
        )
    except (ClusterError, build.BuildError) as err:
        _say(f"devcluster up failed: {err}")
        return 1
    print(Paths(args.dir.resolve()).admin_kubeconfig)
    _say(f"API server {state.server} (Kubernetes {state.kube_version})")
    return 0


def _down(args: argparse.Namespace) -> int:
    try:
        cluster.down(args.dir)
    except (ClusterError, NodeError) as err:
        _say(f"devcluster down failed: {err}")
        return 1
    _say("devcluster stopped")
    return 0


def _status(args: argparse.Namespace) -> int:
    state = planestate.running(Paths(args.dir.resolve()))
    if state is None:
        print("not running")
        return 1
    print(
        f"running: Kubernetes {state.kube_version} at {state.server} (etcd pid {state.etcd_pid}, "
        f"apiserver pid {state.apiserver_pid}, controller-manager pid "
        f"{state.controller_manager_pid}, scheduler pid {state.scheduler_pid})"
    )
    lagging = [f"{name} {v}" for name, v in state.versions().items() if v != state.kube_version]
    if lagging:
        print(f"upgrade unfinished: {', '.join(lagging)}")
    for node in nodes.started(args.dir):
        found = nodestate.read_state(args.dir, node)
        if found is not None:
            print(
                f"node {node}: {found.kind} kubelet {found.kube_version} pid {found.kubelet_pid}, "
                f"root {found.root}"
            )
    return 0


def _refused(action: str, err: skew.RefusedError) -> int:
    _say(f"devcluster {action}: {err.reason}")
    return 2


def _upgrade(args: argparse.Namespace) -> int:
    try:
        state = upgrade.control_plane(
            args.dir, args.kube_version, progress=_say, timeout=args.timeout
        )
    except skew.RefusedError as err:
        return _refused("upgrade", err)
    except (ClusterError, NodeError, build.BuildError) as err:
        _say(f"devcluster upgrade failed: {err}")
        return 1
    _say(f"API server {state.server} (Kubernetes {state.kube_version})")
    return 0


def _upgrade_kubelet(args: argparse.Namespace) -> int:
    if args.hollow or args.real or args.services:
        return _refused(
            "kubelet",
            skew.RefusedError(
                "--upgrade keeps the node's kind and services: drop --hollow, --real and --services"
            ),
        )
    try:
        state = upgrade.kubelet(
            args.dir, args.node, args.kube_version, progress=_say, timeout=args.timeout
        )
    except skew.RefusedError as err:
        return _refused("kubelet", err)
    except (NodeError, ClusterError, build.BuildError) as err:
        _say(f"devcluster kubelet failed: {err}")
        return 1
    print(state.root)
    return 0


def _kubelet(args: argparse.Namespace) -> int:
    if args.upgrade:
        return _upgrade_kubelet(args)
    hollow = args.hollow
    if not hollow and not args.real:
        reason = nodes.real_node_unavailable()
        if reason:
            _say(f"running {args.node} as a hollow kubelet: {reason}")
            hollow = True
    version: str | None = None
    try:
        if args.kube_version is not None:
            version = str(skew.require(skew.offered(args.kube_version, upgrade.OFFERED)))
            binary = build.HOLLOW_KUBELET if hollow else build.REAL_KUBELET
            line = upgrade.unbuilt(version, [binary])
            if line:
                raise skew.RefusedError(line)
        state = nodes.start(
            args.dir,
            args.node,
            hollow=hollow,
            progress=_say,
            timeout=args.timeout,
            services=args.services,
            kube_version=version,
        )
    except skew.RefusedError as err:
        return _refused("kubelet", err)
    except (NodeError, ClusterError, build.BuildError) as err:
        _say(f"devcluster kubelet failed: {err}")
        return 1
    print(state.root)  # the last line on stdout: the folder that holds pods/
    return 0


def _node_kubeconfig(args: argparse.Namespace) -> int:
    if planestate.running(Paths(args.dir.resolve())) is None:
        _say(f"devcluster node-kubeconfig failed: no devcluster runs under {args.dir}")
        return 1
    print(kube.node_kubeconfig(args.dir, args.node))
    return 0


def _lanes(*lanes: Callable[[], None]) -> None:
    """Run the lanes at once, a thread each, and re-raise the first one's error once all ended.

    One Go build leaves the second core idle through its links, module downloads and `go mod
    tidy`; a lane of builds that share nothing with it (no binary, no work folder) fills that
    time. Go's module and build caches are safe for concurrent builds."""
    with concurrent.futures.ThreadPoolExecutor(len(lanes), thread_name_prefix="build") as pool:
        futures = [pool.submit(lane) for lane in lanes]
    for future in futures:
        future.result()


def _labelled(label: str) -> Callable[[str], None]:
    """`_say` for one lane: its lines whole (never torn by another lane's) and marked with it."""

    def say(line: str) -> None:
        with _SAY_LOCK:
            _say(f"{label} | {line}")

    return say


_SAY_LOCK = threading.Lock()


def _build(args: argparse.Namespace) -> int:
    versions = args.kube_version or [build.DEFAULT_KUBE_VERSION]

    def kubernetes() -> None:
        """etcd, then each minor's binaries in one go build (kube-proxy with the first's):
        one after another, as they share the Go build cache."""
        say = _labelled("kubernetes")
        build.ensure_component(build.ETCD, say)
        for version in versions:
            names = [*build.CONTROL_PLANE]
            if args.kubelets:
                names += [build.REAL_KUBELET, build.HOLLOW_KUBELET]
            if args.network and version == versions[0]:
                names.append(build.KUBE_PROXY)
            releasebuild.ensure_release(version, names, say)

    def beside() -> None:
        """What builds apart from Kubernetes (its own binaries and work folders; a module both
        download is safe in Go's module cache): the tests' Go programs, SPIRE, helm, CoreDNS,
        then the images, whose base and packages are mostly downloading and unpacking."""
        say = _labelled("tools")
        if args.interop:
            for name in build.INTEROP_PROGRAMS:
                build.ensure_interop(name, say)
            examplebuild.ensure_example_go(say)
            examplebuild.ensure_example_java(say)
        if args.spire:
            ensure_spire(say)
        if args.helm:
            tools.ensure_helm(say)
        if args.network:
            build.ensure_coredns(say)
        if args.images:
            imagebuild.build(say, examples=True)

    try:
        for version in versions:
            build.release(version)  # an unknown version fails before anything is built
        _lanes(kubernetes, beside)
        # Everything is cached now: the paths, in the order they always came.
        for version in versions:
            bins = build.ensure_binaries(_say, version)
            print(bins.kube_apiserver)
            print(bins.kube_controller_manager)
            print(bins.kube_scheduler)
            if args.kubelets:
                print(build.ensure_kubelet(version, progress=_say))
                print(build.ensure_kubelet(version, hollow=True, progress=_say))
        print(bins.etcd)
        if args.interop:
            for name in build.INTEROP_PROGRAMS:
                print(build.ensure_interop(name, _say))
            print(examplebuild.ensure_example_go(_say))
            print(examplebuild.ensure_example_java(_say))
        if args.spire:
            spire = ensure_spire(_say)
            print(spire.server)
            print(spire.agent)
        if args.helm:
            print(tools.ensure_helm(_say))
        if args.network:
            network = build.ensure_network(versions[0], _say)
            print(network.kube_proxy)
            print(network.coredns)
    except build.BuildError as err:
        _say(str(err))
        return 1
    return 0


def _deps(_args: argparse.Namespace) -> int:
    try:
        installed = host.install_packages(_say)
    except NodeError as err:
        _say(str(err))
        return 1
    _say(f"installed {', '.join(installed)}" if installed else "real-node packages present")
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("devcluster", help="a real local Kubernetes cluster")
    sub = parser.add_subparsers(dest="devcluster_command", required=True, metavar="ACTION")

    def add(name: str, help_text: str, run: Any) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_text)
        p.add_argument(
            "--dir", type=Path, default=DEFAULT_DIR, help="state folder (default: %(default)s)"
        )
        p.set_defaults(run=run)
        return p

    up = add(
        "up",
        "build (once) and start etcd, kube-apiserver, kube-controller-manager and kube-scheduler; "
        "wait until each answers",
        _up,
    )
    up.add_argument(
        "--kube-version",
        choices=sorted(build.KUBERNETES_VERSIONS),
        default=build.DEFAULT_KUBE_VERSION,
        help="Kubernetes minor (default: %(default)s); 1.35 and 1.36 serve certificates.k8s.io/"
        "v1beta1 only",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=cluster.READY_TIMEOUT,
        help="seconds to wait for the control plane (default: %(default)s)",
    )
    up_grade = add(
        "upgrade",
        "upgrade the running control plane in place to the next minor, as kubeadm does: the "
        "same etcd data, kube-apiserver first, then kube-controller-manager and "
        "kube-scheduler; kubelets stay at their minor until `kubelet NODE --upgrade`",
        _upgrade,
    )
    up_grade.add_argument(
        "--kube-version",
        metavar="MINOR",
        required=True,
        help="the target minor (one above today's)",
    )
    up_grade.add_argument(
        "--timeout",
        type=float,
        default=upgrade.READY_TIMEOUT,
        help="seconds the whole upgrade may take, each component answering before the next "
        "stops (default: %(default)s)",
    )
    add("down", "stop everything `up` and `kubelet` started, remove the kubelets' roots", _down)
    add("status", "say whether the devcluster runs, and its kubelets", _status)
    kubelet = add(
        "kubelet",
        "start a kubelet for NODE (of the cluster's minor unless --kube-version), as that node; "
        "wait until it is Ready; print its root directory (the folder holding pods/) as the "
        "last line",
        _kubelet,
    )
    kubelet.add_argument("node", help="node name")
    kind = kubelet.add_mutually_exclusive_group()
    kind.add_argument(
        "--hollow",
        action="store_true",
        help="kubemark's hollow kubelet: real kubelet code, fake runtime, no containers",
    )
    kind.add_argument(
        "--real",
        action="store_true",
        help="containerd + runc, real containers; fail rather than fall back to --hollow "
        "(the default is real where the machine allows it)",
    )
    kubelet.add_argument(
        "--services",
        action="store_true",
        help="real nodes: also run kube-proxy and CoreDNS beside it (Service addresses and "
        "names for its pods)",
    )
    kubelet.add_argument(
        "--kube-version",
        metavar="MINOR",
        help="the kubelet's Kubernetes minor (default: the API server's); it may run up to "
        "three minors behind the API server, never ahead",
    )
    kubelet.add_argument(
        "--upgrade",
        action="store_true",
        help="restart NODE's running kubelet on a newer binary (the API server's minor, or "
        "--kube-version) with that minor's flags and gates, its pods kept",
    )
    kubelet.add_argument(
        "--timeout",
        type=float,
        default=nodes.READY_TIMEOUT,
        help="seconds to wait for the Node to be Ready (default: %(default)s)",
    )
    node = add(
        "node-kubeconfig",
        "create a Node and write a kubeconfig that authenticates as it",
        _node_kubeconfig,
    )
    node.add_argument("node", help="node name")
    b = sub.add_parser(
        "build",
        help="build the control plane (and with --kubelets both kubelets) into the cache, "
        "print the binaries' paths",
    )
    b.add_argument(
        "--kube-version",
        action="append",
        choices=sorted(build.KUBERNETES_VERSIONS),
        help=f"a Kubernetes minor, repeatable (default: {build.DEFAULT_KUBE_VERSION})",
    )
    b.add_argument("--kubelets", action="store_true", help="also the real and hollow kubelets")
    b.add_argument(
        "--interop",
        action="store_true",
        help="also the tests' own Go programs (tests/interop: the go-spiffe checker) and the "
        "Go and Java examples (examples/go, examples/java: a JDK 17+ builds the latter)",
    )
    b.add_argument(
        "--spire",
        action="store_true",
        help="also SPIRE's server and agent (tests/interop/spire), for the federation tests",
    )
    b.add_argument(
        "--helm", action="store_true", help="also helm, to lint and render charts/podcert"
    )
    b.add_argument(
        "--network",
        action="store_true",
        help="also kube-proxy (of the first --kube-version) and CoreDNS, for a real node with "
        "Services (`kubelet --services`)",
    )
    b.add_argument(
        "--images",
        action="store_true",
        help="also podcert's image and the examples' (podman, cached by layers), beside the Go "
        "builds: the tests that run them find them built",
    )
    b.set_defaults(run=_build)
    d = sub.add_parser("deps", help="apt-get install what a real node needs (only what is missing)")
    d.set_defaults(run=_deps)
    imagebuild.register(sub)
    release.register(sub)
