"""`podcert signer`: run the signer controller for one or more signer names."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from podcert import logs
from podcert.rest import ApiError, Rest, load_client
from signer import auditlog, metrics, policy, rotation
from signer.ca import CAError
from signer.castore import CAStore, describe
from signer.controller import Controller, Settings, utcnow
from signer.kube import SignerKube
from signer.leader import Elector, LeaseSettings
from signer.webhook import ServingCert, WebhookServer

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
        default=[],
        help="signer name to serve (repeatable; required to run the signer)",
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
        "--fair-queue",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="workers serve nodes in turn, then each node's namespaces, so one node's flood "
        "cannot hold back the others (--no-fair-queue: one FIFO, for comparison)",
    )
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
    p.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="elect one leader among replicas with a Lease; only it issues",
    )
    p.add_argument("--lease-name", default="podcert-signer", help="the Lease's name")
    p.add_argument(
        "--lease-duration",
        type=float,
        default=15.0,
        help="seconds a lease is honoured without renewal",
    )
    p.add_argument(
        "--renew-deadline",
        type=float,
        default=10.0,
        help="seconds a leader may fail to renew before it steps down",
    )
    p.add_argument(
        "--retry-period",
        type=float,
        default=2.0,
        help="seconds between lease acquire/renew attempts",
    )
    p.add_argument(
        "--identity",
        default=f"{socket.gethostname()}_{os.getpid()}",
        help="this replica's identity in the Lease",
    )
    p.add_argument(
        "--no-trust-bundles", action="store_true", help="do not publish ClusterTrustBundles"
    )
    p.add_argument(
        "--ca-prepare-at",
        type=float,
        default=0.5,
        help="prepare the next CA once the active one has used this share of its life",
    )
    p.add_argument(
        "--ca-overlap-seconds",
        type=float,
        default=3600.0,
        help="a prepared CA is published this long before it starts signing",
    )
    p.add_argument("--ca-root-days", type=int, default=365, help="lifetime of new roots")
    p.add_argument(
        "--ca-intermediate-days",
        type=int,
        default=90,
        help="lifetime of new intermediates (the signing CA)",
    )
    p.add_argument(
        "--webhook-port",
        type=int,
        default=0,
        help="serve the validating admission webhook over HTTPS here (0: off)",
    )
    p.add_argument(
        "--webhook-host",
        default="0.0.0.0",  # noqa: S104
        help="address the webhook binds",
    )
    p.add_argument(
        "--webhook-dns-name",
        action="append",
        default=[],
        help="DNS name in the webhook's serving certificate (repeatable; default "
        "podcert-signer.<namespace>.svc and its cluster.local form)",
    )
    p.add_argument("--log-level", default="INFO", help="log level")
    p.set_defaults(run=run)
    sub = p.add_subparsers(dest="signer_command", metavar="ca")
    ca_parser = sub.add_parser("ca", help="inspect or rotate the CA by hand (safe while issuing)")
    ca_parser.add_argument("action", choices=["status", "prepare", "activate", "retire"])
    ca_parser.add_argument("--id", default=None, help="the generation to activate or retire")
    ca_parser.add_argument(
        "--force",
        action="store_true",
        help="retire even though leaves it signed may not have expired yet",
    )
    ca_parser.set_defaults(run=run_ca)


def _rotation_settings(args: argparse.Namespace) -> rotation.Settings:
    return rotation.Settings(
        prepare_at=args.ca_prepare_at,
        overlap=dt.timedelta(seconds=args.ca_overlap_seconds),
        root_lifetime=dt.timedelta(days=args.ca_root_days),
        intermediate_lifetime=dt.timedelta(days=args.ca_intermediate_days),
    )


def run_ca(args: argparse.Namespace) -> int:
    """`podcert signer ca ...`: the same steps the schedule takes, applied to the Secret."""
    kube = SignerKube(Rest(load_client(args.kubeconfig)))
    cas = CAStore(
        kube,
        args.namespace,
        args.ca_secret,
        utcnow,
        create=False,
        settings=_rotation_settings(args),
    )
    try:
        gens = cas.load()
        if gens is None:
            print(f"error: {cas.error}", file=sys.stderr)
            return 1
        if args.action == "status":
            now = utcnow()
            for g in gens:
                until = (
                    f" trusted until {g.trusted_until:%Y-%m-%dT%H:%M:%SZ}"
                    if g.trusted_until
                    else ""
                )
                print(
                    f"{g.id:24} {g.state:9} since {g.since:%Y-%m-%dT%H:%M:%SZ}  "
                    f"root until {g.root.not_valid_after_utc:%Y-%m-%d}  "
                    f"signing CA until {g.bundle.not_after:%Y-%m-%d}{until}"
                )
            due = (
                rotation.ca_schedule(gens, now, cas.settings) if gens[0].id != "operator" else None
            )
            print(f"next step due: {type(due).__name__ if due else 'none'}")
            return 0
        step: rotation.Step
        if args.action == "prepare":
            step = rotation.Prepare()
        elif args.action == "activate":
            prepared = [g for g in gens if g.state == "prepared" and args.id in (None, g.id)]
            if not prepared:
                print("error: no prepared CA to activate (run `ca prepare` first)", file=sys.stderr)
                return 1
            step = rotation.Activate(prepared[0].id)
        else:
            retired = [g for g in gens if g.state == "retired" and args.id in (None, g.id)]
            if not retired:
                print("error: no retired CA (activate a new one first)", file=sys.stderr)
                return 1
            target = retired[0]
            if not args.force and target.trusted_until and utcnow() < target.trusted_until:
                print(
                    f"error: leaves signed by {target.id} may be valid until "
                    f"{target.trusted_until:%Y-%m-%dT%H:%M:%SZ}; re-issue them and use --force",
                    file=sys.stderr,
                )
                return 1
            step = rotation.Remove(target.id)
        after = cas.step(step)
        print(describe(after))
        return 0
    except (ApiError, rotation.RotationError, CAError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    logs.setup(args.log_level)
    if not args.signer_names:
        log.error("--signer-name is required (repeat it to serve several)")
        return 2
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

    cas = CAStore(
        kube,
        args.namespace,
        args.ca_secret,
        utcnow,
        create=not args.no_create_ca,
        settings=_rotation_settings(args),
    )
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
    leading = threading.Event()
    if not args.leader_elect:
        leading.set()
    controller = Controller(
        kube,
        args.signer_names,
        pol,
        cas,
        m,
        audit,
        settings=Settings(
            workers=args.workers,
            fair_queue=args.fair_queue,
            refresh_fraction=args.refresh_fraction,
            backdate=dt.timedelta(seconds=args.backdate_seconds),
            audit_checkpoint_interval=args.audit_checkpoint_interval,
            publish_trust_bundles=not args.no_trust_bundles,
        ),
        is_leader=leading.is_set,
    )
    server = metrics.serve(m, args.metrics_port, controller.ready, host=args.metrics_host)
    log.info("metrics on port %d", server.server_address[1])
    controller.start()
    webhook_thread = None
    if args.webhook_port:
        names = args.webhook_dns_name or [
            f"podcert-signer.{args.namespace}.svc",
            f"podcert-signer.{args.namespace}.svc.cluster.local",
        ]
        server_hook = WebhookServer(
            args.webhook_host,
            args.webhook_port,
            ServingCert(
                cas.issuing, names, pol.for_signer(args.signer_names[0]).trust_domain, utcnow
            ),
            args.signer_names,
            controller.facts,
            pol,
            utcnow,
        )
        webhook_thread = threading.Thread(target=server_hook.run, args=(stop,), name="webhook")
        webhook_thread.start()
        server_hook.started.wait(30)
        if server_hook.error is not None:
            log.error("the admission webhook could not start: %s", server_hook.error)
            stop.set()
    elector_thread = None
    if args.leader_elect:
        elector = Elector(
            kube.rest,
            args.namespace,
            args.lease_name,
            args.identity,
            LeaseSettings(args.lease_duration, args.renew_deadline, args.retry_period),
            on_start=controller.started_leading,
            on_stop=controller.stopped_leading,
        )
        elector.leading = leading
        elector_thread = threading.Thread(target=elector.run, args=(stop,), name="leader")
        elector_thread.start()
    else:
        controller.started_leading()
    stop.wait()
    log.info("shutting down")
    controller.stop()
    for thread in (elector_thread, webhook_thread):
        if thread is not None:
            thread.join(timeout=10)
    server.shutdown()
    if audit is not None:
        audit.close()
    sys.stderr.flush()
    return 0
