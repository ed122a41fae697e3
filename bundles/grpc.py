"""gRPC (grpcio) with pod certificates: credentials that follow rotation, and peers authorized
by SPIFFE ID before application code sees a request.

grpcio runs TLS in its C core and exposes no verification hook to Python, so what
`bundles.handshake` does for Python's own `ssl` cannot be done inside grpc's handshake. What
each side gets instead:

- Server: `server_credentials(source)` hands grpc a certificate configuration fetcher, which
  grpc calls before every new handshake; it returns the source's newest key, chain and trusted
  roots (ours and the federated ones), so new connections follow rotation. Client certificates
  are required and verified against those roots by grpc. `AuthorizingInterceptor` then judges
  the client on every call, from `ServicerContext.auth_context()`: a client without a verified
  certificate ends with UNAUTHENTICATED, one the authorizer does not allow with
  PERMISSION_DENIED, before the handler runs and before the request's bytes are deserialized.
  grpc has read the request into its own buffers by then; no application code sees it.
  Every call is judged against the current trusted roots, so a connection made under a root
  since removed is served no further call.
- Client: grpc checks the server's chain and, always, its DNS name against the target (or
  `grpc.ssl_target_name_override`), never a SPIFFE ID, and shows the client no peer
  certificate. `Tunnel` closes that gap: a grpc channel made by `Tunnel.channel()` talks
  plaintext HTTP/2 to a private Unix socket of this process, and the tunnel carries each of its
  connections to the target over TLS made with the source's authorizing client context. A
  server the authorizer does not allow is refused inside that handshake: it never reads a byte
  of any request, and the channel reports UNAVAILABLE. It needs no DNS name in the server's
  certificate. `channel_credentials(source)` is grpc's own TLS with the current material, for
  servers whose certificates carry a DNS name (the signer's `dnsNames.services` policy); it
  checks that name, which every pod a Service selects holds, not the SPIFFE ID.

Rotation on the client: each new connection (server credentials: each new handshake; the
tunnel: each upstream connection) uses the newest material; a grpc channel keeps its connection
for long, so servers should set `grpc.max_connection_age_ms` (with a grace) for channels to
reconnect onto new material. `channel_credentials` are fixed: make a new channel after a
rotation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import ssl
import tempfile
import threading
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bundles.authz import Authorizer, Verdict, authorize_peer_chain
from bundles.formats import dump_certificates, dump_private_key, signed_by
from bundles.handshake import RefusalHook
from bundles.source import TLSSource

if TYPE_CHECKING:
    from bundles.source import _Material

__all__ = [
    "AuthorizingInterceptor",
    "Tunnel",
    "channel_credentials",
    "judge_peer",
    "server_credentials",
]

log = logging.getLogger(__name__)

_CHUNK: Final = 65536
_HANDSHAKE_TIMEOUT: Final = 10.0  # seconds for the tunnel's upstream TLS handshake


# --- material ------------------------------------------------------------------------------------


def _material(source: TLSSource) -> _Material:
    """The source's current material, read once: key, chain and trusted roots swap together."""
    return source._material


def _configuration(material: _Material) -> Any:
    credential = material.credential
    return grpc.ssl_server_certificate_configuration(
        [(dump_private_key(credential.key), dump_certificates(credential.chain))],
        root_certificates=dump_certificates(material.everything.roots),
    )


def server_credentials(source: TLSSource) -> Any:
    """`grpc.ServerCredentials` that require a client certificate and present, and trust, the
    source's newest material on every new handshake. Pair with `AuthorizingInterceptor`."""
    served = _material(source)
    lock = threading.Lock()

    def fetch() -> Any:
        nonlocal served
        try:
            current = _material(source)
            with lock:
                if current is served:
                    return None  # grpc keeps the configuration it has
                served = current
            return _configuration(current)
        except Exception:  # grpc would log and keep the old one; say why here
            log.exception("keeping grpc's current certificate configuration")
            return None

    return grpc.dynamic_ssl_server_credentials(
        _configuration(served), fetch, require_client_authentication=True
    )


def channel_credentials(source: TLSSource) -> Any:
    """grpc's own TLS with the source's current material: the server's chain is verified and
    its certificate must name the target (or `grpc.ssl_target_name_override`) as a DNS name;
    its SPIFFE ID is not checked (use `Tunnel` for that). Fixed: after a rotation, make a new
    channel with new credentials."""
    material = _material(source)
    credential = material.credential
    return grpc.ssl_channel_credentials(
        root_certificates=dump_certificates(material.everything.roots),
        private_key=dump_private_key(credential.key),
        certificate_chain=dump_certificates(credential.chain),
    )


