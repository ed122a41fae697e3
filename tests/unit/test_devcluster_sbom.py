"""devcluster.sbom: the release's CycloneDX BOMs from a lock's BOM, dpkg's status and an image's
digest; each one CycloneDX 1.6's schema accepts, naming its subject by version and digest."""

from __future__ import annotations

import json
from typing import Any

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from devcluster import sbom
from devcluster.sbom import DebPackage, ImageRef, SbomError

DIGEST = "sha256:" + "ab" * 32
IMAGE = ImageRef("ghcr.io/podcert/podcert", "0.2.0.dev0", DIGEST)
EPOCH = 1_796_000_000

STATUS = """Package: adduser
Status: install ok installed
Architecture: all
Version: 3.134
Description: add and remove users and groups
 This package includes the 'adduser' and 'deluser' commands.
 .
 Version: 9.9 (a continuation line, not a field)

Package: util-linux
Status: install ok installed
Architecture: amd64
Version: 1:2.38.1-5+deb12u3

Package: gone
Status: deinstall ok config-files
Architecture: amd64
Version: 1.0
"""

# What cyclonedx-py writes for a lock: its subject from pyproject.toml, a component per line.
LOCKED: dict[str, Any] = {
    "$schema": sbom.SCHEMA,
    "bomFormat": "CycloneDX",
    "specVersion": "1.6",
    "version": 1,
    "metadata": {
        "component": {"bom-ref": "root-component", "name": "podcert", "type": "application"}
    },
    "components": [
        {
            "bom-ref": "requirements-L3",
            "name": "cryptography",
            "purl": "pkg:pypi/cryptography@46.0.3",
            "type": "library",
            "version": "46.0.3",
        }
    ],
    "dependencies": [{"ref": "requirements-L3"}],
}


def valid(bom: dict[str, Any]) -> None:
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(bom))
    assert error is None, str(error)


def test_installed_packages_are_read_from_dpkg_status_by_name() -> None:
    assert sbom.installed_debs(STATUS) == [
        DebPackage("adduser", "3.134", "all"),
        DebPackage("util-linux", "1:2.38.1-5+deb12u3", "amd64"),
    ]


def test_a_stanza_without_a_version_is_an_error_naming_it() -> None:
    with pytest.raises(SbomError, match="dpkg status stanza 1: no Version"):
        sbom.installed_debs(STATUS.replace("Version: 1:2.38.1-5+deb12u3\n", ""))


def test_the_distribution_is_os_releases_id_and_version_id() -> None:
    assert sbom.distro('PRETTY_NAME="Debian GNU/Linux 12"\nID=debian\nVERSION_ID="12"\n') == (
        "debian-12"
    )
    with pytest.raises(SbomError, match="os-release: no ID or VERSION_ID"):
        sbom.distro("ID=debian\n")


def test_a_debs_purl_carries_its_epoch_as_a_qualifier_and_encodes_its_version() -> None:
    purl = sbom.deb_purl(DebPackage("util-linux", "1:2.38.1-5+deb12u3", "amd64"), "debian-12")
    assert purl == (
        "pkg:deb/debian/util-linux@2.38.1-5%2Bdeb12u3?arch=amd64&distro=debian-12&epoch=1"
    )


def test_an_images_purl_names_its_manifest_digest_repository_and_tag() -> None:
    assert IMAGE.purl == (
        f"pkg:oci/podcert@{DIGEST}?repository_url=ghcr.io/podcert/podcert&tag=0.2.0.dev0"
    )
    assert IMAGE.reference == "ghcr.io/podcert/podcert:0.2.0.dev0"


def test_the_wheels_bom_is_the_locks_with_the_wheel_as_its_subject() -> None:
    bom = sbom.wheel_bom(LOCKED, "0.2.0.dev0", "cd" * 32, EPOCH)
    valid(bom)
    subject = bom["metadata"]["component"]
    assert (subject["name"], subject["version"], subject["purl"]) == (
        "podcert",
        "0.2.0.dev0",
        "pkg:pypi/podcert@0.2.0.dev0",
    )
    assert subject["hashes"] == [{"alg": "SHA-256", "content": "cd" * 32}]
    assert bom["components"] == LOCKED["components"]
    assert bom["metadata"]["timestamp"] == "2026-11-30T00:53:20+00:00"
    assert "version" not in LOCKED["metadata"]["component"], "the lock's BOM was changed"


def test_a_bom_of_another_project_is_refused() -> None:
    other = {**LOCKED, "metadata": {"component": {"name": "other", "type": "library"}}}
    with pytest.raises(SbomError, match=r"metadata\.component\.name"):
        sbom.wheel_bom(other, "0.2.0.dev0", "cd" * 32, EPOCH)


def test_the_images_bom_lists_the_lock_podcert_and_the_debian_packages_under_the_image() -> None:
    debs = sbom.installed_debs(STATUS)
    bom = sbom.image_bom(LOCKED, debs, "debian-12", IMAGE, "0.2.0.dev0", EPOCH)
    valid(bom)
    subject = bom["metadata"]["component"]
    assert (subject["type"], subject["purl"]) == ("container", IMAGE.purl)
    assert [c["purl"] for c in bom["components"]] == [
        "pkg:pypi/cryptography@46.0.3",
        "pkg:pypi/podcert@0.2.0.dev0",
        "pkg:deb/debian/adduser@3.134?arch=all&distro=debian-12",
        sbom.deb_purl(debs[1], "debian-12"),
    ]
    [root] = [d for d in bom["dependencies"] if d["ref"] == IMAGE.purl]
    assert len(root["dependsOn"]) == 4


def test_an_image_bom_without_python_packages_is_refused() -> None:
    with pytest.raises(SbomError, match="components"):
        sbom.image_bom({**LOCKED, "components": []}, [], "debian-12", IMAGE, "0.2.0", EPOCH)


def test_the_charts_bom_names_the_image_it_deploys_by_digest() -> None:
    bom = sbom.chart_bom("podcert", "0.2.0-dev.0", "0.2.0.dev0", "ef" * 32, IMAGE, EPOCH)
    valid(bom)
    subject = bom["metadata"]["component"]
    assert (subject["name"], subject["version"]) == ("podcert", "0.2.0-dev.0")
    assert subject["hashes"] == [{"alg": "SHA-256", "content": "ef" * 32}]
    [image] = bom["components"]
    assert (image["type"], image["purl"]) == ("container", IMAGE.purl)
    assert bom["dependencies"][0] == {"ref": subject["bom-ref"], "dependsOn": [IMAGE.purl]}
