"""Where a podcert client finds the API server and its credentials: a kubeconfig file, or the
pod's in-cluster configuration (its service account's token and CA).

Read here, without the `kubernetes` package (its loaders import every generated model): podcert
needs only a base URL, an `ssl.SSLContext` and a bearer token that follows a rotated file. What
client-go does that podcert has no use for is refused with a `ClientConfigError` naming the
field (auth-provider plugins, basic auth, impersonation), never silently ignored. Exec credential
plugins (the cloud providers' kubeconfigs) give bearer tokens: `podcert.client.execcredential`.

A projected service-account token rotates (the kubelet rewrites it well before it expires), so a
token file is read again at most every `TOKEN_REREAD_PERIOD` seconds, as client-go's cached
file token source does; a client certificate and key named as files (the kubelet renews its
own) are followed as client-go follows them (`podcert.client.clientcerts`). Messages never quote a
credential (token, key, proxy password).
"""

from __future__ import annotations

import binascii
import functools
import logging
import os
import ssl
import stat
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import yaml

from podcert.client import proxies
from podcert.client.clientcerts import CertFiles, memory_file, subject_of
from podcert.client.execcredential import ExecError, ExecToken
from podcert.errors import ConfigError

log = logging.getLogger("podcert.kubeconfig")

SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_PERIOD: Final = 60.0  # client-go's cached file token source: once a minute
MAX_FILE_BYTES: Final = 4 << 20  # a kubeconfig, token or certificate file larger is not one


class ClientConfigError(ConfigError):
    """The kubeconfig (or the pod's in-cluster credentials) cannot be used; says which and why."""