# --- the server's interceptor --------------------------------------------------------------------


def judge_peer(
    auth_context: Mapping[str, Sequence[bytes]],
    trusted: Mapping[bytes, str | None],
    authorizer: Authorizer,
) -> tuple[bool, Verdict]:
    """(authenticated, verdict) for the peer grpc verified, from its auth context.

    `authenticated` is False when the peer's identity is not established: no certificate, one
    that chains to no root in `trusted`, no usable SPIFFE ID, or a federated root vouching for
    another trust domain's ID. Then `authorizer` is not asked.
    """
    leaf_pem = b"".join(auth_context.get("x509_pem_cert", ()))
    if not leaf_pem:
        return False, Verdict(False, "The peer presented no verified certificate.")
    try:
        (leaf,) = x509.load_pem_x509_certificates(leaf_pem)
        presented = x509.load_pem_x509_certificates(
            b"".join(auth_context.get("x509_pem_cert_chain", ())) or leaf_pem
        )
    except ValueError:
        return False, Verdict(False, "The peer certificate grpc reported cannot be parsed.")
    chain = _path(leaf, [cert for cert in presented if cert != leaf], trusted)
    established = authorize_peer_chain(chain, trusted, lambda peer: Verdict(True, str(peer)))
    if not established:
        return False, established
    return True, authorize_peer_chain(chain, trusted, authorizer)


def _path(
    leaf: x509.Certificate,
    intermediates: list[x509.Certificate],
    trusted: Mapping[bytes, str | None],
) -> list[bytes]:
    """The chain grpc verified, as DER from the leaf to a root of `trusted` (grpc reports the
    presented chain, not the anchor); ends at the last certificate when no root signs it."""
    roots = [x509.load_der_x509_certificate(der) for der in trusted]
    chain = [leaf]
    while chain[-1].public_bytes(serialization.Encoding.DER) not in trusted:
        current = chain[-1]
        anchor = next(
            (r for r in roots if r.subject == current.issuer and signed_by(current, r)), None
        )
        if anchor is not None:
            chain.append(anchor)
            break
        parent = next(
            (c for c in intermediates if c not in chain and c.subject == current.issuer), None
        )
        if parent is None or not signed_by(current, parent):
            break
        chain.append(parent)
    return [cert.public_bytes(serialization.Encoding.DER) for cert in chain]


class AuthorizingInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]  # grpc has no types
    """Judges the client of every call before its handler runs (see the module docstring).

    `on_refusal(verdict)` hears of each refused call. The client is told only its status code
    and "peer not authorized"; the verdict, which names the rule, goes to the log.
    `open_methods` (full names, e.g. `/grpc.health.v1.Health/Check`) are served to anyone: the
    kubelet's gRPC probe speaks no TLS, so a probe port is an insecure port of the same server.
    """

    def __init__(
        self,
        source: TLSSource,
        authorizer: Authorizer,
        *,
        on_refusal: RefusalHook | None = None,
        open_methods: Collection[str] = (),
    ) -> None:
        self._source = source
        self._authorizer = authorizer
        self._on_refusal = on_refusal
        self._open = frozenset(open_methods)

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None or details.method in self._open:
            return handler
        return _guarded(handler, self._admit)

    def _admit(self, context: Any) -> None:
        trusted = _material(self._source).trusted
        authenticated, verdict = judge_peer(context.auth_context(), trusted, self._authorizer)
        if verdict:
            return
        log.warning("refused gRPC call from %s: %s", context.peer(), verdict.reason)
        if self._on_refusal is not None:
            try:
                self._on_refusal(verdict)
            except Exception:
                log.exception("refusal hook %r failed", self._on_refusal)
        code = (
            grpc.StatusCode.PERMISSION_DENIED if authenticated else grpc.StatusCode.UNAUTHENTICATED
        )
        context.abort(code, "peer not authorized")


def _guarded(handler: Any, admit: Callable[[Any], None]) -> Any:
    """`handler` behind `admit`: grpc hands the wrapper raw bytes, deserialized only once the
    peer is admitted, so not even the application's deserializer sees a refused request."""
    load = handler.request_deserializer or (lambda raw: raw)
    serialize = handler.response_serializer

    def each(requests: Iterable[bytes]) -> Iterator[Any]:
        return (load(raw) for raw in requests)

    if handler.unary_unary is not None:

        def unary_unary(raw: bytes, context: Any) -> Any:
            admit(context)
            return handler.unary_unary(load(raw), context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, None, serialize)
    if handler.unary_stream is not None:

        def unary_stream(raw: bytes, context: Any) -> Any:
            admit(context)
            return handler.unary_stream(load(raw), context)

        return grpc.unary_stream_rpc_method_handler(unary_stream, None, serialize)
    if handler.stream_unary is not None:

        def stream_unary(requests: Iterable[bytes], context: Any) -> Any:
            admit(context)
            return handler.stream_unary(each(requests), context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, None, serialize)

    def stream_stream(requests: Iterable[bytes], context: Any) -> Any:
        admit(context)
        return handler.stream_stream(each(requests), context)

    return grpc.stream_stream_rpc_method_handler(stream_stream, None, serialize)


