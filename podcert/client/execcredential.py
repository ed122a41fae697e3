"""A kubeconfig user's `exec` credential plugin: the way EKS (`aws eks get-token`), GKE
(`gke-gcloud-auth-plugin`) and AKS (`kubelogin`) kubeconfigs authenticate, so that `podcert audit`
runs from an operator's workstation with the kubeconfig kubectl uses.

The plugin protocol is client-go's (client.authentication.k8s.io v1 and v1beta1): the command runs
with the kubeconfig's args and env added to ours, `KUBERNETES_EXEC_INFO` naming the version,
whether it may prompt, and with `provideClusterInfo: true` the cluster (server, CA, TLS server
name, proxy, the cluster's exec extension); its stderr is left to the terminal (where the
plugin's prompts and errors belong), and it prints an ExecCredential whose `status.token` is the
bearer token, good until `status.expirationTimestamp` (for the process's life when it has none).
The token is fetched at load, so a broken plugin is a start-up error, again shortly before it
expires, and again when the API server answers 401 to it (`refresh`: client-go's exec
authenticator does the same).

`interactiveMode` as client-go decides it (`interactive`): `Never` never gets standard input;
`IfAvailable` (v1beta1's default) gets it when it is a terminal; `Always` needs one and is
refused without it. v1 requires the field, as client-go does. A command that is not found is
refused with the kubeconfig's `installHint`. A plugin that answers with a client certificate
instead of a token is refused with an ExecError naming the field. No message quotes the
plugin's output: it holds the credential.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, cast

from podcert.errors import ConfigError

log = logging.getLogger("podcert.kubeconfig")

VERSIONS: Final = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
RUN_TIMEOUT: Final = 120.0  # a plugin that opens no browser answers in seconds
REFRESH_BEFORE: Final = 60.0  # fetch a new token this long before the current one expires
MODES: Final = ("Never", "IfAvailable", "Always")
Mode = Literal["Never", "IfAvailable", "Always"]
# Runs the plugin: (argv, env, whether it gets our standard input) -> its standard output.
Runner = Callable[[list[str], dict[str, str], bool], bytes]


class ExecError(ConfigError):
    """The exec plugin is unusable or failed: says which field or what happened."""


def interactive(mode: Mode, stdin_is_terminal: bool) -> bool:
    """Whether the plugin gets standard input and is told it may prompt (client-go's
    isInteractive). Raises ExecError for `Always` without a terminal."""
    if mode == "Always" and not stdin_is_terminal:
        raise ExecError(
            "exec: interactiveMode Always needs a terminal, and standard input is not one"
        )
    return mode != "Never" and stdin_is_terminal


def _stdin_is_terminal() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class Plugin:
    """A kubeconfig's exec section, checked."""

    argv: list[str]
    env: dict[str, str]
    version: str
    mode: Mode
    provide_cluster_info: bool


