"""Federation with other SPIFFE trust domains: what the operator configures, what a polled
bundle endpoint's answer means, and when to poll again. Pure: no I/O, no clock reads.

The policy file's `federation:` section (read here, through the policy's reader, so a mistake
names the file, line and field like every other policy error)::

    federation:
      signerName: example.com/federated   # the ClusterTrustBundles' signer name; default:
                                          #   <the first served signer's domain>/federated
      trustDomains:
        - trustDomain: spire.test          # required; not one of our own trust domains
          bundleEndpointURL: https://spire.example:8443/   # required, https
          bundleEndpointProfile: https_spiffe              # or https_web; default https_spiffe
          endpointSPIFFEID: spiffe://spire.test/spire/server   # https_spiffe: required, an ID
                                          #   in that trust domain (the endpoint's X509-SVID)
          bootstrapBundle: /etc/podcert/spire.test.pem     # https_spiffe: required; the trust
                                          #   domain's roots (PEM, or its SPIFFE bundle JSON),
                                          #   handed over out of band to authenticate the first
                                          #   fetch; later fetches use the bundle fetched last
          webRoots: /etc/ssl/certs/ca.pem  # https_web: CA file for the endpoint's Web PKI
                                          #   certificate; default: the system's roots

Each federated trust domain's current roots are published in a ClusterTrustBundle of its own,
`<signerName with ':'>:<trust domain>`, labelled `podcert.dev/trust-domain: <trust domain>`,
`podcert.dev/federated: "true"` and the standard's labels (`signer.authority.canarying`; with
a preview twin, and twins for every other trust domain podcert serves: `desired`), for pods to
project (`clusterTrustBundle` with that signer name and label selector) and hand to `bundles`
as a federated trust bundle, which trusts those roots for that trust domain's IDs only.

A fetched bundle (`accept`) replaces the last one only when it is a well-formed SPIFFE bundle
(SPIFFE Trust Domain and Bundle, section 4) whose `x509-svid` keys each carry exactly one
certificate matching the key, with at least one root valid now, and whose `spiffe_sequence`
does not go back. Anything else is a `Rejected` naming the field: the last good bundle stays.

What is published for a domain are roots only, each owned by that one domain:

- a root is a self-signed CA certificate: basicConstraints CA:TRUE (and keyCertSign when it
  has a keyUsage), issuer equal to subject, its signature verifying with its own key
  (`root_problem`); an intermediate or a leaf in a bundle is refused (`not-a-ca`,
  `not-self-signed`), the bundle's other roots kept;
- `claim`: a root this signer holds itself (`local-root`), or one another federated domain
  holds now (its last accepted bundle, else its published ClusterTrustBundle, else its
  bootstrap bundle: `owned-by-another-domain`), is refused for the domain that lists it later.
  The first holder keeps it, whatever the names' order; a bundle left with no root is
  `Rejected`. Every refusal is a `RootRefused` naming the domain, the certificate and why.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import urlsplit

from cryptography import exceptions, x509
from cryptography.hazmat.primitives import hashes, serialization

from bundles.formats import dump_roots
from bundles.spiffe import SpiffeId, SpiffeIdError
from podcert.api.validation import signer_name_problem
from signer.authority import canarying, spiffebundle
from signer.policyfile import PolicyReader, trust_domain_problem

if TYPE_CHECKING:  # the policy's reader walks YAML nodes; only its type is needed here
    from yaml.nodes import Node


Profile = Literal["https_spiffe", "https_web"]
PROFILES: Final = ("https_spiffe", "https_web")
MAX_BODY_BYTES: Final = 1 << 20  # a bundle of a few roots is a few KiB; 1 MiB is generous
MAX_KEYS: Final = 256
JWT_SVID_USE: Final = "jwt-svid"
FEDERATED_LABEL: Final = "podcert.dev/federated"
# Polling: the endpoint's refresh hint, kept within these bounds; after a failure, back off
# from MIN_POLL doubling up to the hint (a broken endpoint is not hammered, a fixed one is
# seen again soon).
DEFAULT_POLL: Final = dt.timedelta(minutes=5)
MIN_POLL: Final = dt.timedelta(seconds=5)
MAX_POLL: Final = dt.timedelta(hours=1)


@dataclass(frozen=True)
class FederatedDomain:
    """One trust domain we federate with, and how its bundle endpoint is reached."""

    trust_domain: str
    url: str
    profile: Profile = "https_spiffe"
    endpoint_id: str = ""  # https_spiffe
    bootstrap_bundle: Path | None = None  # https_spiffe
    web_roots: Path | None = None  # https_web; None: the system's roots


@dataclass(frozen=True)
class Federation:
    signer_name: str
    domains: tuple[FederatedDomain, ...]


RootProblem = Literal["not-a-ca", "not-self-signed", "local-root", "owned-by-another-domain"]


@dataclass(frozen=True)
class RootRefused:
    """A certificate `trust_domain`'s bundle listed that is not trusted for that domain."""

    trust_domain: str
    certificate: str  # its subject and SHA-256 fingerprint (`describe`)
    problem: RootProblem
    detail: str

    def __str__(self) -> str:
        return (
            f"{self.trust_domain}: certificate {self.certificate} refused"
            f" ({self.problem}): {self.detail}"
        )


