"""Every `podcert` command answers bad input with one line naming the problem and exit 2 (it was
told something it cannot use) or 1 (it could not do its job), never a traceback: kubeconfigs
that are missing or broken, an API server nobody answers for, signer names that are malformed
or Kubernetes' own, and flag values out of range. The answers that need a real API server
(401, 403, a server lost after start) are in tests/integration/test_cli_errors.py."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devcluster.supervise import free_port
from devcluster.testing import eventually
from podcert import cli
from podcert.errors import EXIT_CLUSTER_UNREADABLE

REPO = Path(__file__).resolve().parents[2]
CA_ACTIONS = ("status", "prepare", "promote", "activate", "retire")


def answer(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run `podcert ARGV` in this process: its exit code and what it wrote on stderr. The
    root logger starts bare, as in a fresh process (other tests leave handlers on it), and is
    put back afterwards (the daemons install their own handler)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers[:] = []
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse's own way out
        code = exit_.code if isinstance(exit_.code, int) else 1
    finally:
        root.handlers[:], root.level = handlers, level
    return code, capsys.readouterr().err


def assert_one_line(err: str, *says: str) -> None:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for text in says:
        assert text in lines[0], lines[0]


def kubeconfig_to(path: Path, server: str) -> Path:
    """A well-formed kubeconfig for `server`, with a token nobody issued."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}
                ],
                "users": [{"name": "u", "user": {"token": "not-a-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.fixture
def unreachable(tmp_path: Path) -> Path:
    """A kubeconfig whose server port nothing listens on."""
    return kubeconfig_to(tmp_path / "unreachable.kubeconfig", f"https://127.0.0.1:{free_port()}")


def commands(kubeconfig: Path, tmp_path: Path) -> dict[str, list[str]]:
    """Every command that reads the cluster, with valid flags besides `kubeconfig`."""
    out = {
        "signer": ["signer", f"--kubeconfig={kubeconfig}", "--signer-name=a.example.com/b"],
        "shim": ["shim", f"--kubeconfig={kubeconfig}", "--node-name=n", f"--root={tmp_path}"],
        "shim rotate --pod": [
            "shim",
            "rotate",
            f"--kubeconfig={kubeconfig}",
            "--namespace=shop",
            "--pod=api-0",
        ],
        "shim rotate --service-account": [
            "shim",
            "rotate",
            f"--kubeconfig={kubeconfig}",
            "--namespace=shop",
            "--service-account=api",
        ],
        "audit": ["audit", f"--kubeconfig={kubeconfig}"],
        "status": ["status", f"--kubeconfig={kubeconfig}"],
        "explain pod": ["explain", "pod", "shop/api-0", f"--kubeconfig={kubeconfig}"],
        "version": ["version", f"--kubeconfig={kubeconfig}"],
    }
    for action in CA_ACTIONS:
        # Flags after the action, as docs/guides/operating.md's CA rotation writes them.
        out[f"signer ca {action}"] = [
            "signer",
            "ca",
            action,
            f"--kubeconfig={kubeconfig}",
            "--namespace=podcert-system",
        ]
    return out


EVERY_COMMAND = sorted(commands(Path("k"), Path("r")))
ONE_SHOT = [c for c in EVERY_COMMAND if c not in ("signer", "shim")]
# The read commands tell a cluster they could not read (3) from findings (1).
READ_COMMANDS = ("audit", "status", "explain pod", "version")

KUBECONFIGS = [
    pytest.param(None, "no such file", id="missing kubeconfig"),
    pytest.param("garbage: [", "not valid YAML", id="kubeconfig that is not YAML"),
    pytest.param("apiVersion: v1\nkind: Config\n", "current-context", id="kubeconfig, no context"),
    pytest.param(
        "apiVersion: v1\nkind: Config\ncurrent-context: gone\ncontexts: []\n",
        "gone",
        id="kubeconfig naming a context it lacks",
    ),
]


@pytest.mark.parametrize(("content", "says"), KUBECONFIGS)
@pytest.mark.parametrize("command", EVERY_COMMAND)
def test_an_unusable_kubeconfig_is_one_line_and_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    content: str | None,
    says: str,
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    if content is not None:
        kubeconfig.write_text(content)

    code, err = answer(commands(kubeconfig, tmp_path)[command], capsys)

    assert code == 2
    assert_one_line(err, str(kubeconfig), says)


@pytest.mark.parametrize("command", ONE_SHOT)
def test_a_command_that_cannot_reach_the_api_server_says_where_and_exits_1_or_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], unreachable: Path, command: str
) -> None:
    server = yaml.safe_load(unreachable.read_text())["clusters"][0]["cluster"]["server"]

    code, err = answer(commands(unreachable, tmp_path)[command], capsys)

    assert code == (EXIT_CLUSTER_UNREADABLE if command in READ_COMMANDS else 1)
    assert_one_line(err, "cannot reach the API server at", server.removeprefix("https://"))


@pytest.mark.parametrize("command", ["signer", "shim"])
def test_a_daemon_waits_for_an_unreachable_api_server_saying_why_and_stops_cleanly(
    tmp_path: Path, unreachable: Path, command: str
) -> None:
    """A long-running component outlives an API server that is away at start (a restart loop
    would only add back-off): it says each time what it cannot reach, and SIGTERM still stops
    it at once with exit 0."""
    argv = [*commands(unreachable, tmp_path)[command], "--metrics-port=0", "--startup-timeout=0"]
    log = tmp_path / "daemon.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "podcert", *argv], stderr=out, stdout=out, cwd=REPO
        )
    try:
        eventually(
            lambda: "API server not usable yet" in log.read_text(),
            timeout=30,
            what=f"{command}'s first retry line",
        )
        assert proc.poll() is None, log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert "Traceback" not in text, text
    waiting = [line for line in text.splitlines() if "API server not usable yet" in line]
    assert "Connection refused" in waiting[0]


