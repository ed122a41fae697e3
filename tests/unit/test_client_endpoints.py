"""podcert.client.endpoints: where a client's connections go, read from its settings. The server
URL's host, port (the scheme's by default) and path prefix; the name TLS checks (the server's
host unless the settings name another); the proxy and its Basic credentials, percent-decoded; the
Host header, without the scheme's default port; and the TLS context of each new connection,
fixed or asked of the certificate files as they are replaced, with none at all over http://."""

from __future__ import annotations

import base64
import ssl
from typing import Any, cast

import pytest

from podcert.client.clientcerts import CertFiles
from podcert.client.endpoints import Endpoint
from podcert.client.kubeconfig import ClientSettings

CONTEXT = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


@pytest.mark.parametrize(
    ("server", "where", "prefix", "host_header"),
    [
        pytest.param("https://10.0.0.1:6443", ("10.0.0.1", 6443), "", "10.0.0.1:6443", id="port"),
        pytest.param(
            "https://api.example.com",
            ("api.example.com", 443),
            "",
            "api.example.com",
            id="https default",
        ),
        pytest.param(
            "https://api.example.com:443/",
            ("api.example.com", 443),
            "",
            "api.example.com",
            id="443 and a slash",
        ),
        pytest.param(
            "https://lb.example.com/k8s/cluster-a/",
            ("lb.example.com", 443),
            "/k8s/cluster-a",
            "lb.example.com",
            id="a path prefix",
        ),
        pytest.param("https://[fd00::1]:6443", ("fd00::1", 6443), "", "[fd00::1]:6443", id="IPv6"),
    ],
)
def test_a_tls_server_url_gives_host_port_prefix_and_host_header(
    server: str, where: tuple[str, int], prefix: str, host_header: str
) -> None:
    endpoint = Endpoint.of(ClientSettings(server, CONTEXT))
    assert (endpoint.host, endpoint.port) == where
    assert endpoint.prefix == prefix
    assert endpoint.host_header == host_header
    assert endpoint.server_hostname == where[0]
    assert endpoint.context is CONTEXT
    assert (endpoint.proxy, endpoint.proxy_auth) == (None, None)


def test_a_plain_http_server_has_no_tls_and_port_80_by_default() -> None:
    endpoint = Endpoint.of(ClientSettings("http://127.0.0.1", CONTEXT))
    assert (endpoint.host, endpoint.port, endpoint.context) == ("127.0.0.1", 80, None)
    assert endpoint.tls() == (0, None)
    assert endpoint.host_header == "127.0.0.1"
    assert Endpoint.of(ClientSettings("http://127.0.0.1:443", None)).host_header == "127.0.0.1:443"


def test_tls_checks_the_name_the_settings_give() -> None:
    settings = ClientSettings(
        "https://10.96.0.1:443", CONTEXT, tls_server_name="kubernetes.default.svc"
    )
    endpoint = Endpoint.of(settings)
    assert endpoint.server_hostname == "kubernetes.default.svc"
    assert endpoint.where == "10.96.0.1:443"


@pytest.mark.parametrize(
    ("proxy", "where", "credentials"),
    [
        pytest.param("http://proxy:3128", ("proxy", 3128), None, id="no credentials"),
        pytest.param("http://proxy", ("proxy", 80), None, id="port 80 by default"),
        pytest.param("http://me:s3cret@proxy:3128", ("proxy", 3128), "me:s3cret", id="user"),
        pytest.param(
            "http://d%40main:p%3Ass@proxy:3128", ("proxy", 3128), "d@main:p:ss", id="escaped"
        ),
        pytest.param("http://me@proxy:3128", ("proxy", 3128), "me:", id="no password"),
    ],
)
def test_a_proxy_and_its_basic_credentials(
    proxy: str, where: tuple[str, int], credentials: str | None
) -> None:
    endpoint = Endpoint.of(ClientSettings("https://10.0.0.1:6443", CONTEXT, proxy=proxy))
    assert endpoint.proxy == where
    if credentials is None:
        assert endpoint.proxy_auth is None
    else:
        assert endpoint.proxy_auth == "Basic " + base64.b64encode(credentials.encode()).decode()
    assert endpoint.where == "10.0.0.1:6443", "the tunnel goes to the API server"


class Rotating:
    """A CertFiles stand-in: the generation and context a new connection gets now."""

    def __init__(self) -> None:
        self.generation = 1
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)

    def current(self) -> tuple[int, ssl.SSLContext]:
        return self.generation, self.context


def test_each_connection_asks_certificate_files_for_the_current_context() -> None:
    files = Rotating()
    settings = ClientSettings("https://10.0.0.1:6443", CONTEXT, client_certs=cast(CertFiles, files))
    endpoint = Endpoint.of(settings)
    assert endpoint.context is CONTEXT
    assert endpoint.tls() == (1, files.context)
    files.generation, files.context = 2, ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    assert endpoint.tls() == (2, files.context)


def test_certificate_files_are_not_asked_over_plain_http() -> None:
    files: Any = Rotating()
    endpoint = Endpoint.of(ClientSettings("http://10.0.0.1:8080", None, client_certs=files))
    assert endpoint.contexts is None
    assert endpoint.tls() == (0, None)


def test_a_fixed_context_is_generation_zero() -> None:
    endpoint = Endpoint.of(ClientSettings("https://10.0.0.1:6443", CONTEXT))
    assert endpoint.tls() == (0, CONTEXT)
