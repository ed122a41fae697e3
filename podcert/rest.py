"""Raw JSON over the official client's connection: auth, TLS and pooling from `kubernetes`,
bodies as plain dicts.

The generated models round-trip every object through pydantic; the controllers only need a few
fields, and the watch needs line-by-line streaming with its own handling of 410 Gone. So the
per-side adapters (signer/kube.py, kubelet_shim/kube.py) speak through this one small class.

Lists of a whole cluster are paged (`list`), and a caller that keeps only a few fields of each
object names them as a `msgspec.Struct` (a shape): each page, and each watch event, is then decoded
straight into those fields, skipping the rest, instead of into dicts of everything. At 150,000 pods
that is the difference between a list held whole as ~6 KB of dicts per pod, with the interpreter
lock held for seconds, and a few small objects per pod decoded in ~2 ms a page.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final, Generic, TypeVar, overload
from urllib.parse import quote, urlencode

import msgspec
import urllib3
import yaml
from kubernetes import client, config

from podcert.errors import ConfigError

JSON = dict[str, Any]
T = TypeVar("T")

PAGE: Final = 500  # objects per list request, as client-go's pager


class _ListMeta(msgspec.Struct, frozen=True):
    resourceVersion: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class _Page(msgspec.Struct, Generic[T], frozen=True):
    items: list[T] | None = None
    metadata: _ListMeta = _ListMeta()


class _Event(msgspec.Struct, frozen=True):
    type: str
    object: msgspec.Raw = msgspec.Raw(b"{}")


_DICT: Final = msgspec.json.Decoder(dict[str, Any])
_EVENT: Final = msgspec.json.Decoder(_Event)


class ApiError(Exception):
    """A non-2xx answer. `status` is the HTTP code; `reason` the Status reason (e.g. Conflict)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def retryable(self) -> bool:
        return self.status in (0, 408, 409, 425, 429) or self.status >= 500


class Gone(ApiError):
    """410: the resourceVersion is too old (compaction); relist."""


class ClientConfigError(ConfigError):
    """The kubeconfig (or the pod's in-cluster credentials) cannot be used; says which and why."""


def load_client(kubeconfig: Path | None) -> client.ApiClient:
    """In-cluster config when `kubeconfig` is None, else that file. Raises ClientConfigError."""
    configuration = client.Configuration()
    try:
        if kubeconfig is None:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            if not kubeconfig.is_file():
                raise ClientConfigError(f"kubeconfig {kubeconfig}: no such file")
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig),
                client_configuration=configuration,
                persist_config=False,
            )
    except ClientConfigError:
        raise
    except (config.ConfigException, OSError, ValueError, yaml.YAMLError) as err:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster configuration"
        # The loaders' messages name structure, never credentials; keep only the first line.
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if isinstance(err, yaml.YAMLError):
            reason = f"not valid YAML ({reason})"
        raise ClientConfigError(f"{where}: {reason}") from None
    # Several worker threads share one pool: make it as wide as they are.
    configuration.connection_pool_maxsize = 32
    hook = getattr(configuration, "refresh_api_key_hook", None)
    if hook is not None:
        throttled: Any = ThrottledRefresh(hook, TOKEN_REFRESH_PERIOD)  # typed None upstream
        configuration.refresh_api_key_hook = throttled
    return client.ApiClient(configuration)


# The client calls its token-refresh hook before EVERY request, and for a token kubeconfig the
# hook rebuilds the whole configuration, rescanning the environment for proxies (0.1-0.4 ms a
# request in a pod with many Service variables). Tokens live for hours; a re-read every 30 s is
# plenty to follow a rotated service-account token.
TOKEN_REFRESH_PERIOD = 30.0


