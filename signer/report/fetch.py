"""The reads behind `podcert status`, `explain pod` and `version`: each returns the objects as
the API server sent them, for the pure models to judge.

`client(args)` is the one place these commands build their cluster client. A read the command
cannot do without (requests, the pod) that fails is `ClusterUnreadable` (exit 3); one it can
report around (the CA Secret, which a reader may lack RBAC for, or the Deployment) becomes a
line saying why it is missing.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from podcert.api import versions as api_versions
from podcert.client import commandline
from podcert.client.discovery import Unserved, certificates_versions
from podcert.client.rest import JSON, ApiError, Rest, path_of
from podcert.errors import ClusterUnreadable, CommandError, one_line
from signer.report.revocations import followed, revoked_of
from signer.report.status import StatusInputs

SIGNER_LABEL: Final = "app.kubernetes.io/name=podcert-signer"


def client(args: argparse.Namespace) -> Rest:
    """The cluster client for a read command, found as kubectl finds it."""
    return Rest(commandline.from_args(args))


@contextmanager
def reading(what: str) -> Iterator[None]:
    """An API failure while reading `what` as ClusterUnreadable, naming it."""
    try:
        yield
    except ApiError as err:
        raise ClusterUnreadable(f"cannot read {what}: {one_line(str(err))}") from None


def _optional(rest: Rest, path: str) -> JSON | str | None:
    """The object, None when absent, or why it could not be read (a refusal, not an outage)."""
    try:
        return rest.get(path)
    except ApiError as err:
        if err.status in (401, 403):
            return f"not readable by this identity ({err.status} {err.reason})"
        raise


def pcr_version(rest: Rest) -> tuple[str, str | None]:
    """(the version requests are read at, trust bundles' or None)."""
    with reading("the API server's discovery"):
        try:
            return certificates_versions(rest)
        except Unserved as err:
            raise CommandError(str(err)) from None


def lease(rest: Rest, namespace: str, name: str) -> JSON | str | None:
    """The signer's Lease, None when absent, or why this identity may not read it."""
    with reading(f"the signer's lease {namespace}/{name}"):
        found = _optional(rest, path_of("coordination.k8s.io/v1", "leases", namespace, name))
    if isinstance(found, str):
        return f"the lease {namespace}/{name} is {found}"
    return found


def deployment(rest: Rest, namespace: str) -> JSON | None:
    """The signer's Deployment (by its app.kubernetes.io/name label), or None."""
    path = path_of("apps/v1", "deployments", namespace)
    try:
        found = rest.request("GET", path, query={"labelSelector": SIGNER_LABEL})
    except ApiError as err:
        if err.status in (401, 403, 404):
            return None
        raise ClusterUnreadable(f"cannot read Deployments: {one_line(str(err))}") from None
    items = found.get("items") or []
    return items[0] if items else None


def pods(rest: Rest) -> list[JSON] | str:
    """Every pod (a revocation is followed), or why this identity may not list them."""
    with reading("pods"):
        try:
            return list(rest.list(path_of("v1", "pods"))[0])
        except ApiError as err:
            if err.status in (401, 403):
                return f"pods are not readable by this identity ({err.status} {err.reason})"
            raise


def status_inputs(
    rest: Rest,
    namespace: str,
    lease_name: str,
    ca_secret: str,
    signer_names: tuple[str, ...],
    now: dt.datetime,
) -> StatusInputs:
    pcr_at, ctb_at = pcr_version(rest)
    with reading(f"the CA Secret {namespace}/{ca_secret}"):
        secret = _optional(rest, path_of("v1", "secrets", namespace, ca_secret))
    data: dict[str, bytes] | str
    if secret is None:
        data = "the Secret does not exist"
    elif isinstance(secret, str):
        data = secret
    else:
        raw = secret.get("data") or {}
        data = {k: base64.b64decode(v) for k, v in raw.items() if isinstance(v, str)}
    bundles: list[JSON] = []
    if ctb_at is not None:
        with reading("ClusterTrustBundles"):
            bundles = list(
                rest.list(path_of(api_versions.group_version(ctb_at), api_versions.CTBS))[0]
            )
    with reading("PodCertificateRequests"):
        requests = list(
            rest.list(path_of(api_versions.group_version(pcr_at), api_versions.PCRS))[0]
        )
    return StatusInputs(
        namespace=namespace,
        lease_name=lease_name,
        ca_secret=ca_secret,
        lease=lease(rest, namespace, lease_name),
        deployment=deployment(rest, namespace),
        secret=data,
        trust_bundles=bundles,
        requests=requests,
        signer_names=signer_names,
        pods=pods(rest) if followed(revoked_of(data), now) else None,
    )


def pod_inputs(rest: Rest, namespace: str, name: str) -> tuple[JSON, list[JSON], list[JSON]]:
    """(the pod, its namespace's requests, its namespace's Events). CommandError when the pod
    does not exist."""
    with reading(f"pod {namespace}/{name}"):
        pod = rest.get(path_of("v1", "pods", namespace, name))
    if pod is None:
        raise CommandError(f"pod {namespace}/{name} does not exist")
    pcr_at, _ = pcr_version(rest)
    with reading(f"PodCertificateRequests in {namespace}"):
        path = path_of(api_versions.group_version(pcr_at), api_versions.PCRS, namespace)
        requests = list(rest.list(path)[0])
    with reading(f"Events in {namespace}"):
        events = list(rest.list(path_of("v1", "events", namespace))[0])
    return pod, requests, events


def version_inputs(rest: Rest) -> tuple[JSON | None, dict[str, Any]]:
    """(/version's answer, each certificates.k8s.io version's discovery answer or None)."""
    with reading("the API server's /version"):
        server = rest.get("/version")
        discovery = {v: rest.get(f"/apis/{api_versions.GROUP}/{v}") for v in api_versions.VERSIONS}
    return server, discovery
