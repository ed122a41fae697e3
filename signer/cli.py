"""`podcert signer`: run the signer controller for one or more signer names."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from podcert import logs
from podcert.rest import ApiError, Rest, load_client
from signer import auditlog, metrics, policy
from signer.castore import CAStore
from signer.controller import Controller, Settings, utcnow
from signer.kube import SignerKube

log = logging.getLogger("podcert.signer")


def _namespace_default() -> str:
    """The pod's own namespace in a cluster, else podcert-system."""
    sa_ns = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if env := os.environ.get("POD_NAMESPACE"):
        return env
    try:
        return sa_ns.read_text().strip() or "podcert-system"
    except OSError:
        return "podcert-system"


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "signer",
        help="issue and deny PodCertificateRequests for our signer names",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="kubeconfig file; in-cluster configuration when absent",
    )
    p.add_argument(
        "--signer-name",
        dest="signer_names",
        action="append",
        required=True,
        help="signer name to serve (repeatable), e.g. example.com/podcert",
    )
    p.add_argument(
        "--trust-domain",
        default="cluster.local",
        help="SPIFFE trust domain for signers the policy does not configure",
    )
    p.add_argument(
        "--namespace",
        default=_namespace_default(),
        help="the signer's own namespace (CA Secret, lease)",
    )
    p.add_argument(
        "--ca-secret",
        default="podcert-ca",
        help="Secret holding the CA; created with a new root + intermediate if absent",
    )
    p.add_argument(
        "--no-create-ca",
        action="store_true",
        help="never create the CA Secret (an operator supplies tls.crt/tls.key/ca.crt)",
    )
    p.add_argument(
        "--policy",
        type=Path,
        default=None,
        help="policy YAML file (validated at start-up); allow-all defaults when absent",
    )
    p.add_argument("--workers", type=int, default=4, help="concurrent reconcile workers")
    p.add_argument(
        "--metrics-port",
        type=int,
        default=9090,
        help="port for /metrics, /healthz and /readyz (0 picks a free one)",
    )
    p.add_argument(
        "--metrics-host",
        default="0.0.0.0",  # noqa: S104
        help="address the metrics server binds",
    )
    p.add_argument(
        "--audit-log",
        type=Path,
        default=None,
        help="append-only, hash-chained audit log file (off when absent)",
    )
    p.add_argument(
        "--audit-checkpoint-every",
        type=int,
        default=1000,
        help="write a signed audit checkpoint every N lines",
    )
    p.add_argument(
        "--audit-checkpoint-interval",
        type=float,
        default=60.0,
        help="seconds between timed audit checkpoints",
    )
    p.add_argument(
        "--refresh-fraction",
        type=float,
        default=0.5,
        help="beginRefreshAt as a fraction of the lifetime (jittered per request)",
    )
    p.add_argument(
        "--backdate-seconds",
        type=int,
        default=60,
        help="notBefore is backdated this far for clock skew (API allows 5 min)",
    )
    p.add_argument("--log-level", default="INFO", help="log level")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    logs.setup(args.log_level)
    if not 1 <= args.workers <= 64:
        log.error("--workers must be between 1 and 64, got %d", args.workers)
        return 2
    if not 0.1 <= args.refresh_fraction <= 0.9:
        log.error("--refresh-fraction must be between 0.1 and 0.9")
        return 2
    try:
        pol = (
            policy.load_policy_file(args.policy, args.signer_names, args.trust_domain)
            if args.policy
            else policy.default_policy(args.signer_names, args.trust_domain)
        )
    except policy.PolicyError as err:
        log.error("invalid policy: %s", err)
        return 2

    kube = SignerKube(Rest(load_client(args.kubeconfig)))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    cas = CAStore(kube, args.namespace, args.ca_secret, utcnow, create=not args.no_create_ca)
    # Start-up waits out transient API trouble instead of crashing into a restart loop.
    delay = 0.5
    while not stop.is_set():
        try:
            version = kube.discover()
            if cas.load() is None:
                log.error("%s", cas.error)
                return 1
            break
        except ApiError as err:
            log.warning("API server not usable yet (%s); retrying in %.1fs", err, delay)
            stop.wait(delay)
            delay = min(delay * 2, 10.0)
    else:
        return 0
    log.info("serving %s on certificates.k8s.io/%s", ", ".join(args.signer_names), version)

    audit = None
    if args.audit_log is not None:
        args.audit_log.parent.mkdir(parents=True, exist_ok=True)
        audit = auditlog.AuditLog(args.audit_log, checkpoint_every=args.audit_checkpoint_every)
    m = metrics.Metrics()
    bundle = cas.bundle
    if bundle is not None:
        m.ca_not_after.set(bundle.not_after.timestamp())
    controller = Controller(
        kube,
        args.signer_names,
        pol,
        cas,
        m,
        audit,
        settings=Settings(
            workers=args.workers,
            refresh_fraction=args.refresh_fraction,
            backdate=dt.timedelta(seconds=args.backdate_seconds),
            audit_checkpoint_interval=args.audit_checkpoint_interval,
        ),
    )
    server = metrics.serve(m, args.metrics_port, controller.ready, host=args.metrics_host)
    log.info("metrics on port %d", server.server_address[1])
    controller.start()
    stop.wait()
    log.info("shutting down")
    controller.stop()
    server.shutdown()
    if audit is not None:
        audit.close()
    sys.stderr.flush()
    return 0
