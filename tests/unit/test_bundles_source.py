"""bundles.source: contexts that follow rotation, and never serve a broken pair.

Files are published the way the kubelet's atomic writer does it (a `..data` symlink swap), and
TLS handshakes run for real between two sources over memory BIOs: no sockets, no sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import ssl
import stat
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from bundles import handshake as handshake_module
from bundles import source as source_module
from bundles.authz import allow_ids
from bundles.formats import (
    ChainError,
    Credential,
    KeyMismatchError,
    MalformedPemError,
    dump_certificates,
    dump_credential,
)
from bundles.source import SourceError, TLSSource
from tests.unit.test_bundles_formats import NOW, Authority, pkcs8

SERVER_ID = "spiffe://cluster.local/ns/shop/sa/checkout"
CLIENT_ID = "spiffe://cluster.local/ns/shop/sa/frontend"
ALLOW_CLIENT = allow_ids([CLIENT_ID])  # one object per rule: contexts are cached per authorizer
ALLOW_SERVER = allow_ids([SERVER_ID])
DEADLINE = 10.0  # seconds; generous, only reached when something is broken


class Volume:
    """A projected volume as the kubelet's atomic writer keeps it.

    Each publish writes the whole payload into a fresh `..<n>` directory, then renames a
    `..data_tmp` symlink over `..data`; the visible names are symlinks into `..data`.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir()
        self.payload: dict[str, bytes] = {}
        self.generation = 0

    def publish(self, **files: bytes) -> None:
        self.payload.update(files)
        self.generation += 1
        directory = self.root / f"..{self.generation:04d}"
        directory.mkdir()
        for name, data in self.payload.items():
            (directory / name).write_bytes(data)
            (directory / name).chmod(0o600)
            visible = self.root / name
            if not visible.is_symlink():
                visible.symlink_to(Path("..data") / name)
        previous = (self.root / "..data").resolve() if (self.root / "..data").exists() else None
        (self.root / "..data_tmp").symlink_to(directory.name)
        (self.root / "..data_tmp").replace(self.root / "..data")
        if previous is not None:
            for old in previous.iterdir():
                old.unlink()
            previous.rmdir()

    def __truediv__(self, name: str) -> Path:
        return self.root / name


class Clock:
    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


class Link:
    """One TLS connection between two contexts over memory BIOs."""

    def __init__(self, server: ssl.SSLContext, client: ssl.SSLContext) -> None:
        self._server_in, self._server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._client_in, self._client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.server = server.wrap_bio(self._server_in, self._server_out, server_side=True)
        self.client = client.wrap_bio(self._client_in, self._client_out, server_side=False)
        pending = [self.client, self.server]
        for _ in range(10):
            for side in list(pending):
                try:
                    side.do_handshake()
                    pending.remove(side)
                except ssl.SSLWantReadError:
                    pass
            self._pump()
            if not pending:
                break
        assert not pending, "handshake did not finish"
        # TLS 1.3: the server judges the client certificate after the client has finished; a
        # round trip makes a rejection surface here.
        self.roundtrip(b"hello")

    def _pump(self) -> None:
        self._server_in.write(self._client_out.read())
        self._client_in.write(self._server_out.read())

    def roundtrip(self, data: bytes) -> None:
        self.client.write(data)
        self._pump()
        received = self.server.read(len(data))
        self.server.write(received)
        self._pump()
        assert self.client.read(len(data)) == data

    def server_leaf(self) -> bytes | None:
        return self.client.getpeercert(binary_form=True)

    def client_leaf(self) -> bytes | None:
        return self.server.getpeercert(binary_form=True)


def der(credential: Credential) -> bytes:
    return credential.leaf.public_bytes(serialization.Encoding.DER)


@pytest.fixture(scope="module")
def ca() -> Authority:
    return Authority("podcert root 1")


@pytest.fixture
def clock() -> Clock:
    return Clock(NOW)


@pytest.fixture
def server_volume(tmp_path: Path, ca: Authority) -> Volume:
    volume = Volume(tmp_path / "server")
    volume.publish(**{"credential.pem": dump_credential(ca.issue(SERVER_ID)), "trust.pem": ca.pem})
    return volume


