"""SPIRE as the upstream, the I/O half: the agent's Workload API, the server's
`NewDownstreamX509CA`, and the leader's loop that keeps an intermediate signed by SPIRE.

What to do is `signer.authority.downstream`'s (pure); this module fetches the signer's own
X509-SVID from the SPIRE agent (`SpiffeWorkloadAPI/FetchX509SVID` on its unix socket; the
signer is registered there as a downstream workload), calls the SPIRE server over mutual TLS
with it (the server is authorized by its SPIFFE ID, `spiffe://<td>/spire/server`), and writes
what SPIRE answered to the CA Secret through `CAStore`. The few protobuf messages are built at
run time from descriptors (no generated stubs; their field numbers are svid.proto's and
workload.proto's, pinned by tests/unit/test_signer_authority_spireupstream.py), so the `spire`
extra is grpcio and protobuf alone.

The loop (`SpireUpstream.run`, leader only) looks every `interval` and after each failure
backs off (`downstream.retry_delay`). A failure is counted and logged, never raised: the
signer keeps issuing from its current intermediate while it lasts. The next intermediate's key
is made once and kept through failed attempts (a PKCS#11 token is not filled with orphans while
SPIRE is away). Neither the SVID's key nor the intermediate's appears in a log, metric or error;
the SVID's key touches the disk only for a call to the server (`new_downstream_ca`).
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import secrets
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from bundles.authz import allow_ids
from bundles.formats import dump_certificates, dump_private_key
from bundles.grpc import Tunnel
from bundles.source import SourceError, TLSSource
from podcert.api import keys
from podcert.client.rest import ApiError
from signer.authority import ca, downstream, offline, schedule
from signer.authority.castore import CAStore, describe

log = logging.getLogger("podcert.signer.spire")

WORKLOAD_METHOD: Final = "/SpiffeWorkloadAPI/FetchX509SVID"
DOWNSTREAM_METHOD: Final = "/spire.api.server.svid.v1.SVID/NewDownstreamX509CA"
# The Workload API refuses a call without it (a guard against server-side request forgery).
WORKLOAD_HEADER: Final = ("workload.spiffe.io", "true")
DEFAULT_TIMEOUT: Final = downstream.Endpoints.timeout

_F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
# (field, number, type, label[, message type]) per message.
_Fields = list[tuple[Any, ...]]


def _file(package: str, messages: dict[str, _Fields]) -> Any:
    """A FileDescriptorProto of `messages`, as protoc would make it from the .proto."""
    proto = descriptor_pb2.FileDescriptorProto(
        name=f"podcert/{package}.proto", package=package, syntax="proto3"
    )
    for name, fields in messages.items():
        msg = proto.message_type.add(name=name)
        for fname, number, ftype, label, *type_name in fields:
            added = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                added.type_name = type_name[0]
    return proto


_POOL = descriptor_pool.DescriptorPool()
# spire-api-sdk proto/spire/api/server/svid/v1/svid.proto: the two messages we send and read.
_POOL.Add(
    _file(
        "spire.api.server.svid.v1",
        {
            "NewDownstreamX509CARequest": [
                ("csr", 1, _F.TYPE_BYTES, _OPT),
                ("preferred_ttl", 2, _F.TYPE_INT32, _OPT),
            ],
            "NewDownstreamX509CAResponse": [
                ("ca_cert_chain", 1, _F.TYPE_BYTES, _REP),
                ("x509_authorities", 2, _F.TYPE_BYTES, _REP),
            ],
        },
    )
)
# go-spiffe proto/spiffe/workload/workload.proto (package-less there; its crl and
# federated_bundles fields are left out: a parser skips fields it does not know).
_POOL.Add(
    _file(
        "podcert.workload",
        {
            "X509SVIDRequest": [],
            "X509SVID": [
                ("spiffe_id", 1, _F.TYPE_STRING, _OPT),
                ("x509_svid", 2, _F.TYPE_BYTES, _OPT),
                ("x509_svid_key", 3, _F.TYPE_BYTES, _OPT),
                ("bundle", 4, _F.TYPE_BYTES, _OPT),
                ("hint", 5, _F.TYPE_STRING, _OPT),
            ],
            "X509SVIDResponse": [
                ("svids", 1, _F.TYPE_MESSAGE, _REP, ".podcert.workload.X509SVID"),
            ],
        },
    )
)


def _message(full_name: str) -> Any:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(full_name))


NewDownstreamX509CARequest = _message("spire.api.server.svid.v1.NewDownstreamX509CARequest")
NewDownstreamX509CAResponse = _message("spire.api.server.svid.v1.NewDownstreamX509CAResponse")
X509SVIDRequest = _message("podcert.workload.X509SVIDRequest")
X509SVIDResponse = _message("podcert.workload.X509SVIDResponse")


@dataclass(frozen=True)
class WorkloadSVID:
    """The signer's X509-SVID and its trust domain's bundle, as the agent gave them."""

    spiffe_id: str
    chain: tuple[x509.Certificate, ...]
    key: keys.PrivateKey = field(repr=False)
    bundle: tuple[x509.Certificate, ...]

    @property
    def trust_domain(self) -> str:
        return self.spiffe_id.removeprefix(offline.SPIFFE_SCHEME).split("/", 1)[0]


def _ders(blob: bytes, what: str) -> tuple[x509.Certificate, ...]:
    try:
        return tuple(x509.load_der_x509_certificate(d) for d in downstream.split_ders(blob))
    except ValueError:
        raise downstream.UpstreamUnavailable(f"{what}: not DER certificates") from None


def fetch_svid(socket_path: str, timeout: float = DEFAULT_TIMEOUT) -> WorkloadSVID:
    """The first X509-SVID the agent's Workload API streams to this process."""
    target = f"unix:{socket_path.removeprefix('unix://')}"
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_stream(
            WORKLOAD_METHOD,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=X509SVIDResponse.FromString,
        )(X509SVIDRequest(), metadata=[WORKLOAD_HEADER], timeout=timeout)
        try:
            first = next(iter(call))
        except grpc.RpcError as err:
            raise _unavailable(f"SPIRE agent {socket_path}", err) from None
        except StopIteration:
            raise downstream.UpstreamUnavailable(
                f"SPIRE agent {socket_path}: ended the stream without an SVID"
            ) from None
        finally:
            call.cancel()
    if not first.svids:
        raise downstream.UpstreamUnavailable(
            f"SPIRE agent {socket_path}: no SVID for this process (is the signer registered?)"
        )
    svid = first.svids[0]
    try:
        key = serialization.load_der_private_key(svid.x509_svid_key, password=None)
    except (ValueError, TypeError):
        raise downstream.UpstreamUnavailable(
            f"SPIRE agent {socket_path}: the SVID's key is not a PKCS#8 key"
        ) from None
    if not isinstance(key, keys.PrivateKey):
        raise downstream.UpstreamUnavailable(
            f"SPIRE agent {socket_path}: the SVID's key is of a type podcert does not use"
        )
    return WorkloadSVID(
        spiffe_id=svid.spiffe_id,
        chain=_ders(svid.x509_svid, f"SPIRE agent {socket_path}: x509_svid"),
        key=key,
        bundle=_ders(svid.bundle, f"SPIRE agent {socket_path}: bundle"),
    )


