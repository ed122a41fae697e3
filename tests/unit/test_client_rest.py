"""`podcert.client.rest.Rest`, what it makes of the API server's answers, against a small scripted
server on loopback (`tests.canned_rest.Server`): an error answer keeps its status, reason and
message, a missing object is None; a query is encoded and the server URL's path prefix kept; a
token that is no header value is refused, never sent; a watch streams its events line by line
across chunks, an expired one raises Gone and a broken one is a plain retryable error; a list is
read a page at a time and an element at a time as it arrives, its version from the first page;
a shaped read decodes only its shape; and a watch or a list left half way never leaves its
connection to the next request. (The connections themselves are test_client_transport.py's.)

Found earlier by tests/integration/test_faults.py: an API server going away mid-watch must be a
plain retry for the reflectors, not an unexpected error with a traceback.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import msgspec
import pytest

from podcert.client import pages
from podcert.client.kubeconfig import ClientConfigError, ClientSettings, Impersonation
from podcert.client.rest import ApiError, Gone, Rest
from tests.canned_rest import Server, answer, chunked, event, rest_for, scripted_servers


@pytest.fixture
def serve() -> Iterator[Callable[..., Server]]:
    with scripted_servers() as start:
        yield start


# --- requests and their answers -------------------------------------------------------------------


def test_error_answers_keep_their_status_and_reason(serve: Callable[..., Server]) -> None:
    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while (request := server.read(reader)) is not None:
            if request.target.startswith("/missing"):
                status = {"kind": "Status", "code": 404, "reason": "NotFound", "message": "no"}
                sock.sendall(answer(404, status))
            elif request.target == "/text":
                sock.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 5\r\n\r\noops!")
            else:
                conflict = {"kind": "Status", "reason": "Conflict", "message": "changed"}
                sock.sendall(answer(409, conflict))

    server = serve(handler)
    rest = rest_for(server)
    assert rest.get("/missing") is None
    with pytest.raises(ApiError) as raised:
        rest.request("PUT", "/conflict", body={})
    assert (raised.value.status, raised.value.reason, raised.value.message) == (
        409,
        "Conflict",
        "changed",
    )
    with pytest.raises(ApiError, match="502 Error: oops!"):
        rest.request("GET", "/text")
    with pytest.raises(ApiError) as raised:
        rest.write("PUT", "/conflict", body={})  # an answer not decoded, its status still checked
    assert (raised.value.status, raised.value.message) == (409, "changed")
    assert server.connections == 1  # error answers leave the connection usable


def test_a_query_is_encoded_and_a_path_prefix_kept(serve: Callable[..., Server]) -> None:
    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while server.read(reader) is not None:
            sock.sendall(answer(200, {}))

    server = serve(handler)
    rest = Rest(ClientSettings(server.url + "/k8s", None))
    rest.request("GET", "/api/v1/pods", query={"labelSelector": "a=b,c", "watch": True})
    assert server.requests[0].target == "/k8s/api/v1/pods?labelSelector=a%3Db%2Cc&watch=true"


def test_a_token_that_is_no_header_value_is_refused_not_sent(
    serve: Callable[..., Server],
) -> None:
    server = serve(lambda _n, reader, _sock: server.read(reader))
    rest = Rest(ClientSettings(server.url, None, token=lambda: "t€ken", source="kubeconfig k"))
    with pytest.raises(ClientConfigError) as raised:
        rest.get("/x")
    assert str(raised.value) == "kubeconfig k: the bearer token is not one line of ASCII"
    assert "t€ken" not in str(raised.value)
    assert server.requests == []


def test_every_request_carries_the_impersonation(serve: Callable[..., Server]) -> None:
    server, plain = serve_with(serve, accepting("")), serve_with(serve, accepting(""))
    who = Impersonation("jane@example.com", ("auditors",), uid="42")
    rest = rest_for(server, impersonate=who)
    rest.get("/a")
    rest.request("POST", "/b", body={})
    for request in server.requests:
        assert request.headers["impersonate-user"] == "jane@example.com"
        assert request.headers["impersonate-group"] == "auditors"
        assert request.headers["impersonate-uid"] == "42"
    rest_for(plain).get("/a")
    assert not any(name.startswith("impersonate") for name in plain.requests[0].headers)


class PluginToken:
    """A token source like an exec plugin's: `refresh(used)` fetches the next token."""

    def __init__(self, *tokens: str) -> None:
        self.tokens = list(tokens)
        self.refreshes = 0

    def __call__(self) -> str:
        return self.tokens[0]

    def refresh(self, used: str) -> bool:
        self.refreshes += 1
        if self.tokens[0] == used and len(self.tokens) > 1:
            self.tokens.pop(0)
        return self.tokens[0] != used