@pytest.fixture
def client_volume(tmp_path: Path, ca: Authority) -> Volume:
    volume = Volume(tmp_path / "client")
    issued = ca.issue(CLIENT_ID)
    volume.publish(
        **{
            "key.pem": pkcs8(issued.key),
            "chain.pem": dump_certificates(issued.chain),
            "trust.pem": ca.pem,
        }
    )
    return volume


@pytest.fixture
def server(server_volume: Volume, clock: Clock) -> TLSSource:
    return TLSSource(server_volume / "credential.pem", server_volume / "trust.pem", clock=clock)


@pytest.fixture
def client(client_volume: Volume, clock: Clock) -> TLSSource:
    return TLSSource(
        (client_volume / "key.pem", client_volume / "chain.pem"),
        client_volume / "trust.pem",
        clock=clock,
    )


def error_of(source: TLSSource) -> Exception | None:
    return source.last_error  # a call, so mypy does not carry an earlier narrowing over


def connect(server: TLSSource, client: TLSSource) -> Link:
    return Link(server.server_context(ALLOW_CLIENT), client.client_context(ALLOW_SERVER))


def contexts(source: TLSSource) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    return source.server_context(ALLOW_CLIENT), source.client_context(ALLOW_SERVER)


# --- loading and contexts ---------------------------------------------------------------------


def test_initial_load_builds_strict_mutual_tls_contexts(server: TLSSource, ca: Authority) -> None:
    server_side, client_side = contexts(server)
    assert server_side.verify_mode == client_side.verify_mode == ssl.CERT_REQUIRED
    assert client_side.check_hostname is False
    assert server_side.minimum_version == client_side.minimum_version == ssl.TLSVersion.TLSv1_2
    assert str(server.credential.spiffe_id) == SERVER_ID
    assert server.trust_domain == "cluster.local"
    assert server.trust_bundle.roots == (ca.cert,)
    assert server.last_error is None


def test_a_real_handshake_proves_both_spiffe_ids(server: TLSSource, client: TLSSource) -> None:
    link = connect(server, client)
    assert link.client.version() == "TLSv1.3"
    assert link.server_leaf() == der(server.credential)
    assert link.client_leaf() == der(client.credential)
    assert server.authorize(link.server, ALLOW_CLIENT).allowed
    assert client.authorize(link.client, ALLOW_SERVER).allowed
    assert not server.authorize(link.server, ALLOW_SERVER).allowed


def test_tls_1_2_peers_are_still_served(server: TLSSource, client: TLSSource) -> None:
    legacy = client.client_context(allow_ids([SERVER_ID]))
    legacy.maximum_version = ssl.TLSVersion.TLSv1_2
    assert Link(server.server_context(ALLOW_CLIENT), legacy).client.version() == "TLSv1.2"


def test_a_client_without_a_certificate_is_refused(server: TLSSource, ca: Authority) -> None:
    anonymous = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    anonymous.check_hostname = False
    anonymous.load_verify_locations(cadata=ca.pem.decode())
    with pytest.raises(ssl.SSLError):
        Link(server.server_context(ALLOW_CLIENT), anonymous)


def test_the_first_load_fails_loudly_without_material(tmp_path: Path, ca: Authority) -> None:
    (tmp_path / "trust.pem").write_bytes(ca.pem)
    with pytest.raises(SourceError) as missing:
        TLSSource(tmp_path / "credential.pem", tmp_path / "trust.pem")
    assert isinstance(missing.value.__cause__, FileNotFoundError)
    (tmp_path / "credential.pem").write_bytes(b"not a bundle")
    with pytest.raises(SourceError) as garbage:
        TLSSource(tmp_path / "credential.pem", tmp_path / "trust.pem")
    assert isinstance(garbage.value.__cause__, MalformedPemError)


# --- rotation ---------------------------------------------------------------------------------


def test_unchanged_files_change_nothing(server: TLSSource, server_volume: Volume) -> None:
    before = contexts(server)
    notified: list[Credential] = []
    server.subscribe(notified.append)
    server_volume.publish()  # same content, new directory: only the content counts
    assert server.refresh() is False
    assert contexts(server) == before
    assert notified == []


