"""Where a podcert client finds the API server and its credentials: kubeconfig files (one, or
several merged by `podcert.client.loadingrules`), or the pod's in-cluster configuration (its
service account's token and CA).

Read here, without the `kubernetes` package (its loaders import every generated model): podcert
needs only a base URL, an `ssl.SSLContext`, a bearer token that follows a rotated file, and whom
to impersonate. What client-go does that podcert has no use for is refused with a
`ClientConfigError` naming the field (auth-provider plugins, basic auth, impersonated extra
fields), never silently ignored. Exec credential plugins (the cloud providers' kubeconfigs)
give bearer tokens: `podcert.client.execcredential`.

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
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from podcert.client import proxies
from podcert.client.clientcerts import CertFiles, memory_file, subject_of
from podcert.client.execcredential import ExecError, ExecToken
from podcert.client.kubeconfigfiles import (
    MAX_FILE_BYTES,
    check_data,
    decoded,
    parse,
    read,
    token_of,
)
from podcert.client.loadingrules import (
    ClientConfigError,
    Impersonation,
    Selected,
    impersonation,
    merge,
    namespace_of,
    select,
)
from podcert.client.loadingrules import string_field as _string

# Re-exported: their homes are loadingrules and kubeconfigfiles.
__all__ = ["MAX_FILE_BYTES", "ClientConfigError", "Impersonation"]

log = logging.getLogger("podcert.kubeconfig")

SERVICE_ACCOUNT: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_PERIOD: Final = 60.0  # client-go's cached file token source: once a minute


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
        self._token = token_of(read(path, what), f"{what} {path}")
        self._next = clock() + period

    def __call__(self) -> str:
        if self.clock() < self._next:
            return self._token
        with self._lock:
            now = self.clock()
            if now >= self._next:
                self._next = now + self.period
                try:
                    self._token = token_of(read(self.path, self.what), f"{self.what} {self.path}")
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
    impersonate: Impersonation | None = None  # whom requests act as, if anyone
    namespace: str = "default"  # the context's (or the pod's): a command's default namespace

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
        said = " and ".join(parts) or f"no credentials ({self.source or 'client settings'})"
        return f"{said}, {self.impersonate.describe()}" if self.impersonate else said


def load(kubeconfig: Path | None) -> ClientSettings:
    """That kubeconfig's current context, or the in-cluster configuration when None."""
    return in_cluster() if kubeconfig is None else from_kubeconfig(kubeconfig)


def in_cluster(
    environ: Mapping[str, str] = os.environ,
    account: Path = SERVICE_ACCOUNT,
    clock: Callable[[], float] = time.monotonic,
    impersonate: Impersonation | None = None,
) -> ClientSettings:
    """The pod's own: the API server's Service from the environment the kubelet sets, the
    service account's token (re-read as it rotates) and the cluster's CA; the namespace is
    POD_NAMESPACE's, else the service account's, else "default" (client-go's)."""
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
    return ClientSettings(
        server, context, token, proxy=proxy, source=where, identity=identity,
        impersonate=impersonate, namespace=_pod_namespace(environ, account),
    )  # fmt: skip


def _pod_namespace(environ: Mapping[str, str], account: Path) -> str:
    if namespace := environ.get("POD_NAMESPACE"):
        return namespace
    try:
        return (
            read(account / "namespace", "namespace").decode(errors="replace").strip() or "default"
        )
    except ClientConfigError:
        return "default"


def from_kubeconfig(
    path: Path,
    environ: Mapping[str, str] = os.environ,
    *,
    context: str | None = None,
    as_user: str | None = None,
    as_groups: Sequence[str] = (),
) -> ClientSettings:
    """The current context (or `context`) of the kubeconfig at `path` (relative file names in
    it are read from its folder, as kubectl does)."""
    return from_files((path,), environ, context=context, as_user=as_user, as_groups=as_groups)


def from_files(
    paths: Sequence[Path],
    environ: Mapping[str, str] = os.environ,
    *,
    where: str | None = None,
    context: str | None = None,
    as_user: str | None = None,
    as_groups: Sequence[str] = (),
) -> ClientSettings:
    """The kubeconfig files, merged as client-go merges a KUBECONFIG list
    (`podcert.client.loadingrules`), at the current context or `context`; `as_user` and
    `as_groups` (--as, --as-group) override the user's impersonation. Every file must exist."""
    where = where or f"kubeconfig {paths[0]}"
    documents = []
    for path in paths:
        try:
            doc = parse(path)
            check_data(doc)
        except ClientConfigError as err:
            raise ClientConfigError(f"kubeconfig {path}: {err}") from None
        documents.append((path, doc))
    try:
        selected = select(merge(documents), context)
        return _from_selected(selected, environ, where, as_user, as_groups)
    except ClientConfigError as err:
        raise ClientConfigError(f"{where}: {err}") from None


