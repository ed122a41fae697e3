"""Gathering what `podcert audit` looks at into a `audit.model.Snapshot`.

The audit itself is pure; this is its edge: reading a node's projected volumes the way a pod sees
them (through each volume's `..data` symlink, one consistent version per volume), the signer's
audit log, trust bundle files, and — isolated in `read_cluster` — the cluster's pods,
PodCertificateRequests and ClusterTrustBundles through `podcert.client.rest`. Nothing here imports
the Kubernetes client at module level, so auditing a node root does not pay for it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

from audit.model import KEY_MARK, TrustSource, VolumeFiles
from bundles import folder
from bundles.formats import MAX_BUNDLE_BYTES
from podcert.api import volumes
from podcert.api.requests import Read
from podcert.api.versions import group_version

if TYPE_CHECKING:
    from podcert.client.rest import Rest

_PEM: Final = b"-----BEGIN "


class SnapshotError(Exception):
    """An input cannot be read at all (a missing root, an unreadable log)."""


# --- the node -----------------------------------------------------------------------------------


def pod_uids(root: Path) -> list[str]:
    """The pods under a kubelet-style root, in a stable order (cheap: one directory listing)."""
    pods = root / volumes.PODS_DIR
    if not pods.is_dir():
        raise SnapshotError(f"{root} has no pods/ directory: not a kubelet (or shim) root")
    with os.scandir(pods) as entries:
        return sorted(entry.name for entry in entries if entry.is_dir())


def read_root(root: Path) -> tuple[VolumeFiles, ...]:
    """Every projected volume under a kubelet-style root that holds PEM files."""
    return tuple(volume for uid in pod_uids(root) for volume in read_pod(root, uid))


def read_pod(root: Path, pod_uid: str) -> list[VolumeFiles]:
    """The pod's projected volumes that hold PEM files, each one consistent version."""
    projected = str(volumes.projected_dir(root, pod_uid))
    try:
        with os.scandir(projected) as entries:
            names = sorted(entry.name for entry in entries if entry.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = (VolumeFiles(pod_uid, name, *_read_volume(f"{projected}/{name}")) for name in names)
    return [volume for volume in found if volume.files]


_Read = tuple[dict[str, bytes], dict[str, int]]  # PEM files, and the modes of the key files


def _read_volume(directory: str) -> _Read:
    """One consistent version of a volume, PEM files only, with the permission bits of those
    that hold a private key.

    Files come from the directory `..data` names; the writer deletes a version only after
    swapping `..data` away from it, so a read counts if `..data` names the same directory before
    and after. Other projected files (service account tokens, config maps) are dropped unread
    beyond their first bytes: the audit has no business holding them.
    """
    # os-level calls on purpose, here and below: this is the loop over thousands of volumes.
    data_link = f"{directory}/{volumes.DATA_DIR}"

    def current() -> str | None:
        try:
            return os.readlink(data_link)  # noqa: PTH115
        except FileNotFoundError:
            return None
        except OSError as exc:  # `..data` is there but no link: nothing consistent to read
            raise _Unreadable from exc

    try:
        read = volumes.read_consistently(
            current, lambda version: _pem_files(f"{directory}/{version}", skip_hidden=False)
        )
    except (_Unreadable, volumes.VolumeChangingError):
        return {}, {}
    if read is None:  # not written by an atomic writer: the visible files
        return _pem_files(directory, skip_hidden=True)
    return read


class _Unreadable(Exception):
    pass


def _pem_files(directory: str, *, skip_hidden: bool) -> _Read:
    files: dict[str, bytes] = {}
    modes: dict[str, int] = {}
    _collect(directory, "", skip_hidden, files, modes)
    return files, modes


def _collect(
    directory: str, prefix: str, skip_hidden: bool, files: dict[str, bytes], modes: dict[str, int]
) -> None:
    with os.scandir(directory) as entries:
        for entry in entries:
            if skip_hidden and entry.name.startswith(".."):
                continue
            if entry.is_dir():
                _collect(entry.path, f"{prefix}{entry.name}/", skip_hidden, files, modes)
            elif entry.is_file():
                mode = None
                fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    # One capped read: the parser reports an oversized file as such.
                    data = os.read(fd, MAX_BUNDLE_BYTES + 1)
                    if _PEM in data and KEY_MARK in data:
                        # The mode of the very file read (its descriptor), for key files only:
                        # one fstat per credential, none for trust bundles or other files.
                        mode = stat.S_IMODE(os.fstat(fd).st_mode)
                finally:
                    os.close(fd)
                if _PEM in data:
                    files[prefix + entry.name] = data
                    if mode is not None:
                        modes[prefix + entry.name] = mode


# --- files given by the operator ----------------------------------------------------------------


def read_audit_log(path: Path) -> tuple[bytes, ...]:
    """The log's complete lines. A last line without its newline is still being written."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SnapshotError(f"cannot read the audit log: {exc}") from exc
    end = data.rfind(b"\n") + 1
    return tuple(data[:end].splitlines())


def read_trust_files(paths: Sequence[Path]) -> tuple[TrustSource, ...]:
    """Each file, and for a SPIFFE credential folder every `<trust-domain>.trust-bundle.pem`
    in it (an empty one, a domain no longer federated, is left out)."""
    sources = []
    for given in paths:
        try:
            if not given.is_dir():
                sources.append(TrustSource(str(given), given.read_bytes()))
                continue
            names = sorted(p.name for p in given.iterdir() if folder.trust_domain_of(p.name))
            found = [(given / name, (given / name).read_bytes()) for name in names]
        except OSError as exc:
            raise SnapshotError(f"cannot read trust bundle {given}: {exc}") from exc
        if not found:
            raise SnapshotError(f"{given} holds no <trust-domain>.trust-bundle.pem")
        sources += [TrustSource(str(path), data) for path, data in found if data.strip()]
    return tuple(sources)


def read_pem(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SnapshotError(f"cannot read {what} {path}: {exc}") from exc


# --- the cluster (the one place that talks to the API server) ----------------------------------


@dataclass(frozen=True)
class ClusterObjects:
    pods: tuple[dict[str, Any], ...]  # those with a podCertificate source, trimmed
    requests: tuple[Read, ...]  # typed as the signer reads them (`podcert.client.rest.REQUESTS`)
    trust: tuple[TrustSource, ...]
    pods_listed: int = 0  # every pod listed, with or without a podCertificate source


def read_cluster(
    rest: Rest, *, namespaces: Sequence[str] = (), node_name: str | None = None
) -> ClusterObjects:
    """Pods, PodCertificateRequests and signer-linked ClusterTrustBundles, listed in pages.

    Each page is cut down to what the audit reads before the next is fetched: pods are decoded
    as `_PodShape` (identity, node, volumes) and kept only with a podCertificate source (no other
    pod can own a projection), trimmed to their projected volumes; requests are decoded into
    the typed request, as the signer reads them (managed fields skipped unread; an object that
    is not one becomes `Unreadable`, which the audit leaves out). So 150,000 pods cost a few MiB
    beyond what is audited. Raises
    `podcert.client.rest.ApiError` when the API server refuses.
    """
    # The Kubernetes client loads only when the cluster is read.
    from podcert.client.discovery import certificates_versions
    from podcert.client.rest import REQUESTS, path_of

    selector = {"fieldSelector": f"spec.nodeName={node_name}"} if node_name else {}
    pcr_version, ctb_version = certificates_versions(rest)

    def pods_of(namespace: str | None) -> tuple[list[dict[str, Any]], int]:
        items, _ = rest.list(path_of("v1", "pods", namespace), _PodShape, query=selector)
        kept, listed = [], 0
        for pod in items:
            listed += 1
            trimmed = _trim_pod(pod)
            if trimmed is not None:
                kept.append(trimmed)
        return kept, listed

    # One list request is served by one API server thread, a page at a time: 150,000 pods took
    # 11-22 s that way here, 5 s as one list per namespace, _LISTS at once.
    scopes: Sequence[str | None] = namespaces or _namespaces(rest) or (None,)
    with ThreadPoolExecutor(_LISTS) as pool:
        found = list(pool.map(pods_of, scopes))
    pods = [pod for kept, _ in found for pod in kept]
    listed = sum(count for _, count in found)
    requests: list[Read] = []
    for namespace in namespaces or (None,):
        path = path_of(group_version(pcr_version), "podcertificaterequests", namespace)
        requests += rest.list(path, REQUESTS, query=selector)[0]
    bundles: Iterable[dict[str, Any]] = ()
    if ctb_version is not None:
        bundles = rest.list(path_of(group_version(ctb_version), "clustertrustbundles"))[0]
    trust = tuple(
        TrustSource(
            f"ClusterTrustBundle {ctb.get('metadata', {}).get('name', '?')}",
            str(ctb.get("spec", {}).get("trustBundle", "")).encode(),
            ctb.get("spec", {}).get("signerName") or None,
        )
        for ctb in bundles
        if ctb.get("spec", {}).get("signerName")  # unlinked bundles vouch for no signer
    )
    return ClusterObjects(tuple(pods), tuple(requests), trust, listed)


_LISTS: Final = 4  # pod lists in flight at once


class _Named(msgspec.Struct, frozen=True):
    metadata: _Meta


def _namespaces(rest: Rest) -> tuple[str, ...]:
    """Every namespace's name; () when the auditor may not list them (pods are then listed in
    one request across namespaces)."""
    from podcert.client.rest import ApiError

    try:
        items, _ = rest.list("/api/v1/namespaces", _Named)
        return tuple(sorted(n.metadata.name for n in items if n.metadata.name))
    except ApiError as err:
        if err.status == 403:
            return ()
        raise


class _Meta(msgspec.Struct, frozen=True):
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None


class _Volume(msgspec.Struct, frozen=True):
    name: Any = None
    projected: Any = None  # as the API holds it: `podcert.api.pods` reads it


class _Spec(msgspec.Struct, frozen=True):
    nodeName: str | None = None  # the API's spelling: msgspec matches fields by name
    volumes: list[_Volume] | None = None


class _PodShape(msgspec.Struct, frozen=True):
    """What the audit reads of a pod; everything else is skipped as the page is decoded."""

    metadata: _Meta = _Meta()
    spec: _Spec = _Spec()


def _trim_pod(pod: _PodShape) -> dict[str, Any] | None:
    """The pod as `podcert.api.pods.parse_pod` reads it, with only its projected volumes; None
    for a pod with no podCertificate source."""
    volumes = [
        {"name": v.name, "projected": v.projected}
        for v in pod.spec.volumes or ()
        if isinstance(v.projected, dict)
    ]
    if not any(
        isinstance(source, dict) and "podCertificate" in source
        for v in volumes
        for source in v["projected"].get("sources") or ()
    ):
        return None
    meta = pod.metadata
    return {
        "metadata": {"namespace": meta.namespace, "name": meta.name, "uid": meta.uid},
        "spec": {"nodeName": pod.spec.nodeName, "volumes": volumes},
    }