def accepting(*good: str) -> Callable[[Server], Callable[[int, BinaryIO, socket.socket], None]]:
    """A handler answering 200 to a bearer token in `good`, else 401."""

    def make(server: Server) -> Callable[[int, BinaryIO, socket.socket], None]:
        def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
            while (request := server.read(reader)) is not None:
                token = request.headers.get("authorization", "").removeprefix("Bearer ")
                unauthorized = {"kind": "Status", "reason": "Unauthorized", "message": "no"}
                sock.sendall(
                    answer(200, {"ok": token}) if token in good else answer(401, unauthorized)
                )

        return handler

    return make


def serve_with(serve: Callable[..., Server], make: Any) -> Server:
    holder: list[Server] = []
    server = serve(lambda n, reader, sock: make(holder[0])(n, reader, sock))
    holder.append(server)
    return server


def test_a_401_refreshes_a_plugin_token_and_sends_the_request_once_more(
    serve: Callable[..., Server],
) -> None:
    server = serve_with(serve, accepting("new"))
    token = PluginToken("old", "new")
    rest = rest_for(server, token=token)

    assert rest.request("POST", "/things", body={"a": 1}) == {"ok": "new"}
    assert [r.headers["authorization"] for r in server.requests] == ["Bearer old", "Bearer new"]
    assert server.requests[0].body == server.requests[1].body == b'{"a":1}'
    assert token.refreshes == 1


def test_a_401_to_the_new_token_too_is_the_answer_not_a_loop(serve: Callable[..., Server]) -> None:
    server = serve_with(serve, accepting())
    token = PluginToken("old", "new", "newer")
    rest = rest_for(server, token=token)

    with pytest.raises(ApiError) as raised:
        rest.get("/x")
    assert raised.value.status == 401
    assert len(server.requests) == 2 and token.refreshes == 1


def test_a_401_to_a_token_that_cannot_refresh_is_not_sent_again(
    serve: Callable[..., Server],
) -> None:
    server = serve_with(serve, accepting())
    rest = rest_for(server, token=lambda: "static")

    with pytest.raises(ApiError, match="401"):
        rest.get("/x")
    assert len(server.requests) == 1


def test_dropping_a_rest_closes_its_idle_connections(serve: Callable[..., Server]) -> None:
    closed = threading.Event()

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while server.read(reader) is not None:
            sock.sendall(answer(200, {}))
        closed.set()

    server = serve(handler)
    rest = rest_for(server)
    rest.get("/x")
    rest.close()
    assert closed.wait(5)


# --- watches --------------------------------------------------------------------------------------


def test_a_watch_streams_events_split_across_chunks(serve: Callable[..., Server]) -> None:
    pods = [{"metadata": {"name": f"p{i}", "resourceVersion": str(i)}} for i in range(3)]
    stream = b"".join(event("ADDED", pod) for pod in pods)
    released = threading.Event()

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while (request := server.read(reader)) is not None:
            if "watch=true" in request.target:
                sock.sendall(chunked(stream[:10], stream[10:70], stream[70:]) + b"0\r\n\r\n")
            else:
                sock.sendall(answer(200, {}))
                released.set()

    server = serve(handler)
    rest = rest_for(server)
    events = list(rest.watch("/api/v1/pods", "1", timeout_seconds=5))

    assert [e["object"] for e in events] == pods
    assert "resourceVersion=1" in server.requests[0].target
    assert "allowWatchBookmarks=true" in server.requests[0].target
    rest.get("/after")  # the watch's connection, read to its end, is reused
    assert server.connections == 1


