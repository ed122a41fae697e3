"""Raw JSON to and from the API server, bodies as plain dicts or small shapes.

The generated models round-trip every object through pydantic; the controllers only need a few
fields, and the watch needs line-by-line streaming with its own handling of 410 Gone. So the
per-side adapters (signer/kube.py, kubelet_shim/kube.py) speak through this one small class, over
podcert's own connections (`podcert.client.transport`) with the settings a kubeconfig or the pod's
in-cluster configuration gives (`podcert.client.kubeconfig`): no `kubernetes` package in the
product.

Lists of a whole cluster are paged (`list`), and a caller that keeps only a few fields of each
object names them as a `msgspec.Struct` (a shape): each page, each watch event and each object
read (`get`), is then decoded straight into those fields, skipping the rest, instead of into
dicts of everything. At 150,000 pods that is the difference between a list held whole as ~6 KB
of dicts per pod, with the interpreter lock held for seconds, and a few small objects per pod
decoded in ~2 ms a page. A page is read as it arrives and decoded an element at a time
(`podcert.client.pages`), so its size is not what a list costs: 500 pods of 660 KB each (labels are
bounded one by one, not in number) cost what one does, plus a buffer of `pages.PIECE`.
"""

from __future__ import annotations

import ssl
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar, overload
from urllib.parse import quote, urlencode

import msgspec

from podcert import __version__
from podcert.api import requests
from podcert.client import pages, transport
from podcert.client.kubeconfig import ClientConfigError, ClientSettings, load
from podcert.client.refusals import Refusals

__all__ = [
    "ClientConfigError",
    "ClientSettings",
]  # re-exported: their home is podcert.client.kubeconfig

JSON = dict[str, Any]
T = TypeVar("T")

PAGE: Final = 500  # objects per list request, as client-go's pager


class _Event(msgspec.Struct, frozen=True):
    type: str
    object: msgspec.Raw = msgspec.Raw(b"{}")


REQUESTS: Final = pages.Lenient(requests.PodCertificateRequest, requests.read_misfit)
"""How the signer and the shim read PodCertificateRequests: typed, straight from each page,
event and GET; an object that is not one becomes `Unreadable`, never an error for the rest of
the page."""

_DICT: Final = msgspec.json.Decoder(dict[str, Any])
_EVENT: Final = msgspec.json.Decoder(_Event)


