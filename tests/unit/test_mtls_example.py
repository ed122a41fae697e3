"""The mTLS example pair over loopback: identity answers, refusals, and rotations with no failure.

Credentials are made by the signer's own CA code and written in the kubelet's atomic-writer
layout by the shim's writer, so the example reads exactly what a pod would. Waits are conditions
with deadlines, never fixed sleeps.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bundles.authz import Authorizer, allow_any_of, allow_ids, allow_workloads
from bundles.source import TLSSource
from bundles.spiffe import SpiffeId
from devcluster.supervise import free_port
from examples.mtls.client import IdentityClient
from examples.mtls.server import IdentityServer
from kubelet_shim.atomic import AtomicDirStorage
from kubelet_shim.storage import FileSpec
from signer import certs, model
from signer.authority import ca

TRUST_DOMAIN = "td.test"
SERVER_ID = f"spiffe://{TRUST_DOMAIN}/ns/shop/sa/api"
CLIENT_ID = f"spiffe://{TRUST_DOMAIN}/ns/shop/sa/web"
DEADLINE = 15.0  # seconds any single condition may take to come true
RELOAD_INTERVAL = 0.2
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)
ALLOW_WEB = allow_workloads("shop", "web", trust_domain=TRUST_DOMAIN)


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def new_ca(name: str) -> ca.CABundle:
    return ca.new_ca(name, now())


def pem(*certificates: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


@dataclass
class Pod:
    """One pod's projected volume, rewritten the way the shim does it."""

    storage: AtomicDirStorage
    uid: str
    spiffe_id: str
    serial: str = ""

    @property
    def directory(self) -> Path:
        return self.storage.volume_dir(self.uid, "identity")

    @property
    def bundle(self) -> Path:
        return self.directory / "credentialbundle.pem"

    @property
    def trust(self) -> Path:
        return self.directory / "trust-bundle.pem"

    def issue(
        self, issuer: ca.CABundle, roots: list[x509.Certificate], *, split: bool = False
    ) -> str:
        """A new key and leaf from `issuer`, with `roots` as the trust bundle; the new serial."""
        key = ec.generate_private_key(ec.SECP256R1())
        not_before = now() - dt.timedelta(minutes=1)
        plan = model.LeafPlan(
            public_key=key.public_key(),
            spiffe_id=self.spiffe_id,
            dns_names=(),
            not_before=not_before,
            not_after=not_before + dt.timedelta(hours=1),
            begin_refresh_at=not_before + dt.timedelta(minutes=30),
        )
        serial = certs.random_serial()
        chain = certs.sign_leaf(plan, ca.issuing_ca(issuer), serial).encode()
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        files = {"trust-bundle.pem": FileSpec(pem(*roots))}
        if split:
            files |= {"tls.key": FileSpec(key_pem, 0o600), "tls.crt": FileSpec(chain)}
        else:
            files["credentialbundle.pem"] = FileSpec(key_pem + chain, 0o600)
        self.storage.write_volume(self.uid, "identity", files, None)
        self.serial = f"{serial:x}"
        return self.serial

    def trust_only(self, roots: list[x509.Certificate]) -> None:
        """Rewrite the trust bundle, keep the credential (a CA rotation's first and last step)."""
        current = self.bundle.read_bytes()
        files = {
            "credentialbundle.pem": FileSpec(current, 0o600),
            "trust-bundle.pem": FileSpec(pem(*roots)),
        }
        self.storage.write_volume(self.uid, "identity", files, None)

    def source(self, *, split: bool = False) -> TLSSource:
        if split:
            return TLSSource((self.directory / "tls.key", self.directory / "tls.crt"), self.trust)
        return TLSSource(self.bundle, self.trust)


@pytest.fixture
def storage(tmp_path: Path) -> AtomicDirStorage:
    return AtomicDirStorage(tmp_path / "node")


@pytest.fixture(scope="module")
def ca1() -> ca.CABundle:
    return new_ca("mtls one")


