"""`podcert signer`: run the signer controller for one or more signer names."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import socket
from pathlib import Path
from typing import Any

from podcert import logs, processflags
from podcert.api.validation import NOT_BEFORE_SKEW, is_dns_label, is_dns_name, signer_name_problem
from podcert.client import commandline
from podcert.client.rest import ApiError, Rest
from podcert.errors import CommandError, ConfigError, one_line
from podcert.helptext import HelpFormatter
from podcert.serving import connections
from signer import build, policy, revoking, upstreamcli
from signer.authority import castatus, offline, schedule, spiffebundle
from signer.authority.ca import CAError
from signer.authority.castore import CAStore, describe
from signer.federation import endpoint, poller
from signer.issue.controller import DEFAULT_SETTINGS, Settings, utcnow
from signer.kube import SignerKube
from signer.leader import LeaseSettings

log = logging.getLogger("podcert.signer")

# The API server wants notBefore within this of its clock, so no backdate may go further.
MAX_BACKDATE_SECONDS = int(NOT_BEFORE_SKEW.total_seconds())


def _namespace_default() -> str:
    """The pod's own namespace in a cluster, else podcert-system."""
    sa_ns = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    if env := os.environ.get("POD_NAMESPACE"):
        return env
    try:
        return sa_ns.read_text().strip() or "podcert-system"
    except OSError:
        return "podcert-system"