class ApiError(Exception):
    """A non-2xx answer. `status` is the HTTP code; `reason` the Status reason (e.g. Conflict)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        # Status 0 is no answer at all: the message says what happened on the way.
        super().__init__(message if status == 0 else f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def retryable(self) -> bool:
        return self.status in (0, 408, 409, 425, 429) or self.status >= 500


class Gone(ApiError):
    """410: the resourceVersion is too old (compaction); relist."""


USER_AGENT: Final = f"podcert/{__version__}"
WATCH_CONNECT_TIMEOUT: Final = 10.0


def load_client(kubeconfig: Path | None) -> ClientSettings:
    """In-cluster configuration when `kubeconfig` is None, else that file's current context.
    Raises ClientConfigError, naming the file (or the in-cluster configuration) and the field."""
    return load(kubeconfig)


class HasClientSettings(Protocol):
    """What a `Rest` is built from: `ClientSettings` itself, or a client that carries them (the
    devcluster's typed client, for tests)."""

    @property
    def client_settings(self) -> ClientSettings: ...


def _impersonation(settings: ClientSettings) -> bytes:
    """The Impersonate-* header lines every request carries (client-go's impersonating round
    tripper), UTF-8 as Go writes them; empty when no one is impersonated."""
    who = settings.impersonate
    if who is None:
        return b""
    lines = [f"Impersonate-User: {who.user}"]
    if who.uid:
        lines.append(f"Impersonate-Uid: {who.uid}")
    lines += [f"Impersonate-Group: {group}" for group in who.groups]
    return "".join(f"{line}\r\n" for line in lines).encode()


def _error(status: int, data: bytes) -> ApiError:
    try:
        body = _DICT.decode(data)
        reason, message = str(body.get("reason", "")), str(body.get("message", ""))
    except msgspec.DecodeError:
        reason, message = "", data[:300].decode(errors="replace")
    cls = Gone if status == 410 else ApiError
    return cls(status, reason or "Error", message)


def _object(data: bytes, method: str, path: str) -> JSON:
    """A 2xx answer's body: a JSON object (an empty body is an empty one)."""
    if not data:
        return {}
    try:
        result: JSON = _DICT.decode(data)
    except msgspec.DecodeError:
        raise ApiError(
            0, "BadResponse", f"{method} {path}: the answer is not a JSON object"
        ) from None
    return result


class Rest:
    """GET/POST/PUT/PATCH/DELETE and WATCH on API paths, with dict bodies.

    Bodies are encoded once, by msgspec, and requests written whole on a kept-alive connection
    (`podcert.client.transport`); the bearer token, when there is one, comes from the settings'
    token source on every request (it re-reads a rotated file itself). Safe to share between
    threads: each request takes a connection of its own from the pool.

    Every failure of a request is an ApiError: the server's status and reason, or status 0 with
    reason Unavailable (no answer, or it broke off: a write may or may not have been applied,
    and is never sent twice by this client) or BadResponse (an answer that is not HTTP/1.1 as
    h11 reads it, or a body that is not the JSON asked for). A token source that hands out what
    is not a header value is a ClientConfigError.

    Every answer is told to `refusals`, which judges whether the API server keeps refusing the
    identity (`podcert.client.refusals`: what a process's /healthz reports)."""

    def __init__(
        self, client: HasClientSettings, timeout: float = 30.0, user_agent: str = USER_AGENT
    ) -> None:
        self.settings = client.client_settings
        self.timeout = timeout
        self._user_agent = user_agent
        self._endpoint = transport.Endpoint.of(self.settings)
        self._pool = transport.Pool(self._endpoint)
        self.refusals = Refusals(self.settings.who)
        # A Rest dropped without close() (tests make one per call) closes its connections too.
        self._finalizer = weakref.finalize(self, self._pool.close)
        self._fixed = (
            f"Host: {self._endpoint.host_header}\r\nUser-Agent: {user_agent}\r\n"
            "Accept: application/json\r\n"
        ).encode("latin-1") + _impersonation(self.settings)

    @property
    def user_agent(self) -> str:
        return self._user_agent

    def close(self) -> None:
        """Close the idle connections (a watch in progress keeps its own until it ends)."""
        self._finalizer()

    def _head(
        self, method: str, target: str, content_type: str, length: int | None
    ) -> tuple[bytes, str | None]:
        """The request's head, and the bearer token it carries (None: none)."""
        if not target.isprintable() or " " in target:
            raise ValueError(f"not a request target: {target[:100]!r}")
        head = f"{method} {target} HTTP/1.1\r\n".encode("latin-1") + self._fixed
        token, value = self.settings.token, None
        if token is not None:
            value = token()
            if not (value.isascii() and value.isprintable()):
                # Token sources check this at load; one that did not is refused, not sent.
                where = self.settings.source or "the client settings"
                raise ClientConfigError(f"{where}: the bearer token is not one line of ASCII")
            head += f"Authorization: Bearer {value}\r\n".encode("ascii")
        if length is not None:
            head += f"Content-Type: {content_type}\r\nContent-Length: {length}\r\n".encode(
                "latin-1"
            )
        return head + b"\r\n", value

    def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, str | int | bool] | None,
        body: Any,
        content_type: str,
        timeout: float | tuple[float, float] | None,
    ) -> transport.Response:
        """The answer, its body not read yet (watches stream it). Raises ApiError(0,
        "Unavailable") when the API server cannot be reached or breaks off, ApiError(0,
        "BadResponse") when its answer is not HTTP/1.1."""
        target = self._endpoint.prefix + path
        if query:
            target += "?" + urlencode(
                [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in query.items()]
            )
        data = msgspec.json.encode(body) if body is not None else None
        limit = timeout or self.timeout
        connect, read = limit if isinstance(limit, tuple) else (limit, limit)
        length = len(data) if data is not None else None
        for attempt in range(2):
            head, used = self._head(method, target, content_type, length)
            try:
                resp = self._pool.send(head, data, method, connect, read)
            except OSError as err:  # refused, reset, timed out, TLS refused, not HTTP
                raise self._unavailable(err) from None
            if attempt == 0 and resp.status == 401 and self._refreshed(used):
                # A 401 is given before the request is acted on: sending it again is safe.
                self._body(resp)
                continue
            break
        self.refusals.answer(method, resp.status)
        return resp

    def _refreshed(self, used: str | None) -> bool:
        """After a 401 to `used`: whether the token source (an exec plugin's) has a new one."""
        refresh = getattr(self.settings.token, "refresh", None)
        return used is not None and refresh is not None and bool(refresh(used))

    def _unavailable(self, err: OSError) -> ApiError:
        if isinstance(err, transport.ProtocolError):
            return ApiError(
                0, "BadResponse", f"the API server at {self._endpoint.where} answered {err}"
            )
        if isinstance(err, ssl.SSLCertVerificationError):
            cause = f"certificate verify failed: {err.verify_message}"
        elif isinstance(err, TimeoutError):
            cause = "timed out"
        else:
            cause = err.strerror or str(err) or type(err).__name__
        return ApiError(
            0, "Unavailable", f"cannot reach the API server at {self._endpoint.where} ({cause})"
        )

    def _body(self, resp: transport.Response) -> bytes:
        try:
            data = resp.read()
        except OSError as err:
            self._pool.discard(resp)
            raise self._unavailable(err) from None
        self._pool.release(resp)
        return data

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
        data = self._body(resp)
        if not 200 <= resp.status < 300:
            raise _error(resp.status, data)
        return _object(data, method, path)

    def write(self, method: str, path: str, *, body: Any) -> None:
        """A write whose answer the caller does not use: its status checked (an ApiError as
        from `request`), its body read to keep the connection and dropped undecoded."""
        resp = self._send(method, path, None, body, "application/json", None)
        data = self._body(resp)
        if not 200 <= resp.status < 300:
            raise _error(resp.status, data)

    def get(self, path: str, **query: str | int | bool) -> JSON | None:
        """The object, or None when it does not exist."""
        try:
            return self.request("GET", path, query=query)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def get_as(self, path: str, shape: type[T] | pages.Shape[T]) -> T | None:
        """The object decoded as `shape` (its other fields skipped unread, never built), or
        None when it does not exist: a read costs the object's bytes and the shape, nothing
        more."""
        resp = self._send("GET", path, None, None, "application/json", None)
        data = self._body(resp)
        if resp.status == 404:
            return None
        if not 200 <= resp.status < 300:
            raise _error(resp.status, data)
        decoders: pages.Shape[T] = _shapes(shape)
        try:
            return decoders.element(data, "object")
        except pages.ListError as err:
            raise ApiError(0, "BadResponse", f"GET {path}: {err}") from None

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
        shape: type[T] | pages.Shape[T],
        *,
        query: Mapping[str, str] | None = None,
        limit: int = PAGE,
    ) -> tuple[Iterator[T], str]: ...

    def list(
        self,
        path: str,
        shape: type[Any] | pages.Shape[Any] | None = None,
        *,
        query: Mapping[str, str] | None = None,
        limit: int = PAGE,
    ) -> tuple[Iterator[Any], str]:
        """Every object at `path`, `limit` a page: (the objects, as `shape` or as dicts, read
        and decoded one at a time as each page arrives; the list's resourceVersion, read from
        the first page before its items). Only the object being decoded is held, and a buffer
        (`podcert.client.pages`). The iterator raises ApiError (Gone when a continue token expired;
        BadResponse for what is not a list page) if a later page fails: the caller must then
        list again, never watch from the version. An iterator dropped half way closes its
        connection."""
        decoders = _shapes(shape)
        first = [self._page(path, decoders, limit, "", query or {})]
        version = first[0].metadata().resourceVersion

        def items() -> Iterator[Any]:
            page = first.pop()  # no reference left to the first page once it is read
            while True:
                yield from page
                token = page.metadata().continue_
                if not token:
                    return
                del page
                page = self._page(path, decoders, limit, token, query or {})

        return items(), version

    def _page(
        self,
        path: str,
        decoders: pages.Shape[Any],
        limit: int,
        token: str,
        query: Mapping[str, str],
    ) -> _Page:
        params: dict[str, str | int | bool] = {**query, "limit": limit}
        if token:
            params["continue"] = token
        resp = self._send("GET", path, params, None, "application/json", None)
        if not 200 <= resp.status < 300:
            raise _error(resp.status, self._body(resp))
        return _Page(pages.Page(self._pieces(resp), decoders), path)

    def _pieces(self, resp: transport.Response) -> Iterator[bytes]:
        """The body's pieces; the connection kept once it is read to its end, else closed."""
        ended = False
        try:
            yield from resp.pieces()
            ended = True
        except OSError as err:  # the API server went away mid-answer
            raise self._unavailable(err) from None
        finally:
            if ended:
                self._pool.release(resp)
            else:
                self._pool.discard(resp)

    def watch(
        self,
        path: str,
        resource_version: str,
        timeout_seconds: int = 300,
        shape: type[Any] | pages.Shape[Any] | None = None,
        **query: str,
    ) -> Iterator[JSON]:
        """Watch events from `resource_version`: {"type", "object"}, the object a dict or, with
        `shape`, that shape. Raises Gone on 410 (as status or ERROR event); ApiError(0,
        "Unavailable") when the stream breaks off."""
        params: dict[str, str | int | bool] = {
            **query,
            "watch": True,
            "resourceVersion": resource_version,
            "allowWatchBookmarks": True,
            "timeoutSeconds": timeout_seconds,
        }
        objects = _shapes(shape)
        timeouts = (WATCH_CONNECT_TIMEOUT, float(timeout_seconds + 30))
        resp = self._send("GET", path, params, None, "application/json", timeouts)
        if not 200 <= resp.status < 300:
            raise _error(resp.status, self._body(resp))
        ended = False
        try:
            rest = b""
            for chunk in resp.chunks():
                *lines, rest = (rest + chunk).split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = _EVENT.decode(line)
                    if event.type == "ERROR":
                        code = _DICT.decode(event.object).get("code")
                        status = code if isinstance(code, int) and 400 <= code < 600 else 500
                        raise _error(status, bytes(event.object))
                    yield {"type": event.type, "object": objects.element(event.object, "object")}
            ended = True
        except OSError as err:  # the API server went away mid-stream
            raise ApiError(0, "Unavailable", f"watch stream broke: {err}") from None
        except (msgspec.DecodeError, pages.ListError) as err:
            raise ApiError(0, "BadResponse", f"watch {path}: {err}") from None
        finally:
            # A stream read to its end leaves the connection reusable; one left half way (an
            # error, or the caller stopped iterating) has unread bytes on it.
            if ended:
                self._pool.release(resp)
            else:
                self._pool.discard(resp)


