"""podcert.client.proxies: which proxy the environment names for a URL, decided as Go's httpproxy
decides it. NO_PROXY's domains (with a leading dot or `*.` only their subdomains), IPs (IPv6 in
brackets, IPv4-mapped ones as IPv4), CIDR ranges and ports; the scheme's own variable; and a
variable that cannot be used refused by name, never quoting its credentials. (How a kubeconfig
picks its proxy from the environment is test_kubeconfig.py's; the differential against httpproxy
itself, tests/integration/test_reference_kubeconfig.py.)"""

from __future__ import annotations

import pytest

from podcert.client.proxies import ProxyError, proxy_for
from podcert.errors import ConfigError

PROXY = "http://proxy:3128"


@pytest.mark.parametrize(
    ("url", "no_proxy", "proxied"),
    [
        pytest.param("https://api.example.com", "example.com", False, id="a domain: itself"),
        pytest.param("https://a.b.example.com", "example.com", False, id="a domain: subdomains"),
        pytest.param("https://notexample.com", "example.com", True, id="a domain: not a suffix"),
        pytest.param("https://example.com", ".example.com", True, id=".domain: not itself"),
        pytest.param("https://api.example.com", ".example.com", False, id=".domain: subdomains"),
        pytest.param("https://example.com", "*.example.com", True, id="*.domain: not itself"),
        pytest.param("https://api.example.com", "*.example.com", False, id="*.domain: subdomains"),
        pytest.param("https://API.Example.COM", "example.com", False, id="any case"),
        pytest.param("https://api.example.com", " other.org , example.com ", False, id="a list"),
        pytest.param("https://api.example.com:6443", "example.com:6443", False, id="domain:port"),
        pytest.param("https://api.example.com", "example.com:6443", True, id="another port"),
        pytest.param("https://api.example.com", "*", False, id="*: nothing proxied"),
        pytest.param("https://10.1.2.3", "10.1.2.3", False, id="an IP"),
        pytest.param("https://10.1.2.4", "10.1.2.3", True, id="another IP"),
        pytest.param("https://10.1.2.3:6443", "10.1.2.3:6443", False, id="IP:port"),
        pytest.param("https://10.1.2.3", "10.0.0.0/8", False, id="in a CIDR"),
        pytest.param("https://11.1.2.3", "10.0.0.0/8", True, id="outside a CIDR"),
        pytest.param("https://api.example.com", "10.0.0.0/8", True, id="a CIDR never a name"),
        pytest.param("https://[fd00::1]:6443", "[fd00::1]:6443", False, id="[IPv6]:port"),
        pytest.param("https://[fd00::1]", "fd00::/8", False, id="an IPv6 CIDR"),
        pytest.param("https://10.1.2.3", "10.0.0.0/08", False, id="a CIDR with a leading zero"),
        pytest.param("https://10.1.2.3", "10.0.0.0/255.0.0.0", True, id="a netmask: no range"),
        pytest.param("https://10.1.2.3", "::ffff:10.0.0.0/104", False, id="mapped IPv4 range"),
        pytest.param("https://[fd00::1]", "0.0.0.0/0", True, id="an IPv4 range, an IPv6 host"),
        pytest.param("https://10.1.2.3", "10.0.0.0/33", True, id="a prefix too long: no range"),
        pytest.param("https://[fe80::1]", "fe80::1%eth0/64", True, id="a zone: no range"),
        pytest.param("https://[::ffff:10.1.2.3]", "10.1.2.3", False, id="IPv4-mapped"),
        pytest.param("https://10.1.2.3", "10.0.0.0/33", True, id="a CIDR that is none"),
        pytest.param("https://10.1.2.3", ",, ,", True, id="only empty entries"),
    ],
)
def test_no_proxy_entries_match_as_in_go(url: str, no_proxy: str, proxied: bool) -> None:
    environ = {"HTTPS_PROXY": PROXY, "NO_PROXY": no_proxy}
    assert proxy_for(url, environ) == (PROXY if proxied else None)


@pytest.mark.parametrize(
    "url", ["https://localhost:6443", "https://127.0.0.2", "https://[::1]:6443"]
)
def test_loopback_is_never_proxied(url: str) -> None:
    assert proxy_for(url, {"HTTPS_PROXY": PROXY}) is None


def test_each_scheme_takes_its_own_variable_upper_case_first() -> None:
    environ = {"HTTP_PROXY": "http://plain:1", "https_proxy": "http://secure:2"}
    assert proxy_for("http://10.0.0.1:8080", environ) == "http://plain:1"
    assert proxy_for("https://10.0.0.1:6443", environ) == "http://secure:2"
    assert proxy_for("ftp://10.0.0.1", environ) is None
    assert proxy_for("https://10.0.0.1", {"no_proxy": "10.0.0.1", "HTTPS_PROXY": PROXY}) is None
    both = {"NO_PROXY": "10.0.0.2", "no_proxy": "10.0.0.1", "HTTPS_PROXY": PROXY}
    assert proxy_for("https://10.0.0.1", both) == PROXY, "NO_PROXY wins over no_proxy"


@pytest.mark.parametrize(
    ("value", "proxy"),
    [
        pytest.param("proxy:3128", "http://proxy:3128", id="no scheme: http://"),
        pytest.param("HTTP://Proxy:3128", "http://Proxy:3128", id="a scheme in capitals"),
        pytest.param(
            "http://me:s3cret@proxy:3128", "http://me:s3cret@proxy:3128", id="credentials kept"
        ),
    ],
)
def test_a_proxy_is_taken_as_go_parses_it(value: str, proxy: str) -> None:
    assert proxy_for("https://10.0.0.1", {"HTTPS_PROXY": value}) == proxy


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        pytest.param(
            {"HTTPS_PROXY": "https://me:s3cret@proxy:443"},
            "the HTTPS_PROXY environment variable names a proxy other than http://",
            id="an https proxy",
        ),
        pytest.param(
            {"HTTPS_PROXY": "socks5://me:s3cret@proxy:1080"},
            "the HTTPS_PROXY environment variable names a proxy other than http://",
            id="a socks proxy",
        ),
        pytest.param(
            {"https_proxy": "http://me:s3cret@proxy:99999"},
            "the HTTPS_PROXY environment variable is not a proxy URL",
            id="a port out of range",
        ),
    ],
)
def test_a_proxy_that_cannot_be_used_is_refused_by_name_never_quoted(
    environ: dict[str, str], says: str
) -> None:
    with pytest.raises(ProxyError) as raised:
        proxy_for("https://10.0.0.1", environ)
    assert str(raised.value) == says
    assert "s3cret" not in str(raised.value)
    assert isinstance(raised.value, ConfigError), "a command answers it with exit 2"


def test_an_unusable_proxy_for_a_host_not_proxied_is_no_error() -> None:
    environ = {"HTTPS_PROXY": "socks5://proxy:1080", "NO_PROXY": "10.0.0.1"}
    assert proxy_for("https://10.0.0.1", environ) is None


def test_http_proxy_is_refused_in_a_cgi_environment() -> None:
    environ = {"HTTP_PROXY": PROXY, "REQUEST_METHOD": "GET"}
    with pytest.raises(ProxyError, match="CGI"):
        proxy_for("http://10.0.0.1", environ)
    assert proxy_for("https://10.0.0.1", {**environ, "HTTPS_PROXY": PROXY}) == PROXY