class ExecToken:
    """A bearer token from an exec plugin, cached until shortly before it expires. `clock` is the
    wall clock in seconds since the epoch (the plugin's expiry is a wall time); `run` runs the
    plugin and returns its standard output, `is_terminal` says whether standard input is a
    terminal (both injected in tests); `cluster` is what `provideClusterInfo` passes on."""

    def __init__(
        self,
        spec: Mapping[str, Any],
        base: Path,
        *,
        cluster: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] = os.environ,
        clock: Callable[[], float] = time.time,
        run: Runner | None = None,
        is_terminal: Callable[[], bool] = _stdin_is_terminal,
    ) -> None:
        self.plugin = _parse(spec, base, environ)
        self.cluster = dict(cluster) if cluster is not None else None
        self.clock = clock
        self.run = run or _run
        self.is_terminal = is_terminal
        self._lock = threading.Lock()
        self._token, self._refresh_at = self._fetch()

    def __call__(self) -> str:
        if self.clock() < self._refresh_at:
            return self._token
        with self._lock:
            if self.clock() >= self._refresh_at:
                try:
                    self._token, self._refresh_at = self._fetch()
                except ExecError as err:
                    if self.clock() >= self._refresh_at + REFRESH_BEFORE:
                        raise  # expired: sending it would only earn a 401
                    log.warning("keeping the current token until it expires: %s", err)
            return self._token

    def refresh(self, used: str) -> bool:
        """After the API server refused `used` (401): run the plugin again unless another
        request already replaced that token. Whether the token now differs from `used`; a
        plugin that fails keeps the current token (and says so in the log)."""
        with self._lock:
            if self._token == used:
                try:
                    self._token, self._refresh_at = self._fetch()
                except ExecError as err:
                    log.warning("the API server refused the token; fetching a new one: %s", err)
            return self._token != used

    def _fetch(self) -> tuple[str, float]:
        plugin = self.plugin
        prompt = interactive(plugin.mode, self.is_terminal())
        spec: dict[str, Any] = {"interactive": prompt}
        if plugin.provide_cluster_info and self.cluster is not None:
            spec["cluster"] = self.cluster
        info = {"apiVersion": plugin.version, "kind": "ExecCredential", "spec": spec}
        env = {**plugin.env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
        return _credential(self.run(plugin.argv, env, prompt), plugin.version, self.clock())


def _parse(spec: Mapping[str, Any], base: Path, environ: Mapping[str, str]) -> Plugin:
    if not isinstance(spec, Mapping):
        raise ExecError("exec: not a mapping")
    version = spec.get("apiVersion")
    if version not in VERSIONS:
        raise ExecError(f"exec: apiVersion is not one of {', '.join(VERSIONS)}")
    mode = spec.get("interactiveMode") or (None if version == VERSIONS[0] else "IfAvailable")
    if mode is None:
        raise ExecError(f"exec: interactiveMode must be set with {version} (Never, IfAvailable "
                        "or Always)")  # fmt: skip
    if mode not in MODES:
        raise ExecError(f"exec: interactiveMode is not one of {', '.join(MODES)}")
    provide = spec.get("provideClusterInfo", False)
    if not isinstance(provide, bool):
        raise ExecError("exec: provideClusterInfo is not true or false")
    hint = spec.get("installHint")
    if hint is not None and not isinstance(hint, str):
        raise ExecError("exec: installHint is not a string")
    command = spec.get("command")
    if not isinstance(command, str) or not command:
        raise ExecError("exec: command is not set")
    args = spec.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ExecError("exec: args is not a list of strings")
    env = dict(environ)
    for i, item in enumerate(spec.get("env") or []):
        if not (
            isinstance(item, Mapping)
            and isinstance(item.get("name"), str)
            and isinstance(item.get("value"), str)
        ):
            raise ExecError(f"exec: env[{i}] is not a name and a string value")
        env[item["name"]] = item["value"]
    # client-go: a relative command with a path separator is relative to the kubeconfig's folder.
    if os.sep in command and not Path(command).is_absolute():
        command = str(base / command)
    found = shutil.which(command, path=env.get("PATH"))
    if found is None:
        said = f"exec: command {command!r} is not found or not executable"
        raise ExecError(f"{said}: {hint.strip()}" if hint and hint.strip() else said)
    return Plugin([found, *args], env, version, cast(Mode, mode), provide)


def _run(argv: list[str], env: dict[str, str], prompt: bool) -> bytes:
    # A plugin that may prompt reads our terminal, and a person may take their time there.
    stdin, timeout = (None, None) if prompt else (subprocess.DEVNULL, RUN_TIMEOUT)
    try:
        done = subprocess.run(
            argv, env=env, stdin=stdin, stdout=subprocess.PIPE, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise ExecError(
            f"exec: {Path(argv[0]).name} gave no answer in {RUN_TIMEOUT:.0f} s"
        ) from None
    except OSError as err:
        raise ExecError(f"exec: {Path(argv[0]).name} did not start: {err.strerror}") from None
    if done.returncode != 0:
        raise ExecError(f"exec: {Path(argv[0]).name} exited {done.returncode}")
    return done.stdout


def _credential(output: bytes, version: str, now: float) -> tuple[str, float]:
    """(the token, when to fetch the next one) from a plugin's output."""
    try:
        doc = json.loads(output)
    except ValueError:
        raise ExecError("exec: the plugin's output is not JSON") from None
    if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
        raise ExecError("exec: the plugin's output is not an ExecCredential")
    if doc.get("apiVersion") != version:
        raise ExecError(f"exec: the plugin answered another apiVersion than {version}")
    status = doc.get("status")
    if not isinstance(status, dict):
        raise ExecError("exec: the plugin's ExecCredential has no status")
    if status.get("clientCertificateData") or status.get("clientKeyData"):
        raise ExecError("exec: plugins answering with a client certificate are not supported")
    token = status.get("token")
    if not isinstance(token, str) or not token.strip() or not token.strip().isprintable():
        raise ExecError("exec: status.token is not one line of text")
    if not token.isascii():
        # A header value is bytes; a bearer token (RFC 6750) is ASCII, and sent as UTF-8 or
        # Latin-1 it would mean different things to different servers.
        raise ExecError("exec: status.token is not ASCII text (it goes in a header)")
    expiry = status.get("expirationTimestamp")
    if expiry is None:
        return token.strip(), float("inf")
    try:
        expires = dt.datetime.fromisoformat(str(expiry).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ExecError("exec: status.expirationTimestamp is not an RFC 3339 time") from None
    if expires <= now:
        raise ExecError("exec: the plugin's token has already expired")
    return token.strip(), max(now, expires - REFRESH_BEFORE)
