"""audit.snapshot: reading a node root, the audit log and the cluster's pods into a `Snapshot`,
the way a pod sees its volumes (one consistent version through `..data`, PEM files only).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from audit.snapshot import SnapshotError, read_audit_log, read_root
from kubelet_shim.atomic import AtomicDirStorage
from kubelet_shim.storage import FileSpec
from podcert.api import volumes
from tests.audit_world import (
    T0,
    World,
    pem,
    pkcs8,
)


def test_a_volume_not_written_by_an_atomic_writer_is_read_from_its_visible_files(
    world: World,
) -> None:
    leaf = world.leaf("plain", T0)
    volume = world.node_root / "pods" / "uid-plain" / "volumes" / "kubernetes.io~projected" / "id"
    volume.mkdir(parents=True)
    (volume / "credentialbundle.pem").write_bytes(pkcs8(leaf.key) + leaf.chain_pem.encode())
    (volume / "token").write_bytes(b"a service account token, not PEM")

    (files,) = read_root(world.node_root)

    assert (files.pod_uid, files.volume, list(files.files)) == (
        "uid-plain",
        "id",
        ["credentialbundle.pem"],
    )


def test_a_volume_is_read_as_the_one_version_its_data_link_names(world: World) -> None:
    first, second = world.leaf("web", T0), world.leaf("web", T0)
    storage = AtomicDirStorage(world.node_root)
    for leaf in (first, second):
        bundle = pkcs8(leaf.key) + leaf.chain_pem.encode()
        storage.write_volume("uid-web", "identity", {"tls.pem": FileSpec(bundle, 0o600)}, None)

    (files,) = read_root(world.node_root)

    assert dict(files.files) == {"tls.pem": pkcs8(second.key) + second.chain_pem.encode()}
    assert dict(files.modes) == {"tls.pem": 0o600}


def test_a_volume_whose_data_entry_is_no_link_has_nothing_consistent_to_read(world: World) -> None:
    volume = volumes.volume_dir(world.node_root, "uid-odd", "identity")
    (volume / volumes.DATA_DIR).mkdir(parents=True)  # a directory where the link should be
    (volume / volumes.DATA_DIR / "ca.pem").write_bytes(pem(world.authority.root))
    (volume / "ca.pem").write_bytes(pem(world.authority.root))

    assert read_root(world.node_root) == ()


def test_a_directory_without_pods_is_not_taken_for_a_kubelet_root(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="has no pods/ directory"):
        read_root(tmp_path)


def test_the_audit_logs_last_line_without_its_newline_is_still_being_written(
    tmp_path: Path,
) -> None:
    log = tmp_path / "audit.jsonl"
    log.write_bytes(b'{"seq":1}\n{"seq":2}\n{"seq":3,"pr')

    assert read_audit_log(log) == (b'{"seq":1}', b'{"seq":2}')
    with pytest.raises(SnapshotError, match="cannot read the audit log"):
        read_audit_log(tmp_path / "absent.jsonl")
