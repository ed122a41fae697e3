"""Container images made on this machine, since no registry is reachable: one busybox image (the
static busybox from Debian's busybox-static and a link per applet) and a pause image that is the
same layer running `sleep infinity`. Written as OCI image archives that `ctr images import` loads.

The archives are pure functions of the busybox binary, so they are byte-for-byte reproducible.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
BUSYBOX_IMAGE = "podcert.local/busybox:1"
PAUSE_IMAGE = "podcert.local/pause:1"

_MTIME = 0  # reproducible archives


@dataclass(frozen=True)
class Image:
    name: str
    cmd: tuple[str, ...]


IMAGES = (Image(BUSYBOX_IMAGE, ("/bin/sh",)), Image(PAUSE_IMAGE, ("/bin/sleep", "infinity")))


def _add(
    tar: tarfile.TarFile,
    name: str,
    *,
    data: bytes | None = None,
    mode: int = 0o755,
    link: str = "",
    directory: bool = False,
) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = _MTIME
    info.mode = mode
    if directory:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif link:
        info.type = tarfile.SYMTYPE
        info.linkname = link
        tar.addfile(info)
    else:
        assert data is not None
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def applets(busybox: Path = BUSYBOX) -> list[str]:
    out = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True)
    return sorted({line.strip() for line in out.stdout.splitlines() if line.strip()})


def root_layer(busybox: bytes, names: list[str]) -> bytes:
    """An uncompressed tar of the root filesystem: /bin/busybox, /bin/<applet> links, and the
    empty folders a container expects."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder in ("bin", "etc", "tmp", "proc", "sys", "dev", "var", "root"):
            _add(tar, folder, directory=True, mode=0o1777 if folder == "tmp" else 0o755)
        _add(tar, "bin/busybox", data=busybox)
        for applet in names:
            if applet != "busybox":
                _add(tar, f"bin/{applet}", link="busybox")
        _add(tar, "etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\n", mode=0o644)
        _add(tar, "etc/group", data=b"root:x:0:\n", mode=0o644)
    return buf.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> dict[str, object]:
    digest = hashlib.sha256(data).hexdigest()
    _add(tar, f"blobs/sha256/{digest}", data=data, mode=0o644)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def oci_archive(image: Image, layer: bytes) -> bytes:
    """An OCI image layout, as a tar, holding one image of one gzip layer."""
    compressed = gzip.compress(layer, mtime=_MTIME)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": list(image.cmd), "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        layer_desc = _blob(tar, compressed)
        config_desc = _blob(tar, json.dumps(config, sort_keys=True).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {**config_desc, "mediaType": "application/vnd.oci.image.config.v1+json"},
            "layers": [{**layer_desc, "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip"}],
        }
        manifest_desc = _blob(tar, json.dumps(manifest, sort_keys=True).encode())
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    **manifest_desc,
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": image.name,
                        "org.opencontainers.image.ref.name": image.name.rsplit(":", 1)[1],
                    },
                }
            ],
        }
        _add(tar, "oci-layout", data=b'{"imageLayoutVersion":"1.0.0"}', mode=0o644)
        _add(tar, "index.json", data=json.dumps(index, sort_keys=True).encode(), mode=0o644)
    return buf.getvalue()


def write_archives(folder: Path, busybox: Path = BUSYBOX) -> list[Path]:
    """Write one OCI archive per image into `folder`; return their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    layer = root_layer(busybox.read_bytes(), applets(busybox))
    out = []
    for image in IMAGES:
        path = folder / (image.name.replace("/", "_").replace(":", "_") + ".tar")
        path.write_bytes(oci_archive(image, layer))
        out.append(path)
    return out
