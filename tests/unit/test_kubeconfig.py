"""podcert reads kubeconfigs and the in-cluster configuration itself, without the
`kubernetes` package. What it uses becomes an `ssl.SSLContext`, a base URL and a token source that
follows a rotated token file; what it cannot use (a plugin, basic auth, a broken field) is a
ClientConfigError naming the file and the field, and never quoting a credential."""

from __future__ import annotations

import base64
import logging
import os
import ssl
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from cryptography.hazmat.primitives import serialization

from podcert.client import kubeconfig as kc
from podcert.client.kubeconfig import ClientConfigError, ClientSettings, TokenFile
from podcert.errors import ConfigError

TOKEN = "secret-token-that-must-never-show"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def client_cert(ca: trustme.CA) -> trustme.LeafCert:
    return ca.issue_cert("client@example.com", common_name="system:node:node-a")


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def kubeconfig(
    user: dict[str, Any] | None = None,
    cluster: dict[str, Any] | None = None,
    server: str = "https://127.0.0.1:6443",
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": "u", "user": user if user is not None else {"token": TOKEN}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }


# --- what is used ------------------------------------------------------------------------------


def test_client_certificate_and_ca_data_make_a_verifying_context(
    tmp_path: Path, ca: trustme.CA, client_cert: trustme.LeafCert
) -> None:
    user = {
        "client-certificate-data": b64(client_cert.cert_chain_pems[0].bytes()),
        "client-key-data": b64(client_cert.private_key_pem.bytes()),
    }
    cluster = {"certificate-authority-data": b64(ca.cert_pem.bytes())}
    path = write(tmp_path / "kubeconfig", kubeconfig(user, cluster, "https://127.0.0.1:6443/"))

    settings = kc.load(path)

    assert settings.server == "https://127.0.0.1:6443"
    assert settings.token is None
    assert settings.source == f"kubeconfig {path}"
    context = settings.ssl_context
    assert context is not None
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert len(context.get_ca_certs()) == 1  # that CA only, not the system's roots


def test_file_names_are_read_from_the_kubeconfigs_folder(
    tmp_path: Path, ca: trustme.CA, client_cert: trustme.LeafCert
) -> None:
    (tmp_path / "pki").mkdir()
    ca.cert_pem.write_to_path(str(tmp_path / "pki/ca.crt"))
    client_cert.cert_chain_pems[0].write_to_path(str(tmp_path / "pki/client.crt"))
    client_cert.private_key_pem.write_to_path(str(tmp_path / "pki/client.key"))
    (tmp_path / "pki/token").write_text(TOKEN + "\n")
    user = {
        "client-certificate": "pki/client.crt",
        "client-key": "pki/client.key",
        "tokenFile": "pki/token",
    }
    path = write(tmp_path / "kubeconfig", kubeconfig(user, {"certificate-authority": "pki/ca.crt"}))

    settings = kc.load(path)

    assert settings.token is not None and settings.token() == TOKEN
    assert settings.ssl_context is not None and len(settings.ssl_context.get_ca_certs()) == 1


def test_a_token_file_wins_over_a_token(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-the-file")
    path = write(tmp_path / "k", kubeconfig({"token": TOKEN, "tokenFile": "token"}))
    token = kc.load(path).token
    assert token is not None and token() == "from-the-file"


def test_insecure_skip_tls_verify_and_tls_server_name(tmp_path: Path) -> None:
    cluster = {"insecure-skip-tls-verify": True, "tls-server-name": "kubernetes.default.svc"}
    settings = kc.load(write(tmp_path / "k", kubeconfig(cluster=cluster)))
    assert settings.ssl_context is not None
    assert settings.ssl_context.verify_mode == ssl.CERT_NONE
    assert settings.tls_server_name == "kubernetes.default.svc"


def test_a_plain_http_server_has_no_tls(tmp_path: Path) -> None:
    settings = kc.load(write(tmp_path / "k", kubeconfig({}, server="http://127.0.0.1:8080")))
    assert settings.ssl_context is None and settings.server == "http://127.0.0.1:8080"
    assert settings.token is None


def test_credentials_are_never_sent_over_plain_http(tmp_path: Path) -> None:
    with pytest.raises(ClientConfigError, match="credentials need an https server"):
        kc.load(write(tmp_path / "k", kubeconfig({"token": TOKEN}, server="http://10.0.0.1:80")))


def test_nothing_of_a_credential_is_in_the_settings_repr(tmp_path: Path) -> None:
    cluster = {"insecure-skip-tls-verify": True, "proxy-url": "http://me:pw-secret@proxy:3128"}
    settings = kc.load(write(tmp_path / "k", kubeconfig(cluster=cluster)))
    assert TOKEN not in repr(settings) and "pw-secret" not in repr(settings)
    assert settings.proxy == "http://me:pw-secret@proxy:3128"


# --- what is refused ---------------------------------------------------------------------------


def broken(tmp_path: Path, ca: trustme.CA, client_cert: trustme.LeafCert, case: str) -> Path:
    """A kubeconfig broken in one way each."""
    path = tmp_path / "kubeconfig"
    other_key = trustme.CA().issue_cert("x").private_key_pem.bytes()
    key = serialization.load_pem_private_key(client_cert.private_key_pem.bytes(), None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"passphrase"),
    )
    cert = b64(client_cert.cert_chain_pems[0].bytes())
    cases: dict[str, Any] = {
        "empty": "",
        "a list": "- a\n- b\n",
        "no context": {"apiVersion": "v1", "kind": "Config"},
        "no such context": {**kubeconfig(), "current-context": "gone"},
        "no such cluster": {
            **kubeconfig(),
            "contexts": [{"name": "x", "context": {"cluster": "nope", "user": "u"}}],
        },
        "no such user": {
            **kubeconfig(),
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "nobody"}}],
        },
        "no server": {**kubeconfig(), "clusters": [{"name": "c", "cluster": {}}]},
        "server not a URL": kubeconfig(server="127.0.0.1:6443"),
        "server port out of range": kubeconfig(server="https://127.0.0.1:99999"),
        "contexts not a list": {**kubeconfig(), "contexts": {"x": 1}},
        "bad base64 CA": kubeconfig(cluster={"certificate-authority-data": "not base64!"}),
        "CA data not PEM": kubeconfig(cluster={"certificate-authority-data": b64(b"junk")}),
        "CA file missing": kubeconfig(cluster={"certificate-authority": "missing.crt"}),
        "insecure and a CA": kubeconfig(
            cluster={
                "insecure-skip-tls-verify": True,
                "certificate-authority-data": b64(ca.cert_pem.bytes()),
            }
        ),
        "bad base64 key": kubeconfig(
            {"client-certificate-data": cert, "client-key-data": "%%%" + TOKEN}
        ),
        "a certificate without its key": kubeconfig({"client-certificate-data": cert}),
        "a key that is not the certificate's": kubeconfig(
            {"client-certificate-data": cert, "client-key-data": b64(other_key)}
        ),
        "an encrypted key": kubeconfig(
            {"client-certificate-data": cert, "client-key-data": b64(encrypted)}
        ),
        "a client key file missing": kubeconfig(
            {"client-certificate": "c.crt", "client-key": "c.key"}
        ),
        "exec": kubeconfig(
            {"exec": {"command": "aws", "args": ["eks", "get-token"], "env": [{"name": TOKEN}]}}
        ),
        "auth-provider": kubeconfig({"auth-provider": {"name": "oidc", "config": {"x": TOKEN}}}),
        "basic auth": kubeconfig({"username": "admin", "password": TOKEN}),
        "groups without a user": kubeconfig({"token": TOKEN, "as-groups": ["system:masters"]}),
        "impersonated extra": kubeconfig(
            {"token": TOKEN, "as": "a", "as-user-extra": {"scopes": ["x"]}}
        ),
        "token file missing": kubeconfig({"tokenFile": "nope"}),
        "token file empty": kubeconfig({"tokenFile": "empty-token"}),
        "token not one line": kubeconfig({"token": TOKEN + "\r\nX-Injected: 1"}),
        "token not a string": kubeconfig({"token": 12345}),
        "proxy not http": kubeconfig(
            {"token": TOKEN}, {"proxy-url": "socks5://me:" + TOKEN + "@proxy:1080"}
        ),
    }
    (tmp_path / "empty-token").write_text("\n")
    doc = cases[case]
    if isinstance(doc, str):
        path.write_text(doc)
    else:
        write(path, doc)
    return path