async def eventually(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {DEADLINE}s waiting for {what}")
        await asyncio.sleep(0.02)


@asynccontextmanager
async def pair(
    server_pod: Pod,
    client_pod: Pod,
    *,
    allow_clients: Authorizer | None = None,
    expect_server: Authorizer | None = None,
    split_client: bool = False,
) -> AsyncIterator[tuple[IdentityServer, IdentityClient]]:
    """A running server and a client for it, both following their files."""
    server = IdentityServer(server_pod.source(), allow_clients or ALLOW_WEB)
    client_source = client_pod.source(split=split_client)
    stop = asyncio.Event()
    watchers = [
        asyncio.create_task(server.source.watch(stop, interval=RELOAD_INTERVAL)),
        asyncio.create_task(client_source.watch(stop, interval=RELOAD_INTERVAL)),
    ]
    port = await server.start("127.0.0.1", 0)
    url = f"https://127.0.0.1:{port}/"
    try:
        async with IdentityClient(client_source, expect_server or allow_ids([SERVER_ID]), url) as c:
            yield server, c
    finally:
        stop.set()
        await server.stop()
        await asyncio.gather(*watchers)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


@pytest.fixture
def pods(storage: AtomicDirStorage, ca1: ca.CABundle) -> tuple[Pod, Pod]:
    server_pod = Pod(storage, "uid-api", SERVER_ID)
    client_pod = Pod(storage, "uid-web", CLIENT_ID)
    server_pod.issue(ca1, [ca1.root])
    client_pod.issue(ca1, [ca1.root])
    return server_pod, client_pod


# --- answers and refusals -------------------------------------------------------------------------


def test_the_server_answers_with_the_callers_identity(pods: tuple[Pod, Pod]) -> None:
    server_pod, client_pod = pods

    async def scenario() -> None:
        async with pair(server_pod, client_pod) as (server, client):
            answer = await client.request()
            assert answer == {
                "caller": CLIENT_ID,
                "caller_serial": client_pod.serial,
                "server_serial": server_pod.serial,
            }
            assert (client.ok, client.failed, server.served, server.refused) == (1, 0, 1, 0)

    run(scenario)


def test_separate_key_and_chain_files_work_too(
    storage: AtomicDirStorage, ca1: ca.CABundle, pods: tuple[Pod, Pod]
) -> None:
    server_pod, _ = pods
    split = Pod(storage, "uid-split", CLIENT_ID)
    split.issue(ca1, [ca1.root], split=True)

    async def scenario() -> None:
        async with pair(server_pod, split, split_client=True) as (_, client):
            answer = await client.request()
            assert answer is not None and answer["caller_serial"] == split.serial

    run(scenario)


def test_a_client_whose_id_is_not_allowed_is_refused_with_a_clear_log_line(
    storage: AtomicDirStorage,
    ca1: ca.CABundle,
    pods: tuple[Pod, Pod],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server_pod, _ = pods
    intruder = Pod(storage, "uid-intruder", f"spiffe://{TRUST_DOMAIN}/ns/other/sa/intruder")
    intruder.issue(ca1, [ca1.root])

    async def scenario() -> None:
        async with pair(server_pod, intruder) as (server, client):
            assert await client.request() is None
            # Refused inside the handshake: no handler ran. Under TLS 1.3 the client learns it
            # only when the server closes (aiohttp then retries a GET once, on a new handshake).
            assert (client.failed, server.served) == (1, 0)
            assert server.refused >= 1
            (error,) = client.errors
            # An end of stream, or a reset when the unread request was still queued at the
            # server as it closed.
            assert error.split(":")[0] in {"ServerDisconnectedError", "ClientOSError"}, error

    with caplog.at_level(logging.WARNING, logger="examples.mtls.server"):
        run(scenario)
    refusals = [r.getMessage() for r in caplog.records if "refused client" in r.getMessage()]
    assert refusals
    for refusal in refusals:
        assert f"spiffe://{TRUST_DOMAIN}/ns/other/sa/intruder" in refusal
        assert "does not match namespace 'shop'" in refusal


def test_a_client_certificate_from_an_untrusted_ca_fails_the_handshake(
    storage: AtomicDirStorage, ca1: ca.CABundle, pods: tuple[Pod, Pod]
) -> None:
    server_pod, _ = pods
    stranger = Pod(storage, "uid-stranger", CLIENT_ID)
    foreign = new_ca("foreign")
    # It trusts the server's CA, so only the server's check can stop it.
    stranger.issue(foreign, [foreign.root, ca1.root])

    async def scenario() -> None:
        async with pair(server_pod, stranger) as (server, client):
            assert await client.request() is None
            assert (client.failed, server.served, server.refused) == (1, 0, 0)

    run(scenario)


@pytest.mark.parametrize(
    ("rule", "allowed"),
    [
        pytest.param(ALLOW_WEB, {"partner": False, "liar": False}, id="shop/web means ours only"),
        pytest.param(
            allow_any_of(ALLOW_WEB, allow_workloads("shop", "web", trust_domain="partner.test")),
            {"partner": True, "liar": False},
            id="the partner's shop/web when named",
        ),
    ],
)
def test_a_federated_trust_domain_never_passes_as_ours(
    storage: AtomicDirStorage,
    ca1: ca.CABundle,
    pods: tuple[Pod, Pod],
    tmp_path: Path,
    rule: Authorizer,
    allowed: dict[str, bool],
) -> None:
    """Issues 17 and 24: the server trusts partner.test's root as partner.test's bundle. The
    partner's spiffe://partner.test/ns/shop/sa/web is not our shop/web (it got 200 as
    shop/web); it gets in only by a rule naming partner.test. A certificate from that root
    claiming one of our IDs never gets in, though TLS verified it."""
    server_pod, _ = pods
    partner_ca = new_ca("partner")
    federated = tmp_path / "federated-partner.pem"
    federated.write_bytes(pem(partner_ca.root))
    partner = Pod(storage, "uid-partner", "spiffe://partner.test/ns/shop/sa/web")
    partner.issue(partner_ca, [partner_ca.root, ca1.root])
    liar = Pod(storage, "uid-liar", CLIENT_ID)
    liar.issue(partner_ca, [partner_ca.root, ca1.root])

    async def scenario() -> None:
        source = TLSSource(
            server_pod.bundle, server_pod.trust, federated={"partner.test": federated}
        )
        server = IdentityServer(source, rule)
        port = await server.start("127.0.0.1", 0)
        url = f"https://127.0.0.1:{port}/"
        try:
            for name, pod in (("partner", partner), ("liar", liar)):
                async with IdentityClient(pod.source(), allow_ids([SERVER_ID]), url) as client:
                    answer = await client.request()
                assert (answer is not None) is allowed[name], (name, client.errors)
                if answer is not None:
                    assert answer["caller"] == pod.spiffe_id
            assert server.served == sum(allowed.values())
        finally:
            await server.stop()

    run(scenario)


def test_the_client_refuses_a_server_with_another_id_before_sending_anything(
    pods: tuple[Pod, Pod],
) -> None:
    server_pod, client_pod = pods
    expected = allow_ids([f"spiffe://{TRUST_DOMAIN}/ns/shop/sa/not-api"])

    async def scenario() -> None:
        async with pair(server_pod, client_pod, expect_server=expected) as (server, client):
            assert await client.request() is None
            (error,) = client.errors
            assert error.startswith("ClientConnectorCertificateError")
            assert f"{SERVER_ID} is not the allowed ID" in error
            assert server.served == 0

    run(scenario)


# --- rotation under load --------------------------------------------------------------------------


def test_leaf_and_ca_rotations_under_steady_load_fail_no_request(
    pods: tuple[Pod, Pod], ca1: ca.CABundle
) -> None:
    server_pod, client_pod = pods
    ca2 = new_ca("mtls two")

    def trusts(source: TLSSource, *roots: x509.Certificate) -> bool:
        return source.trust_bundle.roots == roots

    async def rotate(server: IdentityServer, client: IdentityClient) -> None:
        async def new_leaves(issuer: ca.CABundle, roots: list[x509.Certificate]) -> None:
            serial = server_pod.issue(issuer, roots)
            await eventually(lambda: serial in client.server_serials, "the server's new leaf")
            serial = client_pod.issue(issuer, roots)
            await eventually(lambda: serial in server.client_serials, "the client's new leaf")

        await eventually(lambda: client.ok >= 20, "the first answers")
        for _ in range(3):
            await new_leaves(ca1, [ca1.root])
        # CA rotation: trust old + new everywhere, then issue from the new, then drop the old.
        for pod in (server_pod, client_pod):
            pod.trust_only([ca1.root, ca2.root])
        await eventually(
            lambda: all(trusts(s, ca1.root, ca2.root) for s in (server.source, client.source)),
            "both sides to trust both roots",
        )
        await new_leaves(ca2, [ca1.root, ca2.root])
        for pod in (server_pod, client_pod):
            pod.trust_only([ca2.root])
        await eventually(
            lambda: all(trusts(s, ca2.root) for s in (server.source, client.source)),
            "both sides to trust only the new root",
        )
        settled = client.ok
        await eventually(lambda: client.ok >= settled + 50, "answers after the rotation")

    async def scenario() -> None:
        async with pair(server_pod, client_pod) as (server, client):
            stop = asyncio.Event()
            load = asyncio.create_task(client.run(rate=100, duration=None, stop=stop))
            try:
                await rotate(server, client)
            finally:
                stop.set()
                await load

            assert client.failed == 0, client.errors
            assert server.refused == 0
            # Each side saw every leaf the other had: the first, 3 rotations, the new CA's.
            assert len(client.server_serials) == 5
            assert len(server.client_serials) == 5
            assert client.last is not None
            assert client.last["server_serial"] == server_pod.serial

    run(scenario)


# --- as processes, the way a pod runs them --------------------------------------------------------


@contextmanager
def serving(server_pod: Pod, log: Path, *rules: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`python -m examples.mtls.server` for `server_pod` with peer `rules`, listening."""
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "examples.mtls.server",
            f"--credential-bundle={server_pod.bundle}",
            f"--trust-bundle={server_pod.trust}",
            *rules,
            "--host=127.0.0.1",
            f"--port={port}",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
    )
    try:
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"server did not listen: {log.read_text()}") from None
                time.sleep(0.05)
        yield process, port
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


@pytest.fixture
def server_process(
    pods: tuple[Pod, Pod], tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    with serving(pods[0], tmp_path / "server.log", f"--allow-id={CLIENT_ID}") as running:
        yield running


@pytest.mark.parametrize(
    ("rule", "admitted"),
    [
        pytest.param("shop/web", {CLIENT_ID}, id="shop/web: ours only, as the docs run it"),
        pytest.param(
            "partner.test/shop/web",
            {"spiffe://partner.test/ns/shop/sa/web"},
            id="partner.test/shop/web: the partner's only",
        ),
        pytest.param(
            "*/shop/web",
            {CLIENT_ID, "spiffe://partner.test/ns/shop/sa/web"},
            id="*/shop/web: any trust domain, said out loud",
        ),
    ],
)
def test_the_server_command_scopes_a_workload_rule_to_a_trust_domain(
    storage: AtomicDirStorage,
    ca1: ca.CABundle,
    pods: tuple[Pod, Pod],
    tmp_path: Path,
    rule: str,
    admitted: set[str],
) -> None:
    """Run as docs/getting-started/demo.md runs it plus a federated bundle as docs/SPIRE.md
    adds it, `--allow-workload shop/web` let spiffe://partner.test/ns/shop/sa/web in."""
    server_pod, ours = pods
    partner_ca = new_ca("partner")
    federated = tmp_path / "federated-partner.pem"
    federated.write_bytes(pem(partner_ca.root))
    theirs = Pod(storage, "uid-partner", "spiffe://partner.test/ns/shop/sa/web")
    theirs.issue(partner_ca, [partner_ca.root, ca1.root])
    flags = (f"--allow-workload={rule}", f"--federated-trust-bundle=partner.test={federated}")

    async def callers(port: int) -> set[str]:
        seen: set[str] = set()
        for pod in (ours, theirs):
            url = f"https://127.0.0.1:{port}/"
            async with IdentityClient(pod.source(), allow_ids([SERVER_ID]), url) as client:
                answer = await client.request()
            if answer is not None:
                assert answer["caller"] == pod.spiffe_id
                seen.add(pod.spiffe_id)
        return seen

    with serving(server_pod, tmp_path / "server.log", *flags) as (_, port):
        assert asyncio.run(callers(port)) == admitted
    refused = {CLIENT_ID, theirs.spiffe_id} - admitted
    log = (tmp_path / "server.log").read_text()
    for spiffe_id in refused:
        assert f"refused client: {spiffe_id}" in log


def test_the_commands_serve_and_count(
    pods: tuple[Pod, Pod], server_process: tuple[subprocess.Popen[str], int]
) -> None:
    _, client_pod = pods
    process, port = server_process

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.mtls.client",
            f"--credential-bundle={client_pod.bundle}",
            f"--trust-bundle={client_pod.trust}",
            f"--server-id={SERVER_ID}",
            f"--url=https://127.0.0.1:{port}/",
            "--rate=40",
            "--duration=1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    client_stats = json.loads(done.stdout)
    # How many calls a second of the schedule makes depends on the machine's load; that every
    # call made was answered, and counted alike by both sides, does not.
    assert client_stats["failed"] == 0
    assert client_stats["ok"] == client_stats["requests"] > 0
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    server_stats = json.loads(out)
    assert server_stats["served"] == client_stats["ok"]
    assert server_stats["client_serials"] == [client_pod.serial]


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["--trust-bundle=x", "--allow-id=" + CLIENT_ID], id="no credential"),
        pytest.param(
            ["--credential-bundle=x", "--key=k", "--trust-bundle=x", "--allow-id=" + CLIENT_ID],
            id="a bundle and a key at once",
        ),
        pytest.param(["--credential-bundle=x", "--trust-bundle=x"], id="no client rule"),
        pytest.param(
            ["--credential-bundle=x", "--trust-bundle=x", "--allow-id=https://x"],
            id="a client rule that is not a SPIFFE ID",
        ),
        pytest.param(
            ["--credential-bundle=x", "--trust-bundle=x", "--allow-workload=a/b/c/d"],
            id="a workload rule with four parts",
        ),
        pytest.param(
            ["--credential-bundle=x", "--trust-bundle=x", "--allow-workload=Bad.TD/shop/web"],
            id="a workload rule whose trust domain is malformed",
        ),
        pytest.param(
            ["--credential-bundle=x", "--trust-bundle=x", "--allow-workload=shop/"],
            id="a workload rule without a service account",
        ),
    ],
)
def test_server_usage_errors_exit_2(argv: list[str]) -> None:
    from examples.mtls.server import main

    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2


def test_the_example_modules_do_not_import_the_signer_or_the_shim() -> None:
    code = (
        "import sys, examples.mtls.server, examples.mtls.client; "
        "print(sorted({'signer', 'kubelet_shim', 'kubernetes'} & set(sys.modules)))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "[]"


def test_a_workload_rule_without_a_trust_domain_needs_one_of_our_own() -> None:
    """`NS/SA` means our trust domain; with a certificate that names none it is an error that
    says what to write, never a rule for every trust domain."""
    import argparse

    from examples.mtls import add_peer_arguments, authorizer_from

    parser = argparse.ArgumentParser()
    add_peer_arguments(parser, "allow", "clients")
    rules = authorizer_from(parser, parser.parse_args(["--allow-workload=shop/web"]))
    assert rules(TRUST_DOMAIN)(SpiffeId.parse(CLIENT_ID))
    assert not rules(TRUST_DOMAIN)(SpiffeId.parse("spiffe://partner.test/ns/shop/sa/web"))
    with pytest.raises(ValueError, match="TRUST_DOMAIN/NAMESPACE/SERVICEACCOUNT"):
        rules(None)
