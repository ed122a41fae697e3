"""The devcluster's version skew decisions (`devcluster.skew`), the command lines an upgraded
kubelet runs, and the one-line refusals of `podcert devcluster upgrade | kubelet` that need no
running cluster."""

from __future__ import annotations

import ast
import datetime as dt
import json
from pathlib import Path

import pytest
import yaml

from devcluster import build, identities, nodeconfig, nodes, planestate, skew, upgrade
from devcluster.hollow import kubemark_args
from devcluster.skew import (
    CONTROLLER_MANAGER,
    KUBE_APISERVER,
    SCHEDULER,
    KubeletUpgrade,
    Minor,
    Refused,
)
from podcert.cli import main


def m(text: str) -> Minor:
    found = skew.parse(text)
    assert isinstance(found, Minor), found
    return found


def plane(apiserver: str, kcm: str | None = None, scheduler: str | None = None) -> dict[str, Minor]:
    return {
        KUBE_APISERVER: m(apiserver),
        CONTROLLER_MANAGER: m(kcm or apiserver),
        SCHEDULER: m(scheduler or apiserver),
    }


def test_the_skew_decisions_import_nothing_but_the_standard_library() -> None:
    tree = ast.parse(Path(skew.__file__).read_text())
    imported = {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    } | {
        a.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for a in node.names
    }
    assert imported <= {"__future__", "re", "collections", "dataclasses", "typing"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("1.36", Minor(1, 36), id="a minor"),
        pytest.param(" 1.9 ", Minor(1, 9), id="surrounding blanks ignored"),
        pytest.param(
            "1.36.3",
            Refused("'1.36.3' is not a Kubernetes minor (like 1.37)"),
            id="a patch release is not a minor",
        ),
        pytest.param(
            "v1.36", Refused("'v1.36' is not a Kubernetes minor (like 1.37)"), id="no v prefix"
        ),
        pytest.param("", Refused("'' is not a Kubernetes minor (like 1.37)"), id="empty"),
    ],
)
def test_a_minor_is_parsed_or_refused_naming_the_text(text: str, expected: object) -> None:
    assert skew.parse(text) == expected


def test_minors_order_as_releases_not_as_text() -> None:
    assert m("1.9") < m("1.10") < m("1.37")


def test_only_offered_minors_pass() -> None:
    assert skew.offered("1.36", ("1.35", "1.36", "1.37")) == Minor(1, 36)
    assert skew.offered("1.34", ("1.35", "1.36", "1.37")) == Refused(
        "Kubernetes 1.34 is not offered (the devcluster offers 1.35, 1.36, 1.37)"
    )


# --- the control plane ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("running", "target", "kubelets", "expected"),
    [
        pytest.param(
            plane("1.36"),
            "1.37",
            {"a": "1.36", "b": "1.35"},
            (KUBE_APISERVER, CONTROLLER_MANAGER, SCHEDULER),
            id="one minor up: the API server first, then its clients",
        ),
        pytest.param(
            plane("1.37", kcm="1.36", scheduler="1.36"),
            "1.37",
            {},
            (CONTROLLER_MANAGER, SCHEDULER),
            id="an upgrade cut short after the API server resumes with its clients",
        ),
        pytest.param(
            plane("1.37", scheduler="1.36"),
            "1.37",
            {},
            (SCHEDULER,),
            id="only what does not run the target yet",
        ),
        pytest.param(plane("1.37"), "1.37", {}, (), id="already at the target: nothing to do"),
        pytest.param(
            plane("1.36"),
            "1.35",
            {},
            Refused(
                "cannot downgrade the control plane from 1.36 to 1.35 "
                "(Kubernetes does not support downgrades)"
            ),
            id="a downgrade is refused",
        ),
        pytest.param(
            plane("1.35"),
            "1.37",
            {},
            Refused(
                "cannot upgrade the control plane from 1.35 to 1.37 in one step: upgrade to "
                "1.36 first (one minor at a time)"
            ),
            id="a skip of two minors is refused, naming the next step",
        ),
        pytest.param(
            plane("1.36"),
            "1.37",
            {"old": "1.33", "new": "1.36"},
            Refused(
                "node old's kubelet 1.33 would fall 4 minors behind 1.37 (at most 3): upgrade "
                "that node first"
            ),
            id="refused while a kubelet would fall more than three minors behind",
        ),
        pytest.param(
            plane("1.36"),
            "1.37",
            {"oldest": "1.34"},
            (KUBE_APISERVER, CONTROLLER_MANAGER, SCHEDULER),
            id="a kubelet three minors behind the target is allowed",
        ),
        pytest.param(
            plane("1.36"),
            "2.0",
            {},
            Refused("Kubernetes 1.36 and 2.0 are of different majors"),
            id="another major is refused",
        ),
    ],
)
def test_the_control_plane_moves_one_minor_up_api_server_first(
    running: dict[str, Minor],
    target: str,
    kubelets: dict[str, str],
    expected: object,
) -> None:
    nodes_at = {node: m(v) for node, v in kubelets.items()}
    assert skew.control_plane_steps(running, m(target), nodes_at) == expected