_SHAPES: Final[dict[type[Any], pages.Shape[Any]]] = {}
_DICTS: Final[pages.Shape[JSON]] = pages.Shape(dict[str, Any])


def _shapes(shape: type[Any] | pages.Shape[Any] | None) -> pages.Shape[Any]:
    """The decoders of a shape, made once (msgspec compiles a decoder per type)."""
    if shape is None:
        return _DICTS
    if isinstance(shape, pages.Shape):
        return shape
    found = _SHAPES.get(shape)
    if found is None:
        found = _SHAPES[shape] = pages.Shape(shape)
    return found


class _Page:
    """One page being read: its elements and metadata, every failure an ApiError."""

    def __init__(self, page: pages.Page[Any], path: str) -> None:
        self._page, self._path = page, path

    def metadata(self) -> pages.ListMeta:
        try:
            return self._page.metadata()
        except pages.ListError as err:
            raise ApiError(0, "BadResponse", f"list {self._path}: {err}") from None

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self._page
        except pages.ListError as err:
            raise ApiError(0, "BadResponse", f"list {self._path}: {err}") from None


def resource_version(obj: Any) -> str:
    """metadata.resourceVersion of an object, a dict or a shape ("" when it has none)."""
    if isinstance(obj, Mapping):
        meta = obj.get("metadata")
        return str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""
    meta = getattr(obj, "metadata", None)
    # Shapes spell it as the API does; the typed request (`podcert.api.requests`) as Python does.
    found = getattr(meta, "resourceVersion", None) or getattr(meta, "resource_version", "")
    return str(found or "")


def path_of(group_version: str, resource: str, namespace: str | None = None, name: str = "") -> str:
    """The REST path of a resource: core ("v1") or "group/version"."""
    base = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    if namespace:
        base += f"/namespaces/{quote(namespace, safe='')}"
    base += f"/{resource}"
    if name:
        base += f"/{quote(name, safe='')}"
    return base