@dataclass(frozen=True)
class Bundle:
    """A federated trust domain's bundle as last accepted: the roots trusted for it, and the
    certificates it listed that were refused."""

    trust_domain: str
    roots: tuple[x509.Certificate, ...]
    sequence: int | None = None
    refresh_hint: dt.timedelta | None = None
    refused: tuple[RootRefused, ...] = ()

    def ders(self) -> frozenset[bytes]:
        return frozenset(r.public_bytes(serialization.Encoding.DER) for r in self.roots)


@dataclass(frozen=True)
class Rejected:
    """Why a fetched bundle was not taken; `field` names the part of the document at fault,
    `refused` the certificates refused on the way (when none was left to trust)."""

    field: str
    reason: str
    refused: tuple[RootRefused, ...] = ()

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


# --- the answer of a bundle endpoint ------------------------------------------------------------


def accept(
    body: bytes, trust_domain: str, previous: Bundle | None, now: dt.datetime
) -> Bundle | Rejected:
    """The bundle `body` holds for `trust_domain`, or why it must not replace `previous`."""
    parsed = parse_bundle(body, trust_domain, now)
    if isinstance(parsed, Rejected) or previous is None:
        return parsed
    if (
        previous.sequence is not None
        and parsed.sequence is not None
        and parsed.sequence < previous.sequence
    ):
        return Rejected(
            "spiffe_sequence", f"went back from {previous.sequence} to {parsed.sequence}"
        )
    return parsed


def parse_bundle(body: bytes, trust_domain: str, now: dt.datetime) -> Bundle | Rejected:
    """A SPIFFE bundle document (JWK Set) as a `Bundle` of the roots valid at `now`."""
    if len(body) > MAX_BODY_BYTES:
        return Rejected("body", f"over {MAX_BODY_BYTES} bytes")
    try:
        document = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        return Rejected("body", f"not JSON: {type(err).__name__}")
    if not isinstance(document, dict):
        return Rejected("body", "not a JSON object")
    sequence = _optional_uint(document, "spiffe_sequence")
    if isinstance(sequence, Rejected):
        return sequence
    hint = _optional_uint(document, "spiffe_refresh_hint")
    if isinstance(hint, Rejected):
        return hint
    keys = document.get("keys")
    if not isinstance(keys, list):
        return Rejected("keys", "missing, or not a list")
    if len(keys) > MAX_KEYS:
        return Rejected("keys", f"{len(keys)} keys; at most {MAX_KEYS}")
    roots: dict[bytes, x509.Certificate] = {}
    for index, key in enumerate(keys):
        root = _x509_authority(key, f"keys[{index}]")
        if isinstance(root, Rejected):
            return root
        if root is not None:
            roots.setdefault(root.public_bytes(serialization.Encoding.DER), root)
    if not roots:
        return Rejected("keys", "no x509-svid key: the bundle would trust nothing")
    valid = [r for r in roots.values() if r.not_valid_before_utc <= now <= r.not_valid_after_utc]
    if not valid:
        return Rejected("keys", f"none of the {len(roots)} x509-svid roots is valid now")
    kept: list[x509.Certificate] = []
    refused: list[RootRefused] = []
    for cert in valid:
        problem = root_problem(cert)
        if problem is None:
            kept.append(cert)
        else:
            refused.append(RootRefused(trust_domain, describe(cert), *problem))
    if not kept:
        return _nothing_left(refused)
    return Bundle(
        trust_domain=trust_domain,
        roots=tuple(kept),
        sequence=sequence,
        refresh_hint=dt.timedelta(seconds=hint) if hint else None,
        refused=tuple(refused),
    )


