"""`podcert shim`: run the node agent for one node; `podcert shim rotate`: force re-keying.

The agent runs with the node's own credentials (a DaemonSet mounting the kubelet's kubeconfig,
or in the devcluster the file `podcert devcluster node-kubeconfig` writes). `rotate` runs with an
operator's credentials: it only sets the pod annotation the agents honour.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import time
from pathlib import Path
from typing import Any

from kubelet_shim import build, projection, rekeyable
from kubelet_shim import kube as shim_kube
from kubelet_shim.agent import Settings, utcnow
from podcert import logs, processflags
from podcert.api.times import TimeFieldError, parse_zoned_time
from podcert.api.validation import is_dns_label, is_dns_name
from podcert.client import commandline, eviction
from podcert.client.rest import ApiError, Rest
from podcert.errors import CommandError, ConfigError, one_line
from podcert.helptext import HelpFormatter

log = logging.getLogger("podcert.shim")


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "shim",
        help="the kubelet's half of Pod Certificates for one node (keys, requests, files)",
        description="Run the node agent; `podcert shim rotate --help` for emergency re-keying.",
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="the node's kubeconfig (system:node:<name>); in-cluster configuration when absent",
    )
    p.add_argument("--node-name", default=None, help="the node this agent serves (required)")
    p.add_argument(
        "--root",
        type=Path,
        default=build.DEFAULT_ROOT,
        help="kubelet root: files go to ROOT/pods/<uid>/volumes/kubernetes.io~projected/<vol>",
    )
    p.add_argument(
        "--cleanup-kubeconfig",
        type=Path,
        default=None,
        help="a non-node identity allowed to delete podcertificaterequests, used to delete the "
        "pending requests of deleted pods (NodeRestriction forbids nodes to delete them; "
        "without it the garbage collector removes them through their ownerReference)",
    )
    p.add_argument(
        "--cleanup-in-cluster",
        action="store_true",
        help="use the pod's own ServiceAccount as the cleanup identity (the DaemonSet's way)",
    )
    processflags.add(
        p,
        metrics_host=build.Config.metrics_host,
        metrics_port=build.Config.metrics_port,
        startup_timeout=build.Config.startup_timeout,
        workers=Settings.workers,
        workers_help="pods reconciled concurrently",
    )
    p.add_argument(
        "--refresh-jitter-seconds",
        type=float,
        default=projection.DEFAULT_SETTINGS.jitter.total_seconds(),
        help="random delay added to each beginRefreshAt (the kubelet uses up to 5 min)",
    )
    p.add_argument(
        "--abandon-after-seconds",
        type=float,
        default=projection.DEFAULT_SETTINGS.abandon_after.total_seconds(),
        help="replace a request that vanished before issuance this long after it vanished",
    )
    p.add_argument(
        "--unanswered-after-seconds",
        type=float,
        default=projection.DEFAULT_SETTINGS.unanswered_after.total_seconds(),
        help="record an event when a signer has not answered a request for this long",
    )
    p.add_argument(
        "--clock-offset-seconds",
        type=float,
        default=0.0,
        help="FOR TESTING ONLY: shift the agent's clock by this many seconds",
    )
    p.set_defaults(run=run)

    sub = p.add_subparsers(dest="shim_command", metavar="ACTION")
    r: argparse.ArgumentParser = sub.add_parser(
        "rotate",
        help="force re-keying of a pod's (or a service account's pods') certificates now",
        description="Set the podcert.dev/rotate-before annotation: every node agent re-keys the "
        "credentials of the pod that were issued before that instant (suspected key compromise).",
    )
    commandline.add_flags(r)  # an operator's credentials: they need patch on pods
    r.add_argument(
        "--namespace", help="namespace of the pods (default: the context's, else default)"
    )
    which = r.add_mutually_exclusive_group(required=True)
    which.add_argument("--pod", help="re-key this pod")
    which.add_argument("--service-account", help="re-key every pod running as this account")
    r.add_argument(
        "--before",
        default=None,
        help="RFC 3339 instant; credentials issued before it are replaced (default: now; a "
        "future instant schedules the rotation)",
    )
    r.add_argument(
        "--evict",
        action="store_true",
        help="evict (Eviction API, PodDisruptionBudgets respected) the pods on kubelet nodes, "
        "where no shim acts on the annotation",
    )
    r.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="--evict: give up on a pod its disruption budget keeps refusing after this long",
    )
    r.set_defaults(run=rotate)


def run(args: argparse.Namespace) -> int:
    logs.setup(args.log_level)
    config = config_from(args)
    if isinstance(config, str):
        raise ConfigError(config)
    return build.run(config)


def config_from(args: argparse.Namespace) -> build.Config | str:
    """The validated configuration, or what is wrong with the flags."""
    if not args.node_name:
        return "--node-name is required"
    if not is_dns_name(args.node_name):
        return f"--node-name {args.node_name!r} is not a node name"
    if said := processflags.problem(args):
        return said
    durations = (
        args.refresh_jitter_seconds,
        args.abandon_after_seconds,
        args.unanswered_after_seconds,
    )
    if min(durations) < 0:
        return (
            "--refresh-jitter-seconds, --abandon-after-seconds and --unanswered-after-seconds "
            "must not be negative"
        )
    if args.root.exists() and not args.root.is_dir():
        return f"--root {args.root} is not a directory"
    return build.Config(
        node_name=args.node_name,
        kubeconfig=args.kubeconfig,
        root=args.root,
        cleanup_kubeconfig=args.cleanup_kubeconfig,
        cleanup_in_cluster=args.cleanup_in_cluster,
        agent=Settings(
            workers=args.workers,
            projection=projection.Settings(
                jitter=dt.timedelta(seconds=args.refresh_jitter_seconds),
                abandon_after=dt.timedelta(seconds=args.abandon_after_seconds),
                unanswered_after=dt.timedelta(seconds=args.unanswered_after_seconds),
            ),
        ),
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        clock_offset=dt.timedelta(seconds=args.clock_offset_seconds),
        startup_timeout=args.startup_timeout,
    )


def rotate(args: argparse.Namespace) -> int:
    if args.namespace is not None and not is_dns_label(args.namespace):
        raise ConfigError(f"--namespace {args.namespace!r} is not a namespace name")
    name, flag = (args.pod, "--pod") if args.pod else (args.service_account, "--service-account")
    if not is_dns_name(name):
        raise ConfigError(f"{flag} {name!r} is not a valid name")
    if args.before is None:
        before = utcnow()
    else:
        try:
            before = parse_zoned_time(args.before, "--before")
        except TimeFieldError as err:
            raise ConfigError(str(err)) from None
    settings = commandline.from_args(args)
    namespace = args.namespace or settings.namespace
    rest = Rest(settings)
    try:
        if args.pod:
            pods = [args.pod]
        else:
            pods = shim_kube.pods_of_service_account(rest, namespace, args.service_account)
            if not pods:
                raise CommandError(f"no pod in {namespace} runs as {args.service_account}")
        managers = shim_kube.request_makers(rest, namespace)
        if managers is None:
            print(
                f"cannot list PodCertificateRequests in {namespace}: "
                "whether a shim serves each pod is unchecked"
            )
        verdicts = rekeyable.verdicts(pods, managers or {})
        kubelet = [name for name in pods if verdicts[name] == "kubelet"]
        for name in pods:
            if verdicts[name] == "kubelet":
                continue
            shim_kube.request_rotation(rest, namespace, name, before)
            print(f"pod {namespace}/{name}: re-key credentials issued before {before}")
            if verdicts[name] == "unknown":
                print(f"pod {namespace}/{name}: no request of it shows a shim serves it")
        deadline = utcnow() + dt.timedelta(seconds=args.timeout)
        for name in kubelet:
            if args.evict:
                eviction.evict(rest, namespace, name, deadline, utcnow, time.sleep, 5.0)
                print(f"pod {namespace}/{name}: on a kubelet node: evicted")
            else:
                print(
                    f"pod {namespace}/{name}: on a kubelet node, where no shim acts on the "
                    "annotation: NOT re-keyed (--evict evicts it)"
                )
    except ApiError as err:
        raise CommandError(f"rotate failed: {one_line(str(err))}") from None
    if kubelet and not args.evict:
        raise CommandError(
            f"rotate: {len(kubelet)} pod(s) on kubelet nodes not re-keyed: "
            f"{', '.join(kubelet[:10])} (rerun with --evict)"
        )
    return 0
