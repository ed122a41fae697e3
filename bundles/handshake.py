"""TLS contexts whose handshake ends only for an authorized peer.

A SPIFFE ID checked after the handshake leaves every caller to remember the check, and the usual
client stacks make that impossible: http.client/urllib, requests and httpx write the request, a
bearer token included, as soon as the handshake returns. So the check is part of the handshake.
A context made here wraps connections in `ssl.SSLSocket` / `ssl.SSLObject` subclasses whose
`do_handshake` runs OpenSSL's, then judges the chain OpenSSL verified with
`bundles.authz.authorize_peer_chain` (the anchor must be a root we know, a federated root vouches
for its own trust domain only, then the authorizer) and, on refusal, raises `PeerRefusedError`.

Guarantees (tests/unit/test_bundles_handshake.py holds each, per client stack):
- No application byte is written to, or read from, a refused peer: a read or write before the
  handshake was judged runs the handshake first, and every one after a refusal raises
  `PeerRefusedError` (a refused socket is closed as well). This holds for every stack that goes
  through `SSLContext.wrap_socket` or `wrap_bio`: the `ssl` module itself, http.client/urllib,
  requests (urllib3), httpx (sync and async), aiohttp and asyncio streams.
- On a server the client is judged when its Finished message arrives, before asyncio hands the
  connection to the protocol, so no request handler runs for a refused client.
- A context that no longer verifies (a library set `CERT_NONE` on it) refuses every peer, and
  one that trusts extra roots (a library loaded its own CA file into it) refuses every peer
  those would let in: a chain ending at a root that is neither ours nor federated is refused.
- Only a "probe" context (client certificate optional, for kubelet probes) lets a client that
  presents no certificate through; one presenting a certificate is judged there as anywhere.
  A strict context a library made CERT_OPTIONAL still refuses a client without a certificate.
- A resumed TLS session carries no verified chain, so it is refused; servers issue no session
  tickets, and a client resumes only when its caller passes `session=`.
- `PeerRefusedError` is an `ssl.SSLCertVerificationError`, so every stack reports it as the
  certificate failure it already knows how to report; its message is the verdict's reason.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import secrets
import ssl
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from bundles.authz import Authorizer, Verdict, authorize_peer_chain
from bundles.formats import (
    ChainError,
    Credential,
    TrustBundle,
    describe,
    dump_certificates,
    signed_by,
    verify_chain,
)

log = logging.getLogger(__name__)

# What a context is for. "probe": a server context on which a client may present no certificate
# at all (kubelet HTTPS probes present none); one that presents a certificate is judged as on
# "server". "client+hostname": a client context that also checks the server's DNS name.
Side = Literal["server", "probe", "client", "client+hostname"]
SERVER_SIDES: Final[frozenset[Side]] = frozenset({"server", "probe"})
RefusalHook = Callable[[Verdict], None]  # told of each refusal, e.g. to count or log it

_APPLICATION_VERIFICATION: Final = 50  # X509_V_ERR_APPLICATION_VERIFICATION

# Linux: the credential for load_cert_chain goes into an anonymous memory file (never on disk).
# Tests switch this off to exercise the temporary-directory fallback.
_USE_MEMFD: bool = hasattr(os, "memfd_create") and Path("/proc/self/fd").is_dir()


class PeerRefusedError(ssl.SSLCertVerificationError):
    """The peer's chain verified, but it is not a peer we talk to; `verdict` says why."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.reason)
        self.verdict = verdict
        self.verify_code = _APPLICATION_VERIFICATION
        self.verify_message = verdict.reason

    def __str__(self) -> str:
        return self.verdict.reason


@dataclass(frozen=True, eq=False)
class PeerCheck:
    """What a context judges each peer by: the roots it trusts (DER -> federated trust domain,
    None for our own) and the authorizer; `on_refusal` hears of each refusal."""

    trusted: Mapping[bytes, str | None]
    authorizer: Authorizer
    on_refusal: RefusalHook | None = None
    # A peer that presents no certificate passes (a probe context's clients); one that presents
    # a certificate is judged all the same.
    anonymous: bool = False

    def judge(self, connection: object) -> Verdict:
        if self.anonymous and _presented_nothing(connection):
            return Verdict(True, "The client presented no certificate; this context admits it.")
        return authorize_peer_chain(verified_chain(connection), self.trusted, self.authorizer)


def _presented_nothing(connection: object) -> bool:
    getpeercert = getattr(connection, "getpeercert", None)
    return getpeercert is not None and getpeercert(binary_form=True) is None