def test_a_rotated_leaf_is_picked_up_and_open_connections_survive(
    server: TLSSource, client: TLSSource, server_volume: Volume, ca: Authority
) -> None:
    notified: list[Credential] = []
    server.subscribe(notified.append)
    before = connect(server, client)
    renewed = ca.issue(SERVER_ID)
    server_volume.publish(**{"credential.pem": dump_credential(renewed)})

    assert server.refresh() is True
    assert notified == [renewed]
    assert server.credential == renewed
    assert connect(server, client).server_leaf() == der(renewed)
    before.roundtrip(b"still talking over the old context")


def test_a_mismatched_pair_mid_rotation_is_rejected_and_the_old_contexts_kept(
    server: TLSSource, client: TLSSource, client_volume: Volume, ca: Authority
) -> None:
    old = client.credential
    before = contexts(client)
    renewed = ca.issue(CLIENT_ID)
    # The new key is on disk, the chain is still the old one: a torn key/chain pair.
    client_volume.publish(**{"key.pem": pkcs8(renewed.key)})

    assert client.refresh() is False
    assert isinstance(client.last_error, KeyMismatchError)
    assert contexts(client) == before
    assert connect(server, client).client_leaf() == der(old)

    client_volume.publish(**{"chain.pem": dump_certificates(renewed.chain)})
    assert client.refresh() is True
    assert error_of(client) is None
    assert connect(server, client).client_leaf() == der(renewed)


def test_a_half_written_bundle_is_rejected_until_complete(
    tmp_path: Path, ca: Authority, clock: Clock
) -> None:
    # A writer that is not atomic: the file is read while it is being written.
    (tmp_path / "trust.pem").write_bytes(ca.pem)
    (tmp_path / "credential.pem").write_bytes(dump_credential(ca.issue(SERVER_ID)))
    source = TLSSource(tmp_path / "credential.pem", tmp_path / "trust.pem", clock=clock)
    context = source.server_context(ALLOW_CLIENT)
    renewed = dump_credential(ca.issue(SERVER_ID))

    (tmp_path / "credential.pem").write_bytes(renewed[: len(renewed) - 100])
    assert source.refresh() is False
    assert isinstance(source.last_error, MalformedPemError)
    assert source.server_context(ALLOW_CLIENT) is context

    (tmp_path / "credential.pem").write_bytes(renewed)
    assert source.refresh() is True
    assert source.server_context(ALLOW_CLIENT) is not context


def test_a_vanished_file_keeps_the_old_material(server: TLSSource, server_volume: Volume) -> None:
    context = server.server_context(ALLOW_CLIENT)
    (server_volume / "credential.pem").unlink()
    assert server.refresh() is False
    assert isinstance(server.last_error, FileNotFoundError)
    assert server.server_context(ALLOW_CLIENT) is context


def test_a_leaf_not_yet_valid_is_taken_once_the_clock_reaches_it(
    server: TLSSource, server_volume: Volume, ca: Authority, clock: Clock
) -> None:
    early = ca.issue(SERVER_ID, not_before=NOW + dt.timedelta(minutes=3))
    server_volume.publish(**{"credential.pem": dump_credential(early)})
    assert server.refresh() is False
    assert isinstance(server.last_error, ChainError)
    assert "not valid before" in str(server.last_error)

    clock.now = NOW + dt.timedelta(minutes=5)
    assert server.refresh() is True  # same bytes, judged again at the new now
    assert server.credential == early


def test_a_leaf_of_an_untrusted_ca_is_rejected(server: TLSSource, server_volume: Volume) -> None:
    stranger = Authority("stranger").issue(SERVER_ID)
    server_volume.publish(**{"credential.pem": dump_credential(stranger)})
    assert server.refresh() is False
    assert isinstance(server.last_error, ChainError)


