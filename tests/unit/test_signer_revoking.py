"""signer.revoking: what the revoke command (and `podcert status`) reads of pods and requests,
through `revokeplan.pod_of` and `issued_of` (the podCertificate volumes' signer names, a
terminating pod, the chain and who made a request; an unissued or garbled request is no
evidence)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from signer import revokeplan
from signer.authority import ca
from tests.unit.test_signer_revoke import leaf

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_a_pod_is_read_with_its_signer_names() -> None:
    obj = {
        "metadata": {"namespace": "ns", "name": "a", "uid": "u1", "deletionTimestamp": "x"},
        "spec": {
            "nodeName": "n1",
            "volumes": [
                {"name": "v", "projected": {"sources": [{"podCertificate": {"signerName": "s"}}]}},
                {"name": "w", "emptyDir": {}},
            ],
        },
    }
    got = revokeplan.pod_of(obj)
    assert got == revokeplan.Pod(
        "ns", "a", "u1", "n1", frozenset({"s"}), terminating=True, controlled=False
    )
    obj["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "controller": True}]
    assert revokeplan.pod_of(obj).controlled


def test_an_issued_request_is_read_with_its_chain_and_maker() -> None:
    bundle = ca.new_ca("r", T0)
    pem = b"".join(
        c.public_bytes(serialization.Encoding.PEM) for c in (leaf(bundle), bundle.intermediate)
    ).decode()
    obj = {
        "metadata": {
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {"podUID": "u1", "signerName": "s"},
        "status": {"certificateChain": pem},
    }
    got = revokeplan.issued_of(obj)
    assert got is not None and got.manager == "kubelet" and len(got.chain) == 2
    assert got.created == T0 and got.pod_uid == "u1"


@pytest.mark.parametrize(
    "status",
    [
        pytest.param({}, id="not issued yet"),
        pytest.param({"certificateChain": "garbage"}, id="a chain that is not PEM"),
    ],
)
def test_a_request_without_a_readable_chain_is_no_evidence(status: dict[str, Any]) -> None:
    obj = {"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"}, "status": status}
    assert revokeplan.issued_of(obj) is None
