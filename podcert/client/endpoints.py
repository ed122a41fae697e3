"""Where a client's connections go, and with which TLS context each new one is made.

An `Endpoint` is what `podcert.client.transport` dials: the API server's host and port (through a
proxy's CONNECT tunnel, if any), the name its certificate is checked against, the path prefix
the server URL carries. Its TLS context is fixed, except for a client whose certificate and key
come from files (`podcert.client.clientcerts.CertFiles`): then each new connection asks `tls()` for
the current context, and the generation it returns tells a connection made with a replaced pair,
which is not reused once idle.
"""

from __future__ import annotations

import base64
import ssl
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import unquote, urlsplit

from podcert.client.kubeconfig import ClientSettings


class Contexts(Protocol):
    """A TLS context that may change: (its generation, the context) for the next connection."""

    def current(self) -> tuple[int, ssl.SSLContext]: ...


@dataclass(frozen=True)
class Endpoint:
    """Where the bytes go: the API server (through a proxy's CONNECT tunnel, if any)."""

    host: str
    port: int
    context: ssl.SSLContext | None  # None: plain http; else the first (or only) TLS context
    server_hostname: str  # what TLS checks the certificate against
    prefix: str  # a path the server URL carries, before every API path
    proxy: tuple[str, int] | None = None
    proxy_auth: str | None = None  # a Proxy-Authorization value (never in a message)
    contexts: Contexts | None = None  # where `context` comes from when it can change

    @classmethod
    def of(cls, settings: ClientSettings) -> Endpoint:
        parts = urlsplit(settings.server)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        proxy, auth = None, None
        if settings.proxy:
            p = urlsplit(settings.proxy)
            proxy = (p.hostname or "", p.port or 80)
            if p.username is not None:
                creds = f"{unquote(p.username)}:{unquote(p.password or '')}".encode()
                auth = "Basic " + base64.b64encode(creds).decode()
        tls = parts.scheme == "https"
        return cls(
            host,
            port,
            settings.ssl_context if tls else None,
            settings.tls_server_name or host,
            parts.path.rstrip("/"),
            proxy,
            auth,
            settings.client_certs if tls else None,
        )

    def tls(self) -> tuple[int, ssl.SSLContext | None]:
        """(the generation, the context) a new connection is made with now."""
        if self.contexts is None or self.context is None:
            return 0, self.context
        return self.contexts.current()

    @property
    def where(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def host_header(self) -> str:
        default = 443 if self.context is not None else 80
        return self.where if self.port != default else self.where.rsplit(":", 1)[0]
