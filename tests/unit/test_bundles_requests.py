"""bundles.requests: real requests and urllib3 against a loopback server that records every
byte it reads. A server with the wrong SPIFFE ID reads nothing at all; the right one serves the
session through a leaf rotation and a CA rotation, each request after a rotation on a new
connection made with the client's current material."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import requests

from bundles.authz import Verdict, allow_ids
from bundles.formats import Credential, dump_credential
from bundles.requests import AuthorizingAdapter, PlainHTTPRefused, session
from bundles.source import TLSSource
from tests.recording_stack_peer import (
    CLIENT_ID,
    DEADLINE,
    OTHER_ID,
    SERVER_ID,
    TOKEN,
    RecordingServer,
    Workloads,
    der,
    serving,
)
from tests.unit.test_bundles_formats import Authority, new_key

pytestmark = pytest.mark.timeout(60)

ALLOW_SERVER = allow_ids([SERVER_ID])
HEADERS = {"Authorization": TOKEN}


def test_a_server_with_the_wrong_spiffe_id_never_reads_a_byte(tmp_path: Path) -> None:
    workloads = Workloads(tmp_path, server_id=OTHER_ID)
    refusals: list[Verdict] = []
    with (
        serving(workloads.server).running() as server,
        session(workloads.client.source, ALLOW_SERVER, on_refusal=refusals.append) as http,
    ):
        with pytest.raises(requests.exceptions.SSLError, match=f"{OTHER_ID} is not the allowed"):
            http.get(server.url, headers=HEADERS, timeout=DEADLINE)
        server.wait_ended()
    assert server.received() == [b""]
    assert [v.reason for v in refusals] == [f"{OTHER_ID} is not the allowed ID {SERVER_ID}."]


def test_the_right_server_serves_through_a_leaf_and_a_ca_rotation(tmp_path: Path) -> None:
    workloads = Workloads(tmp_path)
    with (
        serving(workloads.server).running() as server,
        session(workloads.client.source, ALLOW_SERVER) as http,
    ):

        def get(step: str) -> None:
            answer = http.get(server.url, headers=HEADERS, timeout=DEADLINE)
            assert answer.text == "ok", step

        steps = ["first request", "again, keep-alive"]
        for step in steps:
            get(step)
        assert len(server.connections) == 1  # the second request reused the connection
        workloads.rotate_leaves()
        steps.append("leaf rotation")
        get(steps[-1])
        _assert_current(server, workloads, steps)
        for step in workloads.rotate_ca():
            steps.append(step)
            get(step)
            _assert_current(server, workloads, steps)
    server.wait_ended()
    assert all(TOKEN.encode() in got for got in server.received())


def _assert_current(server: RecordingServer, workloads: Workloads, steps: list[str]) -> None:
    """Each rotation's request went on a new connection carrying the client's current leaf,
    and every connection made before it was closed (the older pool's keep-alive included)."""
    made = list(server.connections)
    assert len(made) == len(steps) - 1, steps
    assert made[-1].client_leaf == der(workloads.client.source.credential), steps[-1]
    server.wait_ended(len(made) - 1)


def _server_with_dns_name(tmp_path: Path, workloads: Workloads, name: str) -> TLSSource:
    """The server workload's ID with a DNS name too, as the signer's dnsNames policy issues."""
    key = new_key()
    leaf = workloads.ca.leaf(SERVER_ID, key=key, dns_names=[name])
    folder = tmp_path / "named"
    folder.mkdir()
    (folder / "credential.pem").write_bytes(dump_credential(Credential(key, (leaf,))))
    (folder / "trust.pem").write_bytes(workloads.ca.pem)
    return TLSSource(folder / "credential.pem", folder / "trust.pem")


def test_hostnames_are_checked_only_when_asked_before_the_first_write(tmp_path: Path) -> None:
    workloads = Workloads(tmp_path)
    named = _server_with_dns_name(tmp_path, workloads, "localhost")
    rule = allow_ids([CLIENT_ID])
    with RecordingServer(
        context=lambda: named.server_context(rule), keep_alive=True
    ).running() as server:
        checking = session(workloads.client.source, ALLOW_SERVER, check_hostname=True)
        with checking:
            url = f"https://localhost:{server.port}/"
            assert checking.get(url, headers=HEADERS, timeout=DEADLINE).text == "ok"
            with pytest.raises(requests.exceptions.SSLError, match="doesn't match"):
                checking.get(server.url, headers=HEADERS, timeout=DEADLINE)  # 127.0.0.1
        with session(workloads.client.source, ALLOW_SERVER) as lax:
            assert lax.get(server.url, headers=HEADERS, timeout=DEADLINE).text == "ok"
        server.wait_ended()
    assert [TOKEN.encode() in got for got in server.received()] == [True, False, True]


def test_plain_http_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    with (
        session(Workloads(tmp_path).client.source, ALLOW_SERVER) as http,
        pytest.raises(PlainHTTPRefused, match="over authorized TLS only"),
    ):
        http.get("http://127.0.0.1:9/", headers=HEADERS)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        pytest.param({"verify": False}, "always verifies", id="verify=False"),
        pytest.param({"cert": "/tmp/client.pem"}, "presents the TLSSource's", id="cert"),
    ],
)
def test_nothing_a_caller_passes_weakens_verification(
    option: dict[str, object], message: str, tmp_path: Path
) -> None:
    workloads = Workloads(tmp_path)
    with (
        serving(workloads.server).running() as server,
        session(workloads.client.source, ALLOW_SERVER) as http,
    ):
        with pytest.raises(ValueError, match=message):
            http.get(server.url, headers=HEADERS, timeout=DEADLINE, **option)
        server.wait_ended()
    assert server.connections == []


def test_a_ca_bundle_path_is_not_loaded_and_the_context_stays_verifying(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """requests points urllib3 at a CA bundle (its own, REQUESTS_CA_BUNDLE's, or verify="...")
    and urllib3 loads it into the context it is given: trust would grow by the public roots."""
    workloads = Workloads(tmp_path)
    stranger = tmp_path / "stranger.pem"
    stranger.write_bytes(Authority("a root nobody asked for").pem)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(stranger))
    adapter = AuthorizingAdapter(workloads.client.source, ALLOW_SERVER)
    with serving(workloads.server).running() as server, requests.Session() as http:
        http.mount("https://", adapter)
        assert http.get(server.url, timeout=DEADLINE).text == "ok"
        assert http.get(server.url, timeout=DEADLINE, verify=str(stranger)).text == "ok"
    context = adapter._current_context()
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert len(context.get_ca_certs()) == len(workloads.client.source.trust_bundle.roots)
    assert context is not workloads.client.source.client_context(ALLOW_SERVER)