def _cluster_flags(p: argparse.ArgumentParser, *, after_ca: bool) -> None:
    """The flags `podcert signer` and `podcert signer ca ...` share: where the CA Secret is,
    and the rotation schedule. `ca` takes them after its action too (the runbook's
    `podcert signer ca status --namespace podcert-system`); there they default to nothing, so a
    value given before `ca` stands unless repeated after it. Where the cluster is: the running
    signer takes `--kubeconfig` else the in-cluster configuration, `ca` a person's flags
    (`podcert.client.commandline`)."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if after_ca else value

    if after_ca:
        commandline.add_flags(p, suppress=True)
    else:
        p.add_argument(
            "--kubeconfig",
            type=Path,
            default=None,
            help="kubeconfig file; in-cluster configuration when absent",
        )
    p.add_argument(
        "--namespace",
        default=default(None),
        help="the signer's own namespace (CA Secret, lease; default: POD_NAMESPACE, else the "
        "pod's, else podcert-system; for `ca`, the context's namespace first if it sets one)",
    )
    p.add_argument(
        "--ca-secret",
        default=default(build.Config.ca_secret),
        help="Secret holding the CA; created with a new root + intermediate if absent",
    )
    p.add_argument(
        "--ca-key-uri",
        default=default(build.Config.ca_key_uri),
        help="a pkcs11: URI (RFC 7512): CA keys are made and kept in that token (docs/hsm.md)",
    )
    p.add_argument("--ca-key-pin-file", type=Path, help="the token's PIN (else pin-source)")
    p.add_argument(
        "--ca-prepare-at",
        type=float,
        default=default(schedule.DEFAULT_SETTINGS.prepare_at),
        help="prepare the next CA once the active one has used this share of its life",
    )
    p.add_argument(
        "--ca-overlap-seconds",
        type=float,
        default=default(schedule.DEFAULT_SETTINGS.overlap.total_seconds()),
        help="a prepared CA is published this long before it starts signing",
    )
    p.add_argument(
        "--ca-root-days",
        type=int,
        default=default(schedule.DEFAULT_SETTINGS.root_lifetime.days),
        help="lifetime of new roots",
    )
    p.add_argument(
        "--ca-intermediate-days",
        type=int,
        default=default(schedule.DEFAULT_SETTINGS.intermediate_lifetime.days),
        help="lifetime of new intermediates (the signing CA)",
    )


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "signer",
        help="issue and deny PodCertificateRequests for our signer names",
        formatter_class=HelpFormatter,
        # No abbreviations: `ca ACTION --id GEN` must reach `ca`, not match --identity here.
        allow_abbrev=False,
    )
    _cluster_flags(p, after_ca=False)
    lease = LeaseSettings()
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
    processflags.add(
        p,
        metrics_host=build.Config.metrics_host,
        metrics_port=build.Config.metrics_port,
        startup_timeout=build.Config.startup_timeout,
        workers=DEFAULT_SETTINGS.workers,
        workers_help="concurrent reconcile workers",
    )
    p.add_argument(
        "--fair-queue",
        action=argparse.BooleanOptionalAction,
        default=DEFAULT_SETTINGS.fair_queue,
        help="workers serve nodes in turn, then each node's namespaces, so one node's flood "
        "cannot hold back the others (--no-fair-queue: one FIFO, for comparison)",
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
        default=build.Config.audit_checkpoint_every,
        help="write a signed audit checkpoint every N lines",
    )
    p.add_argument(
        "--audit-checkpoint-interval",
        type=float,
        default=build.Config.audit_checkpoint_interval,
        help="seconds between timed audit checkpoints",
    )
    p.add_argument(
        "--refresh-fraction",
        type=float,
        default=DEFAULT_SETTINGS.refresh_fraction,
        help="beginRefreshAt as a fraction of the lifetime (jittered per request)",
    )
    p.add_argument(
        "--backdate-seconds",
        type=int,
        default=int(DEFAULT_SETTINGS.backdate.total_seconds()),
        help="notBefore is backdated this far for clock skew (at most "
        f"{MAX_BACKDATE_SECONDS}: the API server refuses a notBefore further off)",
    )
    p.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="elect one leader among replicas with a Lease; only it issues",
    )
    p.add_argument("--lease-name", default=build.Config.lease_name, help="the Lease's name")
    p.add_argument(
        "--lease-duration",
        type=float,
        default=lease.duration,
        help="seconds a lease is honoured without renewal",
    )
    p.add_argument(
        "--renew-deadline",
        type=float,
        default=lease.renew_deadline,
        help="seconds a leader may fail to renew before it steps down",
    )
    p.add_argument(
        "--retry-period",
        type=float,
        default=lease.retry_period,
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
        "--webhook-port",
        type=int,
        default=0,
        help="serve the validating admission webhook over HTTPS here (0: off)",
    )
    p.add_argument(
        "--webhook-host",
        default=build.Config.webhook_host,
        help="address the webhook binds",
    )
    p.add_argument(
        "--webhook-dns-name",
        action="append",
        default=[],
        help="DNS name in the webhook's serving certificate (repeatable; default "
        "podcert-signer.<namespace>.svc and its cluster.local form)",
    )
    p.add_argument(
        "--webhook-configuration",
        default="",
        metavar="NAME",
        help="the ValidatingWebhookConfiguration whose caBundle the leader keeps equal to the "
        "CA's roots (default: none)",
    )
    p.add_argument(
        "--bundle-endpoint-port",
        type=int,
        default=0,
        help="serve the trust domain's SPIFFE bundle at / over HTTPS here (0: off)",
    )
    p.add_argument(
        "--bundle-endpoint-host",
        default=endpoint.Settings.host,
        help="address the bundle endpoint binds",
    )
    p.add_argument(
        "--bundle-endpoint-cert",
        type=Path,
        default=None,
        help="https_web profile: the endpoint's Web PKI certificate chain (PEM, with "
        "--bundle-endpoint-key); without it https_spiffe: an SVID of the signer's own, "
        "spiffe://<trust domain>/podcert/bundle-endpoint",
    )
    p.add_argument(
        "--bundle-endpoint-key",
        type=Path,
        default=None,
        help="https_web profile: the private key of --bundle-endpoint-cert (PEM)",
    )
    p.add_argument(
        "--bundle-refresh-hint-seconds",
        type=int,
        default=int(spiffebundle.DEFAULT_REFRESH_HINT.total_seconds()),
        help="spiffe_refresh_hint: how often consumers should poll the bundle (at most half "
        "of --ca-overlap-seconds, so a new root reaches them before it signs)",
    )
    upstreamcli.add_signer_flags(p)
    connections.add_flags(p, "the webhook and the bundle endpoint")
    p.set_defaults(run=run)
    sub = p.add_subparsers(dest="signer_command", metavar="ca")
    ca_parser = sub.add_parser(
        "ca",
        help="inspect or rotate the CA by hand (safe while issuing)",
        description="Inspect or rotate the CA in its Secret by hand (safe while replicas issue).",
    )
    ca_parser.add_argument("action", choices=["status", *schedule.ACTIONS, "import", "revoke"])
    ca_parser.add_argument(
        "generation", nargs="?", default=None, help="revoke: the compromised generation"
    )
    _cluster_flags(ca_parser, after_ca=True)
    ca_parser.add_argument("--id", default=None, help="the generation to act on")
    revoking.add_flags(ca_parser)
    ca_parser.add_argument(
        "--preview",
        action="store_true",
        help="prepare: publish the new root to pods selecting k8s.spiffe.io/canarying=preview "
        "only, until `ca promote` makes it live",
    )
    ca_parser.add_argument(
        "--force",
        action="store_true",
        help="retire before its last leaf expired; prepare: a root of our own though SPIRE "
        "signs; revoke: evict unowned kubelet pods too (gone for good, as `kubectl drain --force`)",
    )
    upstreamcli.add_flags(ca_parser)
    ca_parser.set_defaults(run=run_ca)


def _cluster_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags `podcert signer` and `podcert signer ca` share, or None."""
    if args.namespace is not None and not is_dns_label(args.namespace):
        return f"--namespace {args.namespace!r} is not a namespace name"
    if not is_dns_name(args.ca_secret):
        return f"--ca-secret {args.ca_secret!r} is not a Secret name"

    if not 0.0 < args.ca_prepare_at < 1.0:
        return (
            "--ca-prepare-at must be between 0 and 1 (a share of the CA's life), "
            f"got {args.ca_prepare_at}"
        )
    if args.ca_overlap_seconds < 0:
        return f"--ca-overlap-seconds must not be negative, got {args.ca_overlap_seconds}"
    if min(args.ca_root_days, args.ca_intermediate_days) < 1:
        return "--ca-root-days and --ca-intermediate-days must be at least 1"
    return None


