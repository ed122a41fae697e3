"""A person's commands find the cluster as kubectl does, against the real API server: with only
KUBECONFIG set (a list, merged, the context's namespace the default), with only ~/.kube/config
(a temporary HOME), with --context picking the one context that works, and with --as
impersonating an identity without rights, whose 403 from the server is named. Each command runs
as a person runs it: a new process with nothing but PATH, HOME and what the case sets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.identities import Paths
from devcluster.testing import DevCluster
from kubelet_shim.kube import ROTATE_ANNOTATION
from podcert.client.rest import Rest, path_of
from podcert.errors import EXIT_CLUSTER_UNREADABLE
from tests.integration.helpers import make_pod

REPO = Path(__file__).resolve().parents[2]
NOBODY = "podcert-nobody-person"


def podcert(argv: list[str], home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "podcert", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={"PATH": os.environ["PATH"], "HOME": str(home), **env},
        check=False,
    )


@pytest.fixture(scope="module")
def admin(devcluster: DevCluster) -> dict[str, Any]:
    """The devcluster's admin kubeconfig, as a document."""
    loaded: dict[str, Any] = yaml.safe_load(
        Paths(devcluster.root.resolve()).admin_kubeconfig.read_text()
    )
    return loaded


@pytest.fixture
def pod(devcluster: DevCluster) -> tuple[str, str]:
    """A pod (Pending: no kubelet runs for its node) to ask a rotation for."""
    namespace = devcluster.namespace("person")
    make_pod(devcluster, namespace, "api-0", "person.podcert.dev/s", node="person-node")
    return namespace, "api-0"


def rotation_requested(devcluster: DevCluster, namespace: str, name: str) -> bool:
    got = Rest(devcluster.admin).get(path_of("v1", "pods", namespace, name))
    assert got is not None
    return ROTATE_ANNOTATION in (got["metadata"].get("annotations") or {})


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def test_only_kubeconfig_set_a_merged_list_and_its_contexts_namespace(
    devcluster: DevCluster, admin: dict[str, Any], pod: tuple[str, str], tmp_path: Path
) -> None:
    """The first file sets only a context (the admin's cluster and user, the pod's namespace)
    and makes it current; the second is the admin kubeconfig, whose own current context loses."""
    namespace, name = pod
    cluster, user = admin["clusters"][0]["name"], admin["users"][0]["name"]
    context = {"cluster": cluster, "user": user, "namespace": namespace}
    first = write(
        tmp_path / "contexts.yaml",
        {"contexts": [{"name": "shop", "context": context}], "current-context": "shop"},
    )
    second = write(tmp_path / "admin.yaml", admin)

    done = podcert(
        ["shim", "rotate", f"--pod={name}"],
        tmp_path / "empty-home",
        KUBECONFIG=f"{first}:{tmp_path / 'missing.yaml'}:{second}",
    )

    assert done.returncode == 0, done.stderr
    assert f"pod {namespace}/{name}: re-key" in done.stdout
    assert rotation_requested(devcluster, namespace, name)


def test_only_home_kube_config(
    devcluster: DevCluster, admin: dict[str, Any], pod: tuple[str, str], tmp_path: Path
) -> None:
    namespace, name = pod
    write(tmp_path / ".kube" / "config", admin)

    done = podcert(["shim", "rotate", f"--namespace={namespace}", f"--pod={name}"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert rotation_requested(devcluster, namespace, name)

    audit = podcert(["audit", f"--namespace={namespace}", "-o", "json"], tmp_path)
    assert audit.returncode in (0, 1), audit.stderr  # healthy or findings: the cluster was read
    assert "cluster: " in audit.stdout


def test_context_picks_the_context_that_works(
    devcluster: DevCluster, admin: dict[str, Any], pod: tuple[str, str], tmp_path: Path
) -> None:
    namespace, name = pod
    doc = {**admin}
    gone = {"name": "gone", "cluster": {"server": "http://127.0.0.1:9"}}
    doc["clusters"] = [*admin["clusters"], gone]
    good = {**admin["contexts"][0]["context"], "namespace": namespace}
    doc["contexts"] = [
        {"name": "gone", "context": {"cluster": "gone"}},
        {"name": "good", "context": good},
    ]
    doc["current-context"] = "gone"
    write(tmp_path / ".kube" / "config", doc)

    current = podcert(["shim", "rotate", f"--pod={name}"], tmp_path)
    assert current.returncode == 1
    assert "cannot reach the API server at 127.0.0.1:9" in current.stderr

    chosen = podcert(["shim", "rotate", "--context=good", f"--pod={name}"], tmp_path)
    assert chosen.returncode == 0, chosen.stderr
    assert rotation_requested(devcluster, namespace, name)


def test_as_impersonates_and_the_servers_403_is_named(
    devcluster: DevCluster, admin: dict[str, Any], pod: tuple[str, str], tmp_path: Path
) -> None:
    namespace, name = pod
    write(tmp_path / ".kube" / "config", admin)

    done = podcert(
        ["shim", "rotate", f"--namespace={namespace}", f"--pod={name}", f"--as={NOBODY}"],
        tmp_path,
    )

    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert "403 Forbidden" in line and f'User "{NOBODY}" cannot patch resource "pods"' in line
    assert not rotation_requested(devcluster, namespace, name)

    audit = podcert(
        ["audit", f"--namespace={namespace}", f"--as={NOBODY}", "--as-group=auditors"], tmp_path
    )
    assert audit.returncode == EXIT_CLUSTER_UNREADABLE  # refused to read is unreadable
    assert "403" in audit.stderr and NOBODY in audit.stderr


def test_nothing_found_says_what_was_tried(tmp_path: Path) -> None:
    done = podcert(["audit"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "podcert audit: no client configuration found: no --kubeconfig, KUBECONFIG is not set, "
        f"no {tmp_path}/.kube/config, and not in a pod (KUBERNETES_SERVICE_HOST and "
        "KUBERNETES_SERVICE_PORT are not set); give --kubeconfig or set KUBECONFIG"
    )
