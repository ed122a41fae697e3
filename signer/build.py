"""Wiring: a signer process's pieces, built from its configuration and run on one runtime.

`run(config)` is the whole process: reach the API server (waiting out transient trouble),
load or create the CA, `build` every piece, start them, wait for SIGTERM/SIGINT and stop. Each
piece does one job and learns of the others only through the callbacks wired here:

| piece                    | job                                                           |
|--------------------------|---------------------------------------------------------------|
| `CAStore` (+ its watch)  | the CA set in its Secret, followed by every replica           |
| `Controller` (+ pool)    | settles PodCertificateRequests; only the leader writes         |
| `AuditTrail`             | the audit log's entries, key and checkpoints; fails closed     |
| `Publisher` (+ pool)     | one ClusterTrustBundle per signer name, equal to the roots     |
| `Rotator`                | applies the CA schedule's due step (leader only)               |
| `SuccessorWarning`       | an upstream-signed CA near its end: gauge, log line, Event     |
| `Elector`                | the Lease; starts and stops leading                           |
| `WebhookServer`          | the validating admission webhook (optional)                   |
| `CAInjector` (+ pool)    | its configuration's caBundle, equal to the roots (leader only) |
| `BundleServer`           | the SPIFFE bundle endpoint (optional)                         |
| `Federator` (+ pool)     | federated trust domains' bundles, polled and published (leader) |
| `SpireUpstream`          | SPIRE's bundle followed, its intermediate renewed (leader)     |
| metrics server           | /metrics, /healthz, /readyz                                   |

/healthz is the runtime's (every long-running thread alive) and the signer's identity's:
unhealthy while the API server keeps refusing it (`podcert.client.refusals`: a revoked token, a
deleted service account), which no retry can fix and a restart may.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from podcert import __version__
from podcert.api.versions import CTBS
from podcert.client.discovery import Unserved
from podcert.client.rest import ApiError, Rest, load_client
from podcert.errors import ConfigError, Refused, refusal_is_final
from podcert.reconcile.runtime import GaveUp, Runtime, retry_until
from podcert.serving import health
from podcert.serving.connections import DEFAULT_LIMITS, Limits
from signer import metrics
from signer.admission.cainjector import CAInjector
from signer.auditlog import writer
from signer.auditlog.trail import DEFAULT_CHECKPOINT_INTERVAL, AuditTrail
from signer.authority import downstream, schedule
from signer.authority.castore import CAStore, KeySource
from signer.authority.rotator import Rotator, SuccessorWarning
from signer.authority.trustbundles import Publisher
from signer.federation import endpoint
from signer.federation.poller import Federator, load_bootstraps
from signer.issue.controller import Controller, Settings, utcnow
from signer.kube import SignerKube
from signer.leader import SIGNER_NAMES_ANNOTATION, VERSION_ANNOTATION, Elector, LeaseSettings
from signer.policy import Policy

if TYPE_CHECKING:  # grpcio and protobuf are the `spire` extra's: imported only when used
    from signer.authority.spireupstream import SpireUpstream

log = logging.getLogger("podcert.signer")

WEBHOOK_START_TIMEOUT = 30.0


@dataclass(frozen=True)
class Config:
    """Everything `podcert signer` is told on its command line, validated. A field's default
    here is its flag's default too: the CLI reads it from the class (`Config.metrics_port`)."""

    signer_names: tuple[str, ...]
    policy: Policy
    namespace: str
    kubeconfig: Path | None = None
    ca_secret: str = "podcert-ca"  # noqa: S105 (a Secret's name, not a password)
    create_ca: bool = True
    rotation: schedule.Settings = schedule.DEFAULT_SETTINGS
    rotation_check_interval: float = 30.0  # how often the leader asks the CA schedule
    controller: Settings = field(default_factory=Settings)
    metrics_host: str = "0.0.0.0"  # noqa: S104 (a pod's metrics port is meant to be scraped)
    metrics_port: int = 9090
    metrics_limits: Limits = health.METRICS_LIMITS
    serving_limits: Limits = DEFAULT_LIMITS  # the webhook's and the bundle endpoint's ports
    audit_log: Path | None = None
    audit_checkpoint_every: int = writer.DEFAULT_CHECKPOINT_EVERY
    audit_checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL
    publish_trust_bundles: bool = True
    leader_elect: bool = True
    lease_name: str = "podcert-signer"
    lease: LeaseSettings = field(default_factory=LeaseSettings)
    identity: str = "podcert-signer"
    webhook_host: str = "0.0.0.0"  # noqa: S104
    webhook_port: int = 0  # 0: no webhook
    webhook_dns_names: tuple[str, ...] = ()  # default: the Service's names in `namespace`
    webhook_configuration: str = ""  # the ValidatingWebhookConfiguration whose caBundle we keep
    bundle_endpoint: endpoint.Settings | None = None  # None: no SPIFFE bundle endpoint
    startup_timeout: float = 120.0  # seconds of API trouble at start before exit 1 (0: never)
    ca_key_uri: str = ""  # a pkcs11: URI: the intermediates' keys live in that token ("": Secret)
    ca_key_pin_file: Path | None = None  # the token's PIN (else the URI's pin-source)
    spire: downstream.Endpoints | None = None  # SPIRE signs the intermediates (--upstream spire)

    @property
    def renewal(self) -> downstream.RenewalSettings:
        """When the SPIRE-signed intermediate is renewed: the CA schedule's settings."""
        return downstream.RenewalSettings(
            fraction=self.rotation.prepare_at,
            max_leaf_lifetime=self.rotation.max_leaf_lifetime,
            overlap=self.rotation.overlap,
        )

    @property
    def trust_domain(self) -> str:
        """The first signer's: the audit certificate's and the webhook's."""
        return self.policy.for_signer(self.signer_names[0]).trust_domain


