"""bundles.grpc: a real grpcio server and channel over loopback.

The client's side: through a `Tunnel`, a server with the wrong SPIFFE ID never reads a byte
(not even HTTP/2's preface); the server's side: a client the interceptor refuses never reaches
the handler, nor the request's deserializer. The right pair talks through a leaf rotation and a
CA rotation, each step on a new channel: the server sees the client's current leaf, and a probe
sees the server present its current one. `judge_peer` is held case by case without a server.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bundles.authz import Verdict, allow_ids
from bundles.formats import Credential, dump_certificates, dump_credential
from bundles.grpc import (
    AuthorizingInterceptor,
    Tunnel,
    channel_credentials,
    judge_peer,
    server_credentials,
)
from bundles.handshake import build_contexts
from bundles.source import TLSSource
from tests.recording_stack_peer import (
    CLIENT_ID,
    DEADLINE,
    LOCAL,
    OTHER_ID,
    SERVER_ID,
    TOKEN,
    Workload,
    Workloads,
    der,
    serving,
)
from tests.unit.test_bundles_formats import Authority, new_key

pytestmark = pytest.mark.timeout(60)

ALLOW_SERVER = allow_ids([SERVER_ID])
ALLOW_CLIENT = allow_ids([CLIENT_ID])
BODY = TOKEN.encode()


class Service:
    """Records what application code saw: decoded requests, handled calls, client leaves."""

    def __init__(self) -> None:
        self.decoded: list[bytes] = []
        self.handled: list[bytes] = []
        self.client_leaves: list[bytes] = []

    def decode(self, raw: bytes) -> bytes:
        self.decoded.append(raw)
        return raw

    def echo(self, request: bytes, context: Any) -> bytes:
        self.handled.append(request)
        (pem,) = context.auth_context()["x509_pem_cert"]
        leaf = x509.load_pem_x509_certificate(pem)
        self.client_leaves.append(leaf.public_bytes(serialization.Encoding.DER))
        return b"ok"

    def collect(self, requests: Iterable[bytes], context: Any) -> bytes:
        self.handled.append(b"".join(requests))
        return b"ok"


HEALTH = "/grpc.health.v1.Health/Check"


@contextlib.contextmanager
def grpc_server(
    source: TLSSource,
    service: Service,
    refusals: list[Verdict],
    *,
    probe_port: bool = False,
    options: Sequence[tuple[str, Any]] = (),
) -> Iterator[int]:
    """A grpc server with the authorizing interceptor on a TLS port (yielded), or on a plain
    port for the kubelet's probe, where only the health check is open."""
    interceptor = AuthorizingInterceptor(
        source, ALLOW_CLIENT, on_refusal=refusals.append, open_methods=[HEALTH]
    )
    server = grpc.server(
        ThreadPoolExecutor(max_workers=2), interceptors=[interceptor], options=list(options)
    )
    methods = {
        "Echo": grpc.unary_unary_rpc_method_handler(
            service.echo, request_deserializer=service.decode
        ),
        "Collect": grpc.stream_unary_rpc_method_handler(
            service.collect, request_deserializer=service.decode
        ),
    }
    health = {"Check": grpc.unary_unary_rpc_method_handler(lambda request, context: b"")}
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler("test.Echo", methods),
            grpc.method_handlers_generic_handler("grpc.health.v1.Health", health),
        )
    )
    if probe_port:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", server_credentials(source))
    server.start()
    try:
        yield port
    finally:
        server.stop(None).wait(DEADLINE)


def echo(channel: Any) -> bytes:
    result: bytes = channel.unary_unary("/test.Echo/Echo")(BODY, timeout=DEADLINE)
    return result


def collect(channel: Any) -> bytes:
    result: bytes = channel.stream_unary("/test.Echo/Collect")(iter([BODY, BODY]), timeout=DEADLINE)
    return result


# --- the client's side ---------------------------------------------------------------------------


def test_a_server_with_the_wrong_spiffe_id_never_reads_a_byte(tmp_path: Path) -> None:
    workloads = Workloads(tmp_path, server_id=OTHER_ID)
    refusals: list[Verdict] = []
    with serving(workloads.server).running() as server:
        source = workloads.client.source
        with (
            Tunnel(server.address, source, ALLOW_SERVER, on_refusal=refusals.append) as tunnel,
            tunnel.channel() as channel,
            pytest.raises(grpc.RpcError) as failed,
        ):
            echo(channel)
        server.wait_ended()
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert server.connections and all(got == b"" for got in server.received())
    assert refusals and all(OTHER_ID in v.reason for v in refusals)


