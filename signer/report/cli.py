"""`podcert status`, `podcert explain pod` and `podcert version`: parse, fetch (`fetch`), judge
(`status`, `explain`, `versions`), print (`render` or `podcert.output`). Exit codes are
`podcert.errors`': 0 healthy, 1 findings, 2 usage, 3 the cluster could not be read.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from typing import Any

from podcert.api.validation import is_dns_label, is_dns_name, signer_name_problem
from podcert.client import commandline
from podcert.client.rest import Rest
from podcert.errors import EXIT_CLUSTER_UNREADABLE, EXIT_FINDINGS, EXIT_OK, ConfigError
from podcert.helptext import HelpFormatter, examples
from podcert.output import add_output_flag, document, render
from signer.build import Config
from signer.report import fetch
from signer.report.explain import explain_pod
from signer.report.render import explain_table, status_table, version_table
from signer.report.status import DENIALS_WINDOW, STUCK_AFTER, build_status, leadership, replicas
from signer.report.versions import version_info

DEFAULT_NAMESPACE = "podcert-system"


def _seconds(text: str) -> dt.timedelta:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0")
    return dt.timedelta(seconds=value)


def _cluster_flags(p: argparse.ArgumentParser, *, namespace_flag: str) -> None:
    commandline.add_flags(p)
    flags = ("-n", "--namespace") if namespace_flag == "--namespace" else (namespace_flag,)
    p.add_argument(
        *flags,
        dest="signer_namespace",
        metavar="NAMESPACE",
        default=DEFAULT_NAMESPACE,
        help="the signer's namespace (its lease, CA Secret and Deployment)",
    )
    p.add_argument("--lease-name", default=Config.lease_name, help="the signer's Lease")


def register_status(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "status",
        help="how the signer stands: leader, CA, trust bundles, pending and denied requests",
        description=(
            "Who leads, with which CA generations and what rotation step is due, which trust "
            "bundles are published, which requests wait (and which are stuck), and what was "
            "denied in the last hour, by reason. Exit 0 healthy (a live leader, nothing "
            "stuck), 1 otherwise, 2 on usage errors, 3 when the cluster cannot be read."
        ),
        formatter_class=HelpFormatter,
        epilog=examples(
            "podcert status",
            "podcert status -n podcert-system --signer-name podcert.dev/workload",
            "podcert status -o json | jq .requests.denialsByReason",
        ),
    )
    _cluster_flags(p, namespace_flag="--namespace")
    p.add_argument("--ca-secret", default=Config.ca_secret, help="the Secret holding the CA")
    p.add_argument(
        "--signer-name",
        action="append",
        default=[],
        help="report on these signer names (repeatable); default: those the leader serves",
    )
    p.add_argument(
        "--stuck-after",
        type=_seconds,
        default=str(int(STUCK_AFTER.total_seconds())),
        metavar="SECONDS",
        help="a request pending longer is stuck",
    )
    add_output_flag(p)
    p.set_defaults(run=run_status)


def register_explain(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "explain",
        help="why a pod has (or lacks) its certificate, and what to do",
        description=(
            "Follow each podCertificate source of a pod to its PodCertificateRequests, their "
            "conditions and Events, and say what the signer decided and why, or that no signer "
            "answers, with the next step in plain words. Exit 0 when every source is issued, "
            "1 otherwise, 2 on usage errors, 3 when the cluster cannot be read."
        ),
        formatter_class=HelpFormatter,
        epilog=examples(
            "podcert explain pod shop/api-7d9c",
            "podcert explain pod api-7d9c -n shop -o yaml",
        ),
    )
    p.add_argument("kind", choices=["pod"], help="what to explain (pods only, for now)")
    p.add_argument("name", metavar="[NAMESPACE/]NAME", help="the pod")
    p.add_argument(
        "-n",
        "--namespace",
        help="the pod's namespace (default: the context's namespace, else default)",
    )
    _cluster_flags(p, namespace_flag="--signer-namespace")
    p.add_argument(
        "--stuck-after",
        type=_seconds,
        default=str(int(STUCK_AFTER.total_seconds())),
        metavar="SECONDS",
        help="a request pending longer gets no answer",
    )
    add_output_flag(p)
    p.set_defaults(run=run_explain)


def register_version(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "version",
        help="podcert's, the API server's and the running signer's versions",
        description=(
            "The client's version, the API server's Kubernetes version, the certificates.k8s.io "
            "versions it serves, and the podcert version the signer's leader runs (it writes it "
            "on its Lease). `podcert --version` prints the client's alone, offline."
        ),
        formatter_class=HelpFormatter,
        epilog=examples("podcert version", "podcert version -o json"),
    )
    _cluster_flags(p, namespace_flag="--namespace")
    add_output_flag(p)
    p.set_defaults(run=run_version)


def _check_cluster_flags(args: argparse.Namespace) -> None:
    if not is_dns_label(args.signer_namespace):
        raise ConfigError(f"namespace {args.signer_namespace!r} is not a namespace name")
    if not is_dns_name(args.lease_name):
        raise ConfigError(f"--lease-name {args.lease_name!r} is not an object name")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def run_status(args: argparse.Namespace) -> int:
    _check_cluster_flags(args)
    if not is_dns_name(args.ca_secret):
        raise ConfigError(f"--ca-secret {args.ca_secret!r} is not a Secret name")
    for name in args.signer_name:
        if problem := signer_name_problem(name, builtin_ok=True):
            raise ConfigError(f"--signer-name {name!r}: {problem}")
    rest = fetch.client(args)
    now = _now()
    inputs = fetch.status_inputs(
        rest, args.signer_namespace, args.lease_name, args.ca_secret, tuple(args.signer_name), now
    )
    status = build_status(inputs, now, stuck_after=args.stuck_after, window=DENIALS_WINDOW)
    doc = document("Status", status.as_json())
    sys.stdout.write(render(doc, args.output, lambda: status_table(status)))
    if status.leader.problem is not None:
        print(f"podcert status: {status.leader.problem}", file=sys.stderr)
        return EXIT_CLUSTER_UNREADABLE
    return EXIT_OK if status.healthy else EXIT_FINDINGS


def run_explain(args: argparse.Namespace) -> int:
    _check_cluster_flags(args)
    settings = commandline.from_args(args)
    namespace, _, name = args.name.rpartition("/")
    namespace = namespace or args.namespace or settings.namespace or "default"
    if not is_dns_label(namespace) or not is_dns_name(name):
        raise ConfigError(f"{args.name!r} is not a pod's [NAMESPACE/]NAME")
    rest = Rest(settings)
    pod, requests, events = fetch.pod_inputs(rest, namespace, name)
    now = _now()
    lease = fetch.lease(rest, args.signer_namespace, args.lease_name)
    leader = leadership(lease, f"{args.signer_namespace}/{args.lease_name}", now)
    explanation = explain_pod(pod, requests, events, leader, now, args.stuck_after)
    doc = document("PodExplanation", explanation.as_json())
    sys.stdout.write(render(doc, args.output, lambda: explain_table(explanation)))
    return EXIT_OK if explanation.healthy else EXIT_FINDINGS


def run_version(args: argparse.Namespace) -> int:
    _check_cluster_flags(args)
    rest = fetch.client(args)
    server, discovery = fetch.version_inputs(rest)
    now = _now()
    lease = fetch.lease(rest, args.signer_namespace, args.lease_name)
    leader = leadership(lease, f"{args.signer_namespace}/{args.lease_name}", now)
    info = version_info(
        server, discovery, leader, replicas(fetch.deployment(rest, args.signer_namespace))
    )
    doc = document("Version", info.as_json())
    sys.stdout.write(render(doc, args.output, lambda: version_table(info)))
    return EXIT_OK