# --- kubelets ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kubelet", "apiserver", "expected"),
    [
        pytest.param("1.37", "1.37", None, id="the same minor"),
        pytest.param("1.35", "1.37", None, id="two behind"),
        pytest.param("1.34", "1.37", None, id="three behind, the most allowed"),
        pytest.param(
            "1.33",
            "1.37",
            Refused(
                "node n's kubelet 1.33 would be 4 minors older than the API server (1.37); "
                "kubelets may run at most 3 behind"
            ),
            id="four behind is refused",
        ),
        pytest.param(
            "1.37",
            "1.36",
            Refused(
                "node n's kubelet 1.37 would be newer than the API server (1.36): upgrade the "
                "control plane first"
            ),
            id="newer than the API server is refused",
        ),
    ],
)
def test_a_kubelet_runs_at_most_three_minors_behind_and_never_ahead(
    kubelet: str, apiserver: str, expected: object
) -> None:
    assert skew.kubelet_allowed(m(kubelet), m(apiserver), "n") == expected


@pytest.mark.parametrize(
    ("node", "target", "expected"),
    [
        pytest.param(
            "old",
            None,
            KubeletUpgrade("old", m("1.35"), m("1.37")),
            id="to the API server's minor by default",
        ),
        pytest.param(
            "old", "1.36", KubeletUpgrade("old", m("1.35"), m("1.36")), id="to a minor in between"
        ),
        pytest.param(
            "new",
            None,
            KubeletUpgrade("new", m("1.37"), m("1.37")),
            id="already at the target: an upgrade with nothing to do",
        ),
        pytest.param(
            "new",
            "1.36",
            Refused(
                "cannot downgrade node new's kubelet from 1.37 to 1.36 (Kubernetes does not "
                "support downgrades)"
            ),
            id="a downgrade is refused",
        ),
        pytest.param(
            "old",
            "1.38",
            Refused(
                "node old's kubelet 1.38 would be newer than the API server (1.37): upgrade the "
                "control plane first"
            ),
            id="newer than the API server is refused",
        ),
        pytest.param(
            "ghost",
            None,
            Refused("no kubelet was started for node ghost (started: new, old)"),
            id="an unknown node is refused, naming the started ones",
        ),
    ],
)
def test_a_kubelet_upgrade_moves_up_to_at_most_the_api_servers_minor(
    node: str, target: str | None, expected: object
) -> None:
    kubelets = {"old": m("1.35"), "new": m("1.37")}
    found = skew.kubelet_upgrade(node, kubelets, m("1.37"), m(target) if target else None)
    assert found == expected


def test_an_upgrade_with_nothing_to_do_is_not_needed() -> None:
    assert not KubeletUpgrade("n", m("1.37"), m("1.37")).needed
    assert KubeletUpgrade("n", m("1.36"), m("1.37")).needed


def test_a_refusal_raised_at_the_edge_carries_its_line() -> None:
    with pytest.raises(skew.RefusedError) as caught:
        skew.require(Refused("no"))
    assert caught.value.reason == "no"
    assert skew.require(Minor(1, 2)) == Minor(1, 2)


# --- what an upgraded kubelet runs ---------------------------------------------------------------


def test_an_upgraded_hollow_kubelet_runs_the_new_binary_with_the_new_minors_gates() -> None:
    old = kubemark_args(Path("/c/kubemark-v1.35.4"), "n", Path("/k"), 10250, "1.35", max_pods=300)
    assert any(a.startswith("--feature-gates=") for a in old)
    new = nodes.retargeted_args(old, Path("/c/kubemark-v1.37.2"), "1.37")
    assert new == kubemark_args(Path("/c/kubemark-v1.37.2"), "n", Path("/k"), 10250, "1.37", 300)
    back = nodes.retargeted_args(new, Path("/c/kubemark-v1.36.3"), "1.36")
    assert back == kubemark_args(Path("/c/kubemark-v1.36.3"), "n", Path("/k"), 10250, "1.36", 300)


def test_an_upgraded_real_kubelet_keeps_its_flags_its_gates_live_in_its_config() -> None:
    old = ("/c/kubelet-v1.36.3", "--config=/n/kubelet.yaml", "--root-dir=/r", "--v=1")
    new = nodes.retargeted_args(old, Path("/c/kubelet-v1.37.2"), "1.35")
    assert new == ("/c/kubelet-v1.37.2", "--config=/n/kubelet.yaml", "--root-dir=/r", "--v=1")


