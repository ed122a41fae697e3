"""audit.join: every input joined per pod projection, through `audit_findings` over a real world
(`tests.audit_world`): a pod's sources read as the shim reads them, a file on disk named by the
audit log, an object that is no request left out, and the scope filters.
"""

from __future__ import annotations

import dataclasses

import msgspec

from audit import Settings, audit_findings
from podcert.api.pods import CertificateSource, parse_pod
from podcert.api.requests import Unreadable, decode_request
from tests.audit_world import (
    NOW,
    NS,
    SIGNER,
    T0,
    World,
    healthy,
)


def test_the_audit_reads_a_pods_sources_as_the_shim_does(world: World) -> None:
    """One reading of a pod's projected sources: a podCertificate source the API server would
    refuse is served by no shim, so the audit makes no projection of it either."""
    healthy(world, pods=1)
    pod = world.pod("odd", "uid-odd")
    pod["spec"]["volumes"][0]["projected"]["sources"].append(
        {
            "podCertificate": {
                "signerName": SIGNER,
                "keyType": "DSA2048",
                "credentialBundlePath": "refused.pem",
            }
        }
    )

    report = audit_findings(world.snapshot(), NOW)

    served = [
        (source.volume, source.credential_bundle_path)
        for _, source in parse_pod(pod).work_items()
        if isinstance(source, CertificateSource)
    ]
    audited = [(p.volume, p.path) for p in report.projections if p.pod == "odd"]
    assert audited == served == [("identity", "credentialbundle.pem")]


def test_the_audit_log_names_the_pod_of_a_file_on_disk(world: World) -> None:
    healthy(world, pods=1)

    report = audit_findings(world.snapshot(cluster=False), NOW)

    (projection,) = report.projections
    assert (projection.namespace, projection.pod, projection.signer_name) == (NS, "web-0", SIGNER)


def test_an_object_that_does_not_read_as_a_request_is_left_out(world: World) -> None:
    healthy(world, pods=1)
    clean = audit_findings(world.snapshot(), NOW)
    broken = {"metadata": {"namespace": NS, "name": "odd"}, "spec": {"podUID": 7}}
    odd = decode_request(msgspec.json.encode(broken))
    assert isinstance(odd, Unreadable)
    snapshot = world.snapshot()
    assert snapshot.requests is not None

    report = audit_findings(dataclasses.replace(snapshot, requests=(*snapshot.requests, odd)), NOW)

    assert report == clean


def test_scope_filters_leave_other_namespaces_and_signers_out(world: World) -> None:
    healthy(world, pods=1)
    world.pod("orphan", "uid-orphan", signer="nobody.example/x")
    world.request("orphan", "uid-orphan", T0, signer="nobody.example/x", outcome=None)

    report = audit_findings(world.snapshot(), NOW, Settings(signer_names=frozenset({SIGNER})))

    assert report.healthy, report.findings
    assert [p.pod for p in report.projections] == ["web-0"]
