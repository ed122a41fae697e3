"""ClusterTrustBundles as the shim sees them, and the trust file of each clusterTrustBundle source.

The kubelet re-reads bundles every five minutes, so a CA rotation takes that long to reach pods.
The shim keeps this index current from a watch instead and recomputes a pod's trust files on
every change, so a new root is on disk within moments. Each bundle is parsed once, when it
arrives; selecting and concatenating is then pure work over the index.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import serialization

from bundles import formats
from podcert.api.pods import TrustBundleSource
from podcert.api.selectors import matches_selector

log = logging.getLogger("podcert.shim")


@dataclass(frozen=True)
class Bundle:
    """One ClusterTrustBundle, parsed: its roots as PEM blocks in the order it lists them."""

    name: str
    signer_name: str | None
    labels: Mapping[str, str]
    roots: tuple[bytes, ...]


@dataclass(frozen=True)
class Resolved:
    """What a trust source's file should hold. `content` None means "nothing to write": a
    required bundle is missing (the kubelet would not start the pod), and `problem` says why."""

    content: bytes | None
    problem: str | None = None


def parse_bundle(obj: Mapping[str, Any]) -> Bundle | None:
    """The bundle in a ClusterTrustBundle object, or None when it is unusable (logged).

    The API server already checks that trustBundle holds only CA certificates; a bundle that
    still does not parse is skipped rather than breaking every pod that selects it.
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    signer_name = spec.get("signerName")
    labels = meta.get("labels") or {}
    try:
        parsed = formats.load_trust_bundle(str(spec.get("trustBundle") or "").encode())
    except formats.BundleError as err:
        log.warning("ClusterTrustBundle %s is unusable: %s", name, err, extra={"bundle": name})
        return None
    roots = tuple(cert.public_bytes(serialization.Encoding.PEM) for cert in parsed.roots)
    return Bundle(
        name=name,
        signer_name=signer_name if isinstance(signer_name, str) and signer_name else None,
        labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
        roots=roots,
    )


def selects(source: TrustBundleSource, bundle: Bundle) -> bool:
    if source.name is not None:
        return bundle.name == source.name
    return bundle.signer_name == source.signer_name and matches_selector(
        bundle.labels, source.label_selector
    )


def resolve(source: TrustBundleSource, bundles: Mapping[str, Bundle]) -> Resolved:
    """The trust file for `source`: the distinct roots of every selected bundle.

    Ordered by bundle name, then as each bundle lists them, so the same set of bundles always
    gives the same bytes and an unrelated change never rewrites the file. `optional` sources
    with nothing selected get an empty file, as the kubelet writes.
    """
    chosen = sorted((b for b in bundles.values() if selects(source, b)), key=lambda b: b.name)
    roots = dict.fromkeys(root for bundle in chosen for root in bundle.roots)
    if roots:
        return Resolved(b"".join(roots))
    if source.optional:
        return Resolved(b"")
    if source.name is not None:
        return Resolved(None, f"ClusterTrustBundle {source.name!r} not found")
    return Resolved(
        None, f"no ClusterTrustBundle for signer {source.signer_name!r} matches the selector"
    )