class CAUnusable(Exception):
    """The CA Secret is missing (and may not be created) or holds no usable CA."""


def token_keys(uri: str, pin_file: Path | None) -> KeySource | None:
    """The token holding the CA keys when `uri` names one, logged in now: a wrong URI, PIN,
    token or module raises ConfigError (one line naming it). python-pkcs11 (the `hsm` extra) is
    imported only then."""
    if not uri:
        return None
    from signer.authority import pkcs11uri

    try:
        parsed = pkcs11uri.parse(uri)
    except pkcs11uri.URIError as err:
        raise ConfigError(f"--ca-key-uri: {err}") from None
    try:
        from signer.authority import tokenkeys
    except ImportError as err:
        raise ConfigError(f"--ca-key-uri needs python-pkcs11 (podcert[hsm]): {err}") from None
    where = pin_file or parsed.pin_file()
    if where is None:
        raise ConfigError("--ca-key-uri: give the PIN with --ca-key-pin-file or a pin-source")
    try:
        return tokenkeys.TokenKeys(parsed, tokenkeys.read_pin(where))
    except tokenkeys.TokenConfigError as err:
        raise ConfigError(f"--ca-key-uri: {err}") from None


def spire_module() -> ModuleType:
    """`signer.authority.spireupstream`, whose grpcio and protobuf are the `spire` extra's;
    ConfigError (one line) when they are not installed."""
    try:
        from signer.authority import spireupstream
    except ImportError as err:
        needs = "--upstream spire needs grpcio and protobuf (podcert[spire])"
        raise ConfigError(f"{needs}: {err}") from None
    return spireupstream


def run(config: Config) -> int:
    runtime = Runtime("signer", logger=log)
    runtime.handle_signals()
    try:
        keys = token_keys(config.ca_key_uri, config.ca_key_pin_file)
        spire = spire_module() if config.spire is not None else None
    except ConfigError as err:
        log.error("%s", err)
        return 1
    kube = SignerKube(Rest(load_client(config.kubeconfig)))
    cas = CAStore(
        kube,
        config.namespace,
        config.ca_secret,
        utcnow,
        create=config.create_ca,
        settings=config.rotation,
        keys=keys,
    )
    if spire is not None and config.spire is not None:
        # A new CA Secret starts from SPIRE's intermediate, never from a root of our own.
        cas.first_ca = spire.first_ca(
            config.spire,
            config.trust_domain,
            config.renewal,
            config.rotation.intermediate_lifetime,
            utcnow,
            cas,
        )
        cas.upstream_prepares = True

    @refusal_is_final
    def connect() -> str:
        version = kube.discover(trust_bundles=config.publish_trust_bundles)
        if cas.load() is None:
            raise CAUnusable(cas.error)
        return version

    try:
        # Start-up waits out transient API trouble instead of crashing into a restart loop;
        # credentials the API server refuses are no such trouble.
        version = retry_until(
            connect,
            runtime.stopping,
            transient=(ApiError, downstream.UpstreamUnavailable),
            logger=log,
            give_up_after=config.startup_timeout,
        )
    except (CAUnusable, Refused, GaveUp) as err:
        log.error("%s", err)
        return 1
    except Unserved as err:
        hint = "; or start it with --no-trust-bundles" if CTBS in err.missing else ""
        log.error("the signer cannot run here: %s%s", err, hint)
        return 1
    if version is None:
        return 0
    log.info("serving %s on certificates.k8s.io/%s", ", ".join(config.signer_names), version)
    signer = build(config, kube, cas, runtime)
    signer.start()
    runtime.wait()
    log.info("shutting down")
    runtime.stop()
    sys.stderr.flush()
    return 0


