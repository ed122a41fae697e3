"""bundles.foldersource: a TLSSource over a SPIFFE credential folder.

Folders are published as the kubelet's atomic writer does (`Volume`), and handshakes run for real
over memory BIOs (`Link`): a peer is verified against its own trust domain's bundle only, and a
trust domain whose file goes away (or goes empty) is refused from the next load on.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from pathlib import Path

import pytest

from bundles import folder
from bundles.authz import ANY_TRUST_DOMAIN, Verdict, allow_ids, allow_workloads
from bundles.foldersource import FolderSource
from bundles.formats import Credential, dump_certificates, dump_credential
from bundles.source import SourceError, TLSSource
from tests.unit.test_bundles_formats import NOW, Authority, pkcs8
from tests.unit.test_bundles_source import Clock, Link, Volume

OWN, PARTNER, OTHER = "cluster.local", "partner.test", "other.test"
SERVER_ID = f"spiffe://{OWN}/ns/shop/sa/api"
ANY_WEB = allow_workloads("shop", "web", trust_domain=ANY_TRUST_DOMAIN)  # path only: td by roots
ALLOW_SERVER = allow_ids([SERVER_ID])
DEADLINE = 10.0  # seconds; reached only when something is broken


@pytest.fixture(scope="module")
def own() -> Authority:
    return Authority("own root")


@pytest.fixture(scope="module")
def partner() -> Authority:
    return Authority("partner root")


@pytest.fixture
def clock() -> Clock:
    return Clock(NOW)


def publish(volume: Volume, credential: Credential | bytes, **bundles: Authority) -> Volume:
    data = credential if isinstance(credential, bytes) else dump_credential(credential)
    volume.publish(
        **{folder.CREDENTIAL_BUNDLE: data},
        **{folder.trust_bundle_name(td.replace("_", ".")): ca.pem for td, ca in bundles.items()},
    )
    return volume


@pytest.fixture
def server_volume(tmp_path: Path, own: Authority, partner: Authority) -> Volume:
    volume = Volume(tmp_path / "server")
    return publish(volume, own.issue(SERVER_ID), cluster_local=own, partner_test=partner)


@pytest.fixture
def server(server_volume: Volume, clock: Clock) -> FolderSource:
    return FolderSource(server_volume.root, clock=clock)


def peer(
    tmp_path: Path, name: str, issuer: Authority, spiffe_id: str, *, own: Authority
) -> TLSSource:
    """A client holding `issuer`'s credential for `spiffe_id` that trusts its issuer and our
    root for any ID (a plain TLSSource): whatever is refused, the server refused it."""
    volume = Volume(tmp_path / name)
    roots = own.pem if issuer is own else own.pem + issuer.pem
    volume.publish(
        **{"credential.pem": dump_credential(issuer.issue(spiffe_id)), "trust.pem": roots}
    )
    return TLSSource(volume / "credential.pem", volume / "trust.pem", clock=Clock(NOW))


def connect(server: FolderSource, client: TLSSource) -> Link:
    return Link(server.server_context(ANY_WEB), client.client_context(ALLOW_SERVER))


def refused(server: FolderSource, client: TLSSource) -> Verdict:
    """The server's refusal of `client`, inside the handshake."""
    heard: list[Verdict] = []
    with pytest.raises(ssl.SSLError):
        Link(
            server.server_context(ANY_WEB, on_refusal=heard.append),
            client.client_context(ALLOW_SERVER),
        )
    (verdict,) = heard
    return verdict


# --- loading --------------------------------------------------------------------------------------


def test_the_folder_gives_our_own_and_each_federated_trust_domain(
    server: FolderSource, own: Authority
) -> None:
    assert server.trust_domains == (OWN, PARTNER)
    assert server.trust_domain == OWN
    assert server.trust_bundle.roots == (own.cert,)
    assert server.problems == ()


