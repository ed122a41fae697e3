"""`podcert audit`: the rotation audit from the command line.

Wiring only: read what was asked for (`audit.snapshot`), run the pure audit (`audit.findings`),
print a table (`audit.report`), or JSON or YAML (the report's own fields under the `Audit` kind's
header, `podcert.output`). Exit codes (`podcert.errors`): 0 healthy, 1 findings, 2 usage errors
and input files that cannot be read (argparse itself exits 2 too), 3 a cluster that cannot be
read. `podcert inspect` (`audit.inspect`) is wired here too: it reads a node's files as the
audit does.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import functools
import multiprocessing
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from audit.examine import VolumeFacts, examine_volume
from audit.findings import audit_findings, chain_roots
from audit.inspect import inspect_file, inspection_table
from audit.model import Settings, Snapshot, TrustSource
from audit.report import print_table
from audit.snapshot import (
    SnapshotError,
    pod_uids,
    read_audit_log,
    read_cluster,
    read_pem,
    read_pod,
    read_trust_files,
)
from bundles.formats import BundleError, load_trust_bundle
from podcert.api.times import TimeFieldError, parse_zoned_time
from podcert.api.validation import signer_name_problem
from podcert.client import commandline
from podcert.errors import (
    EXIT_FINDINGS,
    EXIT_OK,
    EXIT_USAGE,
    ClusterUnreadable,
    CommandError,
    ConfigError,
    one_line,
)
from podcert.helptext import HelpFormatter, examples

if TYPE_CHECKING:
    from podcert.client.rest import Rest
from podcert.output import add_output_flag, document, dumps, render

# Below this many volumes a process pool costs more than it saves.
_PARALLEL_FROM: Final = 1000
_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> dt.timedelta:
    """`90s`, `5m`, `1h30m`, `7d`: an argparse type."""
    position, seconds = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != position:
            break
        seconds += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    if not text or position != len(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 5m, 1h30m or 7d")
    return dt.timedelta(seconds=seconds)


def rfc3339(text: str) -> dt.datetime:
    """An RFC 3339 time with a zone (`2026-05-01T12:00:00Z`): an argparse type."""
    try:
        return parse_zoned_time(text, "--now")
    except TimeFieldError as exc:
        raise argparse.ArgumentTypeError(exc.problem) from None


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "audit",
        help="audit pod certificate rotation across the cluster, a node and the audit log",
        description=(
            "Join what the cluster, a node's projected volumes and the signer's audit log say "
            "about every pod certificate projection, and report what is wrong. Exit 0 when "
            "healthy, 1 with findings, 2 on usage errors or unreadable input files, 3 when the "
            "cluster cannot be read."
        ),
        formatter_class=HelpFormatter,
    )
    inputs = p.add_argument_group(
        "inputs (any of them, joined; the cluster, found as kubectl finds it, is read when a "
        "cluster flag is given or neither --root nor --audit-log is)"
    )
    commandline.add_flags(inputs)
    inputs.add_argument(
        "--in-cluster", action="store_true", help="read the cluster with the pod's service account"
    )
    inputs.add_argument(
        "--root", type=Path, help="a node's kubelet (or shim) root: ROOT/pods/<uid>/volumes/..."
    )
    inputs.add_argument(
        "--audit-log",
        type=Path,
        action="append",
        default=[],
        help="a signer replica's audit log file (repeatable: give every replica's)",
    )
    inputs.add_argument(
        "--trust-bundle",
        type=Path,
        action="append",
        default=[],
        help="trust anchors (PEM) for every signer, besides the cluster's, or a SPIFFE "
        "credential folder's <trust-domain>.trust-bundle.pem files (repeatable)",
    )
    inputs.add_argument(
        "--ca-roots",
        type=Path,
        help="the roots the signer holds CA keys for (PEM); trust anchors without one are reported",
    )
    scope = p.add_argument_group("scope")
    scope.add_argument(
        "--namespace", action="append", default=[], help="only these namespaces (repeatable)"
    )
    scope.add_argument(
        "--signer-name", action="append", default=[], help="only these signers (repeatable)"
    )
    scope.add_argument("--node", help="only pods and requests of this node")
    judge = p.add_argument_group("thresholds")
    judge.add_argument("--now", type=rfc3339, help="audit as of this RFC 3339 time")
    judge.add_argument(
        "--stuck-after", type=duration, default="5m", help="a request waiting longer is stuck"
    )
    judge.add_argument(
        "--min-checkpoint",
        type=int,
        metavar="N",
        help="the signer's podcert_signer_audit_checkpoint metric: a log whose newest good "
        "checkpoint is older was cut back",
    )
    judge.add_argument(
        "--checkpoint-max-lag",
        type=duration,
        default="5m",
        help="certificates issued longer ago must be covered by a signed checkpoint",
    )
    judge.add_argument(
        "--chain-only",
        action="store_true",
        help="with no trust roots, check only the audit log's hash chain (it is then not "
        "vouched for) instead of reporting that it cannot be",
    )
    judge.add_argument(
        "--root-expiry-warning",
        type=duration,
        default="7d",
        help="report trust anchors that expire sooner",
    )
    out = p.add_argument_group("output")
    add_output_flag(out)
    out.add_argument(
        "--all", action="store_true", help="list every projection, not only those needing attention"
    )
    out.add_argument(
        "--max-rows", type=int, default=200, help="at most this many table rows (0: no limit)"
    )
    out.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="processes that parse the node's credentials (1: no pool)",
    )
    p.set_defaults(run=run)


def reads_cluster(args: argparse.Namespace) -> bool:
    """Whether to read the cluster: when asked (a cluster flag), or when nothing else is."""
    return commandline.given(args) or args.in_cluster or not (args.root or args.audit_log)


def run(args: argparse.Namespace) -> int:
    if args.in_cluster and (args.kubeconfig or args.context):
        print(
            "podcert audit: --in-cluster and --kubeconfig/--context name two clusters: give one",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.jobs < 1 or args.max_rows < 0 or (args.min_checkpoint or 0) < 0:
        print(
            "podcert audit: --jobs must be >= 1, --max-rows and --min-checkpoint >= 0",
            file=sys.stderr,
        )
        return EXIT_USAGE
    for name in args.signer_name:
        # Kubernetes' own signers are fine to audit: only a name no signer can have is not.
        if problem := signer_name_problem(name, builtin_ok=True):
            print(f"podcert audit: --signer-name {name!r}: {problem}", file=sys.stderr)
            return EXIT_USAGE
    now = args.now or dt.datetime.now(dt.UTC)
    try:
        snapshot = gather(args)
    except SnapshotError as exc:
        print(f"podcert audit: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    settings = Settings(
        stuck_after=args.stuck_after,
        root_expiry_warning=args.root_expiry_warning,
        checkpoint_max_lag=args.checkpoint_max_lag,
        min_checkpoint=args.min_checkpoint,
        log_chain_only=args.chain_only,
        namespaces=frozenset(args.namespace),
        signer_names=frozenset(args.signer_name),
        node_name=args.node,
    )
    try:
        examined = examine_node(args.root, chain_roots(snapshot), now, args.jobs)
    except SnapshotError as exc:
        print(f"podcert audit: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    if examined is not None:
        snapshot = dataclasses.replace(
            snapshot,
            inputs=(*snapshot.inputs, f"node root {args.root}: {len(examined)} projected volumes"),
        )
    report = audit_findings(snapshot, now, settings, examined=examined)
    if args.output == "table":
        print_table(report, show_all=args.all, max_rows=args.max_rows)
    else:
        sys.stdout.write(dumps(document("Audit", report.as_json()), args.output))
    return EXIT_OK if report.healthy else EXIT_FINDINGS


def _client(args: argparse.Namespace) -> Rest:
    """The cluster client, found as kubectl finds it (`--in-cluster`: the pod's own only)."""
    from podcert.client.rest import Rest

    return Rest(commandline.from_args(args, in_cluster_only=args.in_cluster))


def gather(args: argparse.Namespace) -> Snapshot:
    """The snapshot the arguments ask for. Raises SnapshotError when an input cannot be read."""
    inputs: list[str] = []
    pods = requests = None
    trust: tuple[TrustSource, ...] = ()
    if reads_cluster(args):
        # Imported here: the Kubernetes client is only loaded when the cluster is read.
        from podcert.client.discovery import Unserved
        from podcert.client.rest import ApiError

        rest = _client(args)  # a kubeconfig it cannot use is a ConfigError: exit 2
        try:
            objects = read_cluster(rest, namespaces=args.namespace, node_name=args.node)
        except (ApiError, OSError) as exc:
            raise ClusterUnreadable(f"cannot read the cluster: {one_line(str(exc))}") from None
        except Unserved as exc:  # it answered: it cannot hold what is audited
            raise CommandError(f"cannot audit the cluster: {exc}") from None
        pods, requests, trust = objects.pods, objects.requests, objects.trust
        inputs.append(
            f"cluster: {objects.pods_listed} pods ({len(pods)} with a podCertificate source), "
            f"{len(requests)} requests, {len(trust)} trust bundles"
        )
    audit_logs = None
    if args.audit_log:
        audit_logs = tuple((str(path), read_audit_log(path)) for path in args.audit_log)
        inputs += [f"audit log {name}: {len(lines)} lines" for name, lines in audit_logs]
    files = read_trust_files(args.trust_bundle)
    inputs += [f"trust bundle {path}" for path in args.trust_bundle]
    ca_roots = read_pem(args.ca_roots, "CA roots") if args.ca_roots else None
    if args.ca_roots:
        inputs.append(f"CA roots {args.ca_roots}")
    return Snapshot(
        pods=pods,
        requests=requests,
        trust=(*trust, *files),
        audit_logs=audit_logs,
        ca_roots=ca_roots,
        inputs=tuple(inputs),
    )


def examine_node(
    root: Path | None, roots: tuple[bytes, ...], now: dt.datetime, jobs: int
) -> list[VolumeFacts] | None:
    """Read and examine every volume under `root`, in `jobs` processes on large nodes.

    Reading and parsing both cost per volume (syscalls, then certificate parsing and signature
    checks that hold the GIL), so each worker does both for its share of pods and sends back
    only facts.
    """
    if root is None:
        return None
    uids = pod_uids(root)
    work = functools.partial(_read_and_examine, root, roots=roots, now=now)
    if jobs < 2 or len(uids) < _PARALLEL_FROM:
        return [facts for uid in uids for facts in work(uid)]
    # fork: workers start with everything imported; no threads run in this process yet.
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        chunks = pool.map(work, uids, chunksize=max(1, len(uids) // (jobs * 8)))
        return [facts for chunk in chunks for facts in chunk]


def _read_and_examine(
    root: Path, pod_uid: str, *, roots: tuple[bytes, ...], now: dt.datetime
) -> list[VolumeFacts]:
    return [examine_volume(v, roots=roots, now=now) for v in read_pod(root, pod_uid)]


def register_inspect(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "inspect",
        help="what a credential bundle, chain or trust bundle file holds",
        description=(
            "Read a credential bundle (the private key and its chain), a certificate chain "
            "file or a trust bundle and say what it holds: the SPIFFE ID, the key's type (never "
            "the key), each certificate's subject, issuer and validity, the refresh hint, and, "
            "with --trust-bundle, which root anchors the chain. Exit 0 when it is usable, 1 "
            "when it is expired, unanchored or unreadable, 2 on usage errors."
        ),
        formatter_class=HelpFormatter,
        epilog=examples(
            "podcert inspect /var/run/secrets/workload-spiffe-credentials/credential-bundle.pem",
            "podcert inspect credential-bundle.pem --trust-bundle cluster.local.trust-bundle.pem",
            "podcert inspect cluster.local.trust-bundle.pem -o json",
        ),
    )
    p.add_argument("file", type=Path, help="the file to inspect")
    p.add_argument(
        "--trust-bundle",
        type=Path,
        help="trust anchors (PEM): name the root that anchors the file's chain",
    )
    p.add_argument("--now", type=rfc3339, help="judge validity as of this RFC 3339 time")
    add_output_flag(p)
    p.set_defaults(run=run_inspect)


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{what} {path}: {err.strerror or err}") from None


def run_inspect(args: argparse.Namespace) -> int:
    now = args.now or dt.datetime.now(dt.UTC)
    anchors = None
    if args.trust_bundle is not None:
        try:
            anchors = load_trust_bundle(_read(args.trust_bundle, "--trust-bundle")).roots
        except BundleError as err:
            raise ConfigError(f"--trust-bundle {args.trust_bundle}: {err}") from None
    found = inspect_file(str(args.file), _read(args.file, "file"), now, anchors)
    doc = document("Inspection", found.as_json())
    sys.stdout.write(render(doc, args.output, lambda: inspection_table(found)))
    return EXIT_OK if found.healthy else EXIT_FINDINGS