HOSTILE = [
    pytest.param("empty", "current-context", id="an empty file"),
    pytest.param("a list", "not a kubeconfig", id="YAML that is not a mapping"),
    pytest.param("no context", "current-context is not set", id="no current-context"),
    pytest.param("no such context", "no context named 'gone'", id="a context it lacks"),
    pytest.param("no such cluster", "no cluster named 'nope'", id="a cluster it lacks"),
    pytest.param("no such user", "no user named 'nobody'", id="a user it lacks"),
    pytest.param("no server", "server is not set", id="a cluster without a server"),
    pytest.param("server not a URL", "not an http(s) URL", id="a server without a scheme"),
    pytest.param("server port out of range", "no valid port", id="a port out of range"),
    pytest.param("contexts not a list", "contexts: not a list", id="contexts not a list"),
    pytest.param("bad base64 CA", "certificate-authority-data is not valid base64", id="bad b64"),
    pytest.param("CA data not PEM", "certificate-authority-data holds no PEM", id="CA not PEM"),
    pytest.param("CA file missing", "no such file", id="a CA file that is missing"),
    pytest.param("insecure and a CA", "insecure-skip-tls-verify and a certif", id="both"),
    pytest.param("bad base64 key", "client-key-data is not valid base64", id="bad b64 key"),
    pytest.param("a certificate without its key", "client-key(-data) is not set", id="no key"),
    pytest.param("a key that is not the certificate's", "does not match", id="mismatched key"),
    pytest.param("an encrypted key", "encrypted", id="a key behind a passphrase"),
    pytest.param("a client key file missing", "client-certificate", id="missing key files"),
    pytest.param("exec", "exec: apiVersion is not one of", id="exec"),
    pytest.param("auth-provider", "auth-provider: auth-provider plugins", id="auth-provider"),
    pytest.param("basic auth", "basic authentication is not supported", id="basic auth"),
    pytest.param(
        "groups without a user", "without a user to impersonate", id="groups, no user to be"
    ),
    pytest.param("impersonated extra", "as-user-extra", id="impersonating extra fields"),
    pytest.param("token file missing", "tokenFile", id="a token file that is missing"),
    pytest.param("token file empty", "empty-token is empty", id="an empty token file"),
    pytest.param("token not one line", "not one line", id="a token with a line break"),
    pytest.param("token not a string", "token is not a string", id="a token that is a number"),
    pytest.param("proxy not http", "proxy-url is not an http:// URL", id="a SOCKS proxy"),
]