def _nothing_left(refused: Sequence[RootRefused]) -> Rejected:
    reasons = "; ".join(f"{r.certificate}: {r.problem}" for r in refused)
    return Rejected("keys", f"no root left to trust ({reasons})", tuple(refused))


# --- what may be published as a domain's root ---------------------------------------------------


def describe(cert: x509.Certificate) -> str:
    """A certificate as a log line names it: its subject and SHA-256 fingerprint."""
    subject = cert.subject.rfc4514_string() or "(empty subject)"
    return f"{subject!r} sha256:{cert.fingerprint(hashes.SHA256()).hex()}"


def root_problem(cert: x509.Certificate) -> tuple[RootProblem, str] | None:
    """Why `cert` is no root (None when it is one): a root is a CA certificate (basicConstraints
    CA:TRUE; keyCertSign when it has a keyUsage) that issued itself and whose signature
    verifies with its own key."""
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        usage = _optional_key_usage(cert)
    except x509.ExtensionNotFound:
        return "not-a-ca", "no basicConstraints extension"
    except ValueError as err:  # a malformed or duplicated extension
        return "not-a-ca", f"unreadable extensions: {err}"
    if not constraints.ca:
        return "not-a-ca", "basicConstraints CA:FALSE (a leaf)"
    if usage is not None and not usage.key_cert_sign:
        return "not-a-ca", "keyUsage without keyCertSign"
    if cert.issuer != cert.subject:
        return "not-self-signed", f"issued by {cert.issuer.rfc4514_string()!r} (an intermediate)"
    try:
        cert.verify_directly_issued_by(cert)
    except (ValueError, TypeError, exceptions.InvalidSignature):
        return "not-self-signed", "its signature does not verify with its own key"
    return None


def _optional_key_usage(cert: x509.Certificate) -> x509.KeyUsage | None:
    try:
        return cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return None


def claim(
    bundle: Bundle, others: Mapping[str, Collection[bytes]], local: Collection[bytes]
) -> Bundle | Rejected:
    """`bundle` without the roots it may not have: this signer's own (`local`, DER) and those
    other federated domains hold now (`others`: trust domain -> its roots, DER). The holder
    keeps a root; the domain listing it later is refused it."""
    kept: list[x509.Certificate] = []
    refused = list(bundle.refused)
    for root in bundle.roots:
        der = root.public_bytes(serialization.Encoding.DER)
        owners = sorted(
            td for td, ders in others.items() if td != bundle.trust_domain and der in ders
        )
        if der in local:
            refused.append(
                RootRefused(
                    bundle.trust_domain,
                    describe(root),
                    "local-root",
                    "one of this signer's own roots",
                )
            )
        elif owners:
            refused.append(
                RootRefused(
                    bundle.trust_domain,
                    describe(root),
                    "owned-by-another-domain",
                    f"a root of federated trust domain {', '.join(owners)}",
                )
            )
        else:
            kept.append(root)
    if not kept:
        return _nothing_left(refused)
    return replace(bundle, roots=tuple(kept), refused=tuple(refused))


def _optional_uint(document: Mapping[str, Any], name: str) -> int | Rejected | None:
    value = document.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
        return Rejected(name, "not an unsigned 64-bit integer")
    return value