class TokenFile:
    """A bearer token from a file, read again at most every `period` seconds (`clock` is
    monotonic seconds). A read that fails or finds the file empty keeps the last token: the
    kubelet replaces a projected token by an atomic rename, so a failure is brief."""

    def __init__(
        self,
        path: Path,
        *,
        what: str = "tokenFile",
        period: float = TOKEN_REREAD_PERIOD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path, self.what, self.period, self.clock = path, what, period, clock
        self._lock = threading.Lock()
        self._token = _token_of(_read(path, what), f"{what} {path}")
        self._next = clock() + period

    def __call__(self) -> str:
        if self.clock() < self._next:
            return self._token
        with self._lock:
            now = self.clock()
            if now >= self._next:
                self._next = now + self.period
                try:
                    self._token = _token_of(_read(self.path, self.what), f"{self.what} {self.path}")
                except ClientConfigError as err:
                    log.warning("keeping the last token: %s", err)
            return self._token


@dataclass(frozen=True)
class ClientSettings:
    """How to reach one API server as one identity: what `podcert.client.rest.Rest` is built
    from."""

    server: str  # the base URL: https://host:port, maybe with a path; no trailing slash
    ssl_context: ssl.SSLContext | None  # None for an http:// server
    token: Callable[[], str] | None = field(default=None, repr=False)  # bearer token, if any
    tls_server_name: str | None = None  # the name to verify instead of the server's host
    proxy: str | None = field(default=None, repr=False)  # http://[user:pass@]host:port
    source: str = ""  # "kubeconfig PATH" or "in-cluster configuration", for messages
    # Client certificate and key files, followed as they are replaced (`ssl_context`: the first)
    client_certs: CertFiles | None = field(default=None, repr=False)
    identity: str = ""  # who the credentials say we are, for messages: never a secret

    @property
    def client_settings(self) -> ClientSettings:
        """Itself: what `Rest` asks of anything it is built from."""
        return self

    def who(self) -> str:
        """The identity presented now (a client certificate's subject and file, a token's
        source), for messages."""
        parts = [self.identity] if self.identity else []
        if self.client_certs is not None:
            parts.insert(0, self.client_certs.identity)
        return " and ".join(parts) or f"no credentials ({self.source or 'client settings'})"


def load(kubeconfig: Path | None) -> ClientSettings:
    """That kubeconfig's current context, or the in-cluster configuration when None."""
    return in_cluster() if kubeconfig is None else from_kubeconfig(kubeconfig)


def in_cluster(
    environ: Mapping[str, str] = os.environ,
    account: Path = SERVICE_ACCOUNT,
    clock: Callable[[], float] = time.monotonic,
) -> ClientSettings:
    """The pod's own: the API server's Service from the environment the kubelet sets, the
    service account's token (re-read as it rotates) and the cluster's CA."""
    where = "in-cluster configuration"
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise ClientConfigError(
            f"{where}: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set "
            "(not in a pod? give a kubeconfig)"
        )
    if not port.isdigit():
        raise ClientConfigError(f"{where}: KUBERNETES_SERVICE_PORT is not a port number")
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    try:
        token = TokenFile(account / "token", what="token", clock=clock)
        context = _context(cafile=account / "ca.crt")
        proxy = _env_proxy(server, environ)
    except ClientConfigError as err:
        raise ClientConfigError(f"{where}: {err}") from None
    identity = f"service account token {account / 'token'}"
    return ClientSettings(server, context, token, proxy=proxy, source=where, identity=identity)


def from_kubeconfig(path: Path, environ: Mapping[str, str] = os.environ) -> ClientSettings:
    """The current context of the kubeconfig at `path` (relative file names in it are read from
    its folder, as kubectl does)."""
    where = f"kubeconfig {path}"
    try:
        return _from_document(_parse(path), path.parent, environ, where)
    except ClientConfigError as err:
        raise ClientConfigError(f"{where}: {err}") from None


def _parse(path: Path) -> dict[str, Any]:
    try:
        text = _read(path, "file").decode(errors="replace")
    except ClientConfigError as err:
        raise ClientConfigError(str(err).split(": ", 1)[-1]) from None
    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or type(err).__name__
        at = f"line {mark.line + 1}: " if mark is not None else ""
        raise ClientConfigError(f"not valid YAML ({at}{problem})") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ClientConfigError("not a kubeconfig (a YAML mapping)")
    return doc


def _named(doc: Mapping[str, Any], section: str, name: str, inner: str) -> dict[str, Any]:
    """The `inner` mapping of the entry called `name` in list `section` (contexts, clusters,
    users)."""
    entries = doc.get(section) or []
    if not isinstance(entries, list):
        raise ClientConfigError(f"{section}: not a list")
    for entry in entries:
        if isinstance(entry, dict) and entry.get("name") == name:
            found = entry.get(inner) or {}
            if not isinstance(found, dict):
                raise ClientConfigError(f"{section} {name!r}: {inner} is not a mapping")
            return found
    raise ClientConfigError(f"no {section[:-1]} named {name!r} in {section}")


def _string(entry: Mapping[str, Any], key: str, what: str) -> str | None:
    value = entry.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ClientConfigError(f"{what}: {key} is not a string")
    return value


def _from_document(
    doc: Mapping[str, Any], base: Path, environ: Mapping[str, str], where: str
) -> ClientSettings:
    _check_data(doc)
    current = doc.get("current-context")
    if not current or not isinstance(current, str):
        raise ClientConfigError("current-context is not set")
    context = _named(doc, "contexts", current, "context")
    cluster_name = _string(context, "cluster", f"context {current!r}")
    if cluster_name is None:
        raise ClientConfigError(f"context {current!r}: cluster is not set")
    cluster = _named(doc, "clusters", cluster_name, "cluster")
    what = f"cluster {cluster_name!r}"
    server = _string(cluster, "server", what)
    if server is None:
        raise ClientConfigError(f"{what}: server is not set")
    parts = urlsplit(server)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ClientConfigError(f"{what}: server is not an http(s) URL")
    try:
        parts.port  # noqa: B018 (raises on a port out of range)
    except ValueError:
        raise ClientConfigError(f"{what}: server has no valid port") from None
    user_name = _string(context, "user", f"context {current!r}")
    user = _named(doc, "users", user_name, "user") if user_name is not None else {}
    who = f"user {user_name!r}"
    token, chain = _credentials(user, who, base)

    _one_of(cluster, "certificate-authority", what)
    context_, certs = None, None
    if parts.scheme == "https":
        ca_data = _decoded(cluster, "certificate-authority-data", what)
        ca_file = _string(cluster, "certificate-authority", what)
        insecure = cluster.get("insecure-skip-tls-verify") is True
        if insecure and (ca_data or ca_file):
            # client-go refuses the same: which of the two was meant is not known.
            raise ClientConfigError(
                f"{what}: insecure-skip-tls-verify and a certificate-authority both set"
            )
        make = functools.partial(
            _context,
            cafile=base / ca_file if ca_file and not ca_data else None,
            cadata=ca_data,
            insecure=insecure,
            what=what,
        )
        context_ = make()
        if chain is not None:
            cert, key = chain
            if isinstance(cert, Path) and isinstance(key, Path):
                certs = _cert_files(cert, key, make, who)  # re-read as client-go does
                context_ = certs.current()[1]
            else:
                _load_chain(context_, chain, who)
    elif chain is not None or token is not None:
        # client-go never sends credentials over plain http (it drops them); sending a token in
        # clear text would be worse than refusing.
        raise ClientConfigError(f"{what}: credentials need an https server, not http://")
    proxy = _string(cluster, "proxy-url", what)
    if proxy is not None and not (urlsplit(proxy).scheme == "http" and urlsplit(proxy).hostname):
        raise ClientConfigError(f"{what}: proxy-url is not an http:// URL (the only kind used)")
    return ClientSettings(
        server.rstrip("/"),
        context_,
        token,
        tls_server_name=_string(cluster, "tls-server-name", what) if context_ else None,
        proxy=proxy or _env_proxy(server, environ),
        source=where,
        client_certs=certs,
        identity=_identity(user, chain if certs is None else None, base, where),
    )


def _identity(user: Mapping[str, Any], chain: Chain | None, base: Path, where: str) -> str:
    """Who a kubeconfig user's credentials say it is, named without any secret."""
    parts = []
    if chain is not None and isinstance(chain[0], bytes):
        parts.append(f"client certificate {subject_of(chain[0]) or '(no subject)'} in {where}")
    if user.get("exec") is not None:
        parts.append(f"exec credential plugin in {where}")
    elif user.get("tokenFile") or user.get("token"):
        token_file = user.get("tokenFile")
        parts.append(f"bearer token from {base / str(token_file) if token_file else where}")
    return " and ".join(parts)


def _cert_files(cert: Path, key: Path, make: Callable[[], ssl.SSLContext], who: str) -> CertFiles:
    """A client certificate and key from files, read again as they change."""

    def build(cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
        context = make()
        _load_chain(context, (cert_pem, key_pem), who)
        return context

    return CertFiles(cert, key, lambda path, what: _read(path, f"{who}: {what}"), build)


# What client-go can do with a user and podcert does not: each named, so a kubeconfig that
# relies on one is refused instead of used without its credentials.
_UNSUPPORTED: Final = {
    "auth-provider": "auth-provider plugins are not supported (use a token, tokenFile or "
    "certificate)",
    "username": "basic authentication is not supported (Kubernetes removed it in 1.19)",
    "password": "basic authentication is not supported (Kubernetes removed it in 1.19)",
    "as": "impersonation is not supported",
    "as-groups": "impersonation is not supported",
    "as-uid": "impersonation is not supported",
    "as-user-extra": "impersonation is not supported",
}

Chain = tuple[bytes | Path, bytes | Path]  # (certificate, key): PEM bytes or a file


def _credentials(
    user: Mapping[str, Any], what: str, base: Path
) -> tuple[Callable[[], str] | None, Chain | None]:
    """(the bearer token source, the client certificate and key) of a kubeconfig user."""
    for name, why in _UNSUPPORTED.items():
        if user.get(name):
            raise ClientConfigError(f"{what}: {name}: {why}")
    token_file = _string(user, "tokenFile", what)
    token_value = _string(user, "token", what)
    token: Callable[[], str] | None = None
    if user.get("exec") is not None:
        if token_file is not None or token_value is not None:
            raise ClientConfigError(f"{what}: exec and a token both set: which one is meant?")
        try:
            token = ExecToken(user["exec"], base)
        except ExecError as err:
            raise ClientConfigError(f"{what}: {err}") from None
    elif token_file is not None:  # client-go: a token file, when given, wins over the token
        try:
            token = TokenFile(base / token_file)
        except ClientConfigError as err:
            raise ClientConfigError(f"{what}: {err}") from None
    elif token_value is not None:
        value = _token_of(token_value.encode(), f"{what}: token")
        token = lambda: value  # noqa: E731
    _one_of(user, "client-certificate", what)
    _one_of(user, "client-key", what)
    cert = _decoded(user, "client-certificate-data", what) or _path(
        user, "client-certificate", what, base
    )
    key = _decoded(user, "client-key-data", what) or _path(user, "client-key", what, base)
    if (cert is None) != (key is None):
        missing = "client-key(-data)" if key is None else "client-certificate(-data)"
        raise ClientConfigError(f"{what}: a client certificate needs both; {missing} is not set")
    return token, (cert, key) if cert is not None and key is not None else None


def _one_of(entry: Mapping[str, Any], key: str, what: str) -> None:
    """`key` and `key-data` are not both set: client-go refuses that too."""
    if _string(entry, key, what) is not None and _string(entry, f"{key}-data", what) is not None:
        raise ClientConfigError(f"{what}: {key} and {key}-data both set: which one is meant?")


def _path(user: Mapping[str, Any], key: str, what: str, base: Path) -> Path | None:
    name = _string(user, key, what)
    return base / name if name is not None else None


def _decoded(entry: Mapping[str, Any], key: str, what: str) -> bytes | None:
    value = _string(entry, key, what)
    if value is None:
        return None
    # Go's decoder, which kubectl uses, skips line breaks; nothing else. Padding is checked
    # before CPython's strict mode, which alone takes padding after a whole quantum (AAAA==).
    text = value.replace("\n", "").replace("\r", "").encode("ascii", errors="replace")
    padding = len(text) - len(text.rstrip(b"="))
    try:
        if len(text) % 4 or padding > 2 or (padding and (len(text) - padding) % 4 != 4 - padding):
            raise ValueError
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        raise ClientConfigError(f"{what}: {key} is not valid base64") from None


def _check_data(doc: Mapping[str, Any]) -> None:
    """Every cluster's and user's base64 fields decode, used or not: client-go decodes the
    whole file as it loads it, so one broken entry makes the file unusable for kubectl too."""
    for section, inner, keys in (
        ("clusters", "cluster", ("certificate-authority-data",)),
        ("users", "user", ("client-certificate-data", "client-key-data")),
    ):
        entries = doc.get(section)
        for entry in entries if isinstance(entries, list) else ():
            found = entry.get(inner) if isinstance(entry, dict) else None
            if isinstance(found, dict):
                for key in keys:
                    _decoded(found, key, f"{inner} {entry.get('name')!r}")


def _why(err: OSError) -> str:
    """An OSError as the lower-case phrase every other refusal here uses ("no such file")."""
    if isinstance(err, FileNotFoundError):
        return "no such file"
    return (err.strerror or type(err).__name__).lower()


def _read(path: Path, what: str) -> bytes:
    """A regular file's bytes, at most MAX_FILE_BYTES. Opened without blocking and checked to be
    a regular file before any read: a FIFO or a device named as a token or CA file (client-go
    would block on it, or read forever) is refused, naming the field."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        raise ClientConfigError(f"{what} {path}: {_why(err)}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ClientConfigError(f"{what} {path}: not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise ClientConfigError(f"{what} {path}: {_why(err)}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise ClientConfigError(f"{what} {path}: larger than {MAX_FILE_BYTES >> 20} MiB")
    return data


def _token_of(data: bytes, where: str) -> str:
    """The token in `data`, checked to be one header-safe line; `where` names its field."""
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ClientConfigError(f"{where} is not ASCII text") from None
    if not token:
        raise ClientConfigError(f"{where} is empty")
    if not token.isprintable():
        raise ClientConfigError(f"{where} is not one line of text")
    return token


def _context(
    *,
    cafile: Path | None = None,
    cadata: bytes | None = None,
    insecure: bool = False,
    what: str = "",
) -> ssl.SSLContext:
    """A client context: TLS 1.2 or newer, the server checked against the given CA (the
    system's roots when none is given, as client-go)."""
    prefix = f"{what}: " if what else ""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif cadata is not None:
        try:
            context.load_verify_locations(cadata=cadata.decode("ascii", errors="replace"))
        except (ssl.SSLError, ValueError):
            raise ClientConfigError(
                f"{prefix}certificate-authority-data holds no PEM certificate"
            ) from None
    elif cafile is not None:
        pem = _read(cafile, f"{prefix}certificate-authority")
        try:
            context.load_verify_locations(cadata=pem.decode("ascii", errors="replace"))
        except (ssl.SSLError, ValueError):
            raise ClientConfigError(
                f"{prefix}certificate-authority {cafile} holds no PEM certificate"
            ) from None
    else:
        context.load_default_certs()
    return context


def _load_chain(context: ssl.SSLContext, chain: Chain, what: str) -> None:
    """The client certificate and key into `context`. OpenSSL reads them from files only: key
    bytes go through an in-memory file (memfd) that never reaches a disk, or where there is
    none a 0600 temporary file deleted as soon as it is read."""
    cert, key = chain
    asked = []

    def no_passphrase() -> bytes:
        asked.append(True)  # never prompt on a terminal, as OpenSSL would by default
        return b""

    try:
        pem = b"".join(
            _read(part, name) if isinstance(part, Path) else part
            for name, part in (("client-certificate", cert), ("client-key", key))
        )
        with memory_file(pem) as name:
            context.load_cert_chain(name, password=no_passphrase)
    except (ssl.SSLError, ValueError) as err:
        if asked:
            why = "the client key is encrypted: podcert takes only an unencrypted key"
        elif "KEY_VALUES_MISMATCH" in str(err) or "key values mismatch" in str(err):
            why = "the client key does not match the client certificate"
        else:
            why = "the client certificate and key are not a PEM certificate and its key"
        raise ClientConfigError(f"{what}: {why}") from None
    except OSError as err:
        raise ClientConfigError(f"{what}: client certificate: {err.strerror}") from None


def _env_proxy(server: str, environ: Mapping[str, str]) -> str | None:
    try:
        return proxies.proxy_for(server, environ)
    except proxies.ProxyError as err:
        raise ClientConfigError(str(err)) from None