def _run_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags only the running signer takes, or None."""
    if not args.signer_names:
        return "--signer-name is required (repeat it to serve several)"
    for name in args.signer_names:
        if problem := signer_name_problem(name):
            return f"--signer-name {name!r}: {problem}"
    if said := processflags.problem(args):
        return said
    if not 0.1 <= args.refresh_fraction <= 0.9:
        return "--refresh-fraction must be between 0.1 and 0.9"
    if not 0 <= args.backdate_seconds <= MAX_BACKDATE_SECONDS:
        return (
            f"--backdate-seconds must be between 0 and {MAX_BACKDATE_SECONDS} (the API "
            f"server refuses a notBefore further off), got {args.backdate_seconds}"
        )
    for flag, port in (
        ("--webhook-port", args.webhook_port),
        ("--bundle-endpoint-port", args.bundle_endpoint_port),
    ):
        if said := processflags.port_problem(flag, port):
            return said
    if args.webhook_configuration and not is_dns_name(args.webhook_configuration):
        return f"--webhook-configuration {args.webhook_configuration!r} is not an object name"
    if (args.bundle_endpoint_cert is None) != (args.bundle_endpoint_key is None):
        return "--bundle-endpoint-cert and --bundle-endpoint-key go together (https_web)"
    if not 1 <= args.bundle_refresh_hint_seconds <= max(1, args.ca_overlap_seconds / 2):
        return (
            "--bundle-refresh-hint-seconds must be between 1 and half of --ca-overlap-seconds, "
            f"got {args.bundle_refresh_hint_seconds}"
        )
    if args.audit_checkpoint_every < 1 or args.audit_checkpoint_interval <= 0:
        return "--audit-checkpoint-every must be at least 1 and --audit-checkpoint-interval above 0"
    if problem := connections.flags_problem(args):
        return problem
    if not args.lease_duration > args.renew_deadline > args.retry_period > 0:
        return (
            "the lease timings must satisfy --lease-duration > --renew-deadline > "
            f"--retry-period > 0, got {args.lease_duration}, {args.renew_deadline}, "
            f"{args.retry_period}"
        )
    return _cluster_problem(args)


def _rotation_settings(args: argparse.Namespace) -> schedule.Settings:
    return schedule.Settings(
        prepare_at=args.ca_prepare_at,
        overlap=dt.timedelta(seconds=args.ca_overlap_seconds),
        root_lifetime=dt.timedelta(days=args.ca_root_days),
        intermediate_lifetime=dt.timedelta(days=args.ca_intermediate_days),
    )


def run_ca(args: argparse.Namespace) -> int:
    """`podcert signer ca ...`: the same steps the schedule takes, applied to the Secret."""
    if problem := _cluster_problem(args):
        raise ConfigError(problem)
    if args.preview and args.action != "prepare":
        raise ConfigError(f"--preview goes with `ca prepare` only, not `ca {args.action}`")
    if problem := upstreamcli.problem(args):
        raise ConfigError(problem)
    settings = commandline.from_args(args)
    # The context's namespace only when it names one: "default" never holds a signer.
    namespace = args.namespace or (
        settings.namespace if settings.namespace != "default" else _namespace_default()
    )
    kube = SignerKube(Rest(settings))
    keys = build.token_keys(args.ca_key_uri, args.ca_key_pin_file)  # ConfigError, one line
    cas = CAStore(
        kube,
        namespace,
        args.ca_secret,
        utcnow,
        create=False,
        settings=_rotation_settings(args),
        keys=keys,
    )
    try:
        gens = cas.load()
        if gens is None:
            raise CommandError(str(cas.error))
        if args.action == "status":
            print("\n".join(castatus.report(cas, gens, utcnow())))
            return 0
        if (done := upstreamcli.run(args, cas)) is not None:
            return done
        if args.action == "revoke":
            return revoking.run(args, cas, kube)
        step = schedule.manual_step(
            args.action, gens, utcnow(), target=args.id, preview=args.preview, force=args.force
        )
        after = cas.step(step)
        print(describe(after))
        return 0
    except (ApiError, schedule.RotationError, CAError, offline.ChainError) as err:
        raise CommandError(f"ca {args.action}: {one_line(str(err))}") from None


def run(args: argparse.Namespace) -> int:
    logs.setup(args.log_level)
    config = config_from(args)
    if isinstance(config, str):
        raise ConfigError(config)
    return build.run(config)


def config_from(args: argparse.Namespace) -> build.Config | str:
    """The validated configuration, or what is wrong with the flags."""
    if problem := _run_problem(args):
        return problem
    try:
        pol = (
            policy.load_policy_file(args.policy, args.signer_names, args.trust_domain)
            if args.policy
            else policy.default_policy(args.signer_names, args.trust_domain)
        )
    except policy.PolicyError as err:
        return f"invalid policy: {err}"
    if problem := upstreamcli.signer_problem(args, pol):
        return problem
    if pol.federation is not None:  # the bootstrap bundles are read now, so a bad one stops us
        bootstraps = poller.load_bootstraps(pol.federation, utcnow())
        if isinstance(bootstraps, str):
            return f"invalid policy: {bootstraps}"
    return build.Config(
        signer_names=tuple(args.signer_names),
        policy=pol,
        namespace=args.namespace or _namespace_default(),
        kubeconfig=args.kubeconfig,
        ca_secret=args.ca_secret,
        create_ca=not args.no_create_ca,
        rotation=_rotation_settings(args),
        controller=Settings(
            workers=args.workers,
            fair_queue=args.fair_queue,
            refresh_fraction=args.refresh_fraction,
            backdate=dt.timedelta(seconds=args.backdate_seconds),
        ),
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        serving_limits=connections.from_flags(args),
        audit_log=args.audit_log,
        audit_checkpoint_every=args.audit_checkpoint_every,
        audit_checkpoint_interval=args.audit_checkpoint_interval,
        publish_trust_bundles=not args.no_trust_bundles,
        leader_elect=args.leader_elect,
        lease_name=args.lease_name,
        lease=LeaseSettings(args.lease_duration, args.renew_deadline, args.retry_period),
        identity=args.identity,
        webhook_host=args.webhook_host,
        webhook_port=args.webhook_port,
        webhook_dns_names=tuple(args.webhook_dns_name),
        webhook_configuration=args.webhook_configuration,
        bundle_endpoint=_bundle_endpoint(args),
        startup_timeout=args.startup_timeout,
        ca_key_uri=args.ca_key_uri,
        ca_key_pin_file=args.ca_key_pin_file,
        spire=upstreamcli.spire_endpoints(args),
    )


def _bundle_endpoint(args: argparse.Namespace) -> endpoint.Settings | None:
    if not args.bundle_endpoint_port:
        return None
    return endpoint.Settings(
        port=args.bundle_endpoint_port,
        host=args.bundle_endpoint_host,
        web_cert=args.bundle_endpoint_cert,
        web_key=args.bundle_endpoint_key,
        refresh_hint=dt.timedelta(seconds=args.bundle_refresh_hint_seconds),
        limits=connections.from_flags(args),
    )
