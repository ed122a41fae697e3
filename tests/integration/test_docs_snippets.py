"""The docs against a real cluster: every Kubernetes object a page shows is accepted by the API
server (server-side dry run, nothing created), and every page's `docs-test: run` blocks run, in
page order, in one shell (docs/contributing-docs.md, "Pages that run", is the environment)."""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devcluster import cluster, docsnippets, kube
from devcluster.testing import DevCluster, eventually
from podcert.client.rest import ApiError, Rest, path_of

ROOT = Path(__file__).resolve().parents[2]
# API groups whose CRDs the test cluster does not install: their objects are not sent.
NOT_INSTALLED = frozenset({"monitoring.coreos.com"})
RUN_TIMEOUT = 900.0  # a page may start a devcluster, a signer and a node of its own


def _objects() -> list[Any]:
    return [
        pytest.param(obj, id=f"{block.where} {obj['kind']}/{obj.get('metadata', {}).get('name')}")
        for page in docsnippets.pages()
        for block in docsnippets.blocks(page)
        if block.language == "yaml"
        for obj in docsnippets.api_objects(block)
        if obj["apiVersion"].split("/")[0] not in NOT_INSTALLED
    ]


def _resource(rest: Rest, api_version: str, kind: str) -> tuple[str, bool]:
    """(plural, namespaced) of `kind` as the API server's discovery serves it."""
    found = rest.request("GET", "/api/v1" if api_version == "v1" else f"/apis/{api_version}")
    for resource in found["resources"]:
        if resource["kind"] == kind and "/" not in resource["name"]:
            return resource["name"], resource["namespaced"]
    raise AssertionError(f"the API server serves no {kind} in {api_version}")


def _service_account(obj: dict[str, Any]) -> str | None:
    """The service account a pod, or a workload's pod template, runs as (None: not a pod)."""
    spec = obj.get("spec") or {}
    if obj["kind"] != "Pod":
        spec = (spec.get("template") or {}).get("spec") or (
            ((spec.get("jobTemplate") or {}).get("spec") or {}).get("template") or {}
        ).get("spec")
        if not spec:
            return None
    return str(spec.get("serviceAccountName") or "default")


def dry_run(devcluster: DevCluster, obj: dict[str, Any]) -> Any:
    """POST `obj` with dryRun=All. What it names must exist for the API server to judge it, as
    on the reader's cluster: its namespace, and the service account its pods run as (this
    cluster runs no controller that makes `default`) are created first."""
    rest = Rest(devcluster.admin)
    plural, namespaced = _resource(rest, obj["apiVersion"], obj["kind"])
    namespace = obj.get("metadata", {}).get("namespace", "default") if namespaced else None
    if namespace:
        kube.ensure_namespace(devcluster.admin, namespace)
        if account := _service_account(obj):
            kube.ensure_service_account(devcluster.admin, namespace, account)
    return rest.request(
        "POST", path_of(obj["apiVersion"], plural, namespace), query={"dryRun": "All"}, body=obj
    )


@pytest.mark.parametrize("obj", _objects())
def test_every_object_a_page_shows_is_accepted_by_the_api_server(
    devcluster: DevCluster, obj: dict[str, Any]
) -> None:
    dry_run(devcluster, obj)


POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "docs-dry-run", "namespace": "docs-snippets"},
    "spec": {
        "containers": [{"name": "app", "image": "busybox"}],
        "volumes": [
            {
                "name": "identity",
                "projected": {
                    "sources": [
                        {
                            "podCertificate": {
                                "signerName": "podcert.dev/workload",
                                "keyType": "ECDSAP256",
                                "credentialBundlePath": "credential-bundle.pem",
                            }
                        }
                    ]
                },
            }
        ],
    },
}


def test_a_dry_run_accepts_a_valid_pod_and_creates_nothing(devcluster: DevCluster) -> None:
    answer = dry_run(devcluster, POD)
    assert answer["metadata"]["name"] == "docs-dry-run"
    rest = Rest(devcluster.admin)
    with pytest.raises(ApiError) as gone:
        rest.request("GET", path_of("v1", "pods", "docs-snippets", "docs-dry-run"))
    assert gone.value.status == 404


def test_a_dry_run_refuses_a_pod_the_api_server_would_refuse(devcluster: DevCluster) -> None:
    bad = copy.deepcopy(POD)
    bad["spec"]["volumes"][0]["name"] = "Not_A_Name"  # not a DNS label
    with pytest.raises(ApiError) as refused:
        dry_run(devcluster, bad)
    assert refused.value.status == 422


def _pages_that_run() -> list[Any]:
    return [
        pytest.param(page, id=str(page.relative_to(ROOT)))
        for page in docsnippets.pages()
        if docsnippets.run_script(page) is not None
    ]


def run_page(page: Path, work: Path) -> tuple[int, str]:
    """Run `page`'s marked blocks as docs/contributing-docs.md promises; then stop every
    devcluster started under `work` and whatever the shell left running. Returns the exit code
    and the shell's output."""
    script = docsnippets.run_script(page)
    assert script is not None
    folder = work / "work"
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PODCERT_CHECKOUT"] = str(ROOT)
    log = work / "output.log"
    with log.open("wb") as out:
        shell = subprocess.Popen(
            ["bash", "-c", script],
            cwd=folder,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the page's background jobs too
        )
        try:
            code = shell.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            code = -1
        finally:
            for state in folder.rglob("state.json"):
                if state.parent.parent.name != "nodes":  # a control plane's, not a kubelet's
                    cluster.down(state.parent)  # its kubelets too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGTERM)
            shell.wait(timeout=30)
    return code, log.read_text(errors="replace")


@pytest.mark.timeout(RUN_TIMEOUT + 120)
@pytest.mark.parametrize("page", _pages_that_run())
def test_a_pages_marked_blocks_run_in_order(page: Path, tmp_path: Path) -> None:
    code, output = run_page(page, tmp_path)
    assert code == 0, output[-6000:]


def test_a_failing_command_fails_the_page_and_leaves_nothing_running(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- docs-test: run -->\n```sh\n"
        "sleep 600 &\necho $! > sleeper.pid\nfalse\necho after\n```\n"
    )
    code, output = run_page(page, tmp_path)
    assert code != 0
    assert "after" not in output
    pid = int((tmp_path / "work" / "sleeper.pid").read_text())
    eventually(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), timeout=10)


def _zombie(pid: int) -> bool:
    """A killed process not yet reaped by its new parent is gone but for its entry."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True