@pytest.mark.parametrize(("case", "says"), HOSTILE)
def test_an_unusable_kubeconfig_is_a_typed_error_naming_the_field(
    tmp_path: Path, ca: trustme.CA, client_cert: trustme.LeafCert, case: str, says: str
) -> None:
    path = broken(tmp_path, ca, client_cert, case)

    with pytest.raises(ClientConfigError) as raised:
        kc.load(path)

    message = str(raised.value)
    assert isinstance(raised.value, ConfigError)
    assert message.startswith(f"kubeconfig {path}: "), message
    assert says in message, message
    assert "\n" not in message
    assert TOKEN not in message and "BEGIN" not in message and "passphrase" not in message


def test_a_missing_kubeconfig_and_one_that_is_not_yaml(tmp_path: Path) -> None:
    with pytest.raises(ClientConfigError, match=r"(?i)no such file"):
        kc.load(tmp_path / "absent")
    (tmp_path / "k").write_text("garbage: [")
    with pytest.raises(ClientConfigError, match=r"not valid YAML \(line 2: "):
        kc.load(tmp_path / "k")


def load_within(path: Path, deadline: float = 10.0) -> BaseException | ClientSettings:
    """kc.load(path) in a thread, waited for at most `deadline` seconds: what it raised or
    returned. A load still blocked at the deadline fails the test instead of hanging it."""
    outcome: list[BaseException | ClientSettings] = []

    def run() -> None:
        try:
            outcome.append(kc.load(path))
        except BaseException as err:  # handed to the test
            outcome.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(deadline)
    assert outcome, f"loading {path} still blocks after {deadline} s"
    return outcome[0]