def test_a_ca_rotation_reaches_the_trust_bundle_before_the_leaf(
    server: TLSSource,
    client: TLSSource,
    server_volume: Volume,
    client_volume: Volume,
    ca: Authority,
) -> None:
    new_ca = Authority("podcert root 2")
    new_leaf = dump_credential(new_ca.issue(SERVER_ID))
    stale_client = client.client_context(ALLOW_SERVER)

    # A leaf of the new CA before the trust bundle carries the CA: refused.
    server_volume.publish(**{"credential.pem": new_leaf})
    assert server.refresh() is False
    assert isinstance(server.last_error, ChainError)

    # The signer publishes old + new CA; both sides pick it up with no leaf change.
    both = ca.pem + new_ca.pem
    server_volume.publish(**{"trust.pem": both})
    client_volume.publish(**{"trust.pem": both})
    assert server.refresh() is True
    assert client.refresh() is True
    assert server.trust_bundle.roots == client.trust_bundle.roots == (ca.cert, new_ca.cert)
    assert connect(server, client).server_leaf() == der(server.credential)
    assert server.credential.leaf.issuer == new_ca.cert.subject

    # A context built before the CA change does not trust the new server leaf.
    with pytest.raises(ssl.SSLCertVerificationError):
        Link(server.server_context(ALLOW_CLIENT), stale_client)


def test_an_unexpected_failure_keeps_serving_and_is_recorded(
    server: TLSSource, server_volume: Volume, ca: Authority, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("bug in validation")

    monkeypatch.setattr(source_module, "check_usable", broken)
    context = server.server_context(ALLOW_CLIENT)
    server_volume.publish(**{"credential.pem": dump_credential(ca.issue(SERVER_ID))})
    assert server.refresh() is False
    assert isinstance(server.last_error, RuntimeError)
    assert server.server_context(ALLOW_CLIENT) is context


# --- subscribers ------------------------------------------------------------------------------


def test_a_failing_subscriber_does_not_stop_the_others(
    server: TLSSource, server_volume: Volume, ca: Authority, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(credential: Credential) -> None:
        raise RuntimeError("subscriber bug")

    notified: list[Credential] = []
    server.subscribe(broken)
    unsubscribe = server.subscribe(notified.append)
    server_volume.publish(**{"credential.pem": dump_credential(ca.issue(SERVER_ID))})
    with caplog.at_level(logging.ERROR, logger="bundles.source"):
        assert server.refresh() is True
    assert len(notified) == 1
    assert "subscriber" in caplog.text

    unsubscribe()
    unsubscribe()  # idempotent
    server_volume.publish(**{"credential.pem": dump_credential(ca.issue(SERVER_ID))})
    assert server.refresh() is True
    assert len(notified) == 1


# --- the transient key file -------------------------------------------------------------------


@contextlib.contextmanager
def spy_on_transient_files(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, object]]]:
    seen: list[dict[str, object]] = []
    real = handshake_module._transient_file

    @contextlib.contextmanager
    def spy(data: bytes) -> Iterator[str]:
        with real(data) as path:
            seen.append(
                {
                    "path": path,
                    "mode": stat.S_IMODE(Path(path).stat().st_mode),
                    "parent_mode": stat.S_IMODE(Path(path).parent.stat().st_mode),
                    "content": Path(path).read_bytes(),
                }
            )
            yield path

    monkeypatch.setattr(handshake_module, "_transient_file", spy)
    yield seen


