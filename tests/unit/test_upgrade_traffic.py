"""devcluster.upgrade_traffic.judge: what the whole-upgrade test and benchmark call a pod's valid
credential (its files: a bundle that parses and chains to its trust file at `now`, the trust
file exactly the signer's published roots, the leaf naming the pod, a new key after a restart).
Each way of falling short is seen, so the integration test's "nothing invalid" can fail.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from bundles.formats import dump_credential
from devcluster.upgrade_traffic import NAMESPACE, Pod, judge, spki
from tests.unit.test_bundles_formats import NOW, Authority

POD = Pod("app", "uid-1", "node-a", "app")
CA, OTHER = Authority("podcert root"), Authority("another root")


def roots(*authorities: Authority) -> frozenset[bytes]:
    return frozenset(a.cert.public_bytes(serialization.Encoding.DER) for a in authorities)


def volume(tmp_path: Path, bundle: bytes | None, trust: bytes | None) -> Path:
    for name, data in (("credentialbundle.pem", bundle), ("trust-bundle.pem", trust)):
        if data is not None:
            (tmp_path / name).write_bytes(data)
    return tmp_path


def test_a_pods_own_credential_from_the_published_roots_is_valid(tmp_path: Path) -> None:
    issued = CA.issue(POD.spiffe_id)
    folder = volume(tmp_path, dump_credential(issued), CA.pem)
    credential, why = judge(POD, folder, roots(CA), NOW)
    assert why is None
    assert credential is not None and spki(credential) == spki(issued)


ISSUED = CA.issue(POD.spiffe_id)


@pytest.mark.parametrize(
    ("bundle", "trust", "published", "now", "not_key", "because"),
    [
        pytest.param(None, CA.pem, roots(CA), NOW, b"", "FileNotFoundError", id="no bundle yet"),
        pytest.param(
            dump_credential(ISSUED)[:-40],
            CA.pem,
            roots(CA),
            NOW,
            b"",
            "MalformedPemError",
            id="a torn bundle",
        ),
        pytest.param(
            dump_credential(ISSUED),
            OTHER.pem,
            roots(OTHER),
            NOW,
            b"",
            "ChainError",
            id="chains to no root of its trust file",
        ),
        pytest.param(
            dump_credential(ISSUED),
            CA.pem + OTHER.pem,
            roots(CA),
            NOW,
            b"",
            "the trust file is not the signer's published roots",
            id="a root the signer does not publish",
        ),
        pytest.param(
            dump_credential(CA.issue(f"spiffe://cluster.local/ns/{NAMESPACE}/sa/other")),
            CA.pem,
            roots(CA),
            NOW,
            b"",
            f"names spiffe://cluster.local/ns/{NAMESPACE}/sa/other, not {POD.spiffe_id}",
            id="another workload's",
        ),
        pytest.param(
            dump_credential(ISSUED),
            CA.pem,
            roots(CA),
            dt.datetime(2100, 1, 1, tzinfo=dt.UTC),
            b"",
            "ChainError",
            id="expired",
        ),
        pytest.param(
            dump_credential(ISSUED),
            CA.pem,
            roots(CA),
            NOW,
            spki(ISSUED),
            "still the key from before the restart",
            id="not re-keyed",
        ),
    ],
)
def test_a_credential_that_falls_short_is_named_with_why(
    tmp_path: Path,
    bundle: bytes | None,
    trust: bytes,
    published: frozenset[bytes],
    now: dt.datetime,
    not_key: bytes,
    because: str,
) -> None:
    _, why = judge(POD, volume(tmp_path, bundle, trust), published, now, not_key)
    assert why is not None
    assert why.startswith(because)