@pytest.mark.parametrize(
    ("field", "doc"),
    [
        pytest.param("tokenFile", lambda: kubeconfig({"tokenFile": "fifo"}), id="a tokenFile"),
        pytest.param(
            "tokenFile",
            lambda: kubeconfig({"token": TOKEN, "tokenFile": "fifo"}),
            id="a tokenFile beside a token",
        ),
        pytest.param(
            "certificate-authority",
            lambda: kubeconfig(cluster={"certificate-authority": "fifo"}),
            id="a certificate-authority",
        ),
        pytest.param(
            "client-certificate",
            lambda: kubeconfig({"client-certificate": "fifo", "client-key": "fifo"}),
            id="a client certificate and key",
        ),
    ],
)
def test_a_fifo_named_as_a_file_is_refused_without_blocking(
    tmp_path: Path, field: str, doc: Any
) -> None:
    os.mkfifo(tmp_path / "fifo")
    path = write(tmp_path / "kubeconfig", doc())
    raised = load_within(path)
    assert isinstance(raised, ClientConfigError), raised
    assert f"{field} {tmp_path / 'fifo'}: not a regular file" in str(raised)


def test_a_fifo_as_the_kubeconfig_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "kubeconfig")
    raised = load_within(tmp_path / "kubeconfig")
    assert isinstance(raised, ClientConfigError) and "not a regular file" in str(raised), raised


