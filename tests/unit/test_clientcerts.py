"""A client certificate and key named as files are followed as the kubelet renews them
(as client-go's cert_rotation.go does): read again at most once a second, a changed pair loaded
for new connections, a pair that does not load kept out with one line that names the files and
never quotes the key; and a kept-alive connection made with the old pair is not reused."""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from podcert.client import kubeconfig as kc
from podcert.client.clientcerts import REREAD_PERIOD, CertFiles, Seen, due, judge
from podcert.client.kubeconfig import ClientConfigError
from podcert.client.rest import Rest
from tests.unit.test_client_refusals import accept_in_threads

A, B = b"a" * 32, b"b" * 32


@pytest.mark.parametrize(
    ("seen", "now", "expected"),
    [
        pytest.param(Seen(10.0, A), 10.5, False, id="read half a second ago: not again"),
        pytest.param(Seen(10.0, A), 11.0, True, id="read a second ago: again"),
        pytest.param(Seen(10.0, A, refused=B), 11.0, True, id="a refused pair: still looked at"),
    ],
)
def test_the_files_are_read_at_most_once_a_period(seen: Seen, now: float, expected: bool) -> None:
    assert due(seen, now, REREAD_PERIOD) is expected


@pytest.mark.parametrize(
    ("seen", "digest", "verdict"),
    [
        pytest.param(Seen(0.0, A), A, "same", id="unchanged: kept"),
        pytest.param(Seen(0.0, A), B, "load", id="changed: loaded"),
        pytest.param(
            Seen(0.0, A, refused=B), B, "refused before", id="the same bad pair: not again"
        ),
        pytest.param(Seen(0.0, A, refused=B), b"c" * 32, "load", id="the next change: tried"),
        pytest.param(Seen(0.0, A, refused=B), A, "same", id="back to the pair in use: kept"),
    ],
)
def test_a_pair_read_is_judged_by_its_bytes(seen: Seen, digest: bytes, verdict: str) -> None:
    assert judge(seen, digest) == verdict


class Clock:
    """Made after the settings are loaded: CertFiles stamps its first read with the real clock."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def pair(ca: trustme.CA, name: str) -> tuple[bytes, bytes]:
    leaf = ca.issue_cert(f"{name}.example", common_name=f"system:node:{name}")
    return leaf.cert_chain_pems[0].bytes(), leaf.private_key_pem.bytes()


def write_pair(folder: Path, cert: bytes, key: bytes) -> None:
    """Replaced as the kubelet does: each file by a rename, so a reader sees one or the other."""
    for name, data in (("client.crt", cert), ("client.key", key)):
        (folder / f".{name}.tmp").write_bytes(data)
        (folder / f".{name}.tmp").replace(folder / name)


def files_kubeconfig(folder: Path, ca: trustme.CA, server: str) -> Path:
    doc = {
        "clusters": [
            {
                "name": "c",
                "cluster": {
                    "server": server,
                    "certificate-authority": str(folder / "ca.crt"),
                    "tls-server-name": "api.example",
                },
            }
        ],
        "users": [
            {"name": "u", "user": {"client-certificate": "client.crt", "client-key": "client.key"}}
        ],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    ca.cert_pem.write_to_path(str(folder / "ca.crt"))
    (folder / "kubeconfig").write_text(yaml.safe_dump(doc))
    return folder / "kubeconfig"


def certs_of(settings: kc.ClientSettings, clock: Clock) -> CertFiles:
    assert settings.client_certs is not None
    settings.client_certs.clock = clock
    return settings.client_certs


def subject(context: ssl.SSLContext, ca: trustme.CA) -> str:
    """The client certificate a context presents, read back by a TLS server on a socket pair."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("api.example").configure_cert(server)
    ca.configure_trust(server)
    server.verify_mode = ssl.CERT_REQUIRED
    left, right = socket.socketpair()
    seen: list[Any] = []

    def serve() -> None:
        with server.wrap_socket(right, server_side=True) as tls:
            seen.append(tls.getpeercert())

    thread = threading.Thread(target=serve)
    thread.start()
    with context.wrap_socket(left, server_hostname="api.example"):
        thread.join(5)
    return dict(x[0] for x in seen[0]["subject"])["commonName"]