@pytest.mark.parametrize("command", ["signer", "shim"])
def test_a_daemon_gives_up_on_an_api_server_away_longer_than_its_startup_timeout(
    tmp_path: Path, unreachable: Path, command: str
) -> None:
    """Given --startup-timeout, it exits 1 with one line naming the server and the cause, as
    Kubernetes expects of a container whose dependency is missing (it is restarted with
    back-off)."""
    argv = [*commands(unreachable, tmp_path)[command], "--metrics-port=0", "--startup-timeout=2"]
    done = subprocess.run(
        [sys.executable, "-m", "podcert", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    text = done.stdout + done.stderr
    assert done.returncode == 1, text
    assert "Traceback" not in text, text
    (gave_up,) = [line for line in text.splitlines() if "giving up" in line]
    assert "API server not usable yet after 2s (cannot reach the API server at" in gave_up
    assert "Connection refused" in gave_up


SIGNER_NAMES = [
    pytest.param("kubernetes.io/kube-apiserver-client-pod", "Kubernetes' own", id="kubernetes.io"),
    pytest.param("pods.kubernetes.io/mine", "Kubernetes' own", id="under kubernetes.io"),
    pytest.param("k8s.io/mine", "Kubernetes' own", id="k8s.io"),
    pytest.param("my-signer", "domain and a path", id="no path"),
    pytest.param("example.com/a/b", "domain and a path", id="two slashes"),
    pytest.param("localhost/x", "fully qualified", id="single-label domain"),
    pytest.param("Example.com/x", "fully qualified", id="uppercase domain"),
    pytest.param("example.com/Signer", "lowercase", id="uppercase path"),
    pytest.param("example.com/", "domain and a path", id="empty path"),
]


@pytest.mark.parametrize(("name", "says"), SIGNER_NAMES)
def test_the_signer_refuses_a_signer_name_it_must_not_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, says: str
) -> None:
    code, err = answer(
        ["signer", f"--kubeconfig={tmp_path / 'k'}", f"--signer-name={name}"], capsys
    )

    assert code == 2
    assert_one_line(err, repr(name), says)


def test_the_audit_refuses_a_malformed_signer_name_but_audits_kubernetes_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pods").mkdir()  # an empty node root
    code, err = answer(["audit", f"--root={tmp_path}", "--signer-name=my-signer"], capsys)
    assert code == 2
    assert_one_line(err, "'my-signer'", "domain and a path")

    code, err = answer(
        ["audit", f"--root={tmp_path}", "--signer-name=kubernetes.io/kube-apiserver-client-pod"],
        capsys,
    )
    assert (code, err) == (0, "")


def _bad_flags(tmp_path: Path) -> list[tuple[str, list[str], int, tuple[str, ...]]]:
    kc = f"--kubeconfig={tmp_path / 'absent'}"
    signer = ["signer", kc, "--signer-name=a.example.com/b"]
    shim = ["shim", kc, "--node-name=n", f"--root={tmp_path}"]
    rotate = ["shim", "rotate", kc, "--namespace=shop"]
    a_file = tmp_path / "a-file"  # written by the test
    return [
        ("signer --workers x", [*signer, "--workers=x"], 2, ("--workers", "'x'")),
        ("signer --workers 0", [*signer, "--workers=0"], 2, ("--workers", "got 0")),
        ("signer --metrics-port", [*signer, "--metrics-port=70000"], 2, ("--metrics-port",)),
        ("signer --webhook-port", [*signer, "--webhook-port=-1"], 2, ("--webhook-port",)),
        (
            "signer --bundle-endpoint-port",
            [*signer, "--bundle-endpoint-port=70000"],
            2,
            ("--bundle",),
        ),
        (
            "signer bundle endpoint cert without key",
            [*signer, "--bundle-endpoint-port=8443", f"--bundle-endpoint-cert={a_file}"],
            2,
            ("--bundle-endpoint-cert", "--bundle-endpoint-key"),
        ),
        (
            "signer bundle refresh hint past the overlap",
            [*signer, "--bundle-refresh-hint-seconds=3600"],
            2,
            ("--bundle-refresh-hint-seconds", "half of --ca-overlap-seconds"),
        ),
        ("signer --log-level", [*signer, "--log-level=loud"], 2, ("--log-level", "'loud'")),
        ("signer --refresh-fraction", [*signer, "--refresh-fraction=2"], 2, ("--refresh-frac",)),
        ("signer --backdate-seconds", [*signer, "--backdate-seconds=900"], 2, ("--backdate",)),
        ("signer lease timings", [*signer, "--lease-duration=5"], 2, ("--lease-duration",)),
        ("signer --audit-checkpoint", [*signer, "--audit-checkpoint-every=0"], 2, ("--audit",)),
        ("signer --trust-domain", [*signer, "--trust-domain=spiffe://x"], 2, ("scheme",)),
        (
            "signer --policy missing",
            [*signer, f"--policy={tmp_path / 'none.yaml'}"],
            2,
            ("none.yaml",),
        ),
        ("signer --namespace", [*signer, "--namespace=Not_A_Namespace"], 2, ("--namespace",)),
        ("signer --ca-prepare-at", [*signer, "--ca-prepare-at=1.5"], 2, ("--ca-prepare-at",)),
        ("signer no name", ["signer", kc], 2, ("--signer-name is required",)),
        ("signer unknown flag", [*signer, "--wrokers=2"], 2, ("unrecognized", "--wrokers")),
        ("ca unknown action", ["signer", "ca", "rotate", kc], 2, ("invalid choice", "'rotate'")),
        ("ca --namespace", ["signer", "ca", "status", kc, "--namespace=A_B"], 2, ("'A_B'",)),
        ("ca --ca-root-days", ["signer", "ca", "prepare", kc, "--ca-root-days=0"], 2, ("days",)),
        ("ca --preview", ["signer", "ca", "activate", kc, "--preview"], 2, ("--preview goes",)),
        ("shim --node-name", ["shim", kc, "--node-name=Bad_Node"], 2, ("'Bad_Node'",)),
        ("shim no node", ["shim", kc], 2, ("--node-name is required",)),
        ("shim --workers", [*shim, "--workers=0"], 2, ("--workers",)),
        ("shim --metrics-port", [*shim, "--metrics-port=-1"], 2, ("--metrics-port",)),
        ("shim durations", [*shim, "--abandon-after-seconds=-1"], 2, ("negative",)),
        ("shim --log-level", [*shim, "--log-level=chatty"], 2, ("--log-level",)),
        ("shim --root a file", [*shim, f"--root={a_file}"], 2, ("not a directory",)),
        ("rotate --before", [*rotate, "--pod=p", "--before=yesterday"], 2, ("'yesterday'",)),
        ("rotate --namespace", ["shim", "rotate", kc, "--namespace=A", "--pod=p"], 2, ("'A'",)),
        ("rotate --pod", [*rotate, "--pod=Not A Pod"], 2, ("--pod",)),
        ("rotate which pods", rotate, 2, ("--pod", "--service-account")),
        ("audit --in-cluster and --kubeconfig", ["audit", kc, "--in-cluster"], 2, ("give one",)),
        ("audit --stuck-after", ["audit", kc, "--stuck-after=5x"], 2, ("'5x'",)),
        ("audit --now", ["audit", kc, "--now=tuesday"], 2, ("--now",)),
        ("audit --jobs", ["audit", f"--root={tmp_path}", "--jobs=0"], 2, ("--jobs",)),
        ("audit -o", ["audit", kc, "-o", "wide"], 2, ("'wide'",)),
        ("devcluster no action", ["devcluster"], 2, ("required",)),
        ("devcluster up version", ["devcluster", "up", "--kube-version=9.9"], 2, ("'9.9'",)),
        ("devcluster up --timeout", ["devcluster", "up", "--timeout=x"], 2, ("--timeout",)),
        ("devcluster up --dir a file", ["devcluster", "up", f"--dir={a_file}/x"], 1, ("a-file",)),
        ("devcluster kubelet no node", ["devcluster", "kubelet"], 2, ("node",)),
        (
            "devcluster kubelet no cluster",
            ["devcluster", "kubelet", "n", "--hollow", f"--dir={tmp_path}"],
            1,
            ("no devcluster runs under",),
        ),
        (
            "devcluster node-kubeconfig no cluster",
            ["devcluster", "node-kubeconfig", "n", f"--dir={tmp_path}"],
            1,
            ("no devcluster runs under",),
        ),
        ("demo --rate", ["demo", "--rate=fast"], 2, ("--rate", "'fast'")),
        ("demo --rate 0", ["demo", "--rate=0"], 2, ("--rate must be above 0",)),
        ("no command", [], 2, ("COMMAND",)),
        ("unknown command", ["sigenr"], 2, ("'sigenr'",)),
    ]


BAD_FLAG_IDS = [case[0] for case in _bad_flags(Path("/nonexistent-for-ids"))]


@pytest.mark.parametrize("case", BAD_FLAG_IDS)
def test_a_bad_flag_value_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    [(argv, code, says)] = [(a, c, s) for name, a, c, s in _bad_flags(tmp_path) if name == case]
    (tmp_path / "a-file").write_text("")

    got, err = answer(argv, capsys)

    assert got == code, err
    assert_one_line(err, *says)


def test_ca_takes_its_flags_before_and_after_the_action(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runbook line works, the older spelling (flags before `ca`) still does, and a flag
    given after the action wins over the same flag before it."""
    after = tmp_path / "after.kubeconfig"
    before = tmp_path / "before.kubeconfig"
    for argv, named in (
        (["signer", "ca", "status", "--namespace=podcert-system", f"--kubeconfig={after}"], after),
        (["signer", f"--kubeconfig={before}", "--namespace=ns", "ca", "status"], before),
        (["signer", f"--kubeconfig={before}", "ca", "status", f"--kubeconfig={after}"], after),
    ):
        code, err = answer(argv, capsys)
        assert code == 2
        assert_one_line(err, f"kubeconfig {named}: no such file")
