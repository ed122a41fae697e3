"""The library a consuming application uses: read its credential, trust its peers, follow rotation.

`formats` parses credential and trust bundles, `spiffe` reads SPIFFE IDs, `authz` decides which
peers may talk to us, `source` hands out current `ssl.SSLContext`s as files rotate, `refresher`
keeps a source current from a thread and waits for files not there yet, and `handshake` makes
those contexts refuse an unauthorized peer inside the TLS handshake. Nothing imported here needs
the signer, the node shim, `kubernetes` or any web library: the integrations with a stack
(`bundles.aiohttp`, ...) are submodules a workload imports explicitly, with its extra installed.
"""

from bundles.authz import (
    ANY_TRUST_DOMAIN,
    Authorizer,
    Verdict,
    allow_any_of,
    allow_ids,
    allow_trust_domain,
    allow_workloads,
)
from bundles.formats import (
    BundleError,
    Credential,
    PemMaterial,
    TrustBundle,
    dump_certificates,
    dump_private_key,
    dump_trust_bundle,
    load_credential,
    load_credential_files,
    load_trust_bundle,
)
from bundles.handshake import PeerRefusedError
from bundles.refresher import MissingFilesError, Refresher, wait
from bundles.source import SourceError, TLSSource
from bundles.spiffe import CertificateIdError, SpiffeId, SpiffeIdError, spiffe_id_of, workload_of

__all__ = [
    "ANY_TRUST_DOMAIN",
    "Authorizer",
    "BundleError",
    "CertificateIdError",
    "Credential",
    "MissingFilesError",
    "PeerRefusedError",
    "PemMaterial",
    "Refresher",
    "SourceError",
    "SpiffeId",
    "SpiffeIdError",
    "TLSSource",
    "TrustBundle",
    "Verdict",
    "allow_any_of",
    "allow_ids",
    "allow_trust_domain",
    "allow_workloads",
    "dump_certificates",
    "dump_private_key",
    "dump_trust_bundle",
    "load_credential",
    "load_credential_files",
    "load_trust_bundle",
    "spiffe_id_of",
    "wait",
    "workload_of",
]