def test_the_right_pair_talks_through_a_leaf_and_a_ca_rotation(tmp_path: Path) -> None:
    workloads = Workloads(tmp_path)
    service, refusals = Service(), []
    with grpc_server(workloads.server.source, service, refusals) as port:
        address = f"127.0.0.1:{port}"
        with Tunnel(address, workloads.client.source, ALLOW_SERVER) as tunnel:

            def call(step: str) -> None:
                with tunnel.channel() as channel:  # a new channel: a new connection
                    assert echo(channel) == b"ok", step
                assert service.client_leaves[-1] == der(workloads.client.source.credential), step
                assert presented_by(address, workloads) == der(workloads.server.source.credential)

            call("first call")
            workloads.rotate_leaves()
            call("leaf rotation")
            for step in workloads.rotate_ca():
                call(step)
    assert refusals == [] and service.handled == [BODY] * 5


def test_a_long_lived_channel_moves_onto_new_material_as_the_server_ages_connections(
    tmp_path: Path,
) -> None:
    """One channel across a rotation: the server's max connection age sends it a GOAWAY, and
    the channel reconnects through the tunnel with the client's new leaf."""
    workloads = Workloads(tmp_path)
    service, refusals = Service(), []
    aging = [("grpc.max_connection_age_ms", 200), ("grpc.max_connection_age_grace_ms", 1000)]
    with (
        grpc_server(workloads.server.source, service, refusals, options=aging) as port,
        Tunnel(f"127.0.0.1:{port}", workloads.client.source, ALLOW_SERVER) as tunnel,
        tunnel.channel() as channel,
    ):
        call = channel.unary_unary("/test.Echo/Echo")
        assert call(BODY, timeout=DEADLINE) == b"ok"
        workloads.rotate_leaves()
        current = der(workloads.client.source.credential)
        deadline = time.monotonic() + DEADLINE
        while service.client_leaves[-1] != current:
            assert time.monotonic() < deadline, "the channel never reconnected"
            assert call(BODY, timeout=DEADLINE, wait_for_ready=True) == b"ok"
            time.sleep(0.05)
    assert refusals == []


def presented_by(address: str, workloads: Workloads) -> bytes | None:
    """The leaf the server presents to a new connection (a plain TLS probe offering h2)."""
    client = workloads.client.source
    _, context = build_contexts(client.credential, client.trust_bundle)
    context.set_alpn_protocols(["h2"])
    host, port = address.rsplit(":", 1)
    with context.wrap_socket(socket.create_connection((host, int(port)), DEADLINE)) as tls:
        return tls.getpeercert(binary_form=True)


# --- the server's side ---------------------------------------------------------------------------


@pytest.mark.parametrize("call", [echo, collect], ids=["unary request", "streamed requests"])
def test_a_refused_client_never_reaches_the_handler_nor_the_deserializer(
    call: Any, tmp_path: Path
) -> None:
    workloads = Workloads(tmp_path)
    other = Workload(tmp_path / "other", workloads.ca, OTHER_ID)  # our CA, another workload
    service, refusals = Service(), []
    with (
        grpc_server(workloads.server.source, service, refusals) as port,
        Tunnel(f"127.0.0.1:{port}", other.source, ALLOW_SERVER) as tunnel,
        tunnel.channel() as channel,
        pytest.raises(grpc.RpcError) as failed,
    ):
        call(channel)
    assert failed.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert failed.value.details() == "peer not authorized"  # the rule stays in the server's log
    assert service.decoded == service.handled == []
    assert [v.reason for v in refusals] == [f"{OTHER_ID} is not the allowed ID {CLIENT_ID}."]