@dataclass
class Signer:
    """The pieces of one signer process, wired and not yet started."""

    config: Config
    runtime: Runtime
    kube: SignerKube
    cas: CAStore
    metrics: metrics.Metrics
    audit: writer.AuditLog | None
    trail: AuditTrail
    controller: Controller
    publisher: Publisher
    rotator: Rotator
    leading: threading.Event
    server: health.BoundedHTTPServer | None = None
    injector: CAInjector | None = None
    federator: Federator | None = None
    upstream: SpireUpstream | None = None

    def start(self) -> None:
        config, runtime, stop = self.config, self.runtime, self.runtime.stopping
        # /readyz answers from the moment the metrics port listens, while the pieces and the
        # checks readiness needs are still being added below: until the last is added, and the
        # webhook and the bundle endpoint (which start last) accept connections, it says no.
        wired = threading.Event()
        runtime.ready_when(wired.is_set)
        # /healthz: a dead rotation loop, reflector or worker shows, and an identity refused.
        refusals = self.kube.rest.refusals
        self.server = metrics.serve(
            self.metrics,
            config.metrics_port,
            runtime.ready,
            lambda: runtime.healthy() and refusals.healthy(),
            host=config.metrics_host,
            limits=config.metrics_limits,
        )
        log.info("metrics on port %d", self.server.server_address[1])
        # Ready only while not stopping: a server that could not start stops the process.
        runtime.ready_when(lambda: not stop.is_set())
        self.trail.start()
        for reflector in [*self.controller.reflectors, self.cas.follow(stop)]:
            runtime.spawn(reflector.name, reflector.run)
            runtime.ready_when(reflector.synced.is_set)
        if config.publish_trust_bundles:
            for reflector in self.publisher.reflectors:
                runtime.spawn(reflector.name, reflector.run)
            runtime.add_pool(self.publisher.pool())
        runtime.add_pool(self.controller.pool())
        if self.injector is not None:
            runtime.spawn(self.injector.reflector.name, self.injector.reflector.run)
            runtime.add_pool(self.injector.pool())
        runtime.spawn("ca-rotation", self.rotator.run)
        runtime.on_stopping(self.rotator.wake)
        if self.upstream is not None:
            runtime.spawn("spire-upstream", self.upstream.run)
            runtime.on_stopping(self.upstream.wake)
        if self.audit is not None:
            runtime.spawn("audit-checkpoints", lambda: self.trail.run(stop), join=True)
        # After the workers and the checkpoint timer: a last checkpoint, then close up.
        runtime.on_stopped(self.trail.checkpoint)
        runtime.on_stopped(self.server.shutdown)
        if self.audit is not None:
            runtime.on_stopped(self.audit.close)
        runtime.start()
        if self.federator is not None:
            self.federator.start(runtime)
        if config.leader_elect:
            elector = Elector(
                self.kube.rest,
                config.namespace,
                config.lease_name,
                config.identity,
                config.lease,
                on_start=self.started_leading,
                on_stop=self.stopped_leading,
                annotations={
                    VERSION_ANNOTATION: __version__,
                    SIGNER_NAMES_ANNOTATION: ",".join(config.signer_names),
                },
            )
            elector.leading = self.leading
            runtime.spawn("leader", lambda: elector.run(stop), join=True)
        else:
            self.started_leading()
        # After leading has begun: the servers' aiohttp takes a tenth of a second or more to
        # import, and the first issuance does not wait for it.
        if config.webhook_port:
            runtime.ready_when(self._start_webhook().is_set)
        if config.bundle_endpoint is not None:
            bundle_endpoint = endpoint.start(
                config.bundle_endpoint,
                self.cas.issuing,
                self.cas.spiffe_bundle,
                config.trust_domain,
                runtime,
                utcnow,
            )
            runtime.ready_when(bundle_endpoint.listening.is_set)
        wired.set()

    def _start_webhook(self) -> threading.Event:
        """Start the webhook; the event it returns is set while it accepts connections."""
        # aiohttp (a tenth of a second to import) only in a signer that serves the webhook.
        from signer.admission.webhook import ServingCert, WebhookServer

        config = self.config
        names = config.webhook_dns_names or (
            f"podcert-signer.{config.namespace}.svc",
            f"podcert-signer.{config.namespace}.svc.cluster.local",
        )
        hook = WebhookServer(
            config.webhook_host,
            config.webhook_port,
            ServingCert(self.cas.issuing, list(names), config.trust_domain, utcnow),
            config.signer_names,
            self.controller.admission_facts,
            config.policy,
            utcnow,
            config.serving_limits,
        )
        self.runtime.spawn("webhook", lambda: hook.run(self.runtime.stopping), join=True)
        hook.started.wait(WEBHOOK_START_TIMEOUT)
        if hook.error is not None:
            log.error("the admission webhook could not start: %s", hook.error)
            self.runtime.stopping.set()
        return hook.listening

    def started_leading(self) -> None:
        """Pick up every pending request, and look at the trust bundles and the CA schedule."""
        self.metrics.leader.set(1)
        self.controller.started_leading()
        self.publisher.resync()
        if self.injector is not None:
            self.injector.resync()
        if self.federator is not None:
            self.federator.resync()
        self.rotator.wake()
        if self.upstream is not None:
            self.upstream.wake()

    def stopped_leading(self) -> None:
        self.metrics.leader.set(0)
        self.controller.stopped_leading()

    def on_ca_change(self) -> None:
        self.metrics.observe_generations(g.state for g in self.cas.generations)
        bundle = self.cas.bundle
        if bundle is not None:
            self.metrics.ca_not_after.set(bundle.not_after.timestamp())
            # A (new) CA signs now: the audit certificate is re-keyed under it.
            self.trail.on_ca_change()
            if self.upstream is not None:
                self.metrics.observe_upstream(bundle.intermediate, self.config.renewal)
        self.publisher.resync()
        if self.injector is not None:
            self.injector.resync()
        self.rotator.wake()


