"""The kubeconfig reader pinned to client-go, and the proxy environment to Go's httpproxy.

`podcert.kubeconfig.from_kubeconfig` and client-go v0.37.2 (clientcmd's current context, as
kubectl reads it with no flags, then rest.TLSConfigFor and rest.TransportFor, which load every
file and PEM it names; tests/interop/reference) read the same generated kubeconfigs: valid and
broken ones, missing fields, token and tokenFile both, data and files both, relative paths,
auth providers, several contexts. Both refuse, or both resolve the same base URL, trusted CAs,
client certificate, bearer token, TLS server name and proxy. Where podcert refuses what
client-go takes, it is one of these deliberate strictnesses (each refusal names its field):
- what podcert does not do: auth-provider plugins, basic auth, impersonation, exec plugins
  (pinned with E's tests), https:// and socks5:// proxies;
- a server without a scheme: client-go guesses http or https from whether TLS settings are
  present; podcert refuses to guess;
- a token that is not one printable line, and a tokenFile that cannot be read even when a token
  is given beside it (client-go would send a header it cannot, or fall back silently);
- a CA or client certificate file client-go reads past (PEM junk it skips: `bundles.pem`'s
  strictness does not apply here, OpenSSL reads these), or PEM OpenSSL refuses.

`podcert.proxies.proxy_for` and httpproxy (what client-go's transport consults) answer the same
for generated environments (upper and lower case, NO_PROXY with `*`, CIDRs, IPs with and
without ports, domains with a leading dot or `*.`) and server URLs.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from podcert import proxies
from tests.integration.reference import DIFFERENTIAL, Reference

PROXIES = [
    "http://proxy:3128", "proxy:3128", "http://user:pass@proxy:3128", "HTTP://Proxy:3128",
    "https://proxy:443", "socks5://proxy:1080", "http://[bad", "", "http://proxy:99999",
]  # fmt: skip
NO_PROXY_ENTRIES = [
    "*", "10.0.0.0/8", "10.1.2.3", "10.1.2.3:6443", "10.1.2.3:443", "192.168.0.0/16",
    "fd00::/8", "fd00::1", "[fd00::1]:6443", "example.com", ".example.com", "*.example.com",
    "api.example.com:6443", "EXAMPLE.com", " example.com ", "", "10.0.0.0/33", "[::1]", ":6443",
    "kubernetes.default.svc", ".svc", "10.0.0.1/8",
]  # fmt: skip
SERVERS = [
    "https://10.1.2.3:6443", "https://10.200.0.1", "https://192.168.1.1:443",
    "https://[fd00::1]:6443", "https://[fe80::1]:6443", "https://example.com:6443",
    "https://api.example.com:6443", "https://apiexample.com", "https://API.Example.com",
    "http://10.1.2.3:8080", "https://127.0.0.1:6443", "https://localhost:6443",
    "https://[::1]:6443", "https://[::ffff:10.1.2.3]:6443", "https://kubernetes.default.svc",
]  # fmt: skip
VARIABLES = ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY"]
ENVIRON = st.fixed_dictionaries(
    {},
    optional={
        **{name: st.sampled_from(PROXIES) for name in VARIABLES},
        "NO_PROXY": st.lists(st.sampled_from(NO_PROXY_ENTRIES), max_size=4).map(",".join),
        "no_proxy": st.lists(st.sampled_from(NO_PROXY_ENTRIES), max_size=4).map(",".join),
        "REQUEST_METHOD": st.just("GET"),
    },
)


def unusable(proxy: str | None) -> bool:
    """A proxy URL podcert refuses: none, not http://, or a port out of range."""
    if proxy is None or not proxy.startswith("http://"):
        return True
    try:
        urlsplit(proxy).port  # noqa: B018
    except ValueError:
        return True
    return False


@pytest.fixture(scope="module")
def reference() -> Iterator[Reference]:
    with Reference.started() as started:
        yield started


@DIFFERENTIAL
@given(ENVIRON, st.sampled_from(SERVERS))
@example({"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "10.0.0.0/8"}, "https://10.1.2.3:6443")
@example({"HTTPS_PROXY": "http://proxy:3128"}, "https://127.0.0.1:6443")
@example({"HTTPS_PROXY": "http://u:1", "https_proxy": "http://l:1"}, "https://10.1.2.3:6443")
@example({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.1.2.3:6443"}, "https://10.1.2.3:6443")
@example({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*.example.com"}, "https://example.com:6443")
def test_the_proxy_environment_is_read_as_go_reads_it(
    reference: Reference, environ: dict[str, str], server: str
) -> None:
    theirs = reference.ask("proxy", environ=environ, url=server)
    try:
        ours = proxies.proxy_for(server, environ)
    except proxies.ProxyError as err:
        # Go goes direct on what it cannot parse, and dials a port out of range; podcert
        # speaks only http:// to proxies.
        assert "error" in theirs or unusable(theirs["proxy"]), f"Go: {theirs}; podcert: {err}"
        return
    assert "error" not in theirs, theirs
    assert ours == theirs["proxy"]
