"""The bundle endpoint's edge: which certificate it serves with (its own SVID, re-issued on time
and on a CA change; or the operator's Web PKI files, re-read on change), and what it answers
before a CA is loaded. The bundle's contents are test_signer_spiffebundle's."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiohttp.test_utils import make_mocked_request
from cryptography import x509

from signer import model
from signer.authority import ca
from signer.federation import endpoint

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


class Clock:
    def __init__(self, now: Any) -> None:
        self.now = now

    def __call__(self) -> Any:
        return self.now


def test_the_endpoint_id_is_under_podcert_where_no_pod_id_can_be() -> None:
    assert endpoint.endpoint_id("td.test") == "spiffe://td.test/podcert/bundle-endpoint"


def test_its_svid_is_kept_until_half_its_life_and_reissued_when_the_ca_changes() -> None:
    first, second = (ca.issuing_ca(ca.new_ca(f"g{i}", T0)) for i in range(2))
    issuing: list[model.IssuingCA | None] = [None]
    clock = Clock(T0)
    identity = endpoint.SpiffeIdentity(lambda: issuing[0], "td.test", clock)
    assert identity.current() is None  # no CA yet: nothing to serve with

    issuing[0] = first
    one = identity.current()
    assert one is not None and identity.current() is one
    clock.now = T0 + dt.timedelta(hours=11)
    assert identity.current() is one
    clock.now = T0 + dt.timedelta(hours=13)  # past half of its day
    two = identity.current()
    assert two is not None and two is not one
    issuing[0] = second  # activated: the next handshake gets an SVID from the new CA
    assert identity.current() not in (one, two, None)


@pytest.fixture
def web_files(tmp_path: Path) -> tuple[trustme.CA, Path, Path]:
    return trustme.CA(), tmp_path / "chain.pem", tmp_path / "key.pem"


def write(authority: trustme.CA, cert: Path, key: Path) -> None:
    leaf = authority.issue_cert("bundle.example.com")
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())


def test_the_web_certificate_is_reread_on_change_and_a_bad_pair_keeps_the_last_good(
    web_files: tuple[trustme.CA, Path, Path],
) -> None:
    authority, cert, key = web_files
    write(authority, cert, key)
    clock = Clock(0.0)
    identity = endpoint.WebIdentity(cert, key, clock, interval=10.0)
    first = identity.current()
    assert first is not None

    write(authority, cert, key)  # renewed by the operator's tooling
    clock.now = 5.0
    assert identity.current() is first  # not looked at again yet
    clock.now = 11.0
    renewed = identity.current()
    assert renewed is not None and renewed is not first

    key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nbroken\n-----END PRIVATE KEY-----\n")
    clock.now = 22.0
    assert identity.current() is renewed


def test_missing_web_files_leave_nothing_to_serve_so_the_endpoint_does_not_start(
    tmp_path: Path,
) -> None:
    identity = endpoint.WebIdentity(tmp_path / "no.pem", tmp_path / "no.key", Clock(0.0))
    with pytest.raises(RuntimeError, match="no certificate"):
        endpoint.listener_context(identity)


def serve(roots: list[x509.Certificate], sequence: int) -> Any:
    """One GET / answered by the handler (TLS is the listener's business, not its)."""
    identity = endpoint.SpiffeIdentity(lambda: None, "td.test", Clock(T0))
    server = endpoint.BundleServer(endpoint.Settings(port=0), identity, lambda: (roots, sequence))
    return asyncio.run(server.handle(make_mocked_request("GET", "/")))


def test_before_a_ca_is_loaded_it_answers_503_rather_than_an_empty_bundle() -> None:
    assert serve([], 0).status == 503


def test_it_answers_the_bundle_as_json() -> None:
    root = ca.new_ca("g", T0).root
    response = serve([root], 9)
    assert response.status == 200
    assert response.content_type == "application/json"
    doc = json.loads(response.body)
    assert doc["spiffe_sequence"] == 9
    assert len(doc["keys"]) == 1


def test_the_profile_follows_the_flags() -> None:
    assert endpoint.Settings(port=1).profile == "https_spiffe"
    web = endpoint.Settings(port=1, web_cert=Path("c"), web_key=Path("k"))
    assert web.profile == "https_web"