class ThrottledRefresh:
    """Runs the client's token-refresh hook at most once per `period` seconds.

    Both of the client's loaders (kubeconfig and in-cluster) install a fresh hook each time
    theirs runs; this one stays in front by taking the newcomer as its inner hook."""

    def __init__(
        self, hook: Any, period: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.hook = hook
        self.period = period
        self.clock = clock
        self._last = float("-inf")
        self._lock = threading.Lock()

    def __call__(self, configuration: Any) -> None:
        with self._lock:
            now = self.clock()
            if now - self._last < self.period:
                return
            self._last = now
            self.hook(configuration)
            installed = getattr(configuration, "refresh_api_key_hook", None)
            if installed is not self:
                self.hook = installed
                configuration.refresh_api_key_hook = self


def _error(status: int, data: bytes) -> ApiError:
    try:
        body = json.loads(data)
        reason, message = str(body.get("reason", "")), str(body.get("message", ""))
    except ValueError:
        reason, message = "", data[:300].decode(errors="replace")
    cls = Gone if status == 410 else ApiError
    return cls(status, reason or "Error", message)


class Rest:
    """GET/POST/PUT/PATCH/DELETE and WATCH on API paths, with dict bodies.

    Requests go straight to the client's urllib3 pool with the client's TLS settings and
    credentials: the generated client's `param_serialize` walked every body (a copy of each
    object, under a lock the workers shared) and `json.dumps` encoded it again, a third of the
    status write's CPU. Bodies are encoded once, by msgspec."""

    def __init__(self, api: client.ApiClient, timeout: float = 30.0) -> None:
        self.api = api
        self.timeout = timeout

    @property
    def user_agent(self) -> str:
        return str(self.api.user_agent)

    def _headers(self, content_type: str) -> dict[str, str]:
        headers = {
            **self.api.default_headers,
            "Accept": "application/json",
            "Content-Type": content_type,
        }
        # As the generated client applies "BearerToken": the token (refreshed by the
        # configuration's throttled hook), when the kubeconfig has one; else client certificates
        # in the pool's TLS settings authenticate.
        bearer = self.api.configuration.auth_settings().get("BearerToken")
        if bearer and bearer.get("value"):
            headers[bearer["key"]] = bearer["value"]
        return headers

    def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str | int | bool] | None,
        body: Any,
        content_type: str,
        timeout: float | tuple[float, float] | None,
    ) -> Any:
        """The urllib3 response, its body not read yet (watches stream it)."""
        url = self.api.configuration.host + path
        if query:
            url += "?" + urlencode(
                [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in query.items()]
            )
        limit = timeout or self.timeout
        try:
            return self.api.rest_client.pool_manager.request(
                method,
                url,
                body=msgspec.json.encode(body) if body is not None else None,
                headers=self._headers(content_type),
                timeout=(
                    urllib3.Timeout(connect=limit[0], read=limit[1])
                    if isinstance(limit, tuple)
                    else urllib3.Timeout(total=limit)
                ),
                preload_content=False,
            )
        except OSError as err:  # connection refused/reset: the API server is away
            raise ApiError(0, "Unavailable", str(err)) from None
        except Exception as err:
            if _from_urllib3(err):
                raise ApiError(0, "Unavailable", str(err)) from None
            raise

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str | int | bool] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> JSON:
        resp = self._send(method, path, query, body, content_type, timeout)
        data = resp.read()
        resp.release_conn()
        if not 200 <= resp.status < 300:
            raise _error(resp.status, data)
        result: JSON = _DICT.decode(data) if data else {}
        return result

    def get(self, path: str, **query: str | int | bool) -> JSON | None:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", path, query=query)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    @overload
    def list(
        self,
        path: str,
        shape: None = None,
        *,
        query: Mapping[str, str] | None = None,
        limit: int = PAGE,
    ) -> tuple[Iterator[JSON], str]: ...

    @overload
    def list(
        self,
        path: str,
        shape: type[T],
        *,
        query: Mapping[str, str] | None = None,
        limit: int = PAGE,
    ) -> tuple[Iterator[T], str]: ...

    def list(
        self,
        path: str,
        shape: type[Any] | None = None,
        *,
        query: Mapping[str, str] | None = None,
        limit: int = PAGE,
    ) -> tuple[Iterator[Any], str]:
        """Every object at `path`, `limit` a page: (the objects, as `shape` or as dicts, one page
        at a time; the list's resourceVersion, known from the first page). Only the page being
        read is held. The iterator raises ApiError (Gone when a continue token expired) if a
        later page fails: the caller must then list again, never watch from the version."""
        decoder = msgspec.json.Decoder(_Page[shape] if shape is not None else _Page[JSON])  # type: ignore[valid-type]
        first = [self._page(path, decoder, limit, "", query or {})]
        version = str(first[0].metadata.resourceVersion)

        def items() -> Iterator[Any]:
            page = first.pop()  # no reference left to the first page once it is read
            while True:
                token = page.metadata.continue_
                if page.items:
                    yield from page.items
                if not token:
                    return
                del page
                page = self._page(path, decoder, limit, token, query or {})

        return items(), version

    def _page(
        self,
        path: str,
        decoder: msgspec.json.Decoder[Any],
        limit: int,
        token: str,
        query: Mapping[str, str],
    ) -> Any:
        params: dict[str, str | int | bool] = {**query, "limit": limit}
        if token:
            params["continue"] = token
        resp = self._send("GET", path, params, None, "application/json", None)
        data = resp.read()
        resp.release_conn()
        if not 200 <= resp.status < 300:
            raise _error(resp.status, data)
        try:
            return decoder.decode(data)
        except msgspec.DecodeError as err:
            raise ApiError(0, "BadResponse", f"list {path}: {err}") from None

    def watch(
        self,
        path: str,
        resource_version: str,
        timeout_seconds: int = 300,
        shape: type[Any] | None = None,
        **query: str,
    ) -> Iterator[JSON]:
        """Watch events from `resource_version`: {"type", "object"}, the object a dict or, with
        `shape`, that shape. Raises Gone on 410 (as status or ERROR event)."""
        params: dict[str, str | int | bool] = {
            **query,
            "watch": True,
            "resourceVersion": resource_version,
            "allowWatchBookmarks": True,
            "timeoutSeconds": timeout_seconds,
        }
        objects = msgspec.json.Decoder(shape) if shape is not None else _DICT
        resp = self._send("GET", path, params, None, "application/json", (10, timeout_seconds + 30))
        if not 200 <= resp.status < 300:
            raise _error(resp.status, resp.read())
        raw = resp
        try:
            rest = b""
            for chunk in raw.stream(64 * 1024, decode_content=True):
                *lines, rest = (rest + chunk).split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = _EVENT.decode(line)
                    if event.type == "ERROR":
                        status = _DICT.decode(event.object)
                        raise _error(int(status.get("code", 500)), bytes(event.object))
                    yield {"type": event.type, "object": objects.decode(event.object)}
        except Exception as err:
            # A stream cut short (the API server went away mid-response) surfaces as urllib3's
            # ProtocolError: as much an outage as a refused connection, not an unexpected bug.
            if isinstance(err, OSError | ValueError) or _from_urllib3(err):
                raise ApiError(0, "Unavailable", f"watch stream broke: {err}") from None
            raise
        finally:
            raw.release_conn()


def resource_version(obj: Any) -> str:
    """metadata.resourceVersion of an object, a dict or a shape ("" when it has none)."""
    if isinstance(obj, Mapping):
        meta = obj.get("metadata")
        return str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""
    return str(getattr(getattr(obj, "metadata", None), "resourceVersion", "") or "")


def _from_urllib3(err: BaseException) -> bool:
    """urllib3's own errors (ProtocolError, MaxRetryError...) do not derive from OSError."""
    return type(err).__module__.startswith("urllib3")


def path_of(group_version: str, resource: str, namespace: str | None = None, name: str = "") -> str:
    """The REST path of a resource: core ("v1") or "group/version"."""
    base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    if namespace:
        base += f"/namespaces/{quote(namespace, safe='')}"
    base += f"/{resource}"
    if name:
        base += f"/{quote(name, safe='')}"
    return base