def test_a_probe_port_serves_the_open_methods_only(tmp_path: Path) -> None:
    workloads = Workloads(tmp_path)
    service, refusals = Service(), []
    with (
        grpc_server(workloads.server.source, service, refusals, probe_port=True) as port,
        grpc.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        assert channel.unary_unary(HEALTH)(b"", timeout=DEADLINE) == b""
        with pytest.raises(grpc.RpcError) as failed:
            echo(channel)
    assert failed.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert service.decoded == service.handled == []
    assert [v.reason for v in refusals] == ["The peer presented no verified certificate."]


PARTNER = "partner.test"


def _context_of(credential: Credential) -> dict[str, list[bytes]]:
    pem = credential.leaf.public_bytes(serialization.Encoding.PEM)
    return {"x509_pem_cert": [pem], "x509_pem_cert_chain": [pem]}


def _trusted(ours: Authority, partner: Authority) -> dict[bytes, str | None]:
    return {
        ours.cert.public_bytes(serialization.Encoding.DER): None,
        partner.cert.public_bytes(serialization.Encoding.DER): PARTNER,
    }


@pytest.mark.parametrize(
    ("issuer", "claimed", "expected"),
    [
        pytest.param("ours", CLIENT_ID, (True, True), id="allowed"),
        pytest.param("ours", OTHER_ID, (True, False), id="authenticated, not allowed"),
        pytest.param("intermediate", CLIENT_ID, (True, True), id="through an intermediate"),
        pytest.param("partner", CLIENT_ID, (False, False), id="federated root, our ID"),
        pytest.param("stranger", CLIENT_ID, (False, False), id="a root we do not trust"),
        pytest.param("none", CLIENT_ID, (False, False), id="no certificate"),
    ],
)
def test_judge_peer(issuer: str, claimed: str, expected: tuple[bool, bool]) -> None:
    ours, partner = Authority("ours"), Authority("partner")
    if issuer == "none":
        auth_context: dict[str, list[bytes]] = {}
    elif issuer == "intermediate":
        middle = ours.intermediate()
        credential = middle.issue(claimed)
        auth_context = {
            "x509_pem_cert": [credential.leaf.public_bytes(serialization.Encoding.PEM)],
            "x509_pem_cert_chain": [dump_certificates(credential.chain)],
        }
    else:
        authority = {"ours": ours, "partner": partner}.get(issuer) or Authority("stranger")
        auth_context = _context_of(authority.issue(claimed))
    authenticated, verdict = judge_peer(auth_context, _trusted(ours, partner), ALLOW_CLIENT)
    assert (authenticated, verdict.allowed) == expected, verdict.reason


# --- grpc's own TLS: a DNS name is needed --------------------------------------------------------


def _named(tmp_path: Path, workloads: Workloads, name: str) -> TLSSource:
    key = new_key()
    leaf = workloads.ca.leaf(SERVER_ID, key=key, dns_names=[name])
    folder = tmp_path / "named"
    folder.mkdir()
    (folder / "credential.pem").write_bytes(dump_credential(Credential(key, (leaf,))))
    (folder / "trust.pem").write_bytes(workloads.ca.pem)
    return TLSSource(folder / "credential.pem", folder / "trust.pem")


def test_grpcs_own_tls_needs_the_server_to_hold_a_dns_name(tmp_path: Path) -> None:
    workloads = Workloads(tmp_path)
    named = _named(tmp_path, workloads, f"api.shop.svc.{LOCAL}")
    override = [("grpc.ssl_target_name_override", f"api.shop.svc.{LOCAL}")]
    credentials = channel_credentials(workloads.client.source)
    for source, works in ((named, True), (workloads.server.source, False)):
        service: Service = Service()
        with grpc_server(source, service, []) as port:
            address = f"127.0.0.1:{port}"
            with grpc.secure_channel(address, credentials, options=override) as channel:
                if works:
                    assert echo(channel) == b"ok"
                else:
                    with pytest.raises(grpc.RpcError) as failed:
                        echo(channel)
                    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert service.handled == ([BODY] if works else [])


def test_a_tunnel_refuses_a_target_without_a_port(tmp_path: Path) -> None:
    source = Workloads(tmp_path).client.source
    with pytest.raises(ValueError, match="expected host:port"):
        Tunnel("api.shop.svc", source, ALLOW_SERVER)


def test_the_tunnels_socket_is_private_and_gone_after_close(tmp_path: Path) -> None:
    source = Workloads(tmp_path).client.source
    with Tunnel("127.0.0.1:9", source, ALLOW_SERVER) as tunnel:
        assert tunnel.path.exists()
        assert tunnel.path.parent.stat().st_mode & 0o777 == 0o700
    assert not tunnel.path.parent.exists()