def test_a_watch_stream_cut_short_is_an_unavailable_api_error(
    serve: Callable[..., Server],
) -> None:
    pod = {"metadata": {"name": "p", "resourceVersion": "7"}}

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        server.read(reader)
        sock.sendall(chunked(event("ADDED", pod)) + b'40\r\n{"type":')  # then gone
        sock.shutdown(socket.SHUT_RDWR)

    server = serve(handler)
    events = rest_for(server).watch("/api/v1/pods", "1")
    assert next(events)["object"] == pod
    with pytest.raises(ApiError) as broke:
        next(events)
    assert (broke.value.status, broke.value.reason) == (0, "Unavailable")
    assert broke.value.retryable
    assert "watch stream broke" in str(broke.value)


def test_an_expired_watch_raises_gone(serve: Callable[..., Server]) -> None:
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while server.read(reader) is not None:
            sock.sendall(chunked(event("ERROR", status)) + b"0\r\n\r\n")

    server = serve(handler)
    with pytest.raises(Gone, match="410 Expired: too old"):
        list(rest_for(server).watch("/api/v1/pods", "1"))


def test_a_watch_error_event_with_an_odd_code_is_an_api_error(
    serve: Callable[..., Server],
) -> None:
    status = {"kind": "Status", "code": "gone", "reason": "Expired", "message": "?"}

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        server.read(reader)
        sock.sendall(chunked(event("ERROR", status)) + b"0\r\n\r\n")

    server = serve(handler)
    with pytest.raises(ApiError) as raised:
        list(rest_for(server).watch("/api/v1/pods", "1"))
    assert (raised.value.status, raised.value.reason) == (500, "Expired")


def test_a_watch_left_half_way_does_not_leave_its_connection_for_others(
    serve: Callable[..., Server],
) -> None:
    pod = {"metadata": {"name": "p", "resourceVersion": "7"}}

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while (request := server.read(reader)) is not None:
            if "watch=true" in request.target:
                sock.sendall(chunked(event("ADDED", pod), event("ADDED", pod)))
            else:
                sock.sendall(answer(200, {"plain": True}))

    server = serve(handler)
    rest = rest_for(server)
    events = rest.watch("/api/v1/pods", "1")
    next(events)
    events.close()  # the caller stopped: the rest of the stream is unread

    assert rest.get("/x") == {"plain": True}
    assert server.connections == 2


# --- lists and shaped reads -----------------------------------------------------------------------


class PodName(msgspec.Struct, frozen=True):
    class Meta(msgspec.Struct, frozen=True):
        name: str = ""

    metadata: Meta = Meta()


def test_a_list_page_is_decoded_as_it_arrives(serve: Callable[..., Server]) -> None:
    """The first pod is handed out while the rest of its page is still to come: a page is never
    held whole (the server sends the rest only once the client has the first), only a buffer
    of about `pages.PIECE` bytes."""
    first_seen = threading.Event()
    rest_sent: list[bool] = []
    pods = [{"metadata": {"name": f"p{i}"}, "spec": {"x": "y" * 100_000}} for i in range(20)]
    body = json.dumps({"metadata": {"resourceVersion": "42"}, "items": pods}).encode()
    cut = body.index(b'{"metadata": {"name": "p15"}')
    assert cut > pages.PIECE

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        server.read(reader)
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        sock.sendall(head + b"%x\r\n%s\r\n" % (cut, body[:cut]))
        rest_sent.append(first_seen.wait(5))
        sock.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body) - cut, body[cut:]))

    server = serve(handler)
    items, version = rest_for(server).list("/api/v1/pods", PodName)
    assert version == "42"
    assert next(items).metadata.name == "p0"
    first_seen.set()
    assert [p.metadata.name for p in items] == [f"p{i}" for i in range(1, 20)]
    assert rest_sent == [True], "the client waited for the whole page before its first pod"


