"""The kubeconfig reader pinned to client-go, and the proxy environment to Go's httpproxy.

`podcert.client.kubeconfig.from_kubeconfig` and client-go v0.37.2 (clientcmd's current context, as
kubectl reads it with no flags, then rest.TLSConfigFor and rest.TransportFor, which load every
file and PEM it names; tests/interop/reference) read the same generated kubeconfigs: valid and
broken ones, missing fields, token and tokenFile both, data and files both, relative paths,
auth providers, exec plugins, impersonation, several contexts. A person's command
(`podcert.client.commandline.load`) and clientcmd's loading rules read the same generated
KUBECONFIG lists (several files, overlapping names, missing files) with a `--context`, `--as`
and `--as-group` override. Both refuse, or both resolve the same base URL, trusted CAs, client
certificate, bearer token and credential kind, TLS server name, proxy, namespace,
impersonation, and exec plugin's interactive mode and cluster info. Where podcert refuses what
client-go takes, it is one of these deliberate strictnesses (each refusal names its field):
- what podcert does not do: auth-provider plugins, basic auth, impersonating extra fields,
  https:// and socks5:// proxies;
- a context naming a user the file lacks: client-go goes on without credentials, podcert takes
  it for the typo it likely is;
- an exec plugin is run at load, so one that cannot run here (interactiveMode Always without a
  terminal) is refused then; client-go, with a client certificate beside it, runs it only at
  the first request, and fails there;
- a server without a scheme: client-go guesses http or https from whether TLS settings are
  present; podcert refuses to guess; nor does it take a port out of range (client-go fails to
  dial it);
- credentials with an http:// server: client-go drops them, podcert refuses rather than
  guess whether they were meant for a TLS server;
- a token that is not one printable line, and a tokenFile that cannot be read even when a token
  is given beside it (client-go would send a header it cannot, or fall back silently);
- a CA or client certificate file client-go reads past (PEM junk it skips: `bundles.pem`'s
  strictness does not apply here, OpenSSL reads these), or PEM OpenSSL refuses.

`podcert.client.proxies.proxy_for` and httpproxy (what client-go's transport consults) answer the
same for generated environments (upper and lower case, NO_PROXY with `*`, CIDRs, IPs with and
without ports, domains with a leading dot or `*.`) and server URLs.
"""

from __future__ import annotations

import base64
import hashlib
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import trustme
import yaml
from hypothesis import event, example, given
from hypothesis import strategies as st

