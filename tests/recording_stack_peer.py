"""What the stack integrations' suites (`test_bundles_httpx`, `_requests`, `_grpc`) share: two
workloads whose files rotate the way the kubelet's atomic writer rotates them, and a loopback
TLS server (`tests.recording_peer.RecordingServer`) that records every application byte it
reads, per connection.

`Workloads` holds a client and a server workload, each a projected volume (`Volume`) and a
`TLSSource` over it, issued by one test CA; its steps are the rotations the suites go through:
a leaf rotation, then a CA rotation (the new root added to both trust bundles, new leaves from
the new CA, the old root removed). Each step refreshes both sources, as `watch()` would.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from bundles.authz import Authorizer, allow_ids
from bundles.formats import dump_credential
from bundles.source import TLSSource
from tests.recording_peer import DEADLINE, TOKEN, RecordingServer, der
from tests.unit.test_bundles_formats import Authority
from tests.unit.test_bundles_source import Volume

__all__ = ["DEADLINE", "TOKEN", "RecordingServer", "der"]  # the suites import them from here too

LOCAL = "cluster.local"
SERVER_ID = f"spiffe://{LOCAL}/ns/shop/sa/api"
CLIENT_ID = f"spiffe://{LOCAL}/ns/shop/sa/web"
OTHER_ID = f"spiffe://{LOCAL}/ns/shop/sa/other"


class Workload:
    """One pod's projected volume and the TLSSource over it."""

    def __init__(self, folder: Path, ca: Authority, spiffe_id: str) -> None:
        self.spiffe_id = spiffe_id
        self.volume = Volume(folder)
        self.volume.publish(
            **{"credential.pem": dump_credential(ca.issue(spiffe_id)), "trust.pem": ca.pem}
        )
        self.source = TLSSource(self.volume / "credential.pem", self.volume / "trust.pem")

    def publish(self, **files: bytes) -> None:
        self.volume.publish(**files)
        assert self.source.refresh(), self.source.last_error


class Workloads:
    """A client and a server workload of one CA, and the rotations they go through."""

    def __init__(self, folder: Path, *, server_id: str = SERVER_ID) -> None:
        self.ca = Authority("podcert root 1")
        self.client = Workload(folder / "client", self.ca, CLIENT_ID)
        self.server = Workload(folder / "server", self.ca, server_id)

    @property
    def both(self) -> tuple[Workload, Workload]:
        return self.client, self.server

    def rotate_leaves(self) -> None:
        """Both get a new leaf from the current CA."""
        for workload in self.both:
            workload.publish(
                **{"credential.pem": dump_credential(self.ca.issue(workload.spiffe_id))}
            )

    def rotate_ca(self) -> Iterator[str]:
        """The CA rotation, one step per iteration (the step's name is yielded after it)."""
        new = Authority("podcert root 2")
        for workload in self.both:
            workload.publish(**{"trust.pem": self.ca.pem + new.pem})
        yield "new root added to both trust bundles"
        old, self.ca = self.ca, new
        self.rotate_leaves()
        yield "new leaves from the new CA"
        for workload in self.both:
            workload.publish(**{"trust.pem": new.pem})
        assert old.cert not in self.client.source.trust_bundle.roots
        yield "old root removed"


def serving(workload: Workload, allow_clients: Authorizer | None = None) -> RecordingServer:
    """A recording server presenting `workload`'s current material, authorizing its clients
    with `allow_clients` (default: the client workload) inside the handshake."""
    rule = allow_clients or allow_ids([CLIENT_ID])
    return RecordingServer(context=lambda: workload.source.server_context(rule), keep_alive=True)