def test_a_list_reads_every_page_and_its_version_from_the_first(
    serve: Callable[..., Server],
) -> None:
    answers = {
        "": {"metadata": {"resourceVersion": "9", "continue": "c1"}, "items": [{"n": 0}]},
        # A later page's metadata after its items: its continue token is still read.
        "c1": {
            "items": [{"n": 1}, {"n": 2}],
            "metadata": {"resourceVersion": "9", "continue": "c2"},
        },
        "c2": {"items": [{"n": 3}], "metadata": {"resourceVersion": "9"}},
    }

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while (request := server.read(reader)) is not None:
            token = request.target.partition("continue=")[2]
            sock.sendall(chunked(json.dumps(answers[token]).encode()) + b"0\r\n\r\n")

    server = serve(handler)
    items, version = rest_for(server).list("/api/v1/pods", limit=1)
    assert version == "9"
    assert list(items) == [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}]
    assert all("limit=1" in r.target for r in server.requests)
    assert server.connections == 1, "each page read to its end leaves the connection reusable"


def test_a_first_page_with_its_metadata_after_the_items_still_gives_the_version(
    serve: Callable[..., Server],
) -> None:
    page = {"items": [{"n": 0}, {"n": 1}], "metadata": {"resourceVersion": "5"}}

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        server.read(reader)
        sock.sendall(answer(200, page))

    items, version = rest_for(server := serve(handler)).list("/api/v1/pods")
    assert version == "5"
    assert list(items) == page["items"]


def test_a_list_left_half_way_closes_its_connection(serve: Callable[..., Server]) -> None:
    body = {"metadata": {"resourceVersion": "1"}, "items": [{"n": "x" * pages.PIECE}] * 3}

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while (request := server.read(reader)) is not None:
            if "limit=" in request.target:
                sock.sendall(answer(200, body))
            else:
                sock.sendall(answer(200, {"plain": True}))

    server = serve(handler)
    rest = rest_for(server)
    items, _ = rest.list("/api/v1/pods")
    next(items)
    items.close()  # the caller stopped with the page unread

    assert rest.get("/x") == {"plain": True}
    assert server.connections == 2


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"metadata":{},"items":[{"n":1},', id="a page cut short"),
        pytest.param(b'{"metadata":{},"items":[{"n":1}}', id="a page not JSON"),
        pytest.param(b'{"metadata":{},"items":[1]}', id="an item not an object"),
        pytest.param(b'{"metadata":{},"items":[]} {}', id="more after the page"),
        pytest.param(b'{"items":[],"items":[]}', id="items twice"),
    ],
)
@pytest.mark.parametrize("framing", ["chunked", "to the end"])
def test_a_broken_list_page_is_a_bad_response(
    serve: Callable[..., Server], body: bytes, framing: str
) -> None:
    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        server.read(reader)
        if framing == "chunked":  # no last chunk: the server went away after the body
            sock.sendall(chunked(body))
        else:
            sock.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body)
        sock.shutdown(socket.SHUT_RDWR)

    server = serve(handler)
    with pytest.raises(ApiError) as failed:
        items, _ = rest_for(server).list("/api/v1/pods")
        list(items)
    assert (failed.value.status, failed.value.reason) == (0, "BadResponse"), failed.value
    assert failed.value.retryable


def test_a_shaped_get_decodes_only_the_shape(serve: Callable[..., Server]) -> None:
    pod = {"metadata": {"name": "p", "annotations": {"a": "b" * 1000}}, "spec": {}}

    def handler(_n: int, reader: BinaryIO, sock: socket.socket) -> None:
        while (request := server.read(reader)) is not None:
            if request.target.endswith("/gone"):
                sock.sendall(answer(404, {"kind": "Status", "reason": "NotFound"}))
            elif request.target.endswith("/odd"):
                sock.sendall(answer(200, [1, 2]))
            else:
                sock.sendall(answer(200, pod))

    rest = rest_for(server := serve(handler))
    assert rest.get_as("/api/v1/pods/p", PodName) == PodName(PodName.Meta("p"))
    assert rest.get_as("/api/v1/pods/gone", PodName) is None
    with pytest.raises(ApiError) as odd:
        rest.get_as("/api/v1/pods/odd", PodName)
    assert (odd.value.status, odd.value.reason) == (0, "BadResponse")