from podcert.client import commandline, proxies
from podcert.client import kubeconfig as kc
from podcert.client.execcredential import ExecToken
from podcert.client.kubeconfig import TokenFile
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
# Ranges Go's net.ParseCIDR takes or refuses (then it reads the entry as a domain).
NO_PROXY_ENTRIES += [
    "10.0.0.0/255.0.0.0", "10.0.0.0/08", "::ffff:10.0.0.0/104", "0.0.0.0/0", "::/0",
    "10.1.2.3/32", "fd00::1/128", "10.0.0.0/", "fe80::1%eth0/64", "10.0.0.0/8/8",
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


# --- kubeconfigs ------------------------------------------------------------------------------

# Where podcert refuses what client-go takes, the refusal names one of these (module docstring).
DELIBERATE = (
    "auth-provider plugins are not supported",
    "basic authentication is not supported",
    "proxy-url is not an http:// URL",
    "server is not an http(s) URL",
    "not one line of text",
    "tokenFile",
    "credentials need an https server",
    "a client certificate needs both",
    "no user named",
    "server has no valid port",
    "interactiveMode Always needs a terminal",
    "impersonating extra fields is not done",
)


@dataclass(frozen=True, repr=False)
class Materials:
    """Files a generated kubeconfig names (in `files/` beside it), and what they hold."""

    folder: Path
    ca_pem: tuple[bytes, bytes]  # two roots
    client: tuple[tuple[bytes, bytes], tuple[bytes, bytes]]  # two (certificate, key) PEM pairs
    client_ca: trustme.CA
    server: trustme.LeafCert


@pytest.fixture(scope="module")
def materials(tmp_path_factory: pytest.TempPathFactory) -> Materials:
    folder = tmp_path_factory.mktemp("kubeconfigs")
    files = folder / "files"
    files.mkdir()
    roots = trustme.CA(), trustme.CA()
    client_ca = trustme.CA()
    leaves = [client_ca.issue_cert(f"client-{i}@example.com") for i in range(2)]
    client = tuple(
        (leaf.cert_chain_pems[0].bytes(), leaf.private_key_pem.bytes()) for leaf in leaves
    )
    for i, root in enumerate(roots):
        (files / f"ca{i}.pem").write_bytes(root.cert_pem.bytes())
    for i, (cert, key) in enumerate(client):
        (files / f"client{i}.crt").write_bytes(cert)
        (files / f"client{i}.key").write_bytes(key)
    (files / "token").write_text("file-token\n")
    (files / "empty-token").write_text("")
    (files / "not-pem").write_text("not a certificate\n")
    script = files / "plugin.sh"  # an exec plugin: answers a token in the version asked (argv 1)
    script.write_text(
        '#!/bin/sh\nprintf \'{"apiVersion":"%s","kind":"ExecCredential",'
        '"status":{"token":"exec-token"}}\' "$1"\n'
    )
    script.chmod(0o755)
    return Materials(
        folder,
        (roots[0].cert_pem.bytes(), roots[1].cert_pem.bytes()),
        (client[0], client[1]),  # type: ignore[arg-type]
        client_ca,
        trustme.CA().issue_cert("server.example"),
    )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def mostly(valid: list[dict[str, Any]], broken: list[dict[str, Any]]) -> st.SearchStrategy[Any]:
    """One of the pieces, a valid one four times as often as a broken one: a file is refused
    for its first broken piece, and the resolved values are compared only where both accept."""
    return st.sampled_from(valid * 4 + broken)


def choices(m: Materials) -> dict[str, st.SearchStrategy[dict[str, Any]]]:
    """The pieces of a kubeconfig: each a strategy of the keys it adds."""
    files, absolute = "files", str(m.folder / "files")
    (cert0, key0), (cert1, key1) = m.client
    none: dict[str, Any] = {}
    ca = mostly([
        none, none,
        {"certificate-authority-data": b64(m.ca_pem[0])},
        {"certificate-authority-data": b64(m.ca_pem[0] + m.ca_pem[1])},
        {"certificate-authority": f"{files}/ca0.pem"},
        {"certificate-authority": f"{absolute}/ca1.pem"},
        {"insecure-skip-tls-verify": True},
    ], [
        {"certificate-authority-data": "!!not base64"},
        {"certificate-authority-data": b64(b"not pem")},
        {"certificate-authority": f"{files}/missing.pem"},
        {"certificate-authority": f"{files}/not-pem"},
        {"certificate-authority-data": b64(m.ca_pem[0]), "certificate-authority": f"{files}/c"},
        {"insecure-skip-tls-verify": True, "certificate-authority-data": b64(m.ca_pem[0])},
    ])  # fmt: skip
    extension = {"name": "client.authentication.k8s.io/exec", "extension": {"audience": "a"}}
    cluster = st.fixed_dictionaries(
        {
            "server": st.sampled_from(
                ["https://10.1.2.3:6443", "https://10.1.2.3:6443/", "https://[fd00::1]:6443"] * 3
                + ["https://h.example:8443/prefix/", "http://10.1.2.3:8080"]
                + ["10.1.2.3:6443", "", "ftp://x", "https://h.example:99999"]
            ),
        },
        optional={
            "tls-server-name": st.just("api.example"),
            "proxy-url": st.sampled_from(["http://proxy:3128", "socks5://p:1080", "https://p:443"]),
            "extensions": st.just([extension]),
        },
    ).flatmap(lambda c: ca.map(lambda extra: {**c, **extra}))
    token = mostly([
        none, none, {"token": "tok-1"},
        {"tokenFile": f"{files}/token"}, {"tokenFile": f"{absolute}/token"},
        {"token": "tok-1", "tokenFile": f"{files}/token"},
    ], [
        {"token": "tok\n2"},
        {"tokenFile": f"{files}/missing"}, {"tokenFile": f"{files}/empty-token"},
        {"token": "tok-1", "tokenFile": f"{files}/missing"},
        {"token": "tok-1", "tokenFile": f"{files}/empty-token"},
    ])  # fmt: skip
    certificate = mostly([
        none, none,
        {"client-certificate-data": b64(cert0), "client-key-data": b64(key0)},
        {"client-certificate": f"{files}/client0.crt", "client-key": f"{files}/client0.key"},
        {"client-certificate": f"{absolute}/client1.crt", "client-key": f"{absolute}/client1.key"},
        {"client-certificate-data": b64(cert1), "client-key": f"{files}/client1.key"},
    ], [
        {"client-certificate-data": b64(cert0)},
        {"client-key-data": b64(key0)},
        {"client-certificate-data": b64(cert0), "client-key-data": b64(key1)},
        {"client-certificate-data": "!!", "client-key-data": b64(key0)},
        {
            "client-certificate-data": b64(cert0), "client-key-data": b64(key0),
            "client-certificate": f"{files}/client1.crt", "client-key": f"{files}/client1.key",
        },
        {"client-certificate": f"{files}/missing.crt", "client-key": f"{files}/client0.key"},
    ])  # fmt: skip
    v1, v1beta1 = (f"client.authentication.k8s.io/{v}" for v in ("v1", "v1beta1"))
    other = mostly([
        none, none, none,
        {"as": "someone"},
        {"as": "someone", "as-groups": ["g1", "g2"]},
        {"as": "someone", "as-uid": "1234"},
        {"exec": {"apiVersion": v1beta1, "command": f"{files}/plugin.sh", "args": [v1beta1]}},
        {"exec": {
            "apiVersion": v1, "command": f"{absolute}/plugin.sh", "args": [v1],
            "interactiveMode": "Never", "provideClusterInfo": True,
        }},
        {"exec": {
            "apiVersion": v1beta1, "command": f"{files}/plugin.sh", "args": [v1beta1],
            "interactiveMode": "IfAvailable", "provideClusterInfo": True,
        }},
    ], [
        {"auth-provider": {"name": "oidc"}},
        {"username": "u", "password": "p"},
        {"as-groups": ["g1"]},
        {"as": "x", "as-user-extra": {"scopes": ["a"]}},
        {"exec": {"command": "plugin"}},
        {"exec": {"apiVersion": v1, "command": f"{files}/plugin.sh", "args": [v1]}},
        {"exec": {
            "apiVersion": v1, "command": f"{files}/plugin.sh", "args": [v1],
            "interactiveMode": "Always",
        }},
    ])  # fmt: skip
    # An exec plugin beside a token podcert refuses (which one is meant?): not generated.
    user = st.tuples(token, certificate, other).map(
        lambda p: {**(p[0] if "exec" not in p[2] else {}), **p[1], **p[2]}
    )
    return {"cluster": cluster, "user": user}


@st.composite
def kubeconfigs(draw: st.DrawFn, m: Materials) -> dict[str, Any]:
    pieces = choices(m)
    names = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True))
    contexts = [
        {
            "name": name,
            "context": draw(
                st.fixed_dictionaries(
                    {"cluster": st.sampled_from(["c1", "c1", "c2", "nope"])},
                    optional={
                        "user": st.sampled_from(["u1", "u1", "u2", "nobody"]),
                        "namespace": st.sampled_from(["shop", "kube-system"]),
                    },
                ).map(lambda c: c if c["cluster"] != "nope" else {})
            ),
        }
        for name in names
    ]
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": n, "cluster": draw(pieces["cluster"])} for n in ("c1", "c2")],
        "users": [{"name": n, "user": draw(pieces["user"])} for n in ("u1", "u2")],
        "contexts": contexts,
    }
    current = draw(st.sampled_from([*names * 3, "gone", None]))
    if current is not None:
        doc["current-context"] = current
    return doc


