"""A `TLSSource` over a SPIFFE credential folder (the Filesystem Delivery layout, `bundles.folder`).

`FolderSource()` finds the folder as the standard says (`SPIFFE_CREDENTIAL_FOLDER`, else the
default folders), and on every load lists it again: `credential-bundle.pem` is the credential,
the `<trust-domain>.trust-bundle.pem` of the leaf's own trust domain is its trust bundle, and
every other `<trust-domain>.trust-bundle.pem` is a federated trust domain's.

What it guarantees beyond `TLSSource`:

- A peer is judged only by its own trust domain's bundle: every root vouches for the IDs of the
  trust domain whose file holds it (our own roots for our own trust domain's IDs too), so a peer
  whose trust domain has no bundle in the folder is refused inside the handshake. A root two
  federated files list vouches for neither; a root our own file lists stays ours.
- A trust domain whose file is removed, or empty (the kubelet writes an `optional`
  clusterTrustBundle source that selects nothing as an empty file), is dropped at the next load;
  new handshakes refuse its peers from then on (open connections keep the context they were made
  with). `watch()` loads at least every `interval` seconds (at most five minutes, the standard's
  bound) and as soon as inotify reports a change; `refresh_if_stale()` lets a program without
  an event loop keep the same bound.
- A federated trust domain's unreadable file drops that domain (fail closed, named in
  `problems`) rather than stopping the whole source: a partner's bad bundle never holds back our
  own credential's rotation. Our own trust domain's bundle missing or unreadable, or a
  credential bundle that breaks the layout (key block first, nothing between blocks), keeps the
  previous material, as any bad read does.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bundles import folder
from bundles.formats import BundleError, TrustBundle, load_credential, load_trust_bundle
from bundles.handshake import check_usable, load_contexts
from bundles.source import Clock, SourceError, StrPath, TLSSource, _Material, _read_capped

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger(__name__)

__all__ = ["FolderSource", "LayoutError"]


class LayoutError(BundleError):
    """A file of the credential folder breaks the Filesystem Delivery layout."""


class FolderSource(TLSSource):
    """Server and client SSL contexts from a SPIFFE credential folder, following its changes.

    `folder` names it outright; without it the folder is located (`bundles.folder.locate`:
    `SPIFFE_CREDENTIAL_FOLDER`, else the first of `defaults` that holds a credential bundle).
    The first load happens here and raises `SourceError` when there is no folder or nothing
    usable in it.
    """

    def __init__(
        self,
        folder_path: StrPath | None = None,
        *,
        defaults: Sequence[Path] = folder.DEFAULT_FOLDERS,
        clock: Clock | None = None,
    ) -> None:
        found = Path(folder_path) if folder_path is not None else folder.locate_here(defaults)
        if found is None:
            looked = ", ".join(str(d) for d in defaults)
            raise SourceError(
                f"no SPIFFE credential folder: {folder.ENV_VAR} is not set and no "
                f"{folder.CREDENTIAL_BUNDLE} is in {looked or 'any default folder'}"
            )
        self.folder = found
        self._checked_at: dt.datetime | None = None
        self._domains: tuple[str, ...] = ()
        self._problems: tuple[str, ...] = ()
        bundle = found / folder.CREDENTIAL_BUNDLE
        # The base class watches the parents of these paths: the folder itself.
        super().__init__(bundle, bundle, clock=clock)

    # --- what consumers use -------------------------------------------------------------------

    @property
    def trust_domains(self) -> tuple[str, ...]:
        """The trust domains whose peers may be verified now: our own first, then the others."""
        return self._domains

    @property
    def problems(self) -> tuple[str, ...]:
        """Why a federated trust domain's file was not taken at the last load (each dropped)."""
        return self._problems

    @property
    def checked_at(self) -> dt.datetime | None:
        """When (by the source's clock) the folder was last read, changed or not."""
        return self._checked_at

    def refresh_if_stale(self, interval: dt.timedelta = folder.MAX_RELOAD_INTERVAL) -> bool:
        """`refresh()` when the last read is `interval` old or more (never more than five
        minutes): cheap enough to call per request in a program with no watcher. True when new
        material was swapped in."""
        if not folder.stale(self._checked_at, self._clock(), interval):
            return False
        return self.refresh()

    async def watch(self, stop_event: asyncio.Event, *, interval: float = 2.0) -> None:
        """`TLSSource.watch`, with `interval` held to the standard's five minutes."""
        await super().watch(stop_event, interval=folder.check_interval(interval))

    # --- loading --------------------------------------------------------------------------------

    def _read(self) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
        """The folder's listing of trust bundles (as the first "content", so that a removed
        file changes the digests), the credential bundle, then each trust bundle."""
        self._checked_at = self._clock()
        names: list[str] = []
        bundles: list[bytes] = []
        with os.scandir(self.folder) as entries:
            listed = sorted(
                e.name for e in entries if folder.trust_domain_of(e.name) and _is_file(e)
            )
        credential = _read_capped(self.folder / folder.CREDENTIAL_BUNDLE)
        for name in listed:
            try:
                bundles.append(_read_capped(self.folder / name))
            except FileNotFoundError:  # removed since the listing: absent, as it now is
                continue
            names.append(name)
        contents = ("\n".join(names).encode(), credential, *bundles)
        return contents, tuple(hashlib.sha256(content).digest() for content in contents)

    def _build(self, contents: tuple[bytes, ...], digests: tuple[bytes, ...]) -> _Material:
        listing, credential_data, *bundle_data = contents
        files = dict(zip(listing.decode().split("\n") if listing else [], bundle_data, strict=True))
        if problem := folder.credential_bundle_problem(credential_data):
            raise LayoutError(problem)
        credential = load_credential(credential_data)
        own = credential.spiffe_id.trust_domain  # CertificateIdError: no usable SPIFFE ID
        own_name = folder.trust_bundle_name(own)
        if not files.get(own_name, b"").strip():
            raise LayoutError(
                f"{self.folder} holds no {own_name}: the bundle of our own trust domain {own}"
            )
        if problem := folder.trust_bundle_problem(files[own_name], own_name):
            raise LayoutError(problem)
        own_bundle = load_trust_bundle(files[own_name])
        check_usable(credential, own_bundle, self._clock())
        trusted: dict[bytes, str | None] = {_der(r): own for r in own_bundle.roots}
        listed: dict[bytes, tuple[x509.Certificate, list[str]]] = {}
        problems: list[str] = []
        for name, data in files.items():
            domain = folder.trust_domain_of(name)
            if domain is None or domain == own or not data.strip():
                continue  # an empty file: the domain is not (or no longer) federated
            try:
                if problem := folder.trust_bundle_problem(data, name):
                    raise LayoutError(problem)
                roots = load_trust_bundle(data).roots
            except BundleError as exc:
                problems.append(f"{name}: {exc}")
                continue
            for root in roots:
                if _der(root) not in trusted:  # our own roots stay ours
                    listed.setdefault(_der(root), (root, []))[1].append(domain)
        everything = list(own_bundle.roots)
        for der, (root, holders) in listed.items():
            if len(holders) == 1:
                trusted[der] = holders[0]
                everything.append(root)
            else:
                problems.append(
                    f"root {root.subject.rfc4514_string()!r} is listed by "
                    f"{' and '.join(holders)}: trusted for none of them"
                )
        material = _Material(
            digests, credential, own_bundle, TrustBundle(tuple(everything)), trusted
        )
        with self._contexts_lock:
            kinds = list(self._wanted)
            if kinds:
                material.contexts.update(zip(kinds, self._load(material, kinds), strict=True))
            else:
                load_contexts(credential, material.everything, [("server", None)])
        federated = sorted({d for d in trusted.values() if d is not None and d != own})
        self._note((own, *federated), tuple(problems))
        return material

    def _note(self, domains: tuple[str, ...], problems: tuple[str, ...]) -> None:
        for gone in sorted(set(self._domains) - set(domains)):
            log.warning(
                "trust domain %s left %s: its peers are refused from now on", gone, self.folder
            )
        for problem in sorted(set(problems) - set(self._problems)):
            log.warning("%s: %s", self.folder, problem)
        self._domains, self._problems = domains, problems


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()  # follows the atomic writer's symlinks
    except OSError:
        return False