def test_an_upgraded_real_kubelets_config_gets_the_new_minors_gates_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    def config(version: str) -> dict[str, object]:
        return nodeconfig.kubelet_config(
            kube_version=version,
            folder=tmp_path,
            socket=tmp_path / "c.sock",
            cgroup="/podcert-devcluster-n",
            address="192.0.2.2",
            port=10250,
            ca_file=tmp_path / "ca.crt",
            max_pods=300,
            sync_frequency=dt.timedelta(seconds=10),
        )

    path = tmp_path / "kubelet.yaml"
    path.write_text(yaml.safe_dump(config("1.35"), sort_keys=False))
    nodes.retarget_config(path, "1.37")
    assert yaml.safe_load(path.read_text()) == config("1.37")
    assert config("1.37") != config("1.35")


# --- the recorded state --------------------------------------------------------------------------


def test_a_state_written_before_upgrades_existed_reads_every_component_at_its_version(
    tmp_path: Path,
) -> None:
    paths = identities.Paths(tmp_path)
    old = {
        "etcd_pid": 1,
        "apiserver_pid": 2,
        "etcd_port": 3,
        "apiserver_port": 4,
        "etcd_binary": "e",
        "apiserver_binary": "a",
        "kube_version": "1.36",
    }
    paths.state.write_text(json.dumps(old))
    state = planestate.read_state(paths)
    assert state is not None
    assert state.versions() == dict.fromkeys(
        (KUBE_APISERVER, CONTROLLER_MANAGER, SCHEDULER), "1.36"
    )


# --- the CLI's refusals that need no cluster -----------------------------------------------------


def test_a_version_not_built_names_the_build_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PODCERT_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    assert upgrade.unbuilt("1.36", [build.HOLLOW_KUBELET]) == (
        "kubemark v1.36.3 not built yet: run "
        "`podcert devcluster build --kube-version 1.36 --kubelets` first"
    )
    assert upgrade.unbuilt("1.37", build.CONTROL_PLANE) == (
        "kube-apiserver, kube-controller-manager, kube-scheduler v1.37.2 not built yet: run "
        "`podcert devcluster build --kube-version 1.37` first"
    )
    cached = build.cached_path(build.kubernetes_component(build.HOLLOW_KUBELET, "1.36"))
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"")
    assert upgrade.unbuilt("1.36", [build.HOLLOW_KUBELET]) is None


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        pytest.param(
            ["upgrade", "--kube-version=1.34"],
            "devcluster upgrade: Kubernetes 1.34 is not offered (the devcluster offers 1.35, "
            "1.36, 1.37)",
            id="upgrade to a minor not offered",
        ),
        pytest.param(
            ["upgrade", "--kube-version=latest"],
            "devcluster upgrade: 'latest' is not a Kubernetes minor (like 1.37)",
            id="upgrade to something not a minor",
        ),
        pytest.param(
            ["upgrade", "--kube-version=1.37"],
            "devcluster upgrade: kube-apiserver, kube-controller-manager, kube-scheduler "
            "v1.37.2 not built yet: run `podcert devcluster build --kube-version 1.37` first",
            id="upgrade to a minor not built",
        ),
        pytest.param(
            ["kubelet", "n", "--hollow", "--kube-version=1.36"],
            "devcluster kubelet: kubemark v1.36.3 not built yet: run "
            "`podcert devcluster build --kube-version 1.36 --kubelets` first",
            id="a kubelet of a minor not built",
        ),
        pytest.param(
            ["kubelet", "n", "--hollow", "--kube-version=1.30"],
            "devcluster kubelet: Kubernetes 1.30 is not offered (the devcluster offers 1.35, "
            "1.36, 1.37)",
            id="a kubelet of a minor not offered",
        ),
        pytest.param(
            ["kubelet", "n", "--upgrade", "--kube-version=1.3x"],
            "devcluster kubelet: '1.3x' is not a Kubernetes minor (like 1.37)",
            id="a kubelet upgrade to something not a minor",
        ),
        pytest.param(
            ["kubelet", "n", "--upgrade", "--hollow"],
            "devcluster kubelet: --upgrade keeps the node's kind and services: drop --hollow, "
            "--real and --services",
            id="an upgrade told a node kind",
        ),
    ],
)
def test_bad_version_input_gets_one_line_and_exit_2(
    argv: list[str],
    line: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("PODCERT_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    code = main(["devcluster", *argv, f"--dir={tmp_path / 'cluster'}"])
    out = capsys.readouterr()
    assert (code, out.err.splitlines(), out.out) == (2, [line], "")