def _x509_authority(key: object, where: str) -> x509.Certificate | Rejected | None:
    """The root an `x509-svid` key carries; None for keys of other uses (JWT authorities, and
    uses we do not know, are skipped as go-spiffe does)."""
    if not isinstance(key, dict):
        return Rejected(where, "not a JSON object")
    use = key.get("use")
    if not isinstance(use, str):
        return Rejected(f"{where}.use", "missing, or not a string")
    if use != spiffebundle.X509_SVID_USE:
        return None
    chain = key.get("x5c")
    if not isinstance(chain, list) or len(chain) != 1 or not isinstance(chain[0], str):
        return Rejected(f"{where}.x5c", "an x509-svid key holds exactly one certificate")
    try:
        der = base64.b64decode(chain[0], validate=True)
        root = x509.load_der_x509_certificate(der)
    except (binascii.Error, ValueError):
        return Rejected(f"{where}.x5c[0]", "not a base64 DER certificate")
    try:
        expected = spiffebundle.jwk(root)
    except ValueError as err:
        return Rejected(f"{where}.x5c[0]", str(err))
    for name in ("kty", "crv", "x", "y", "n", "e"):
        if key.get(name) != expected.get(name):
            return Rejected(f"{where}.{name}", "does not match the key of the certificate in x5c")
    return root


def bootstrap_roots(data: bytes, trust_domain: str, now: dt.datetime) -> Bundle | Rejected:
    """The out-of-band roots of a federated trust domain: PEM certificates, or its SPIFFE bundle
    document (what `spire-server bundle show -format spiffe` prints)."""
    if data.lstrip().startswith(b"{"):
        return parse_bundle(data, trust_domain, now)
    try:
        roots = x509.load_pem_x509_certificates(data)
    except ValueError:
        return Rejected("bootstrapBundle", "neither PEM certificates nor a SPIFFE bundle")
    return Bundle(trust_domain=trust_domain, roots=tuple(roots))


def next_poll(hint: dt.timedelta | None, failures: int) -> dt.timedelta:
    """When to poll an endpoint again: its refresh hint (bounded), or after `failures`
    failures in a row a back-off that doubles from MIN_POLL up to that."""
    regular = min(max(hint or DEFAULT_POLL, MIN_POLL), MAX_POLL)
    if failures <= 0:
        return regular
    backoff: dt.timedelta = MIN_POLL * int(2 ** min(failures - 1, 16))
    return min(regular, backoff)


# --- the ClusterTrustBundles --------------------------------------------------------------------


def bundle_name(signer_name: str, trust_domain: str) -> str:
    """`<signer name, '/' -> ':'>:<trust domain>`: linked to the signer name, one per domain."""
    return f"{signer_name.replace('/', ':')}:{trust_domain}"


def desired(
    signer_name: str, bundle: Bundle, managed_by: Mapping[str, str], workloads: Sequence[str]
) -> list[dict[str, Any]]:
    """The ClusterTrustBundles publishing a federated domain's roots (each once: the API server
    refuses a bundle that lists one twice): a live and a preview one for each trust domain we
    serve (`workloads`, the default first), with the standard's labels. The default's live one
    keeps `bundle_name` and the label `podcert.dev/trust-domain`, which older selectors use."""
    td, out = bundle.trust_domain, list[dict[str, Any]]()
    for index, workload in enumerate(workloads):
        for channel in canarying.CHANNELS:
            first_live = index == 0 and channel == canarying.LIVE
            labels = {**managed_by, FEDERATED_LABEL: "true"}
            labels |= {"podcert.dev/trust-domain": td} if first_live else {}
            labels |= canarying.labels(channel, workload, td)
            name = bundle_name(signer_name, td) + (f":{workload}" if index else "")
            name += "" if channel == canarying.LIVE else ":preview"
            spec = {"signerName": signer_name, "trustBundle": dump_roots(bundle.roots).decode()}
            out.append({"metadata": {"name": name, "labels": labels}, "spec": spec})
    return out


# --- the policy file's section ------------------------------------------------------------------


def default_signer_name(served: Sequence[str]) -> str:
    return f"{served[0].partition('/')[0]}/federated" if served else "podcert.dev/federated"


