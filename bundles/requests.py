"""A requests adapter that authorizes the server inside the TLS handshake and follows rotation.

`AuthorizingAdapter` hands urllib3 the source's current authorizing client context
(`TLSSource.client_context`) for every request: the handshake of each new connection ends only
for a server whose chain and SPIFFE ID the authorizer allows (`bundles.handshake`), so a refused
server never reads a byte of the request. `session()` mounts it on `https://` and refuses
`http://` outright.

Guarantees (tests/unit/test_bundles_requests.py holds each, against real requests and urllib3):
- Rotation is followed per request: urllib3 keys its pools by the SSL context, so once the
  source has swapped material (`refresh()` or `watch()`), the next request opens a new pool made
  with the new context; the adapter then closes the older pools' idle keep-alive connections,
  and a connection still streaming a response is closed when it is returned.
- Hostnames are not checked unless asked (`check_hostname=True`): a pod certificate names a
  workload, and urllib3 would otherwise demand the URL's host among the certificate's DNS names,
  which the signer issues only when its policy turns them on. Asked, urllib3 checks them after
  the handshake and before the first write.
- Nothing a caller passes widens trust or weakens verification: `verify=False` and `cert=` are
  refused, and a CA bundle path (`verify="..."`, or `REQUESTS_CA_BUNDLE` through the session) is
  not loaded: trust comes from the source alone. urllib3 sets the verify mode of the context it
  is given on each connection; the adapter always has it set to verify, and each adapter judges
  with a context of its own (urllib3 also sets ALPN on it), shared with no other client.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Mapping
from typing import Any

import requests
import requests.adapters
from requests.models import PreparedRequest

from bundles.authz import Authorizer, Verdict
from bundles.handshake import RefusalHook
from bundles.source import TLSSource

__all__ = ["AuthorizingAdapter", "PlainHTTPRefused", "session"]


class PlainHTTPRefused(requests.exceptions.InvalidSchema):
    """An `http://` URL on a session whose requests must go over authorized TLS."""


class AuthorizingAdapter(requests.adapters.HTTPAdapter):
    """An `HTTPAdapter` whose connections end their handshake only for a server `authorizer`
    allows, made with `source`'s current material.

    Mount it for `https://` (`session()` does). `on_refusal(verdict)` hears of each refused
    server; `adapter_options` go to `HTTPAdapter` (`pool_maxsize`, `max_retries`, ...).
    """

    def __init__(
        self,
        source: TLSSource,
        authorizer: Authorizer,
        *,
        on_refusal: RefusalHook | None = None,
        check_hostname: bool = False,
        **adapter_options: Any,
    ) -> None:
        self._source = source
        self._authorizer = authorizer
        self._hook = _own_kind(on_refusal)
        # urllib3: None matches the URL's host against the certificate, False skips the match.
        self._assert_hostname: bool | None = None if check_hostname else False
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        super().__init__(**adapter_options)

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        pool_kwargs.update(cert_reqs="CERT_REQUIRED", assert_hostname=self._assert_hostname)
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        proxy_kwargs.update(cert_reqs="CERT_REQUIRED", assert_hostname=self._assert_hostname)
        return super().proxy_manager_for(proxy, **proxy_kwargs)

    def build_connection_pool_key_attributes(
        self,
        request: PreparedRequest,
        verify: bool | str,
        cert: str | tuple[str, str] | None = None,
    ) -> Any:
        # verify=True and no cert: requests then sets only cert_reqs; the context is ours.
        host_params, pool_kwargs = super().build_connection_pool_key_attributes(request, True)
        pool_kwargs["ssl_context"] = self._current_context()
        return host_params, pool_kwargs

    def cert_verify(self, conn: Any, url: str, verify: Any, cert: Any) -> None:
        # requests would point urllib3 at its CA bundle, which urllib3 loads into the context.
        conn.cert_reqs = "CERT_REQUIRED"
        conn.ca_certs = None
        conn.ca_cert_dir = None

    def send(
        self,
        request: PreparedRequest,
        stream: bool = False,
        timeout: float | tuple[float, float] | tuple[float, None] | None = None,
        verify: bool | str = True,
        cert: bytes | str | tuple[bytes | str, bytes | str] | None = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        if verify is False:
            raise ValueError(
                "verify=False: an AuthorizingAdapter always verifies and authorizes the server"
            )
        if cert is not None:
            raise ValueError("cert: an AuthorizingAdapter presents the TLSSource's credential")
        if not (request.url or "").lower().startswith("https://"):
            raise PlainHTTPRefused(
                f"refusing {request.url}: an AuthorizingAdapter sends requests over TLS only",
                request=request,
            )
        return super().send(request, stream, timeout, True, None, proxies)

    def _current_context(self) -> ssl.SSLContext:
        context = self._source.client_context(self._authorizer, on_refusal=self._hook)
        with self._lock:
            rotated = self._context is not None and self._context is not context
            self._context = context
        if rotated:
            # Pools made with older material: their idle connections close now, busy ones
            # when they are returned. The new context's pool is made after this.
            self.poolmanager.clear()
            for manager in self.proxy_manager.values():
                manager.clear()
        return context


class _RefusePlainHTTP(requests.adapters.BaseAdapter):
    def send(self, request: PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
        raise PlainHTTPRefused(
            f"refusing {request.url}: this session sends requests over authorized TLS only",
            request=request,
        )

    def close(self) -> None:
        pass


def session(
    source: TLSSource,
    authorizer: Authorizer,
    *,
    on_refusal: RefusalHook | None = None,
    check_hostname: bool = False,
    **adapter_options: Any,
) -> requests.Session:
    """A `requests.Session` with an `AuthorizingAdapter` on `https://`, refusing `http://`."""
    adapter = AuthorizingAdapter(
        source,
        authorizer,
        on_refusal=on_refusal,
        check_hostname=check_hostname,
        **adapter_options,
    )
    opened = requests.Session()
    opened.mount("https://", adapter)
    opened.mount("http://", _RefusePlainHTTP())
    return opened


def _own_kind(on_refusal: RefusalHook | None) -> RefusalHook:
    """A hook object of this adapter's own: `TLSSource` caches one context per (authorizer,
    hook), so the adapter's context is shared with no other client."""

    def hook(verdict: Verdict) -> None:
        if on_refusal is not None:
            on_refusal(verdict)

    return hook
