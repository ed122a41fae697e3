"""`podcert version`'s model: the API server's certificates.k8s.io versions from discovery, and
the signer's version from what its leader wrote on the lease."""

from __future__ import annotations

from podcert import __version__
from signer.report.status import Replicas, leadership
from signer.report.versions import version_info
from tests.unit.test_report_status import NOW, lease

ALL = {"resources": [{"name": "podcertificaterequests"}, {"name": "clustertrustbundles"}]}


def test_each_served_version_lists_the_resources_of_ours_it_serves() -> None:
    info = version_info(
        {"gitVersion": "v1.36.3"},
        {"v1": None, "v1beta1": ALL},
        leadership(None, "ns/l", NOW),
        None,
    )

    assert info.certificates == {
        "v1": (),
        "v1beta1": ("podcertificaterequests", "clustertrustbundles"),
    }
    assert info.pcr_version == "v1beta1"
    assert info.server == "v1.36.3"
    assert info.client == __version__


def test_the_signers_version_is_the_leaders_and_the_image_the_deployments() -> None:
    image = Replicas("ns/podcert-signer", 2, 2, 2, "ghcr.io/podcert/podcert:0.3.0")

    info = version_info({}, {"v1": ALL}, leadership(lease(), "ns/l", NOW), image)

    assert (info.signer, info.signer_holder, info.signer_live) == ("0.2.0", "signer-0", True)
    assert info.signer_image == "ghcr.io/podcert/podcert:0.3.0"
    doc = info.as_json()
    assert doc["signer"]["version"] == "0.2.0"
    assert doc["server"]["kubernetes"] is None


def test_a_lease_this_identity_may_not_read_says_so_instead_of_no_leader() -> None:
    refused = leadership(
        "the lease ns/l is not readable by this identity (403 Forbidden)", "ns/l", NOW
    )

    info = version_info({}, {"v1": ALL}, refused, None)

    assert info.signer is None
    assert info.as_json()["signer"]["problem"].endswith("(403 Forbidden)")