def test_a_token_file_replaced_by_a_fifo_keeps_the_last_token(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("first\n")
    now = [0.0]
    token = TokenFile(tmp_path / "token", clock=lambda: now[0])
    (tmp_path / "token").unlink()
    os.mkfifo(tmp_path / "token")
    now[0] += kc.TOKEN_REREAD_PERIOD
    assert token() == "first"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_token_file(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "token").chmod(0)
    with pytest.raises(ClientConfigError, match=r"tokenFile .*: Permission denied"):
        kc.load(write(tmp_path / "k", kubeconfig({"tokenFile": "token"})))


def test_an_unreadable_token_file_is_named(tmp_path: Path) -> None:
    """Whatever the reason it cannot be read (here it is a folder), the message names it."""
    (tmp_path / "token").mkdir()
    with pytest.raises(ClientConfigError) as raised:
        kc.load(write(tmp_path / "k", kubeconfig({"tokenFile": "token"})))
    assert f"tokenFile {tmp_path / 'token'}: " in str(raised.value)


def test_key_bytes_never_reach_a_file_that_stays(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    ca: trustme.CA,
    client_cert: trustme.LeafCert,
) -> None:
    """Without memfd, the client key goes through a 0600 temporary file, deleted once read."""
    monkeypatch.delattr(os, "memfd_create", raising=False)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    seen: list[int] = []
    load_cert_chain = ssl.SSLContext.load_cert_chain

    def spy(self: ssl.SSLContext, certfile: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(Path(certfile).stat().st_mode & 0o777)
        load_cert_chain(self, certfile, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", spy)
    user = {
        "client-certificate-data": b64(client_cert.cert_chain_pems[0].bytes()),
        "client-key-data": b64(client_cert.private_key_pem.bytes()),
    }
    kc.load(write(tmp_path / "k", kubeconfig(user)))
    assert seen == [0o600]
    assert list(scratch.iterdir()) == []


# --- token rotation ----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_token_file_is_read_again_at_most_once_a_period(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "token"
    path.write_text("first")
    clock = Clock()
    token = TokenFile(path, period=60.0, clock=clock)
    assert token() == "first"

    path.write_text("second")  # the kubelet rotated it
    clock.now += 59.9
    assert token() == "first"  # not read again yet
    clock.now += 0.2
    assert token() == "second"

    path.unlink()  # mid-rotation: keep the last token, say so without it
    clock.now += 61
    with caplog.at_level(logging.WARNING):
        assert token() == "second"
    assert "keeping the last token" in caplog.text and "second" not in caplog.text
    path.write_text("third\n")
    clock.now += 30
    assert token() == "second"  # the failed read counts as a read: wait a period
    clock.now += 31
    assert token() == "third"


# --- in-cluster --------------------------------------------------------------------------------


@pytest.fixture
def account(tmp_path: Path, ca: trustme.CA) -> Path:
    folder = tmp_path / "serviceaccount"
    folder.mkdir()
    (folder / "token").write_text(TOKEN)
    ca.cert_pem.write_to_path(str(folder / "ca.crt"))
    return folder


@pytest.mark.parametrize(
    ("host", "server"),
    [
        pytest.param("10.96.0.1", "https://10.96.0.1:443", id="IPv4"),
        pytest.param("fd00:10:96::1", "https://[fd00:10:96::1]:443", id="IPv6 bracketed"),
    ],
)
def test_in_cluster_reads_the_service_account(account: Path, host: str, server: str) -> None:
    env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": "443"}
    clock = Clock()
    settings = kc.in_cluster(env, account, clock)
    assert settings.server == server
    assert settings.source == "in-cluster configuration"
    assert settings.ssl_context is not None and len(settings.ssl_context.get_ca_certs()) == 1
    assert settings.token is not None and settings.token() == TOKEN
    (account / "token").write_text("rotated")
    clock.now += kc.TOKEN_REREAD_PERIOD
    assert settings.token() == "rotated"


IN_CLUSTER = [
    pytest.param({}, None, "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT", id="no env"),
    pytest.param({"KUBERNETES_SERVICE_PORT": "x"}, None, "not a port number", id="bad port"),
    pytest.param({}, "token", "token ", id="no token file"),
    pytest.param({}, "ca.crt", "certificate-authority", id="no CA file"),
]


@pytest.mark.parametrize(("env", "remove", "says"), IN_CLUSTER)
def test_unusable_in_cluster_configuration(
    account: Path, env: dict[str, str], remove: str | None, says: str
) -> None:
    environ = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", **env}
    if not env and remove is None:
        environ = {}
    if remove is not None:
        (account / remove).unlink()
    with pytest.raises(ClientConfigError) as raised:
        kc.in_cluster(environ, account)
    assert str(raised.value).startswith("in-cluster configuration: ")
    assert says in str(raised.value)


# --- proxies from the environment --------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "proxy"),
    [
        pytest.param({}, None, id="none set"),
        pytest.param({"HTTPS_PROXY": "http://proxy:3128"}, "http://proxy:3128", id="HTTPS_PROXY"),
        pytest.param({"https_proxy": "proxy:3128"}, "http://proxy:3128", id="no scheme"),
        pytest.param(
            {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "10.0.0.1,.svc"},
            None,
            id="NO_PROXY covers the host",
        ),
        pytest.param({"HTTP_PROXY": "http://proxy:3128"}, None, id="an http proxy only"),
        pytest.param(
            {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "10.0.0.0/8"}, None, id="a CIDR"
        ),
        pytest.param(
            {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "10.0.0.1:6443"}, None, id="IP:port"
        ),
        pytest.param(
            {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": "10.0.0.1:443"},
            "http://proxy:3128",
            id="IP with another port",
        ),
        pytest.param(
            {"HTTPS_PROXY": "http://upper:1", "https_proxy": "http://lower:1"},
            "http://upper:1",
            id="upper case wins, as in Go",
        ),
        pytest.param({"ALL_PROXY": "http://proxy:3128"}, None, id="ALL_PROXY is not read"),
    ],
)
def test_a_proxy_from_the_environment(tmp_path: Path, env: dict[str, str], proxy: str) -> None:
    path = write(
        tmp_path / "k",
        kubeconfig(cluster={"insecure-skip-tls-verify": True}, server="https://10.0.0.1:6443"),
    )
    assert kc.from_kubeconfig(path, env).proxy == proxy


@pytest.mark.parametrize(
    "server", ["https://127.0.0.1:6443", "https://[::1]:6443", "https://localhost"]
)
def test_loopback_servers_are_never_proxied(tmp_path: Path, server: str) -> None:
    path = write(
        tmp_path / "k", kubeconfig(cluster={"insecure-skip-tls-verify": True}, server=server)
    )
    assert kc.from_kubeconfig(path, {"HTTPS_PROXY": "http://proxy:3128"}).proxy is None


def test_settings_are_their_own_client_settings(tmp_path: Path) -> None:
    settings = kc.load(write(tmp_path / "k", kubeconfig({}, server="http://127.0.0.1:1")))
    assert isinstance(settings, ClientSettings) and settings.client_settings is settings


# --- several files ------------------------------------------------------------------------------


def test_merged_files_read_each_entrys_relative_names_from_its_own_folder(
    tmp_path: Path, ca: trustme.CA
) -> None:
    """A KUBECONFIG list: the cluster's CA file beside the first file, the user's token file
    beside the second, the context (and its namespace) in a third; --context and --as given."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    ca.cert_pem.write_to_path(str(tmp_path / "one" / "ca.pem"))
    (tmp_path / "two" / "token").write_text("file-token\n")
    clusters = write(
        tmp_path / "one" / "clusters",
        {"clusters": [{"name": "c", "cluster": {"server": "https://10.0.0.1:6443",
                                                "certificate-authority": "ca.pem"}}]},
    )  # fmt: skip
    users = write(
        tmp_path / "two" / "users", {"users": [{"name": "u", "user": {"tokenFile": "token"}}]}
    )
    contexts = write(
        tmp_path / "contexts",
        {"contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}]},
    )

    settings = kc.from_files(
        [clusters, users, contexts], {}, where="KUBECONFIG", context="x", as_user="auditor"
    )

    assert settings.server == "https://10.0.0.1:6443"
    assert settings.token is not None and settings.token() == "file-token"
    assert settings.ssl_context is not None and settings.ssl_context.get_ca_certs()
    assert (settings.namespace, settings.source) == ("ns", "KUBECONFIG")
    assert settings.impersonate == kc.Impersonation("auditor")


def test_a_broken_file_in_a_list_is_named(tmp_path: Path) -> None:
    good = write(tmp_path / "good", kubeconfig({"token": TOKEN}))
    bad = tmp_path / "bad"
    bad.write_text("garbage: [")
    with pytest.raises(ClientConfigError, match=f"kubeconfig {bad}: not valid YAML"):
        kc.from_files([good, bad], {}, where="KUBECONFIG")


def test_a_ca_file_that_cannot_be_read_is_refused_even_for_an_http_server(tmp_path: Path) -> None:
    """client-go opens it whatever the scheme: a kubeconfig kubectl refuses is refused."""
    cluster = {"certificate-authority": "missing.pem"}
    path = write(tmp_path / "k", kubeconfig({}, cluster, server="http://127.0.0.1:8080"))
    with pytest.raises(
        ClientConfigError, match=r"certificate-authority .*missing\.pem: no such file"
    ):
        kc.load(path)