@pytest.mark.skipif(not handshake_module._USE_MEMFD, reason="memfd is Linux-only")
def test_on_linux_the_key_file_is_an_anonymous_memfd(
    server_volume: Volume, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    with spy_on_transient_files(monkeypatch) as seen:
        TLSSource(server_volume / "credential.pem", server_volume / "trust.pem", clock=clock)
    assert len(seen) == 1
    assert str(seen[0]["path"]).startswith("/proc/self/fd/")


def test_without_memfd_the_key_goes_encrypted_into_a_private_directory_then_away(
    server_volume: Volume,
    client: TLSSource,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    clock: Clock,
) -> None:
    monkeypatch.setattr(handshake_module, "_USE_MEMFD", False)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    with spy_on_transient_files(monkeypatch) as seen:
        fallback = TLSSource(
            server_volume / "credential.pem", server_volume / "trust.pem", clock=clock
        )
    (written,) = seen
    assert written["mode"] == 0o600
    assert written["parent_mode"] == 0o700
    content = written["content"]
    assert isinstance(content, bytes)
    assert b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in content
    assert b"-----BEGIN PRIVATE KEY-----" not in content
    assert list(scratch.iterdir()) == []  # removed as soon as the contexts were loaded
    assert connect(fallback, client).server_leaf() == der(fallback.credential)


# --- watching ---------------------------------------------------------------------------------


async def wait_until(
    condition: Callable[[], bool],
    *,
    watcher: asyncio.Task[None] | None = None,
    then: Callable[[], object] | None = None,
) -> None:
    """Poll `condition` (calling `then` between polls) until it holds or the deadline passes.

    A watcher task that ended early fails the wait with its own exception.
    """
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if watcher is not None and watcher.done():
            watcher.result()
            pytest.fail("watch() returned before it was stopped")
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        if then is not None:
            then()
        await asyncio.sleep(0.05)


def count_reloads(source: TLSSource, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = source._reload

    def counting() -> object:
        calls[0] += 1
        return real()

    monkeypatch.setattr(source, "_reload", counting)
    return calls


async def watch_rotation(
    server: TLSSource,
    server_volume: Volume,
    ca: Authority,
    monkeypatch: pytest.MonkeyPatch,
    *,
    interval: float,
) -> None:
    """Start watch(), rotate until a subscriber hears of it, then stop and expect a prompt end."""
    reloads = count_reloads(server, monkeypatch)
    rotated = asyncio.Event()
    server.subscribe(lambda credential: rotated.set())
    stop = asyncio.Event()
    watcher = asyncio.create_task(server.watch(stop, interval=interval))
    await wait_until(lambda: reloads[0] >= 1, watcher=watcher)  # initial check, found nothing
    assert not rotated.is_set()

    def rotate() -> None:
        server_volume.publish(**{"credential.pem": dump_credential(ca.issue(SERVER_ID))})

    rotate()
    # Publishing again while waiting covers the moment before the inotify watch is in place.
    await wait_until(rotated.is_set, watcher=watcher, then=rotate)
    stop.set()
    await asyncio.wait_for(watcher, DEADLINE)


def run(coroutine: Awaitable[None]) -> None:
    async def main() -> None:
        await coroutine

    asyncio.run(main())


def test_watch_wakes_on_inotify_well_before_the_interval(
    server: TLSSource,
    server_volume: Volume,
    ca: Authority,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # With a 60 s interval, only an inotify wake-up can notice the rotation within the deadline.
    with caplog.at_level(logging.INFO, logger="bundles.source"):
        run(watch_rotation(server, server_volume, ca, monkeypatch, interval=60))
    assert "polling" not in caplog.text


def test_watch_polls_by_content_without_watchfiles(
    server: TLSSource, server_volume: Volume, ca: Authority, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "watchfiles", None)  # makes the import fail
    run(watch_rotation(server, server_volume, ca, monkeypatch, interval=0.05))


def test_watch_polls_when_inotify_fails(
    server: TLSSource, server_volume: Volume, ca: Authority, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_awatch(*paths: object, **options: object) -> object:
        raise OSError(28, "inotify watch limit reached")

    monkeypatch.setattr("watchfiles.awatch", broken_awatch)
    run(watch_rotation(server, server_volume, ca, monkeypatch, interval=0.05))


def test_cancelling_watch_leaves_the_callers_stop_event_alone(
    server: TLSSource, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        reloads = count_reloads(server, monkeypatch)
        stop = asyncio.Event()
        watcher = asyncio.create_task(server.watch(stop, interval=0.2))
        await wait_until(lambda: reloads[0] >= 1)
        watcher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(watcher, DEADLINE)
        assert not stop.is_set()

    run(scenario())


def test_watch_refuses_a_non_positive_interval(server: TLSSource) -> None:
    with pytest.raises(ValueError, match="positive"):
        run(server.watch(asyncio.Event(), interval=0))