def _from_selected(
    selected: Selected,
    environ: Mapping[str, str],
    where: str,
    as_user: str | None,
    as_groups: Sequence[str],
) -> ClientSettings:
    cluster, base = selected.cluster.value, selected.cluster.base
    what = f"cluster {selected.cluster_name!r}"
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
    user = selected.user.value if selected.user is not None else {}
    user_base = selected.user.base if selected.user is not None else base
    who = f"user {selected.user_name!r}"
    impersonate = impersonation(user, who, as_user, as_groups)
    exec_cluster = _exec_cluster(cluster, base, what) if user.get("exec") is not None else None
    token, chain = _credentials(user, who, user_base, exec_cluster)

    _one_of(cluster, "certificate-authority", what)
    context_, certs = None, None
    if parts.scheme == "https":
        ca_data = decoded(cluster, "certificate-authority-data", what)
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
    elif ca_file := _string(cluster, "certificate-authority", what):
        read(base / ca_file, f"{what}: certificate-authority")  # unused, but client-go opens it
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
        identity=_identity(user, chain if certs is None else None, user_base, where),
        impersonate=impersonate,
        namespace=namespace_of(selected),
    )


def _exec_cluster(cluster: Mapping[str, Any], base: Path, what: str) -> dict[str, Any]:
    """What an exec plugin with `provideClusterInfo` is told of the cluster (client-go's
    rest.ConfigToExecCluster, as JSON): the CA's bytes, whether given as data or as a file,
    and the cluster's `client.authentication.k8s.io/exec` extension as `config`."""
    info: dict[str, Any] = {"server": _string(cluster, "server", what) or ""}
    if name := _string(cluster, "tls-server-name", what):
        info["tls-server-name"] = name
    if cluster.get("insecure-skip-tls-verify") is True:
        info["insecure-skip-tls-verify"] = True
    ca = decoded(cluster, "certificate-authority-data", what)
    if ca is None and (ca_file := _string(cluster, "certificate-authority", what)):
        ca = read(base / ca_file, f"{what}: certificate-authority")
    if ca:
        info["certificate-authority-data"] = binascii.b2a_base64(ca, newline=False).decode()
    if proxy := _string(cluster, "proxy-url", what):
        info["proxy-url"] = proxy
    extensions = cluster.get("extensions")
    for item in extensions if isinstance(extensions, list) else ():
        if isinstance(item, dict) and item.get("name") == "client.authentication.k8s.io/exec":
            info["config"] = item.get("extension")
    return info


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

    return CertFiles(cert, key, lambda path, what: read(path, f"{who}: {what}"), build)


# What client-go can do with a user and podcert does not: each named, so a kubeconfig that
# relies on one is refused instead of used without its credentials.
_UNSUPPORTED: Final = {
    "auth-provider": "auth-provider plugins are not supported (use a token, tokenFile or "
    "certificate)",
    "username": "basic authentication is not supported (Kubernetes removed it in 1.19)",
    "password": "basic authentication is not supported (Kubernetes removed it in 1.19)",
}

Chain = tuple[bytes | Path, bytes | Path]  # (certificate, key): PEM bytes or a file


def _credentials(
    user: Mapping[str, Any], what: str, base: Path, exec_cluster: Mapping[str, Any] | None
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
            token = ExecToken(user["exec"], base, cluster=exec_cluster)
        except ExecError as err:
            raise ClientConfigError(f"{what}: {err}") from None
    elif token_file is not None:  # client-go: a token file, when given, wins over the token
        try:
            token = TokenFile(base / token_file)
        except ClientConfigError as err:
            raise ClientConfigError(f"{what}: {err}") from None
    elif token_value is not None:
        value = token_of(token_value.encode(), f"{what}: token")
        token = lambda: value  # noqa: E731
    _one_of(user, "client-certificate", what)
    _one_of(user, "client-key", what)
    cert = decoded(user, "client-certificate-data", what) or _path(
        user, "client-certificate", what, base
    )
    key = decoded(user, "client-key-data", what) or _path(user, "client-key", what, base)
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
        pem = read(cafile, f"{prefix}certificate-authority")
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
            read(part, name) if isinstance(part, Path) else part
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
