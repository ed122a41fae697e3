"""Which proxy the environment names for a URL: HTTPS_PROXY / HTTP_PROXY unless NO_PROXY covers
the host, decided as Go's golang.org/x/net/http/httpproxy decides it for client-go and kubectl,
so that podcert goes where kubectl goes.

Upper-case names win over lower-case ones; ALL_PROXY is not read; localhost and loopback
addresses never go through a proxy; NO_PROXY entries are `*`, CIDR ranges (10.0.0.0/8), IPs
(with an optional port), and domains (`example.com` covers itself and its subdomains,
`.example.com` and `*.example.com` only subdomains), each with an optional port. Where Go quietly
goes direct on a proxy variable it cannot parse, `proxy_for` raises ProxyError naming the
variable; so it does for a proxy that is not http:// (the only kind podcert's transport speaks).
tests/integration/test_reference_kubeconfig.py pins it to httpproxy. Pure.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Final
from urllib.parse import SplitResult, urlsplit

from podcert.errors import ConfigError

_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class ProxyError(ConfigError):
    """A proxy variable that cannot be used; the message names it, never its credentials."""


def proxy_for(url: str, environ: Mapping[str, str]) -> str | None:
    """The proxy URL (http://[user:pass@]host:port) requests to `url` go through, or None."""
    target = urlsplit(url)
    name = {"https": "HTTPS_PROXY", "http": "HTTP_PROXY"}.get(target.scheme)
    if name is None:
        return None
    value = environ.get(name) or environ.get(name.lower())
    if not value:
        return None
    if name == "HTTP_PROXY" and environ.get("REQUEST_METHOD"):
        raise ProxyError("HTTP_PROXY is not used in a CGI environment (REQUEST_METHOD is set)")
    host = target.hostname or ""
    port = str(target.port or _DEFAULT_PORTS[target.scheme])
    if not _use_proxy(host, port, environ.get("NO_PROXY") or environ.get("no_proxy") or ""):
        return None
    proxy = _parse(value)
    if proxy is None:
        raise ProxyError(f"the {name} environment variable is not a proxy URL")
    if proxy.scheme != "http":
        raise ProxyError(f"the {name} environment variable names a proxy other than http://")
    return proxy.geturl()


def _parse(value: str) -> SplitResult | None:
    """Go's parseProxy: the URL as given when it has a scheme and a host, else http:// + it."""
    for candidate in (value, "http://" + value):
        try:
            parts = urlsplit(candidate)
        except ValueError:
            continue
        if parts.scheme and parts.hostname:
            try:
                parts.port  # noqa: B018 (raises on a port out of range, which Go would dial)
            except ValueError:
                return None
            return parts
    return None


def _use_proxy(host: str, port: str, no_proxy: str) -> bool:
    if host == "localhost":
        return False
    address = _address(host)
    if address is not None and address.is_loopback:
        return False
    host = host.strip().lower()
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return False
        if (network := _cidr(entry)) is not None:
            if address is not None and _in_network(address, network):
                return False
            continue
        entry_host, entry_port = _split_host_port(entry)
        if not entry_host:
            continue
        entry_address = _address(entry_host)
        if entry_address is not None:
            if address == entry_address and entry_port in ("", port):
                return False
            continue
        if address is not None or entry_port not in ("", port):
            continue
        if entry_host.startswith("*."):
            entry_host = entry_host[1:]
        exact = not entry_host.startswith(".")
        suffix = entry_host if not exact else "." + entry_host
        if host.endswith(suffix) or (exact and host == entry_host):
            return False
    return True


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _cidr(entry: str) -> Network | None:
    """The address range `entry` is as Go's net.ParseCIDR reads it, or None: an address without
    a zone, '/', then decimal digits (leading zeros allowed) up to the address's bits; a
    netmask such as /255.0.0.0 is no range (Go then takes the entry for a domain). A range of
    IPv4-mapped IPv6 addresses (::ffff:10.0.0.0/104) is the IPv4 range, as Go compares them."""
    text, slash, bits = entry.partition("/")
    if not slash or not bits.isascii() or not bits.isdigit() or "%" in text:
        return None
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    prefix = int(bits)
    if prefix > address.max_prefixlen:
        return None
    network = ipaddress.ip_network((address, prefix), strict=False)
    mapped = network.network_address.ipv4_mapped if network.version == 6 else None
    if mapped is not None and prefix >= 96:
        return ipaddress.IPv4Network((mapped, prefix - 96), strict=False)
    return network


def _split_host_port(entry: str) -> tuple[str, str]:
    """Go's net.SplitHostPort where it succeeds (brackets dropped), else (entry, "")."""
    host, colon, port = entry.rpartition(":")
    if not colon:
        return entry, ""
    if host.startswith("["):
        if not host.endswith("]") or "[" in host[1:] or "]" in host[:-1]:
            return entry, ""
        return host[1:-1], port
    if ":" in host or "[" in host or "]" in host or "]" in port or "[" in port:
        return entry, ""
    return host, port


def _address(host: str) -> Address | None:
    """The IP address `host` is, an IPv4-mapped IPv6 one as its IPv4 address (Go compares them
    so), or None for a name."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _in_network(address: Address, network: Network) -> bool:
    return address.version == network.version and address in network
