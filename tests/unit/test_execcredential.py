"""A kubeconfig's exec credential plugin (EKS, GKE and AKS kubeconfigs use one): run as client-go
runs it, its token cached until shortly before it expires, and every broken plugin or answer a
ClientConfigError naming the field, never quoting the plugin's output."""

from __future__ import annotations

import base64
import datetime as dt
import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from podcert.client import kubeconfig as kc
from podcert.client.execcredential import (
    REFRESH_BEFORE,
    ExecError,
    ExecToken,
    Mode,
    Runner,
    interactive,
)
from podcert.client.kubeconfig import ClientConfigError

V1 = "client.authentication.k8s.io/v1"
SECRET = "plugin-token-that-must-never-show"


def iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


EXPIRES = 1_000_000.0  # when the first token of the refresh tests expires


def answer(token: str = SECRET, expiry: str | None = None, **status: Any) -> bytes:
    body: dict[str, Any] = {"token": token, **status}
    if expiry is not None:
        body["expirationTimestamp"] = expiry
    return json.dumps({"apiVersion": V1, "kind": "ExecCredential", "status": body}).encode()


def plugin(folder: Path, body: str) -> Path:
    """An executable Python script in `folder`, as a cloud CLI would be on PATH."""
    script = folder / "get-token"
    script.write_text(f"#!{sys.executable}\nimport json, os, sys\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def config_with(folder: Path, exec_spec: dict[str, Any]) -> Path:
    path = folder / "config"
    path.write_text(
        yaml.safe_dump(
            {
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": "https://127.0.0.1:8443",
                            "insecure-skip-tls-verify": True,
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"exec": exec_spec}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def test_a_kubeconfig_with_an_exec_plugin_authenticates_with_its_token(tmp_path: Path) -> None:
    # The plugin echoes what client-go gives it: the kubeconfig's env and the exec info.
    plugin(
        tmp_path,
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "assert info['spec']['interactive'] is False and info['apiVersion'] == sys.argv[2]\n"
        "token = os.environ['REGION'] + '-' + sys.argv[1]\n"
        "print(json.dumps({'apiVersion': sys.argv[2], 'kind': 'ExecCredential',"
        " 'status': {'token': token}}))",
    )
    path = config_with(
        tmp_path,
        {
            "apiVersion": V1,
            "command": "./get-token",  # relative to the kubeconfig's folder, as client-go has it
            "args": ["cluster-1", V1],
            "env": [{"name": "REGION", "value": "eu"}],
            "interactiveMode": "Never",
        },
    )

    settings = kc.load(path)

    assert settings.token is not None
    assert settings.token() == "eu-cluster-1"


def test_the_token_is_fetched_again_shortly_before_it_expires() -> None:
    now = [0.0]
    answers = [answer("first", iso(EXPIRES))]
    runs: list[dict[str, str]] = []

    def run(argv: list[str], env: dict[str, str], prompt: bool) -> bytes:
        runs.append(env)
        return answers.pop(0)

    now[0] = EXPIRES - 3600  # the first token has an hour left
    token = ExecToken(
        {"apiVersion": V1, "interactiveMode": "Never", "command": sys.executable},
        Path(),
        clock=lambda: now[0],
        run=run,
    )
    assert token() == "first" and len(runs) == 1

    now[0] = EXPIRES - REFRESH_BEFORE - 1  # not yet due: the cached one
    assert token() == "first" and len(runs) == 1

    answers.append(answer("second", iso(EXPIRES + 3600)))
    now[0] = EXPIRES - REFRESH_BEFORE  # due
    assert token() == "second" and len(runs) == 2
    assert json.loads(runs[1]["KUBERNETES_EXEC_INFO"])["kind"] == "ExecCredential"


def test_a_failed_refresh_keeps_the_token_until_it_expires_then_fails() -> None:
    now = [EXPIRES - 3600]
    answers: list[bytes | Exception] = [answer("only", iso(EXPIRES))]

    def run(argv: list[str], env: dict[str, str], prompt: bool) -> bytes:
        got = answers.pop(0) if answers else ExecError("exec: get-token exited 1")
        if isinstance(got, Exception):
            raise got
        return got

    token = ExecToken(
        {"apiVersion": V1, "interactiveMode": "Never", "command": sys.executable},
        Path(),
        clock=lambda: now[0],
        run=run,
    )
    now[0] = EXPIRES - 10  # due, the plugin fails, the token still has 10 s
    assert token() == "only"
    now[0] = EXPIRES  # expired, the plugin still fails
    with pytest.raises(ExecError, match="exited 1"):
        token()


def test_a_token_without_expiry_is_kept_for_the_process_life() -> None:
    calls = []

    def run(argv: list[str], env: dict[str, str], prompt: bool) -> bytes:
        calls.append(1)
        return answer("forever")

    token = ExecToken(
        {"apiVersion": V1, "interactiveMode": "Never", "command": sys.executable}, Path(), run=run
    )
    assert [token() for _ in range(3)] == ["forever"] * 3 and len(calls) == 1


BAD_ANSWERS = [
    pytest.param(b"not json " + SECRET.encode(), "not JSON", id="not JSON"),
    pytest.param(b'{"kind": "Secret"}', "not an ExecCredential", id="another kind"),
    pytest.param(
        json.dumps({"apiVersion": "v9", "kind": "ExecCredential"}).encode(),
        "another apiVersion",
        id="another version",
    ),
    pytest.param(
        json.dumps({"apiVersion": V1, "kind": "ExecCredential"}).encode(), "no status", id="none"
    ),
    pytest.param(
        answer("", clientCertificateData="CERT", clientKeyData=SECRET),
        "client certificate are not supported",
        id="a client certificate",
    ),
    pytest.param(answer(""), "status.token is not one line", id="an empty token"),
    pytest.param(answer(SECRET + "\r\nX-Injected: 1"), "not one line", id="a header injection"),
    pytest.param(answer(SECRET + "€"), "status.token is not ASCII", id="a token holding a euro"),
    pytest.param(answer("é" + SECRET), "status.token is not ASCII", id="a Latin-1 letter"),
    pytest.param(answer(expiry="yesterday"), "not an RFC 3339 time", id="a bad expiry"),
    pytest.param(answer(expiry="2001-01-01T00:00:00Z"), "already expired", id="expired"),
]


@pytest.mark.parametrize(("output", "says"), BAD_ANSWERS)
def test_a_bad_answer_is_a_typed_error_that_quotes_nothing(output: bytes, says: str) -> None:
    with pytest.raises(ExecError) as raised:
        ExecToken(
            {"apiVersion": V1, "interactiveMode": "Never", "command": sys.executable},
            Path(),
            clock=lambda: 1e9,
            run=lambda argv, env, prompt: output,
        )

    assert says in str(raised.value)
    assert SECRET not in str(raised.value) and "CERT" not in str(raised.value)


BAD_SPECS = [
    pytest.param({"command": "x"}, "exec: apiVersion is not one of", id="no apiVersion"),
    pytest.param(
        {"apiVersion": V1, "interactiveMode": "Never"}, "exec: command is not set", id="no command"
    ),
    pytest.param(
        {"apiVersion": V1, "command": sys.executable},
        "interactiveMode must be set with client.authentication.k8s.io/v1",
        id="v1 without interactiveMode (client-go requires it)",
    ),
    pytest.param(
        {"apiVersion": V1, "command": sys.executable, "interactiveMode": "Sometimes"},
        "interactiveMode is not one of Never, IfAvailable, Always",
        id="an interactiveMode client-go does not know",
    ),
    pytest.param(
        {
            "apiVersion": V1,
            "interactiveMode": "Never",
            "command": "no-such-plugin-here",
            "installHint": "install it with: brew install no-such-plugin",
        },
        "not found or not executable: install it with: brew install no-such-plugin",
        id="a missing command, with the kubeconfig's install hint",
    ),
    pytest.param(
        {"apiVersion": V1, "interactiveMode": "Never", "command": "no-such-plugin-here"},
        "not found",
        id="missing",
    ),
    pytest.param(
        {"apiVersion": V1, "interactiveMode": "Never", "command": sys.executable, "args": "-c"},
        "args is not a list",
        id="args",
    ),
    pytest.param(
        {
            "apiVersion": V1,
            "interactiveMode": "Never",
            "command": sys.executable,
            "env": [{"name": "A"}],
        },
        "env[0] is not a name and a string value",
        id="env",
    ),
    pytest.param(
        {"apiVersion": V1, "command": sys.executable, "interactiveMode": "Always"},
        "needs a terminal",
        id="interactive",
    ),
]


@pytest.mark.parametrize(("spec", "says"), BAD_SPECS)
def test_an_unusable_exec_section_names_its_field(
    tmp_path: Path, spec: dict[str, Any], says: str
) -> None:
    path = config_with(tmp_path, spec)

    with pytest.raises(ClientConfigError) as raised:
        kc.load(path)

    assert str(raised.value).startswith(f"kubeconfig {path}: user 'u': exec")
    assert says in str(raised.value)


def test_a_plugin_that_fails_is_named_with_its_exit_code_not_its_output(tmp_path: Path) -> None:
    plugin(tmp_path, f"print({SECRET!r}); sys.exit(3)")
    path = config_with(
        tmp_path,
        {"apiVersion": V1, "interactiveMode": "Never", "command": str(tmp_path / "get-token")},
    )

    with pytest.raises(ClientConfigError, match="get-token exited 3") as raised:
        kc.load(path)

    assert SECRET not in str(raised.value)


def test_exec_beside_a_token_is_ambiguous(tmp_path: Path) -> None:
    path = config_with(
        tmp_path, {"apiVersion": V1, "interactiveMode": "Never", "command": sys.executable}
    )
    doc = yaml.safe_load(path.read_text())
    doc["users"][0]["user"]["token"] = SECRET
    path.write_text(yaml.safe_dump(doc))

    with pytest.raises(ClientConfigError, match="exec and a token both set") as raised:
        kc.load(path)

    assert SECRET not in str(raised.value)


def test_an_exec_plugins_token_is_never_sent_over_plain_http(tmp_path: Path) -> None:
    # client-go drops credentials for an http:// server; sending the token in clear text would be
    # worse than refusing.
    plugin(
        tmp_path,
        "print(json.dumps({'apiVersion': sys.argv[1], 'kind': 'ExecCredential',"
        " 'status': {'token': 'secret'}}))",
    )
    path = config_with(
        tmp_path,
        {"apiVersion": V1, "interactiveMode": "Never", "command": "./get-token", "args": [V1]},
    )
    document = yaml.safe_load(path.read_text())
    document["clusters"][0]["cluster"] = {"server": "http://127.0.0.1:8080"}
    path.write_text(yaml.safe_dump(document))

    with pytest.raises(kc.ClientConfigError, match="credentials need an https server"):
        kc.load(path)


# --- interactive mode, cluster info, a refresh on 401 ---------------------------------------------


@pytest.mark.parametrize(
    ("mode", "terminal", "prompts"),
    [
        pytest.param("Never", True, False, id="Never: not even at a terminal"),
        pytest.param("Never", False, False, id="Never, no terminal"),
        pytest.param("IfAvailable", True, True, id="IfAvailable at a terminal"),
        pytest.param("IfAvailable", False, False, id="IfAvailable, no terminal"),
        pytest.param("Always", True, True, id="Always at a terminal"),
    ],
)
def test_a_plugin_may_prompt_as_client_go_decides(
    mode: Mode, terminal: bool, prompts: bool
) -> None:
    assert interactive(mode, terminal) is prompts


def test_always_without_a_terminal_is_refused_naming_the_mode() -> None:
    with pytest.raises(ExecError, match="interactiveMode Always needs a terminal"):
        interactive("Always", False)


def recording(runs: list[tuple[dict[str, Any], bool]]) -> Runner:
    def run(argv: list[str], env: dict[str, str], prompt: bool) -> bytes:
        runs.append((json.loads(env["KUBERNETES_EXEC_INFO"]), prompt))
        return answer()

    return run


CLUSTER = {"server": "https://10.0.0.1:6443", "certificate-authority-data": "Q0E="}


def test_at_a_terminal_an_if_available_plugin_gets_standard_input() -> None:
    runs: list[tuple[dict[str, Any], bool]] = []
    spec = {"apiVersion": V1, "interactiveMode": "IfAvailable", "command": sys.executable}
    ExecToken(spec, Path(), run=recording(runs), is_terminal=lambda: True)
    [(info, prompt)] = runs
    assert prompt is True and info["spec"] == {"interactive": True}


@pytest.mark.parametrize("provide", [True, False], ids=["provideClusterInfo", "not asked"])
def test_the_cluster_is_passed_on_only_when_asked(provide: bool) -> None:
    runs: list[tuple[dict[str, Any], bool]] = []
    spec = {
        "apiVersion": V1,
        "interactiveMode": "Never",
        "command": sys.executable,
        "provideClusterInfo": provide,
    }
    ExecToken(spec, Path(), cluster=CLUSTER, run=recording(runs), is_terminal=lambda: True)
    [(info, prompt)] = runs
    assert prompt is False
    assert info["spec"] == (
        {"interactive": False, "cluster": CLUSTER} if provide else {"interactive": False}
    )


def test_a_kubeconfigs_cluster_reaches_the_plugin_ca_file_and_all(tmp_path: Path) -> None:
    plugin(
        tmp_path,
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "token = json.dumps(info['spec']['cluster'], sort_keys=True).encode().hex()\n"
        "print(json.dumps({'apiVersion': sys.argv[1], 'kind': 'ExecCredential',"
        " 'status': {'token': token}}))",
    )
    path = config_with(
        tmp_path,
        {
            "apiVersion": V1, "command": "./get-token", "args": [V1],
            "interactiveMode": "Never", "provideClusterInfo": True,
        },
    )  # fmt: skip
    ca = trustme.CA().cert_pem.bytes()
    (tmp_path / "ca.pem").write_bytes(ca)
    document = yaml.safe_load(path.read_text())
    document["clusters"][0]["cluster"] = {
        "server": "https://127.0.0.1:8443/",
        "certificate-authority": "ca.pem",
        "tls-server-name": "api.example",
        "proxy-url": "http://proxy:3128",
        "extensions": [{"name": "client.authentication.k8s.io/exec", "extension": {"aud": "x"}}],
    }
    path.write_text(yaml.safe_dump(document))

    token = kc.load(path).token
    assert token is not None
    assert json.loads(bytes.fromhex(token())) == {
        "server": "https://127.0.0.1:8443/",
        "certificate-authority-data": base64.b64encode(ca).decode(),
        "tls-server-name": "api.example",
        "proxy-url": "http://proxy:3128",
        "config": {"aud": "x"},
    }


def test_a_refused_token_is_fetched_again_once_however_many_requests_saw_it() -> None:
    runs: list[tuple[dict[str, Any], bool]] = []
    tokens = iter(["first", "second", "third"])

    def run(argv: list[str], env: dict[str, str], prompt: bool) -> bytes:
        runs.append(({}, prompt))
        return answer(next(tokens))

    token = ExecToken(
        {"apiVersion": V1, "interactiveMode": "Never", "command": sys.executable}, Path(), run=run
    )
    assert token() == "first"
    assert token.refresh("first") is True and token() == "second"
    assert token.refresh("first") is True and len(runs) == 2  # another request already did
    assert token() == "second"


def test_a_refresh_that_fails_keeps_the_token() -> None:
    answers: list[bytes | Exception] = [answer("only"), ExecError("exec: get-token exited 1")]

    def run(argv: list[str], env: dict[str, str], prompt: bool) -> bytes:
        got = answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return got

    token = ExecToken(
        {"apiVersion": V1, "interactiveMode": "Never", "command": sys.executable}, Path(), run=run
    )
    assert token.refresh("only") is False and token() == "only"
