"""The client configuration of a command a person runs (`podcert audit`, `podcert signer ca ...`,
`podcert shim rotate`): kubectl's flags, and where kubectl looks, so that the first command on a
laptop works with the kubeconfig kubectl uses. A new command gets it all by `add_flags(parser)`
and `from_args(args)`. The long-running components do not use this: they take `--kubeconfig`,
else the in-cluster configuration (`podcert.client.kubeconfig.load`), and nothing else.

Where the configuration comes from (`source`, pure):
1. `--kubeconfig FILE` (it must exist);
2. else the files KUBECONFIG lists that exist, merged as client-go merges them
   (`podcert.client.loadingrules`);
3. else ~/.kube/config, when it exists and this process is not in a pod;
4. else the pod's in-cluster configuration, when it is in one (KUBERNETES_SERVICE_HOST and
   KUBERNETES_SERVICE_PORT set and the service account's token present: client-go's test).
Nothing found is one line saying what was tried. One difference from client-go, deliberate: in
a pod the pod's own identity wins over a ~/.kube/config (kubectl would take the file).

`--context` picks another context than the current one, and its namespace becomes the
command's default namespace (`ClientSettings.namespace`; an explicit `--namespace` wins).
`--as` and `--as-group` impersonate, over the kubeconfig user's `as` and `as-groups`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podcert.client.kubeconfig import SERVICE_ACCOUNT, ClientSettings, from_files, in_cluster
from podcert.client.loadingrules import ClientConfigError, impersonation, kubeconfig_files


def add_flags(parser: argparse._ActionsContainer, *, suppress: bool = False) -> None:
    """kubectl's client flags. With `suppress`, a flag not given leaves no attribute (for a
    sub-command that takes them again after its parent did: `podcert signer ca`)."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=default(None),
        help="kubeconfig file; without it KUBECONFIG's files, else ~/.kube/config, else the "
        "pod's in-cluster configuration",
    )
    parser.add_argument(
        "--context",
        default=default(None),
        help="the kubeconfig context to use, not the current one",
    )
    parser.add_argument(
        "--as", dest="as_user", default=default(None), metavar="USER", help="impersonate USER"
    )
    parser.add_argument(
        "--as-group",
        dest="as_groups",
        action="append",
        default=default([]),
        metavar="GROUP",
        help="impersonate GROUP too (repeatable; needs --as)",
    )


@dataclass(frozen=True)
class Files:
    """Read these kubeconfig files (merged); `where` names them in messages."""

    paths: tuple[Path, ...]
    where: str


@dataclass(frozen=True)
class InCluster:
    """Use the pod's own service account."""


def source(
    explicit: Path | None,
    environ: Mapping[str, str],
    exists: Callable[[Path], bool],
    pod: str | None,
) -> Files | InCluster:
    """Where a person's command finds its configuration. `pod` is None in a pod, else why this
    is not one (for the message). Raises ClientConfigError saying what was tried."""
    if explicit is not None:
        return Files((explicit,), f"kubeconfig {explicit}")
    home = Path(environ.get("HOME") or Path.home())
    listed = kubeconfig_files(environ, home)
    found = tuple(p for p in listed if exists(p))
    if environ.get("KUBECONFIG") and found:
        return Files(found, f"KUBECONFIG {os.pathsep.join(map(str, found))}")
    if not environ.get("KUBECONFIG") and found and pod is not None:
        return Files(found, f"kubeconfig {found[0]}")
    if pod is None:
        return InCluster()
    if environ.get("KUBECONFIG"):
        files = f"none of KUBECONFIG's files exists ({', '.join(map(str, listed))})"
    else:
        files = f"KUBECONFIG is not set, no {listed[0]}"
    raise ClientConfigError(
        f"no client configuration found: no --kubeconfig, {files}, and not in a pod ({pod}); "
        "give --kubeconfig or set KUBECONFIG"
    )


def not_in_pod(environ: Mapping[str, str], account: Path = SERVICE_ACCOUNT) -> str | None:
    """None in a pod (client-go's in-cluster test), else why this is not one."""
    if not environ.get("KUBERNETES_SERVICE_HOST") or not environ.get("KUBERNETES_SERVICE_PORT"):
        return "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set"
    if not (account / "token").is_file():
        return f"no service account token at {account / 'token'}"
    return None


def load(
    kubeconfig: Path | None,
    *,
    context: str | None = None,
    as_user: str | None = None,
    as_groups: Sequence[str] = (),
    in_cluster_only: bool = False,
    environ: Mapping[str, str] = os.environ,
    account: Path = SERVICE_ACCOUNT,
) -> ClientSettings:
    """The client settings of a person's command (see the module docstring); with
    `in_cluster_only` the pod's own, wherever else a configuration might be."""
    found = (
        InCluster()
        if in_cluster_only
        else source(kubeconfig, environ, Path.is_file, not_in_pod(environ, account))
    )
    if isinstance(found, Files):
        return from_files(
            found.paths,
            environ,
            where=found.where,
            context=context,
            as_user=as_user,
            as_groups=as_groups,
        )
    where = "in-cluster configuration"
    if context:
        raise ClientConfigError(f"{where}: --context {context!r} needs a kubeconfig (none found)")
    impersonate = impersonation({}, where, as_user, as_groups)
    return in_cluster(environ, account, impersonate=impersonate)


def from_args(args: argparse.Namespace, *, in_cluster_only: bool = False) -> ClientSettings:
    """`load` with the flags `add_flags` defined."""
    return load(
        getattr(args, "kubeconfig", None),
        context=getattr(args, "context", None),
        as_user=getattr(args, "as_user", None),
        as_groups=getattr(args, "as_groups", None) or (),
        in_cluster_only=in_cluster_only,
    )


def given(args: argparse.Namespace) -> bool:
    """Whether any of the flags `add_flags` defined was given."""
    return any(
        getattr(args, name, None) for name in ("kubeconfig", "context", "as_user", "as_groups")
    )