def test_the_folder_is_found_through_the_variable_and_the_defaults(
    server_volume: Volume, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(folder.ENV_VAR, str(server_volume.root))
    assert FolderSource(defaults=[]).folder == server_volume.root
    monkeypatch.delenv(folder.ENV_VAR)
    assert FolderSource(defaults=[tmp_path / "none", server_volume.root]).folder == (
        server_volume.root
    )
    with pytest.raises(SourceError, match=folder.ENV_VAR):
        FolderSource(defaults=[tmp_path / "none"])


def test_without_our_own_trust_domains_bundle_there_is_nothing_to_serve(
    tmp_path: Path, own: Authority, partner: Authority
) -> None:
    volume = publish(Volume(tmp_path / "f"), own.issue(SERVER_ID), partner_test=partner)
    with pytest.raises(SourceError, match=f"no {OWN}.trust-bundle.pem"):
        FolderSource(volume.root)


def test_a_credential_bundle_with_the_key_last_is_refused(tmp_path: Path, own: Authority) -> None:
    issued = own.issue(SERVER_ID)
    swapped = dump_certificates(issued.chain) + pkcs8(issued.key)
    volume = publish(Volume(tmp_path / "f"), swapped, cluster_local=own)
    with pytest.raises(SourceError, match="PRIVATE KEY block first") as caught:
        FolderSource(volume.root)
    assert "BEGIN PRIVATE KEY" not in str(caught.value)


# --- peers, each by its own trust domain's bundle -------------------------------------------


def test_a_peer_of_our_trust_domain_and_one_of_a_federated_domain_are_served(
    server: FolderSource, own: Authority, partner: Authority, tmp_path: Path
) -> None:
    connect(server, peer(tmp_path, "web", own, f"spiffe://{OWN}/ns/shop/sa/web", own=own))
    connect(server, peer(tmp_path, "pweb", partner, f"spiffe://{PARTNER}/ns/shop/sa/web", own=own))


@pytest.mark.parametrize(
    ("issuer", "spiffe_id"),
    [
        pytest.param("partner", f"spiffe://{OTHER}/ns/shop/sa/web", id="a domain with no bundle"),
        pytest.param("own", f"spiffe://{PARTNER}/ns/shop/sa/web", id="our root, a partner's ID"),
        pytest.param("partner", f"spiffe://{OWN}/ns/shop/sa/web", id="a partner's root, our ID"),
    ],
)
def test_a_peer_is_verified_only_against_its_own_trust_domains_bundle(
    server: FolderSource,
    own: Authority,
    partner: Authority,
    tmp_path: Path,
    issuer: str,
    spiffe_id: str,
) -> None:
    authority = own if issuer == "own" else partner
    verdict = refused(server, peer(tmp_path, "impostor", authority, spiffe_id, own=own))
    assert "vouches for its own IDs only" in verdict.reason


# --- de-federation --------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["removed", "emptied"])
def test_a_trust_domain_whose_file_goes_is_refused_from_the_next_load(
    server: FolderSource,
    server_volume: Volume,
    own: Authority,
    partner: Authority,
    tmp_path: Path,
    how: str,
) -> None:
    client = peer(tmp_path, "pweb", partner, f"spiffe://{PARTNER}/ns/shop/sa/web", own=own)
    connect(server, client)
    name = folder.trust_bundle_name(PARTNER)
    if how == "removed":
        del server_volume.payload[name]
        server_volume.publish()
    else:
        server_volume.publish(**{name: b""})  # an optional source that selects nothing

    assert server.refresh()
    assert server.trust_domains == (OWN,)
    with pytest.raises(ssl.SSLCertVerificationError):  # the server no longer holds its root
        connect(server, client)


def test_refresh_if_stale_rereads_within_five_minutes_and_not_before_it_is_due(
    server: FolderSource, server_volume: Volume, clock: Clock
) -> None:
    assert server.checked_at == NOW
    del server_volume.payload[folder.trust_bundle_name(PARTNER)]
    server_volume.publish()

    clock.now = NOW + dt.timedelta(minutes=4, seconds=59)
    assert not server.refresh_if_stale(dt.timedelta(hours=1))  # asked for an hour: capped at 5 min
    assert PARTNER in server.trust_domains
    clock.now = NOW + dt.timedelta(minutes=5)
    assert server.refresh_if_stale(dt.timedelta(hours=1))
    assert server.trust_domains == (OWN,)
    assert server.checked_at == clock.now


def test_a_partners_unreadable_bundle_drops_that_domain_and_our_rotation_goes_on(
    server: FolderSource, server_volume: Volume, own: Authority, caplog: pytest.LogCaptureFixture
) -> None:
    server_volume.publish(**{folder.trust_bundle_name(PARTNER): b"not a bundle\n"})
    assert server.refresh()
    assert server.trust_domains == (OWN,)
    (problem,) = server.problems
    assert problem.startswith(folder.trust_bundle_name(PARTNER))

    rotated = own.issue(SERVER_ID)
    publish(server_volume, rotated)
    assert server.refresh()
    assert server.credential.leaf == rotated.leaf


def test_a_root_two_partners_list_vouches_for_neither(
    server_volume: Volume, partner: Authority, own: Authority, tmp_path: Path
) -> None:
    server_volume.publish(**{folder.trust_bundle_name(OTHER): partner.pem})
    server = FolderSource(server_volume.root)
    assert any("trusted for none" in p for p in server.problems)
    client = peer(tmp_path, "p", partner, f"spiffe://{PARTNER}/ns/shop/sa/web", own=own)
    with pytest.raises(ssl.SSLCertVerificationError):  # the server does not load that root
        connect(server, client)


def test_files_of_other_names_are_ignored(server_volume: Volume) -> None:
    server_volume.publish(**{"trust-bundle.pem": b"junk", "Bad.Name.trust-bundle.pem": b"junk"})
    assert FolderSource(server_volume.root).trust_domains == (OWN, PARTNER)


# --- watching -----------------------------------------------------------------------------------


def test_watch_refuses_an_interval_beyond_the_standards_five_minutes(server: FolderSource) -> None:
    with pytest.raises(ValueError, match="interval"):
        asyncio.run(server.watch(asyncio.Event(), interval=301))


def test_watch_drops_a_removed_trust_domain_on_its_own(
    server: FolderSource, server_volume: Volume
) -> None:
    async def scenario() -> None:
        stop, dropped = asyncio.Event(), asyncio.Event()
        server.subscribe(lambda _: dropped.set() if PARTNER not in server.trust_domains else None)
        task = asyncio.create_task(server.watch(stop, interval=0.2))
        del server_volume.payload[folder.trust_bundle_name(PARTNER)]
        server_volume.publish()
        try:
            await asyncio.wait_for(dropped.wait(), DEADLINE)
        finally:
            stop.set()
            await task

    asyncio.run(scenario())
    assert server.trust_domains == (OWN,)