def server_id(trust_domain: str) -> str:
    """The SPIFFE ID every SPIRE server of a trust domain presents."""
    return f"spiffe://{trust_domain}/spire/server"


def new_downstream_ca(
    server: str,
    svid: WorkloadSVID,
    csr_der: bytes,
    preferred_ttl: dt.timedelta,
    timeout: float = DEFAULT_TIMEOUT,
) -> tuple[list[bytes], list[bytes]]:
    """Ask the SPIRE server at `server` (host:port) to sign our intermediate: (ca_cert_chain,
    x509_authorities), DER.

    Mutual TLS with the SVID, and the server must chain to the bundle and be `server_id`. grpc
    checks a DNS name only (SPIRE's server SVID has none), so the call goes through
    `bundles.grpc.Tunnel`, whose TLS judges the server's SPIFFE ID in the handshake. Python's
    ssl reads keys from files only: the SVID is written to a 0700 folder of this process's own
    for the call and removed after it.
    """
    ttl = max(0, min(int(preferred_ttl.total_seconds()), 2**31 - 1))
    request = NewDownstreamX509CARequest(csr=csr_der, preferred_ttl=ttl)
    with tempfile.TemporaryDirectory(prefix="podcert-spire-") as folder:
        credential, trust = Path(folder) / "credential-bundle.pem", Path(folder) / "bundle.pem"
        credential.touch(0o600)
        credential.write_bytes(dump_private_key(svid.key) + dump_certificates(svid.chain))
        trust.write_bytes(dump_certificates(svid.bundle))
        try:
            source = TLSSource(credential, trust)
        except SourceError as err:
            raise downstream.UpstreamUnavailable(f"SPIRE agent's SVID unusable: {err}") from None
        want = server_id(svid.trust_domain)
        with Tunnel(server, source, allow_ids([want])) as tunnel, tunnel.channel() as channel:
            call = channel.unary_unary(
                DOWNSTREAM_METHOD,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=NewDownstreamX509CAResponse.FromString,
            )
            try:
                answer = call(request, timeout=timeout)
            except grpc.RpcError as err:
                raise _unavailable(f"SPIRE server {server} ({want})", err) from None
    return list(answer.ca_cert_chain), list(answer.x509_authorities)