def _judge(connection: ssl.SSLSocket | ssl.SSLObject) -> Verdict:
    # The connection's context, not the one it was made with: a server's sni_callback may have
    # moved it onto newer material, whose roots are the ones that verified the peer.
    check = getattr(connection.context, "_podcert_check", None)
    if not isinstance(check, PeerCheck):
        return Verdict(False, "The TLS context carries no peer check; refusing every peer.")
    if connection.context.verify_mode == ssl.CERT_NONE:  # OpenSSL ignored what it found
        verdict = Verdict(False, "The TLS context no longer verifies peers; refusing every peer.")
    else:
        verdict = check.judge(connection)
    if not verdict and check.on_refusal is not None:
        try:
            check.on_refusal(verdict)
        except Exception:
            log.exception("refusal hook %r failed", check.on_refusal)
    return verdict


class _AuthorizingSocket(ssl.SSLSocket):
    """An SSLSocket whose handshake ends only for an authorized peer."""

    _podcert_verdict: Verdict | None = None

    def do_handshake(self, block: bool = False) -> None:
        if self._podcert_verdict is None:
            super().do_handshake(block)
            self._podcert_verdict = _judge(self)
        if not self._podcert_verdict:
            self.close()
            raise PeerRefusedError(self._podcert_verdict)

    def _judged(self) -> None:
        if self._podcert_verdict is None and getattr(self, "_sslobj", None) is not None:
            self.do_handshake()  # OpenSSL would otherwise finish the handshake unjudged
        elif self._podcert_verdict is not None and not self._podcert_verdict:
            raise PeerRefusedError(self._podcert_verdict)

    def read(self, len: int = 1024, buffer: Any = None) -> Any:  # ssl's own names
        self._judged()
        return super().read(len, buffer)

    def write(self, data: Any) -> int:
        self._judged()
        return super().write(data)

    def send(self, data: Any, flags: int = 0) -> int:  # sendfile and makefile use it
        self._judged()
        return super().send(data, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        self._judged()
        super().sendall(data, flags)

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        self._judged()
        return super().recv(buflen, flags)

    def recv_into(self, buffer: Any, nbytes: int | None = None, flags: int = 0) -> int:
        self._judged()
        return super().recv_into(buffer, nbytes, flags)


class _AuthorizingObject(ssl.SSLObject):
    """An SSLObject (asyncio, anyio) whose handshake ends only for an authorized peer."""

    _podcert_verdict: Verdict | None = None

    def do_handshake(self) -> None:
        if self._podcert_verdict is None:
            super().do_handshake()
            self._podcert_verdict = _judge(self)
        if not self._podcert_verdict:
            raise PeerRefusedError(self._podcert_verdict)

    def _judged(self) -> None:
        if self._podcert_verdict is None or not self._podcert_verdict:
            self.do_handshake()

    def read(self, len: int = 1024, buffer: Any = None) -> Any:  # ssl's own names
        self._judged()
        return super().read(len, buffer)

    def write(self, data: Any) -> int:
        self._judged()
        return super().write(data)


class _AuthorizingContext(ssl.SSLContext):
    sslsocket_class = _AuthorizingSocket
    sslobject_class = _AuthorizingObject
    _podcert_check: PeerCheck


def check_of(context: object) -> PeerCheck | None:
    """The peer check a context made here carries; None for any other context."""
    check = getattr(context, "_podcert_check", None)
    return check if isinstance(check, PeerCheck) else None


def load_contexts(
    credential: Credential,
    trust_bundle: TrustBundle,
    wanted: Sequence[tuple[Side, PeerCheck | None]],
) -> list[ssl.SSLContext]:
    """One context per `(side, check)`: TLS 1.2+ (1.3 preferred), mutual, trusting only
    `trust_bundle`, no hostname checks (identity is the SPIFFE ID) except on "client+hostname",
    a client certificate optional only on "probe". With a check, the context judges every peer
    inside the handshake; without one it does not (validation only)."""
    contexts: list[ssl.SSLContext] = []
    for side, check in wanted:
        server = side in SERVER_SIDES
        protocol = ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT
        if check is None:
            context = ssl.SSLContext(protocol)
        else:
            context = _AuthorizingContext(protocol)
            context._podcert_check = check
            if server:
                # A resumed session carries no verified chain to judge: every handshake is full.
                context.num_tickets = 0
        context.minimum_version = ssl.TLSVersion.TLSv1_2  # OpenSSL negotiates 1.3 first
        # OPTIONAL still fails a handshake whose client presents a certificate that does not
        # verify; it only lets a client present none.
        context.verify_mode = ssl.CERT_OPTIONAL if side == "probe" else ssl.CERT_REQUIRED
        context.check_hostname = side == "client+hostname"
        # Every certificate of a trust bundle is an anchor, an intermediate too, as for
        # go-spiffe and Python 3.13's defaults; `check_usable` judges material the same way.
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        context.load_verify_locations(cadata=trust_bundle.der())
        contexts.append(context)
    # load_cert_chain reads only from a path. The key goes there encrypted under a one-time
    # password, inside a memfd (never on disk) where available, else in a 0600 file inside a
    # private 0700 temporary directory; either is gone when this block ends.
    password = secrets.token_urlsafe(32)
    key_pem = credential.key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(password.encode("ascii")),
    )
    with _transient_file(key_pem + dump_certificates(credential.chain)) as path:
        for context in contexts:
            context.load_cert_chain(path, password=password)
    return contexts


