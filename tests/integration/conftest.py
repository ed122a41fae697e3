"""Factories every integration test starts its processes with: `start_signer(...)` and
`start_shim(...)`, each a real child process with its real identity (the signer's ServiceAccount
and RBAC, a node's client certificate), waited ready, and stopped when the module is done.

Flags are keyword arguments, spelled as in Python: `audit_log=path` is `--audit-log=path`,
`fair_queue=False` is `--no-fair-queue`, `webhook_port=8443` is `--webhook-port=8443`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from devcluster import processes, release
from devcluster.testing import DevCluster


def flags(**values: Any) -> list[str]:
    """Command-line flags from keyword arguments (None: left out; True/False: --x/--no-x)."""
    out: list[str] = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + flag[2:])
        elif isinstance(value, list | tuple):
            out += [f"{flag}={item}" for item in value]
        else:
            out.append(f"{flag}={value}")
    return out


P = TypeVar("P", processes.Signer, processes.Shim)


def _launch(started: list[P], proc: P, wait: bool) -> P:
    """Start `proc` (waited ready unless told not to) and remember it for the module's end."""
    started.append(proc)
    proc.start()
    if wait:
        proc.wait_ready()
    return proc


def _stop_all(started: Sequence[processes.Process]) -> None:
    for proc in reversed(started):
        proc.stop()


class StartSigner(Protocol):
    def __call__(
        self,
        *signer_names: str,
        namespace: str,
        cluster: DevCluster | None = None,
        workdir: Path | None = None,
        wait: bool = True,
        extra: Sequence[str] = (),
        **flag_values: Any,
    ) -> processes.Signer: ...


StartShim = Callable[..., processes.Shim]


@pytest.fixture(scope="module")
def start_signer(
    devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartSigner]:
    """`podcert signer` for these signer names as its own ServiceAccount in `namespace`."""
    started: list[processes.Signer] = []
    default_workdir = tmp_path_factory.mktemp("signers")

    def start(
        *signer_names: str,
        namespace: str,
        cluster: DevCluster | None = None,
        workdir: Path | None = None,
        wait: bool = True,
        extra: Sequence[str] = (),
        **flag_values: Any,
    ) -> processes.Signer:
        proc = processes.signer(
            (cluster or devcluster).root,
            workdir or default_workdir,
            list(signer_names),
            namespace=namespace,
            extra=[*flags(**flag_values), *extra],
        )
        return _launch(started, proc, wait)

    yield start
    _stop_all(started)


@pytest.fixture(scope="module")
def start_shim(
    devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartShim]:
    """`podcert shim` as `node` (its own client certificate), waited ready."""
    started: list[processes.Shim] = []
    default_workdir = tmp_path_factory.mktemp("shims")

    def start(
        node: str,
        *,
        cluster: DevCluster | None = None,
        workdir: Path | None = None,
        wait: bool = True,
        **kwargs: Any,
    ) -> processes.Shim:
        workdir = workdir or default_workdir
        kwargs.setdefault("root", workdir / f"root-{node}")
        proc = processes.shim((cluster or devcluster).root, workdir, node, **kwargs)
        return _launch(started, proc, wait)

    yield start
    _stop_all(started)


@pytest.fixture(scope="session")
def released(tmp_path_factory: pytest.TempPathFactory) -> release.Artefacts:
    """The release artefacts of the tree, as `podcert devcluster release` builds them (the image
    from podman's cache when it is built): test_release checks each as a user would use it,
    test_helm_install installs the chart package and runs the image archive on the real node.
    Both are machine modules, run one after another in one worker, so it is built once."""
    if os.geteuid() != 0:
        pytest.fail("building the release's image needs root (podman's storage)")
    out = tmp_path_factory.mktemp("dist")
    return release.build(out, lambda line: print(line, flush=True))