def _unavailable(where: str, err: grpc.RpcError) -> downstream.UpstreamUnavailable:
    code = err.code() if isinstance(err, grpc.Call) else None
    details = err.details() if isinstance(err, grpc.Call) else str(err)
    return downstream.UpstreamUnavailable(
        f"{where}: {code.name if code else 'error'}: {details or 'no details'}"
    )


class Observer:
    """What the loop reports (the signer's metrics); the default observes nothing."""

    def renewed(self, bundle: ca.CABundle) -> None: ...

    def failed(self) -> None: ...

    def pending(self, due: bool) -> None: ...


class SpireUpstream:
    """The leader's loop: follow SPIRE's bundle, renew the intermediate when due."""

    def __init__(
        self,
        cas: CAStore,
        endpoints: downstream.Endpoints,
        trust_domain: str,
        settings: downstream.RenewalSettings,
        preferred_ttl: dt.timedelta,
        is_leader: Callable[[], bool],
        stop: threading.Event,
        clock: Callable[[], dt.datetime],
        *,
        interval: float = 30.0,
        observer: Observer | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.cas = cas
        self.endpoints = endpoints
        self.trust_domain = trust_domain
        self.settings = settings
        self.preferred_ttl = preferred_ttl
        self.is_leader = is_leader
        self.interval = interval
        self.clock = clock
        self.observer = observer or Observer()
        self._rng = rng or random.Random()  # noqa: S311 (jitter, not secrets)
        self._stop = stop
        self._wake = threading.Event()
        self.failures = 0
        self.last_error: str | None = None
        self._next_key: keys.PrivateKey | None = None  # kept until SPIRE signs it

    def wake(self) -> None:
        self._wake.set()

    def run(self) -> None:
        while not self._stop.is_set():
            if self.failures:  # retried on its own schedule, sooner or later than `interval`
                wait = downstream.retry_delay(self.failures, self.settings, self._rng.random())
                self._wake.wait(wait.total_seconds())
            else:
                self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set() or not self.is_leader():
                continue
            self.step()

    def step(self) -> bool:
        """One look: follow SPIRE's bundle, and renew if due. False when SPIRE failed."""
        try:
            self._step()
        except (downstream.UpstreamUnavailable, offline.ChainError) as err:
            self.failures += 1
            self.last_error = str(err)
            self.observer.failed()
            log.warning("SPIRE upstream (attempt %d failed): %s", self.failures, err)
            return False
        except (ApiError, schedule.RotationError, ca.CAError) as err:
            log.warning("SPIRE upstream: the CA Secret was not updated: %s", err)
            return False
        if self.failures:
            log.info("SPIRE upstream answers again after %d failed attempt(s)", self.failures)
        self.failures, self.last_error = 0, None
        return True

    def _step(self) -> None:
        svid = fetch_svid(self.endpoints.agent_socket, self.endpoints.timeout)
        if svid.trust_domain != self.trust_domain:
            raise offline.ChainError(
                f"SVID {svid.spiffe_id}: trust domain {svid.trust_domain!r}, but the signer "
                f"issues for {self.trust_domain!r}"
            )
        if not downstream.same_set(svid.bundle, self.cas.upstream_authorities):
            self.cas.rewrite(downstream.with_authorities(svid.bundle))
            log.info("SPIRE's X.509 authorities changed: %d now", len(svid.bundle))
        now = self.clock()
        why = downstream.renewal_due(
            self.cas.generations,
            self.cas.upstream_authorities,
            self.cas.renewal_requested,
            now,
            self.settings,
        )
        self.observer.pending(why is not None)
        if why is None:
            return
        log.info("asking SPIRE for a new intermediate: %s", why)
        if self._next_key is None:
            self._next_key = new_key(self.cas, now)
        bundle, authorities = fetch_intermediate(
            self._next_key,
            self.endpoints,
            svid,
            self.trust_domain,
            now,
            self.settings,
            self.preferred_ttl,
        )
        self.cas.rewrite(downstream.with_generation(bundle, authorities))
        self._next_key = None
        log.info("intermediate signed by SPIRE added: %s", describe(self.cas.generations))
        self.observer.renewed(bundle)
        self.observer.pending(False)


def new_key(cas: CAStore, now: dt.datetime) -> keys.PrivateKey:
    """The next intermediate's key: made in the token when the CA keys live in one."""
    if cas.keys is None:
        return keys.generate("ECDSAP256")
    return cas.keys.new_key(f"{now:%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}-spire")


def fetch_intermediate(
    key: keys.PrivateKey,
    endpoints: downstream.Endpoints,
    svid: WorkloadSVID,
    trust_domain: str,
    now: dt.datetime,
    settings: downstream.RenewalSettings,
    preferred_ttl: dt.timedelta,
) -> tuple[ca.CABundle, list[x509.Certificate]]:
    """An intermediate for `key` signed by SPIRE and checked, and SPIRE's authorities."""
    csr = offline.intermediate_csr(
        key, trust_domain, f"podcert {trust_domain} intermediate {now:%Y-%m-%dT%H:%M:%SZ}"
    )
    chain, authorities = new_downstream_ca(
        endpoints.server,
        svid,
        csr.public_bytes(serialization.Encoding.DER),
        preferred_ttl,
        endpoints.timeout,
    )
    answer = downstream.check_answer(chain, authorities, key, trust_domain, now, settings)
    return downstream.bundle_of(answer, key), list(answer.authorities)


def first_ca(
    endpoints: downstream.Endpoints,
    trust_domain: str,
    settings: downstream.RenewalSettings,
    preferred_ttl: dt.timedelta,
    clock: Callable[[], dt.datetime],
    cas: CAStore,
) -> Callable[[], tuple[ca.CABundle, dict[str, bytes]]]:
    """What `CAStore.load` makes a new CA Secret from: SPIRE's intermediate and authorities
    (UpstreamUnavailable while SPIRE is away: the signer's start-up waits it out)."""

    made: list[keys.PrivateKey] = []  # one key through every attempt of the start-up

    def make() -> tuple[ca.CABundle, dict[str, bytes]]:
        svid = fetch_svid(endpoints.agent_socket, endpoints.timeout)
        if svid.trust_domain != trust_domain:
            raise downstream.UpstreamUnavailable(
                f"SVID {svid.spiffe_id}: trust domain {svid.trust_domain!r}, but the signer "
                f"issues for {trust_domain!r}"
            )
        try:
            now = clock()
            made[:] = made or [new_key(cas, now)]
            bundle, authorities = fetch_intermediate(
                made[0], endpoints, svid, trust_domain, now, settings, preferred_ttl
            )
        except offline.ChainError as err:
            raise downstream.UpstreamUnavailable(f"SPIRE's answer refused: {err}") from None
        return bundle, downstream.authorities_to_secret(authorities)

    return make