def build_contexts(
    credential: Credential, trust_bundle: TrustBundle
) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts that verify the peer's chain but judge no SPIFFE ID: for
    callers that authorize peers some other way. Workloads want `TLSSource`'s contexts."""
    server, client = load_contexts(credential, trust_bundle, [("server", None), ("client", None)])
    return server, client


# The usages a leaf must allow: the same leaf serves as a server and as a client (mTLS).
_PURPOSES: Final = {
    ExtendedKeyUsageOID.SERVER_AUTH: "serverAuth",
    ExtendedKeyUsageOID.CLIENT_AUTH: "clientAuth",
}


def check_usable(credential: Credential, trust_bundle: TrustBundle, now: dt.datetime) -> None:
    """Raise ChainError unless a peer holding `trust_bundle` takes `credential` at `now`, as a
    server and as a client (what TLSSource checks before swapping material in).

    `bundles.formats.verify_chain` (signatures, validity windows, CA flags) and what OpenSSL
    checks beyond it: every CA's path length constraint, and the extended key usages of every
    certificate below the anchor. tests/unit/test_bundles_chain_check.py holds the verdict
    equal to real handshakes'.
    """
    verify_chain(credential, trust_bundle, now)
    path = _path(credential.chain, trust_bundle)
    for position, cert in enumerate(path):
        if position < len(path) - 1:
            _check_purposes(cert, position)
        if position > 0:
            try:
                limit = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
            except x509.ExtensionNotFound:
                continue
            below = position - 1  # CA certificates between this one and the leaf
            if limit.path_length is not None and below > limit.path_length:
                raise ChainError(
                    f"{describe(cert)} allows {limit.path_length} CA certificate(s) below it; "
                    f"the chain has {below}"
                )


def _check_purposes(cert: x509.Certificate, position: int) -> None:
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return  # no restriction
    if ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE in usages:
        return
    missing = [name for oid, name in _PURPOSES.items() if oid not in usages]
    if missing:
        role = "leaf" if position == 0 else f"chain certificate #{position + 1}"
        raise ChainError(f"{role} {describe(cert)} does not allow {' and '.join(missing)}")


def _path(chain: Sequence[x509.Certificate], trust_bundle: TrustBundle) -> list[x509.Certificate]:
    """The path verify_chain accepted, leaf first, ending at the anchor it found."""
    for position, cert in enumerate(chain):
        if position > 0 and cert in trust_bundle.roots:
            return list(chain[: position + 1])
        for root in trust_bundle.roots:
            if root.subject == cert.issuer and signed_by(cert, root):
                return [*chain[: position + 1], root]
    return list(chain)


def verified_chain(connection: object) -> list[bytes] | None:
    """The chain TLS verified for the peer (DER, leaf first, trust anchor last), or None.

    Takes an `ssl.SSLSocket`, an `ssl.SSLObject` or the `_ssl._SSLSocket` underneath either (what
    httpx's sync client reports as its `ssl_object`). Public from Python 3.13; before it, a
    method of the `_ssl` object.
    """
    getter = getattr(connection, "get_verified_chain", None)
    if getter is None:
        getter = getattr(getattr(connection, "_sslobj", None), "get_verified_chain", None)
    if getter is None:
        return None
    chain = getter()
    # 3.13 gives DER bytes; 3.10-3.12 `_ssl.Certificate`s (2 is `_ssl.ENCODING_DER`).
    return [c if isinstance(c, bytes) else bytes(c.public_bytes(2)) for c in chain or ()]


@contextlib.contextmanager
def _transient_file(data: bytes) -> Iterator[str]:
    """A path OpenSSL can open, holding `data` only for the duration of the block."""
    if _USE_MEMFD:
        try:
            fd = os.memfd_create("podcert-credential", os.MFD_CLOEXEC)
        except OSError:  # seccomp or an old kernel: fall through to the temporary directory
            pass
        else:
            try:
                with os.fdopen(os.dup(fd), "wb") as file:
                    file.write(data)
                yield f"/proc/self/fd/{fd}"
            finally:
                os.close(fd)
            return
    with tempfile.TemporaryDirectory(prefix="podcert-") as directory:
        path = Path(directory) / "credential.pem"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        yield str(path)