def presented_certificate(context: ssl.SSLContext, m: Materials) -> bytes | None:
    """The client certificate (DER) `context` presents, by a handshake in memory with a server
    that asks for one. The server's own certificate is not checked (compared apart)."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    m.server.configure_cert(server_context)
    m.client_ca.configure_trust(server_context)
    server_context.verify_mode = ssl.CERT_OPTIONAL
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    pipes = [ssl.MemoryBIO() for _ in range(4)]
    client = context.wrap_bio(pipes[0], pipes[1], server_hostname="server.example")
    server = server_context.wrap_bio(pipes[2], pipes[3], server_side=True)
    done = [False, False]
    for _ in range(10):
        for i, side in enumerate((client, server)):
            if not done[i]:
                try:
                    side.do_handshake()
                    done[i] = True
                except ssl.SSLWantReadError:
                    pass
        pipes[2].write(pipes[1].read())
        pipes[0].write(pipes[3].read())
        if all(done):
            break
    assert all(done), "the in-memory handshake did not finish"
    return server.getpeercert(binary_form=True)


def digest(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()


def credential_kinds(settings: kc.ClientSettings) -> list[str]:
    """How podcert authenticates: exec, token-file, token and/or certificate."""
    kinds = []
    if isinstance(settings.token, ExecToken):
        kinds.append("exec")
    elif isinstance(settings.token, TokenFile):
        kinds.append("token-file")
    elif settings.token is not None:
        kinds.append("token")
    if settings.client_certs is not None or "client certificate" in settings.identity:
        kinds.append("certificate")
    return kinds


def their_kinds(theirs: dict[str, Any]) -> list[str]:
    """How client-go authenticates, in the same words (a token file wins over a token)."""
    kinds = []
    if theirs["exec_command"]:
        kinds.append("exec")
    elif theirs["token_file"]:
        kinds.append("token-file")
    elif theirs["token"]:
        kinds.append("token")
    if theirs["client_cert"]:
        kinds.append("certificate")
    return kinds


def exec_reading(settings: kc.ClientSettings) -> tuple[str, dict[str, Any] | None]:
    """(the exec plugin's interactiveMode, the cluster info it is given) in the reference's
    terms, or ("", None) without a plugin."""
    token = settings.token
    if not isinstance(token, ExecToken):
        return "", None
    if not token.plugin.provide_cluster_info or token.cluster is None:
        return token.plugin.mode, None
    info = token.cluster
    ca = info.get("certificate-authority-data")
    return token.plugin.mode, {
        "server": info["server"],
        "tls-server-name": info.get("tls-server-name", ""),
        "insecure-skip-tls-verify": info.get("insecure-skip-tls-verify", False),
        "ca_sha256": digest(base64.b64decode(ca)) if ca else "",
        "proxy-url": info.get("proxy-url", ""),
        "config": info.get("config"),
    }


def podcert_reading(settings: kc.ClientSettings, m: Materials) -> dict[str, Any]:
    """podcert's settings in the reference's terms."""
    context = settings.ssl_context
    who = settings.impersonate
    mode, cluster = exec_reading(settings)
    out: dict[str, Any] = {
        "server": settings.server,
        "token": settings.token() if settings.token is not None else "",
        "tls_server_name": settings.tls_server_name or "",
        "proxy": settings.proxy or "",
        "namespace": settings.namespace,
        "as_user": who.user if who else "",
        "as_uid": (who.uid or "") if who else "",
        "as_groups": list(who.groups) if who else [],
        "exec_mode": mode,
        "exec_cluster": cluster,
        "kinds": credential_kinds(settings),
    }
    if context is not None:
        out["insecure"] = context.verify_mode == ssl.CERT_NONE
        out["cas"] = [digest(der) for der in context.get_ca_certs(binary_form=True)]
        presented = presented_certificate(context, m)
        out["client_cert"] = digest(presented) if presented else ""
    return out


def expected_reading(
    theirs: dict[str, Any], ours: dict[str, Any], settings: kc.ClientSettings
) -> dict[str, Any]:
    """client-go's answer in the terms of `podcert_reading`."""
    keys = ("server", "token", "tls_server_name", "proxy", "namespace", "as_user", "as_uid")
    expected = {key: theirs[key] for key in keys}
    expected["as_groups"] = theirs["as_groups"] or []
    expected["exec_mode"] = theirs["exec_mode"]
    expected["exec_cluster"] = theirs["exec_cluster"]
    expected["kinds"] = their_kinds(theirs)
    if theirs["exec_command"]:
        expected["token"] = "exec-token"  # client-go asks the plugin per request; podcert at load
    if settings.ssl_context is not None:
        expected["insecure"] = theirs["insecure"]
        expected["client_cert"] = theirs["client_cert"]
        # client-go without a CA uses the system's roots: podcert's context holds those then.
        expected["cas"] = theirs["cas"] if theirs["cas"] is not None else ours["cas"]
    return expected


def judge(theirs: dict[str, Any], read: Callable[[], kc.ClientSettings], m: Materials) -> None:
    """Both refuse, podcert refuses deliberately, or both resolve the same."""
    try:
        settings = read()
    except kc.ClientConfigError as err:
        event("both refuse" if "error" in theirs else "podcert refuses deliberately")
        if "error" in theirs:
            return
        assert any(why in str(err) for why in DELIBERATE), f"client-go takes it: {theirs}\n{err}"
        return
    assert "error" not in theirs, f"podcert takes what client-go refuses: {theirs['error']}"
    event("both accept")
    ours = podcert_reading(settings, m)
    for feature, present in (
        ("impersonating", ours["as_user"]),
        ("an exec plugin", ours["exec_mode"]),
        ("an exec plugin given the cluster", ours["exec_cluster"]),
        ("a namespace from the context", ours["namespace"] != "default"),
    ):
        if present:
            event(f"both accept, with {feature}")
    assert ours == expected_reading(theirs, ours, settings)


@DIFFERENTIAL
@given(data=st.data())
def test_kubeconfigs_are_read_as_client_go_reads_them(
    reference: Reference, materials: Materials, data: st.DataObject
) -> None:
    doc = data.draw(kubeconfigs(materials))
    environ = data.draw(st.sampled_from([{}, {"HTTPS_PROXY": "http://envproxy:3128"}]))
    path = materials.folder / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    theirs = reference.ask("kubeconfig", path=str(path), environ=environ)
    judge(theirs, lambda: kc.from_kubeconfig(path, environ), materials)


OVERRIDES = st.fixed_dictionaries(
    {},
    optional={
        "context": st.sampled_from(["a", "b", "c", "gone"]),
        "as": st.sampled_from(["operator", "system:serviceaccount:shop:api"]),
        "as_groups": st.lists(st.sampled_from(["g1", "g2", "system:masters"]), max_size=2),
    },
)


@DIFFERENTIAL
@given(data=st.data())
def test_kubeconfig_lists_are_merged_as_client_go_merges_them(
    reference: Reference, materials: Materials, data: st.DataObject
) -> None:
    """KUBECONFIG with up to three files (and now and then one that does not exist), their
    names overlapping, read by a person's command with --context, --as and --as-group."""
    count = data.draw(st.integers(min_value=1, max_value=3))
    paths = []
    for i in range(count):
        path = materials.folder / f"kubeconfig-{i}"
        path.write_text(yaml.safe_dump(data.draw(kubeconfigs(materials))))
        paths.append(str(path))
    if data.draw(st.booleans()):
        paths.insert(data.draw(st.integers(0, len(paths))), str(materials.folder / "missing"))
    flags = data.draw(OVERRIDES)
    proxy_env = data.draw(st.sampled_from([{}, {"HTTPS_PROXY": "http://envproxy:3128"}]))
    theirs = reference.ask("kubeconfig", paths=paths, environ=proxy_env, **flags)
    environ = {**proxy_env, "KUBECONFIG": ":".join(paths), "HOME": str(materials.folder)}

    def read() -> kc.ClientSettings:
        return commandline.load(
            None,
            context=flags.get("context"),
            as_user=flags.get("as"),
            as_groups=flags.get("as_groups", ()),
            environ=environ,
            account=materials.folder / "no-service-account",
        )

    judge(theirs, read, materials)
