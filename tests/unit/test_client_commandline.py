"""podcert.client.commandline: where a person's command finds its client configuration
(--kubeconfig, KUBECONFIG, ~/.kube/config outside a pod, the pod's own), with --context, the
context's namespace and --as/--as-group; and the one line said when nothing is found. (Against
a real API server: tests/integration/test_person_commands.py; against client-go:
tests/integration/test_reference_kubeconfig.py.)"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from podcert import cli
from podcert.client import commandline
from podcert.client.commandline import Files, InCluster, source
from podcert.client.loadingrules import ClientConfigError, Impersonation

HOME = Path("/home/op")
HOME_CONFIG = HOME / ".kube/config"
NOT_A_POD = "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set"


def exists_only(*paths: Path) -> Any:
    return lambda path: path in paths


@pytest.mark.parametrize(
    ("explicit", "environ", "existing", "pod", "found"),
    [
        pytest.param(
            Path("/k"), {"KUBECONFIG": "/a"}, [Path("/a"), HOME_CONFIG], None,
            Files((Path("/k"),), "kubeconfig /k"), id="--kubeconfig wins over everything",
        ),
        pytest.param(
            None, {"KUBECONFIG": "/a:/gone:/b"}, [Path("/a"), Path("/b"), HOME_CONFIG], NOT_A_POD,
            Files((Path("/a"), Path("/b")), "KUBECONFIG /a:/b"),
            id="KUBECONFIG: its files that exist, not ~/.kube/config",
        ),
        pytest.param(
            None, {"KUBECONFIG": "/a"}, [Path("/a")], None,
            Files((Path("/a"),), "KUBECONFIG /a"), id="KUBECONFIG even in a pod",
        ),
        pytest.param(
            None, {"KUBECONFIG": "/gone"}, [HOME_CONFIG], None, InCluster(),
            id="KUBECONFIG's files all missing, in a pod: the pod's",
        ),
        pytest.param(
            None, {}, [HOME_CONFIG], NOT_A_POD, Files((HOME_CONFIG,), f"kubeconfig {HOME_CONFIG}"),
            id="~/.kube/config outside a pod",
        ),
        pytest.param(
            None, {}, [HOME_CONFIG], None, InCluster(), id="in a pod, the pod's over ~/.kube/config"
        ),
        pytest.param(None, {}, [], None, InCluster(), id="in a pod with nothing else"),
    ],
)  # fmt: skip
def test_where_a_persons_command_finds_its_configuration(
    explicit: Path | None,
    environ: dict[str, str],
    existing: list[Path],
    pod: str | None,
    found: Files | InCluster,
) -> None:
    assert source(explicit, {"HOME": str(HOME), **environ}, exists_only(*existing), pod) == found


@pytest.mark.parametrize(
    ("environ", "says"),
    [
        pytest.param({}, f"KUBECONFIG is not set, no {HOME_CONFIG}", id="nothing at all"),
        pytest.param(
            {"KUBECONFIG": "/a:/b"},
            "none of KUBECONFIG's files exists (/a, /b)",
            id="KUBECONFIG naming only missing files",
        ),
    ],
)
def test_nothing_found_is_one_line_saying_what_was_tried(
    environ: dict[str, str], says: str
) -> None:
    with pytest.raises(ClientConfigError) as raised:
        source(None, {"HOME": str(HOME), **environ}, exists_only(), NOT_A_POD)
    message = str(raised.value)
    assert "\n" not in message
    for tried in ("no --kubeconfig", says, f"not in a pod ({NOT_A_POD})"):
        assert tried in message


def test_a_pod_is_known_by_its_service_host_and_token(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert commandline.not_in_pod({}, tmp_path) == NOT_A_POD
    assert commandline.not_in_pod(env, tmp_path) == f"no service account token at {tmp_path}/token"
    (tmp_path / "token").write_text("t")
    assert commandline.not_in_pod(env, tmp_path) is None


def write_config(path: Path, namespace: str | None = None) -> Path:
    context: dict[str, str] = {"cluster": "c", "user": "u"}
    if namespace:
        context["namespace"] = namespace
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "c", "cluster": {"server": f"https://{path.stem}:6443"}}],
                "users": [{"name": "u", "user": {"token": "t", "as": "auditor"}}],
                "contexts": [
                    {"name": "main", "context": context},
                    {"name": "other", "context": {"cluster": "c", "namespace": "other"}},
                ],
                "current-context": "main",
            }
        )
    )
    return path


def test_home_config_gives_the_contexts_namespace_and_impersonation(tmp_path: Path) -> None:
    write_config(tmp_path / ".kube" / "config", namespace="shop")
    environ = {"HOME": str(tmp_path)}

    settings = commandline.load(None, environ=environ, account=tmp_path / "none")
    assert (settings.namespace, settings.impersonate) == ("shop", Impersonation("auditor"))

    other = commandline.load(
        None,
        context="other",
        as_user="reader",
        as_groups=["team"],
        environ=environ,
        account=tmp_path / "none",
    )
    assert (other.namespace, other.impersonate) == ("other", Impersonation("reader", ("team",)))
    assert "impersonating 'reader' in groups team" in other.who()


def test_the_pods_namespace_is_pod_namespace_else_its_service_accounts(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    (tmp_path / "namespace").write_text("podcert-system\n")
    trustme.CA().cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    environ = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}

    settings = commandline.load(None, as_user="reader", environ=environ, account=tmp_path)
    assert (settings.source, settings.namespace) == ("in-cluster configuration", "podcert-system")
    assert settings.impersonate == Impersonation("reader")  # --as in a pod too
    pod_namespace = {**environ, "POD_NAMESPACE": "shop"}
    assert commandline.load(None, environ=pod_namespace, account=tmp_path).namespace == "shop"


def test_in_cluster_context_is_refused_rather_than_ignored(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    environ = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(ClientConfigError, match="--context 'x' needs a kubeconfig"):
        commandline.load(None, context="x", environ=environ, account=tmp_path)


def test_the_flags_parse_as_kubectls() -> None:
    parser = argparse.ArgumentParser()
    commandline.add_flags(parser)
    args = parser.parse_args(["--context=c", "--as=u", "--as-group=a", "--as-group=b"])
    assert (args.kubeconfig, args.context, args.as_user, args.as_groups) == (
        None,
        "c",
        "u",
        ["a", "b"],
    )
    assert commandline.given(args)
    assert not commandline.given(parser.parse_args([]))


def test_suppressed_flags_leave_no_attribute_to_override_the_parents() -> None:
    parser = argparse.ArgumentParser()
    commandline.add_flags(parser, suppress=True)
    assert vars(parser.parse_args([])) == {}


def test_a_command_with_no_configuration_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)

    code = cli.main(["shim", "rotate", "--pod=p"])

    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith("podcert shim: no client configuration found: no --kubeconfig")
    assert f"no {tmp_path}/.kube/config" in err
