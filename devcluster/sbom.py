"""The release's software bills of materials (CycloneDX 1.6 JSON), one per artefact, composed from
what is locked and what the image holds: pure functions of their inputs (`devcluster.release`
gathers them).

- The wheel's: every package of `locks/runtime.txt` (what installing the wheel with its `server`
  extra takes, as cyclonedx-py reads the lock), under podcert itself with the wheel's SHA-256.
- The image's: the same Python packages, podcert, and every Debian package the image's dpkg
  status says is installed (`pkg:deb/debian/...`, the distribution from its os-release), under
  the image itself (`pkg:oci/...@<manifest digest>`).
- The chart's: the chart (with the package's SHA-256) and the one image it deploys by default.

Each BOM names its subject in `metadata.component`; the image's purl carries its manifest digest,
so a BOM says which bytes it describes. Timestamps are the release's SOURCE_DATE_EPOCH.
"""

from __future__ import annotations

import copy
import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from packageurl import PackageURL

SPEC_VERSION = "1.6"
SCHEMA = "http://cyclonedx.org/schema/bom-1.6.schema.json"

Bom = dict[str, Any]


@dataclass(frozen=True)
class DebPackage:
    name: str
    version: str  # as dpkg spells it, epoch included (`1:2.38.1-5+deb12u3`)
    architecture: str


@dataclass(frozen=True)
class ImageRef:
    """An image by repository, tag and manifest digest (`sha256:<hex>`)."""

    repository: str
    tag: str
    digest: str

    @property
    def reference(self) -> str:
        return f"{self.repository}:{self.tag}"

    @property
    def purl(self) -> str:
        name = self.repository.rsplit("/", 1)[-1]
        qualifiers = {"repository_url": self.repository, "tag": self.tag}
        return PackageURL(
            type="oci", name=name, version=self.digest, qualifiers=qualifiers
        ).to_string()


class SbomError(ValueError):
    """Input an SBOM cannot be made from; the message names the field."""


def installed_debs(status: str) -> list[DebPackage]:
    """The packages dpkg's status file (`/var/lib/dpkg/status`) records as installed, by name.

    Stanzas are separated by blank lines; continuation lines (a leading space) belong to the
    field before them and are not needed here. A stanza whose Status is anything but
    `install ok installed` (removed, half-configured) is not in the image's inventory."""
    found: dict[str, DebPackage] = {}
    for number, stanza in enumerate(re.split(r"\n\s*\n", status.strip())):
        fields = dict(
            line.split(":", 1) for line in stanza.splitlines() if line and not line[0].isspace()
        )
        fields = {key.strip(): value.strip() for key, value in fields.items()}
        if fields.get("Status") != "install ok installed":
            continue
        for key in ("Package", "Version", "Architecture"):
            if not fields.get(key):
                raise SbomError(f"dpkg status stanza {number}: no {key}")
        package = DebPackage(fields["Package"], fields["Version"], fields["Architecture"])
        found[package.name] = package
    return [found[name] for name in sorted(found)]


def distro(os_release: str) -> str:
    """`debian-12` from an os-release file: its ID and VERSION_ID (purl's `distro` qualifier)."""
    fields = dict(
        (key, value.strip().strip('"'))
        for key, _, value in (line.partition("=") for line in os_release.splitlines())
        if key
    )
    if not fields.get("ID") or not fields.get("VERSION_ID"):
        raise SbomError("os-release: no ID or VERSION_ID")
    return f"{fields['ID']}-{fields['VERSION_ID']}"


def deb_purl(package: DebPackage, distribution: str) -> str:
    """purl-spec's deb type: the epoch, when there is one, as a qualifier, not in the version."""
    epoch, _, version = package.version.rpartition(":")
    qualifiers = {"arch": package.architecture, "distro": distribution}
    if epoch:
        qualifiers["epoch"] = epoch
    return PackageURL(
        type="deb", namespace="debian", name=package.name, version=version, qualifiers=qualifiers
    ).to_string()


def _sha256(digest: str) -> list[dict[str, str]]:
    return [{"alg": "SHA-256", "content": digest}]


def _pypi_podcert(version: str) -> dict[str, Any]:
    purl = f"pkg:pypi/podcert@{version}"
    return {
        "type": "library",
        "bom-ref": purl,
        "name": "podcert",
        "version": version,
        "purl": purl,
        "licenses": [{"license": {"id": "Apache-2.0"}}],
    }


def _timestamp(epoch: int) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat()


def wheel_bom(locked: Bom, version: str, wheel_sha256: str, epoch: int) -> Bom:
    """cyclonedx-py's BOM of the runtime lock, its subject made the wheel: podcert, its version,
    its purl and the wheel's digest (cyclonedx-py knows neither from a dynamic version)."""
    bom = copy.deepcopy(locked)
    component = bom.setdefault("metadata", {}).setdefault("component", {})
    if component.get("name") != "podcert":
        raise SbomError("metadata.component.name: the lock's BOM is not podcert's")
    component.update(
        {
            "type": "library",
            "version": version,
            "purl": f"pkg:pypi/podcert@{version}",
            "hashes": _sha256(wheel_sha256),
        }
    )
    bom["metadata"]["timestamp"] = _timestamp(epoch)
    return bom


def image_bom(
    locked: Bom,
    debs: list[DebPackage],
    distribution: str,
    image: ImageRef,
    version: str,
    epoch: int,
) -> Bom:
    """The image's inventory: the runtime lock's Python packages (cyclonedx-py's BOM of it),
    podcert's own wheel, and the Debian packages of its base, under the image itself."""
    python = copy.deepcopy(locked.get("components") or [])
    if not python:
        raise SbomError("components: the lock's BOM lists no package")
    debian = [
        {
            "type": "library",
            "bom-ref": deb_purl(package, distribution),
            "name": package.name,
            "version": package.version,
            "purl": deb_purl(package, distribution),
        }
        for package in debs
    ]
    components = [*python, _pypi_podcert(version), *debian]
    return {
        "$schema": SCHEMA,
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "version": 1,
        "metadata": {
            "timestamp": _timestamp(epoch),
            "component": {
                "type": "container",
                "bom-ref": image.purl,
                "name": image.repository,
                "version": image.tag,
                "purl": image.purl,
                "licenses": [{"license": {"id": "Apache-2.0"}}],
            },
        },
        "components": components,
        "dependencies": [
            {"ref": image.purl, "dependsOn": [c["bom-ref"] for c in components]},
            *({"ref": c["bom-ref"]} for c in components),
        ],
    }


def chart_bom(
    name: str, chart_version: str, app_version: str, chart_sha256: str, image: ImageRef, epoch: int
) -> Bom:
    """The chart and the image its templates default to (`image.repository`, the appVersion tag)."""
    chart_ref = f"chart:{name}@{chart_version}"
    return {
        "$schema": SCHEMA,
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "version": 1,
        "metadata": {
            "timestamp": _timestamp(epoch),
            "component": {
                "type": "application",
                "bom-ref": chart_ref,
                "name": name,
                "version": chart_version,
                "description": f"Helm chart of podcert {app_version}",
                "hashes": _sha256(chart_sha256),
                "licenses": [{"license": {"id": "Apache-2.0"}}],
            },
        },
        "components": [
            {
                "type": "container",
                "bom-ref": image.purl,
                "name": image.repository,
                "version": image.tag,
                "purl": image.purl,
            }
        ],
        "dependencies": [{"ref": chart_ref, "dependsOn": [image.purl]}, {"ref": image.purl}],
    }