def test_a_renewed_pair_is_presented_once_its_files_are_read_again(
    tmp_path: Path, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    write_pair(tmp_path, *pair(ca, "old"))
    settings = kc.load(files_kubeconfig(tmp_path, ca, "https://127.0.0.1:6443"))
    clock = Clock()
    certs = certs_of(settings, clock)
    generation, context = certs.current()
    assert subject(context, ca) == "system:node:old"

    write_pair(tmp_path, *pair(ca, "new"))
    clock.now += REREAD_PERIOD / 2
    assert certs.current() == (generation, context), "read again within a second"
    clock.now += REREAD_PERIOD / 2
    with caplog.at_level(logging.INFO, "podcert.kubeconfig"):
        renewed, new_context = certs.current()
    assert renewed == generation + 1 and subject(new_context, ca) == "system:node:new"
    assert "CN=system:node:new" in certs.identity and str(tmp_path / "client.crt") in certs.identity
    assert [r.getMessage() for r in caplog.records if "replaced" in r.getMessage()]

    clock.now += REREAD_PERIOD
    assert certs.current()[0] == renewed, "the same bytes again are no new pair"


@pytest.mark.parametrize(
    "half",
    [
        pytest.param("key of another", id="a key that does not match the certificate"),
        pytest.param("cut short", id="a certificate file cut short mid-write"),
        pytest.param("gone", id="the key file gone for a moment"),
    ],
)
def test_a_pair_that_does_not_load_keeps_the_last_with_one_line(
    tmp_path: Path, ca: trustme.CA, caplog: pytest.LogCaptureFixture, half: str
) -> None:
    write_pair(tmp_path, *pair(ca, "old"))
    settings = kc.load(files_kubeconfig(tmp_path, ca, "https://127.0.0.1:6443"))
    clock = Clock()
    certs = certs_of(settings, clock)
    first = certs.current()
    cert, key = pair(ca, "new")
    other_key = pair(ca, "other")[1]
    if half == "key of another":
        write_pair(tmp_path, cert, other_key)
    elif half == "cut short":
        write_pair(tmp_path, cert[: len(cert) // 2], key)
    else:
        write_pair(tmp_path, cert, key)
        (tmp_path / "client.key").unlink()

    with caplog.at_level(logging.INFO, "podcert.kubeconfig"):
        for _ in range(3):  # three looks at the same bad pair: one line
            clock.now += REREAD_PERIOD
            assert certs.current() == first
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert str(tmp_path / "client.crt") in lines[0] and "CN=system:node:old" in lines[0]
    for secret in (key, other_key):
        body = b"".join(secret.splitlines()[1:-1]).decode()
        assert body[:40] not in lines[0]

    write_pair(tmp_path, cert, key)  # the next change: tried, and taken
    clock.now += REREAD_PERIOD
    generation, context = certs.current()
    assert generation == first[0] + 1 and subject(context, ca) == "system:node:new"


def test_a_pair_in_one_file_is_followed_too(tmp_path: Path, ca: trustme.CA) -> None:
    """kubelet-client-current.pem holds both, and kubeconfigs name it twice."""
    cert, key = pair(ca, "old")
    (tmp_path / "current.pem").write_bytes(cert + key)
    config = files_kubeconfig(tmp_path, ca, "https://127.0.0.1:6443")
    doc = yaml.safe_load(config.read_text())
    doc["users"][0]["user"] = {"client-certificate": "current.pem", "client-key": "current.pem"}
    config.write_text(yaml.safe_dump(doc))
    settings = kc.load(config)
    clock = Clock()
    certs = certs_of(settings, clock)
    cert, key = pair(ca, "new")
    (tmp_path / "current.pem.tmp").write_bytes(key + cert)
    (tmp_path / "current.pem.tmp").replace(tmp_path / "current.pem")
    clock.now += REREAD_PERIOD
    assert subject(certs.current()[1], ca) == "system:node:new"
    assert "CN=system:node:new" in certs.identity


def test_unusable_files_at_start_are_still_refused(tmp_path: Path, ca: trustme.CA) -> None:
    cert, _ = pair(ca, "old")
    write_pair(tmp_path, cert, pair(ca, "other")[1])
    with pytest.raises(ClientConfigError, match="does not match the client certificate"):
        kc.load(files_kubeconfig(tmp_path, ca, "https://127.0.0.1:6443"))


def test_certificate_data_in_the_kubeconfig_is_not_re_read(tmp_path: Path, ca: trustme.CA) -> None:
    import base64

    cert, key = pair(ca, "old")
    config = files_kubeconfig(tmp_path, ca, "https://127.0.0.1:6443")
    doc = yaml.safe_load(config.read_text())
    doc["users"][0]["user"] = {
        "client-certificate-data": base64.b64encode(cert).decode(),
        "client-key-data": base64.b64encode(key).decode(),
    }
    config.write_text(yaml.safe_dump(doc))
    settings = kc.load(config)
    assert settings.client_certs is None
    assert "CN=system:node:old" in settings.who()


# --- over connections: a kept-alive connection made with the old pair is not reused ------------


@pytest.fixture
def mtls_server(ca: trustme.CA) -> Iterator[tuple[str, list[str]]]:
    """An HTTPS server on loopback that asks for a client certificate and answers 200 to every
    request, keeping connections alive; records the CN each connection presented."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("api.example").configure_cert(context)
    ca.configure_trust(context)
    context.verify_mode = ssl.CERT_REQUIRED
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[str] = []

    def serve(sock: socket.socket) -> None:
        try:
            with context.wrap_socket(sock, server_side=True) as tls:
                seen.append(dict(x[0] for x in tls.getpeercert()["subject"])["commonName"])  # type: ignore[index]
                reader = tls.makefile("rb")
                while line := reader.readline():
                    while reader.readline() not in (b"\r\n", b""):
                        pass
                    del line
                    tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        except OSError:
            pass

    accept_in_threads(listener, serve)
    yield f"https://127.0.0.1:{listener.getsockname()[1]}", seen
    listener.close()


def test_new_requests_present_the_renewed_pair_not_the_kept_alive_old_one(
    tmp_path: Path, ca: trustme.CA, mtls_server: tuple[str, list[str]]
) -> None:
    url, seen = mtls_server
    write_pair(tmp_path, *pair(ca, "old"))
    settings = kc.load(files_kubeconfig(tmp_path, ca, url))
    clock = Clock()
    certs_of(settings, clock)
    rest = Rest(settings, timeout=5.0)
    rest.get("/a")
    rest.get("/b")
    assert seen == ["system:node:old"], "one kept-alive connection"

    write_pair(tmp_path, *pair(ca, "new"))
    clock.now += REREAD_PERIOD
    rest.get("/c")
    rest.get("/d")
    assert seen == ["system:node:old", "system:node:new"]
    rest.close()