def build(config: Config, kube: SignerKube, cas: CAStore, runtime: Runtime) -> Signer:
    """Every piece, wired to the others; `cas` is loaded."""
    audit = None
    if config.audit_log is not None:
        config.audit_log.parent.mkdir(parents=True, exist_ok=True)
        audit = writer.AuditLog(config.audit_log, checkpoint_every=config.audit_checkpoint_every)
    m = metrics.Metrics()
    bundle = cas.bundle
    if bundle is not None:
        m.ca_not_after.set(bundle.not_after.timestamp())
    m.observe_generations(g.state for g in cas.generations)
    trail = AuditTrail(
        audit,
        m,
        cas.issuing,
        config.trust_domain,
        clock=utcnow,
        backdate=config.controller.backdate,
        checkpoint_interval=config.audit_checkpoint_interval,
    )
    runtime.ready_when(lambda: cas.bundle is not None)
    runtime.ready_when(trail.writable)
    leading = threading.Event()
    if not config.leader_elect:
        leading.set()
    controller = Controller(
        kube,
        config.signer_names,
        config.policy,
        cas,
        m,
        trail,
        settings=config.controller,
        is_leader=leading.is_set,
        stop=runtime.stopping,
    )
    publisher = Publisher(
        kube,
        {s: config.policy.for_signer(s).trust_domain for s in config.signer_names},
        cas.live_roots,
        leading.is_set,
        runtime.stopping,
        preview_roots=cas.trusted_roots,
    )
    warning = SuccessorWarning(cas, m.ca_upstream_successor_due.set, kube, leading.is_set)
    rotator = Rotator(
        cas,
        leading.is_set,
        runtime.stopping,
        interval=config.rotation_check_interval,
        every_look=warning.check,
    )
    signer = Signer(
        config, runtime, kube, cas, m, audit, trail, controller, publisher, rotator, leading
    )
    if config.webhook_configuration:
        signer.injector = CAInjector(
            kube, config.webhook_configuration, cas.trusted_roots, leading.is_set, runtime.stopping
        )
    federated = config.policy.federation
    if federated is not None and federated.domains:
        bootstraps = load_bootstraps(federated, utcnow())
        if isinstance(bootstraps, str):  # checked at start-up; a file changed since
            raise ValueError(bootstraps)
        signer.federator = Federator(
            kube,
            federated,
            bootstraps,
            leading.is_set,
            runtime.stopping,
            utcnow,
            local_roots=cas.trusted_roots,  # never published as another domain's
            workloads=_served_trust_domains(config),
        )
    if config.spire is not None:
        spire = spire_module()
        signer.upstream = spire.SpireUpstream(
            cas,
            config.spire,
            config.trust_domain,
            config.renewal,
            config.rotation.intermediate_lifetime,
            leading.is_set,
            runtime.stopping,
            utcnow,
            interval=config.spire.interval,
            observer=metrics.UpstreamObserver(m),
        )
        if bundle is not None:
            m.observe_upstream(bundle.intermediate, config.renewal)
    cas.on_change(signer.on_ca_change)
    return signer


def _served_trust_domains(config: Config) -> list[str]:
    """The trust domains this signer issues in, the default first: each federates."""
    served = {config.policy.for_signer(s).trust_domain for s in config.signer_names}
    return [config.trust_domain, *sorted(served - {config.trust_domain})]