# --- the client's tunnel -------------------------------------------------------------------------


class Tunnel:
    """A private local endpoint for grpc channels to `target` (`host:port`), whose every
    connection goes on to the target over TLS that ends only for a server `authorizer` allows.

    The socket lives in a 0700 directory of its own; the tunnel's event loop runs in a daemon
    thread. Close it (or use it as a context manager) when the channels are closed.
    """

    def __init__(
        self,
        target: str,
        source: TLSSource,
        authorizer: Authorizer,
        *,
        on_refusal: RefusalHook | None = None,
    ) -> None:
        host, separator, port = target.rpartition(":")
        if not separator or not host or not port.isdigit():
            raise ValueError(f"target {target!r}: expected host:port")
        self.target = target
        self._host, self._port = host.strip("[]"), int(port)
        self._source, self._authorizer = source, authorizer
        self._hook = _own_kind(on_refusal)  # a context of our own: we set ALPN on it
        self._prepared: weakref.WeakSet[ssl.SSLContext] = weakref.WeakSet()
        self._folder = Path(tempfile.mkdtemp(prefix="podcert-grpc-"))  # 0700
        self.path = self._folder / "tunnel.sock"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name=target)
        self._thread.start()
        self._links: set[asyncio.Task[None]] = set()
        try:
            self._server = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result()
        except BaseException:
            self._stop_loop()
            raise

    @property
    def address(self) -> str:
        """The target to give `grpc.insecure_channel` or `grpc.aio.insecure_channel`."""
        return f"unix:{self.path}"

    def options(self) -> list[tuple[str, Any]]:
        """Channel options: the `:authority` the server sees is the real target's."""
        return [("grpc.default_authority", self.target)]

    def channel(self, options: Sequence[tuple[str, Any]] = ()) -> Any:
        """A `grpc.Channel` through the tunnel."""
        return grpc.insecure_channel(self.address, options=[*self.options(), *options])

    def close(self) -> None:
        if self._loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(self._shut(), self._loop).result(_HANDSHAKE_TIMEOUT)
        self._stop_loop()

    def __enter__(self) -> Tunnel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_HANDSHAKE_TIMEOUT)
        self._loop.close()
        shutil.rmtree(self._folder, ignore_errors=True)

    async def _listen(self) -> asyncio.AbstractServer:
        return await asyncio.start_unix_server(self._accept, path=str(self.path))

    async def _shut(self) -> None:
        self._server.close()
        for link in list(self._links):
            link.cancel()
        await asyncio.gather(*self._links, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._links.add(task)
        try:
            await self._carry(reader, writer)
        except asyncio.CancelledError:
            # The tunnel is closing. Ending the link normally, not cancelled: on Python 3.11 the
            # stream server's done-callback logs a cancelled connection task as an error.
            pass
        finally:
            self._links.discard(task)
            writer.close()

    async def _carry(self, local_in: asyncio.StreamReader, local_out: asyncio.StreamWriter) -> None:
        context = self._source.client_context(self._authorizer, on_refusal=self._hook)
        if context not in self._prepared:
            context.set_alpn_protocols(["h2"])  # grpc servers require HTTP/2 by ALPN
            self._prepared.add(context)
        try:
            remote_in, remote_out = await asyncio.open_connection(
                self._host,
                self._port,
                ssl=context,
                server_hostname=self._host,
                ssl_handshake_timeout=_HANDSHAKE_TIMEOUT,
            )
        except (OSError, TimeoutError) as exc:  # PeerRefusedError is an SSLError, an OSError
            log.warning("gRPC tunnel to %s: no connection: %s", self.target, exc)
            return
        try:
            await asyncio.gather(_pipe(local_in, remote_out), _pipe(remote_in, local_out))
        finally:
            remote_out.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until either side ends, then end the other."""
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


def _own_kind(on_refusal: RefusalHook | None) -> RefusalHook:
    """A hook object of the tunnel's own: `TLSSource` caches one context per (authorizer,
    hook), so the tunnel's context (whose ALPN it sets) is shared with no other client."""

    def hook(verdict: Verdict) -> None:
        if on_refusal is not None:
            on_refusal(verdict)

    return hook