def read_section(
    reader: PolicyReader, node: Node, served: Sequence[str], own_trust_domains: set[str]
) -> Federation:
    """`federation:` of the policy file, validated; errors name the line and the field."""
    keys = reader.mapping(node, "federation", {"signerName", "trustDomains"})
    signer_name = default_signer_name(served)
    if "signerName" in keys:
        value = keys["signerName"][1]
        signer_name = reader.string(value, "federation.signerName")
        if problem := signer_name_problem(signer_name):
            raise reader.error(value, "federation.signerName", problem)
        if signer_name in served:
            raise reader.error(
                value, "federation.signerName", "must differ from the signer names served"
            )
    domains: list[FederatedDomain] = []
    if "trustDomains" in keys:
        items = reader.sequence(keys["trustDomains"][1], "federation.trustDomains")
        for index, item in enumerate(items):
            path = f"federation.trustDomains[{index}]"
            domain = _read_domain(reader, item, path)
            if domain.trust_domain in own_trust_domains:
                raise reader.error(item, f"{path}.trustDomain", "is one of our own trust domains")
            if any(d.trust_domain == domain.trust_domain for d in domains):
                raise reader.error(item, f"{path}.trustDomain", "is listed twice")
            domains.append(domain)
    return Federation(signer_name=signer_name, domains=tuple(domains))


def _read_domain(reader: PolicyReader, node: Node, path: str) -> FederatedDomain:
    keys = reader.mapping(
        node,
        path,
        {
            "trustDomain",
            "bundleEndpointURL",
            "bundleEndpointProfile",
            "endpointSPIFFEID",
            "bootstrapBundle",
            "webRoots",
        },
    )
    for required in ("trustDomain", "bundleEndpointURL"):
        if required not in keys:
            raise reader.error(node, f"{path}.{required}", "required")
    td_node = keys["trustDomain"][1]
    trust_domain = reader.string(td_node, f"{path}.trustDomain")
    if problem := trust_domain_problem(trust_domain):
        raise reader.error(td_node, f"{path}.trustDomain", problem)
    url_node = keys["bundleEndpointURL"][1]
    url = reader.string(url_node, f"{path}.bundleEndpointURL")
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname or parts.username or parts.fragment:
        raise reader.error(url_node, f"{path}.bundleEndpointURL", "must be an https:// URL")
    profile = "https_spiffe"
    if "bundleEndpointProfile" in keys:
        value = keys["bundleEndpointProfile"][1]
        profile = reader.string(value, f"{path}.bundleEndpointProfile")
        if profile not in PROFILES:
            raise reader.error(
                value, f"{path}.bundleEndpointProfile", f"must be one of {', '.join(PROFILES)}"
            )
    fields = {
        name: reader.string(keys[name][1], f"{path}.{name}")
        for name in ("endpointSPIFFEID", "bootstrapBundle", "webRoots")
        if name in keys
    }
    if profile == "https_spiffe":
        for required in ("endpointSPIFFEID", "bootstrapBundle"):
            if required not in fields:
                raise reader.error(node, f"{path}.{required}", "required with https_spiffe")
        if "webRoots" in fields:
            raise reader.error(node, f"{path}.webRoots", "only with https_web")
        id_node = keys["endpointSPIFFEID"][1]
        try:
            endpoint = SpiffeId.parse(fields["endpointSPIFFEID"])
        except SpiffeIdError as err:
            raise reader.error(id_node, f"{path}.endpointSPIFFEID", str(err)) from None
        if endpoint.trust_domain != trust_domain or not endpoint.path:
            raise reader.error(
                id_node,
                f"{path}.endpointSPIFFEID",
                f"must be a workload ID in trust domain {trust_domain}",
            )
    else:
        for extra in ("endpointSPIFFEID", "bootstrapBundle"):
            if extra in fields:
                raise reader.error(node, f"{path}.{extra}", "only with https_spiffe")
    return FederatedDomain(
        trust_domain=trust_domain,
        url=url,
        profile="https_web" if profile == "https_web" else "https_spiffe",
        endpoint_id=fields.get("endpointSPIFFEID", ""),
        bootstrap_bundle=Path(fields["bootstrapBundle"]) if "bootstrapBundle" in fields else None,
        web_roots=Path(fields["webRoots"]) if "webRoots" in fields else None,
    )
