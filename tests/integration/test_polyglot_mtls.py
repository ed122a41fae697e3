"""Go and Java workloads (examples/go, examples/java) talk mutual TLS with the Python example
pair (examples/mtls) on SPIFFE credential folders, in both directions, through a leaf rotation
and a CA rotation, with 0 failed calls; a peer with the wrong SPIFFE ID is refused in the
handshake and the other side receives nothing from it.

Credentials are made with the signer's own code (`signer.certs.sign_leaf` under a
`signer.authority.ca` root and intermediate: the profiles podcert issues) for every key type the
API defines, and written by the shim's atomic writer in the Filesystem Delivery layout, so each
language reads what a pod would. Where a language's library refuses something podcert issues,
a test here fails with that library's own reason.

The programs are built once per content of their sources (`devcluster.examplebuild`); no
cluster is needed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from devcluster import examplebuild
from devcluster.testing import eventually
from kubelet_shim.atomic import AtomicDirStorage
from podcert.api import keys
from signer.authority import ca
from tests.integration.polyglot_helpers import (
    DEADLINE,
    Folder,
    Program,
    Running,
    now,
    python_client,
    python_server,
    reloads,
)

TRUST_DOMAIN = "polyglot.test"
PARTNER = "partner.test"
SERVER_ID = f"spiffe://{TRUST_DOMAIN}/ns/shop/sa/api"
CLIENT_ID = f"spiffe://{TRUST_DOMAIN}/ns/shop/sa/web"
IMPOSTOR_ID = f"spiffe://{TRUST_DOMAIN}/ns/shop/sa/impostor"
PARTNER_ID = f"spiffe://{PARTNER}/ns/shop/sa/web"

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def programs() -> dict[str, Program]:
    go = examplebuild.ensure_example_go()
    jar = examplebuild.ensure_example_java()
    return {
        "go": Program("go", (str(go),)),
        "java": Program("java", tuple(examplebuild.java_command(jar))),
    }


@pytest.fixture(params=["go", "java"])
def program(request: pytest.FixtureRequest, programs: dict[str, Program]) -> Program:
    return programs[request.param]


@pytest.fixture(scope="module")
def ca1() -> ca.CABundle:
    return ca.new_ca("polyglot one", now())


@pytest.fixture(scope="module")
def ca2() -> ca.CABundle:
    return ca.new_ca("polyglot two", now())


@pytest.fixture
def storage(tmp_path: Path) -> AtomicDirStorage:
    return AtomicDirStorage(tmp_path / "node")


_uids = itertools.count()


@pytest.fixture
def make_folder(storage: AtomicDirStorage) -> Callable[[str], Folder]:
    def make(spiffe_id: str) -> Folder:
        return Folder(storage, f"pod-{next(_uids)}", spiffe_id)

    return make


@pytest.fixture
def stopper() -> Iterator[list[Running]]:
    """Processes to stop at the end whatever happened."""
    started: list[Running] = []
    yield started
    for running in reversed(started):
        if running.proc.poll() is None:
            running.proc.kill()
            running.proc.wait()


# --- rotation, both directions ------------------------------------------------------------------


def caller_serials(server: Running, python: bool) -> list[str]:
    """The client leaf serials a server has answered, in the order first seen."""
    if python:
        return [
            line.rsplit("certificate serial ", 1)[1].strip()
            for line in server.output().splitlines()
            if "first request from" in line
        ]
    return [e["caller_serial"] for e in server.events("caller")]


def rotate_both(
    server: Folder,
    client: Folder,
    python_side: Running,
    ca1: ca.CABundle,
    ca2: ca.CABundle,
    client_seen_by_server: Callable[[str], bool],
    server_seen_by_client: Callable[[str], bool],
) -> tuple[list[str], list[str]]:
    """From the running leaves of `ca1` (both folders trusting its root alone): a leaf rotation,
    then a CA rotation (the new root added to both folders' trust bundles, new leaves from the
    new CA, the old root removed) and one more leaf rotation under the new root alone. Each step
    waits until both sides have met the new material. The serials in use at each step, server
    side and client side."""
    server_serials, client_serials = [server.serial], [client.serial]

    def met() -> None:
        what = f"both sides using the leaves {server_serials[-1]} / {client_serials[-1]}"
        eventually(
            lambda: (
                client_seen_by_server(client_serials[-1])
                and server_seen_by_client(server_serials[-1])
            ),
            timeout=DEADLINE,
            what=what,
        )

    def rotate(issuer: ca.CABundle) -> None:
        server_serials.append(server.issue(issuer))
        client_serials.append(client.issue(issuer))
        met()

    def retrust(*roots: x509.Certificate) -> None:
        before = reloads(python_side)
        server.trust(TRUST_DOMAIN, *roots)
        client.trust(TRUST_DOMAIN, *roots)
        # The Go and Java sides read the files at their next handshake; the Python side at its
        # next content check: wait for it, as a CA rotation waits for every pod's trust file.
        eventually(
            lambda: reloads(python_side) > before,
            timeout=DEADLINE,
            what="the Python side reloading its trust bundle",
        )

    met()
    rotate(ca1)  # a leaf rotation
    retrust(ca1.root, ca2.root)  # CA rotation: prepare
    rotate(ca2)  # activate
    retrust(ca2.root)  # retire the old root
    rotate(ca2)  # a leaf rotation under the new root alone
    return server_serials, client_serials


def started_folders(
    make_folder: Callable[[str], Folder], issuer: ca.CABundle
) -> tuple[Folder, Folder]:
    """The server's and the client's folders: a leaf of `issuer` each, its root trusted."""
    server, client = make_folder(SERVER_ID), make_folder(CLIENT_ID)
    for folder in (server, client):
        folder.trust(TRUST_DOMAIN, issuer.root)
        folder.issue(issuer)
    return server, client


def test_go_and_java_clients_call_the_python_server_through_leaf_and_ca_rotations(
    program: Program,
    make_folder: Callable[[str], Folder],
    ca1: ca.CABundle,
    ca2: ca.CABundle,
    tmp_path: Path,
    stopper: list[Running],
) -> None:
    server, client = started_folders(make_folder, ca1)
    py, url = python_server(
        server, TRUST_DOMAIN, tmp_path / "py-server.log", f"--allow-id={CLIENT_ID}"
    )
    stopper.append(py)
    caller = program.client(
        client, url, tmp_path / f"{program.language}-client.log", f"--peer-id={SERVER_ID}"
    )
    stopper.append(caller)

    issued_server, issued_client = rotate_both(
        server,
        client,
        py,
        ca1,
        ca2,
        client_seen_by_server=lambda s: s in caller_serials(py, python=True),
        server_seen_by_client=lambda s: any(
            e["server_serial"] == s for e in caller.events("server")
        ),
    )

    calls = caller.stop()
    assert calls["failed"] == 0, calls["errors"]
    assert calls["ok"] > 0
    # The client met every server leaf and the server every client leaf, in the order issued.
    assert calls["server_serials"] == issued_server
    assert caller_serials(py, python=True) == issued_client
    answered = py.stop()
    assert answered["refused"] == 0
    # A call cut by SIGTERM may have been answered without being counted.
    assert answered["served"] >= calls["ok"]


def test_the_python_client_calls_go_and_java_servers_through_leaf_and_ca_rotations(
    program: Program,
    make_folder: Callable[[str], Folder],
    ca1: ca.CABundle,
    ca2: ca.CABundle,
    tmp_path: Path,
    stopper: list[Running],
) -> None:
    server, client = started_folders(make_folder, ca1)
    answering, url = program.server(
        server, tmp_path / f"{program.language}-server.log", f"--peer-id={CLIENT_ID}"
    )
    stopper.append(answering)
    py = python_client(
        client, TRUST_DOMAIN, url, tmp_path / "py-client.log", f"--server-id={SERVER_ID}"
    )
    stopper.append(py)

    issued_server, issued_client = rotate_both(
        server,
        client,
        py,
        ca1,
        ca2,
        client_seen_by_server=lambda s: s in caller_serials(answering, python=False),
        # The server drains connections made before its rotation, so the Python client's next
        # connection meets the new leaf.
        server_seen_by_client=lambda s: any(
            e["serial"] == s for e in answering.events("presented")
        ),
    )

    # The old root, removed from the server's folder, no longer vouches for anyone: a leaf of
    # the old CA is refused at its next handshake.
    stale = make_folder(CLIENT_ID)
    stale.trust(TRUST_DOMAIN, ca2.root)
    stale.issue(ca1)
    probe = program.client(
        stale, url, tmp_path / "stale.log", f"--peer-id={SERVER_ID}", "--requests=1"
    )
    assert probe.wait()["failed"] == 1
    assert len(answering.events("refused")) == 1

    calls = py.stop()
    assert calls["failed"] == 0, calls["errors"]
    assert calls["exit"] == 0
    assert calls["server_serials"] == issued_server
    answered = answering.stop()
    assert answered["refused"] == 1
    assert answered["client_serials"] == issued_client
    assert answered["callers"] == [CLIENT_ID]
    assert answered["served"] == calls["ok"]


# --- a peer with the wrong SPIFFE ID ------------------------------------------------------------


def test_go_and_java_clients_refuse_a_python_server_with_another_id_before_sending_a_byte(
    program: Program,
    make_folder: Callable[[str], Folder],
    ca1: ca.CABundle,
    tmp_path: Path,
    stopper: list[Running],
) -> None:
    server, client = started_folders(make_folder, ca1)
    server.issue(ca1, spiffe_id=IMPOSTOR_ID)  # same CA, same trust domain, another workload
    py, url = python_server(
        server, TRUST_DOMAIN, tmp_path / "py-server.log", f"--allow-id={CLIENT_ID}"
    )
    stopper.append(py)
    caller = program.client(
        client, url, tmp_path / "client.log", f"--peer-id={SERVER_ID}", "--requests=3"
    )
    stopper.append(caller)

    calls = caller.wait()
    assert (calls["ok"], calls["failed"], calls["exit"]) == (0, 3, 1)
    assert all(IMPOSTOR_ID in reason for reason in calls["errors"]), calls["errors"]
    # The server recorded no request: the client left inside the handshake.
    assert py.stop()["served"] == 0


def test_go_and_java_servers_refuse_a_python_client_with_another_id_inside_the_handshake(
    program: Program,
    make_folder: Callable[[str], Folder],
    ca1: ca.CABundle,
    tmp_path: Path,
    stopper: list[Running],
) -> None:
    server, client = started_folders(make_folder, ca1)
    client.issue(ca1, spiffe_id=IMPOSTOR_ID)
    answering, url = program.server(server, tmp_path / "server.log", f"--peer-id={CLIENT_ID}")
    stopper.append(answering)
    py = python_client(
        client,
        TRUST_DOMAIN,
        url,
        tmp_path / "py-client.log",
        f"--server-id={SERVER_ID}",
        "--duration=1",
        "--rate=5",
    )
    stopper.append(py)

    calls = py.wait()
    assert calls["ok"] == 0 and calls["failed"] > 0 and calls["exit"] == 1
    answered = answering.stop()
    assert answered["served"] == 0 and answered["callers"] == []
    assert answered["refused"] > 0
    assert all(IMPOSTOR_ID in e["reason"] for e in answering.events("refused"))


# --- every key type the API defines, under CAs of several key types ------------------------------

KEY_CASES = [
    pytest.param("ECDSAP256", leaf, id=f"{leaf} leaf, ECDSAP256 CA") for leaf in keys.KEY_TYPES
] + [
    pytest.param(issuer, "ECDSAP256", id=f"ECDSAP256 leaf, {issuer} CA")
    for issuer in ("ECDSAP384", "ECDSAP521", "RSA3072", "ED25519")
]


@pytest.mark.parametrize(("ca_key", "leaf_key"), KEY_CASES)
def test_every_key_type_podcert_issues_works_both_ways(
    program: Program,
    ca_key: keys.KeyType,
    leaf_key: keys.KeyType,
    make_folder: Callable[[str], Folder],
    tmp_path: Path,
    stopper: list[Running],
) -> None:
    issuer = ca.new_ca(f"polyglot {ca_key}", now(), key_type=ca_key)
    server, client = started_folders(make_folder, issuer)
    server.issue(issuer, leaf_key)
    client.issue(issuer, leaf_key)

    py, url = python_server(
        server, TRUST_DOMAIN, tmp_path / "py-server.log", f"--allow-id={CLIENT_ID}"
    )
    stopper.append(py)
    calls = program.client(
        client, url, tmp_path / "client.log", f"--peer-id={SERVER_ID}", "--requests=2"
    ).wait()
    assert (calls["ok"], calls["failed"]) == (2, 0), calls["errors"]
    py.stop()

    answering, url = program.server(server, tmp_path / "server.log", f"--peer-id={CLIENT_ID}")
    stopper.append(answering)
    py_calls = python_client(
        client,
        TRUST_DOMAIN,
        url,
        tmp_path / "py-client.log",
        f"--server-id={SERVER_ID}",
        "--duration=0.5",
        "--rate=4",
    ).wait()
    assert py_calls["failed"] == 0 and py_calls["ok"] > 0, py_calls["errors"]
    assert answering.stop()["client_serials"] == [client.serial]


# --- trust bundles per trust domain, read per handshake (Go and Java face each other) -----------


@pytest.mark.parametrize(("client_language", "server_language"), [("go", "java"), ("java", "go")])
def test_a_federated_trust_domain_counts_from_the_next_handshake_and_vouches_for_its_own_ids_only(
    client_language: str,
    server_language: str,
    programs: dict[str, Program],
    make_folder: Callable[[str], Folder],
    ca1: ca.CABundle,
    tmp_path: Path,
    stopper: list[Running],
) -> None:
    partner_ca = ca.new_ca("partner", now())
    server = make_folder(SERVER_ID)
    server.trust(TRUST_DOMAIN, ca1.root)
    server.issue(ca1)
    client = make_folder(PARTNER_ID)
    client.trust(TRUST_DOMAIN, ca1.root)  # to verify the server
    client.trust(PARTNER, partner_ca.root)
    client.issue(partner_ca)
    answering, url = programs[server_language].server(
        server, tmp_path / "server.log", f"--peer-id={PARTNER_ID}", f"--peer-id={CLIENT_ID}"
    )
    stopper.append(answering)
    runs = itertools.count()

    def call() -> dict[str, Any]:
        log = tmp_path / f"client-{next(runs)}.log"
        caller = programs[client_language].client(
            client, url, log, f"--peer-id={SERVER_ID}", "--requests=1"
        )
        return caller.wait()

    # No partner.test bundle in the server's folder: its peers are refused.
    refused = call()
    assert refused["failed"] == 1
    assert any(PARTNER in e["reason"] for e in answering.events("refused"))
    # Federated: the file is there, the next handshake is allowed (no restart).
    server.trust(PARTNER, partner_ca.root)
    assert call()["ok"] == 1
    # The partner's root does not vouch for an ID of our trust domain, though the ID is allowed.
    client.issue(partner_ca, spiffe_id=CLIENT_ID)
    assert call()["failed"] == 1
    client.issue(partner_ca)
    assert call()["ok"] == 1
    # De-federated: the file is gone, the next handshake is refused.
    server.trust(PARTNER)
    assert call()["failed"] == 1
    answered = answering.stop()
    assert answered["served"] == 2 and answered["callers"] == [PARTNER_ID]
