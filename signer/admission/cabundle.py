"""The caBundle the signer's own ValidatingWebhookConfiguration must carry, decided from the CA set.

The webhook's serving certificate is issued by the active CA and re-issued by each replica as
soon as it sees another CA become active, so the API server must already trust the next root
before it signs: the bundle holds every root the CA set trusts (`rotation.trusted_roots`):

- prepared: published for `--ca-overlap-seconds` before it signs, so the API server has it
  before any replica serves a certificate from it;
- active: what signs the serving certificates now;
- retired: a replica that has not yet seen the activation still serves a certificate from it,
  and a retired root stays until its last leaf has expired anyway.

With `kubectl apply` owning everything else of the object (the manifest sets no caBundle), the
signer writes only this field, as cert-manager's cainjector does. Pure: the caller reads the
configuration and writes what `updated` returns.
"""

from __future__ import annotations

import base64
import binascii
import copy
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bundles.formats import dump_roots


def _certificates(field: object) -> frozenset[bytes] | None:
    """The DER of each certificate in a caBundle field (base64 of PEM); None when it is absent
    or unreadable, which no wanted bundle equals."""
    if not isinstance(field, str) or not field:
        return None
    try:
        pem = base64.b64decode(field, validate=True)
        return frozenset(
            c.public_bytes(serialization.Encoding.DER) for c in x509.load_pem_x509_certificates(pem)
        )
    except (ValueError, binascii.Error):
        return None


def updated(config: Mapping[str, Any], roots: Sequence[x509.Certificate]) -> dict[str, Any] | None:
    """`config` with every webhook's `clientConfig.caBundle` holding exactly `roots`, or None
    when each already does (in any order: nothing to write). Everything else is kept as read,
    metadata.resourceVersion included, so the write is refused if the object changed meanwhile.
    No roots (no CA loaded) is no decision."""
    if not roots:
        return None
    wanted = dump_roots(roots)
    want = _certificates(base64.b64encode(wanted).decode())
    webhooks = config.get("webhooks")
    if not isinstance(webhooks, list) or not webhooks:
        return None
    stale = [i for i, hook in enumerate(webhooks) if _holds(hook) not in (want, _MALFORMED)]
    if not stale:
        return None
    out = copy.deepcopy(dict(config))
    encoded = base64.b64encode(wanted).decode()
    for i in stale:
        out["webhooks"][i].setdefault("clientConfig", {})["caBundle"] = encoded
    return out


_MALFORMED: frozenset[bytes] = frozenset({b"malformed"})


def _holds(hook: object) -> frozenset[bytes] | None:
    """The roots a webhook's caBundle holds; _MALFORMED for a webhook that is no object or
    whose clientConfig is none (the API server stores no such thing; left alone)."""
    if not isinstance(hook, Mapping):
        return _MALFORMED
    client = hook.get("clientConfig", {})
    if not isinstance(client, Mapping):
        return _MALFORMED
    return _certificates(client.get("caBundle"))
