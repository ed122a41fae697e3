"""The mTLS example pair: an aiohttp server and client that talk with pod certificates.

Why it exists: it is the proof that a workload can live on what the kubelet (or our shim) projects
into its pod — a credential bundle (or key + chain files) and a trust bundle — through leaf and CA
rotations, without a restart and without a failed request. Both sides hold a
`bundles.source.TLSSource`, so every new handshake uses the newest material, and both decide who
the peer is by SPIFFE ID with `bundles.authz`, never by hostname.

This module holds what the two share: the command-line options for the projected files and the
peer rules, and the serial of a certificate as the audit log writes it.

A workload rule names a trust domain or means our own: `--allow-workload shop/web` admits
`spiffe://<our trust domain>/ns/shop/sa/web` only (our trust domain is that of our own
certificate's SPIFFE ID), never a federated partner's `/ns/shop/sa/web`;
`--allow-workload spire.test/shop/web` names the partner's, and `'*/shop/web'` says "any trust
domain" out loud.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

from cryptography import x509

from bundles.authz import (
    ANY_TRUST_DOMAIN,
    Authorizer,
    allow_any_of,
    allow_ids,
    allow_trust_domain,
    allow_workloads,
)
from bundles.source import StrPath
from bundles.spiffe import parse_trust_domain


def add_credential_arguments(parser: argparse.ArgumentParser) -> None:
    files = parser.add_argument_group("projected files (as the pod sees them)")
    files.add_argument(
        "--credential-bundle", type=Path, help="key and chain in one file (one atomic read)"
    )
    files.add_argument("--key", type=Path, help="key file (with --certificate-chain)")
    files.add_argument("--certificate-chain", type=Path, help="chain file (with --key)")
    files.add_argument("--trust-bundle", type=Path, required=True, help="trust anchors (PEM)")
    files.add_argument(
        "--federated-trust-bundle",
        dest="federated",
        action="append",
        default=[],
        metavar="TRUST_DOMAIN=PATH",
        help="a federated trust domain's roots (PEM, e.g. its projected ClusterTrustBundle), "
        "trusted for that trust domain's IDs only (repeatable)",
    )
    files.add_argument(
        "--reload-interval",
        type=float,
        default=2.0,
        help="seconds between content checks of the files (inotify wakes it up earlier)",
    )
    parser.add_argument("--log-level", default="INFO")


def credential_paths(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> StrPath | tuple[StrPath, StrPath]:
    """The credential as TLSSource takes it; a usage error (exit 2) unless exactly one form."""
    if args.credential_bundle is not None and args.key is None and args.certificate_chain is None:
        path: StrPath = args.credential_bundle
        return path
    if args.credential_bundle is None and args.key is not None and args.certificate_chain:
        pair: tuple[StrPath, StrPath] = (args.key, args.certificate_chain)
        return pair
    parser.error("give either --credential-bundle, or --key with --certificate-chain")


def federated_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Path]:
    """`--federated-trust-bundle` as TLSSource takes it; a usage error for a bad one."""
    out: dict[str, Path] = {}
    for item in args.federated:
        trust_domain, equals, path = item.partition("=")
        try:
            trust_domain = parse_trust_domain(trust_domain)
        except ValueError as exc:
            parser.error(f"--federated-trust-bundle {item!r}: {exc}")
        if not equals or not path or trust_domain in out:
            parser.error(f"--federated-trust-bundle {item!r} is not a new TRUST_DOMAIN=PATH")
        out[trust_domain] = Path(path)
    return out


def add_peer_arguments(parser: argparse.ArgumentParser, prefix: str, who: str) -> None:
    """`--<prefix>-id`, `--<prefix>-trust-domain`, `--<prefix>-workload`: who may talk to us."""
    rules = parser.add_argument_group(f"which {who} may talk to us (any rule allows)")
    rules.add_argument(
        f"--{prefix}-id", dest="ids", action="append", default=[], help="a SPIFFE ID (repeatable)"
    )
    rules.add_argument(
        f"--{prefix}-trust-domain",
        dest="trust_domains",
        action="append",
        default=[],
        help="any ID in this trust domain (repeatable)",
    )
    rules.add_argument(
        f"--{prefix}-workload",
        dest="workloads",
        action="append",
        default=[],
        metavar="[TRUST_DOMAIN/]NAMESPACE/SERVICEACCOUNT",
        help="/ns/<ns>/sa/<sa> IDs whose namespace and service account match these globs, in "
        "TRUST_DOMAIN ('*': any trust domain, federated ones included); without it, in our own "
        "trust domain (our certificate's), never a federated one (repeatable)",
    )


Rules = Callable[[str | None], Authorizer]  # our own trust domain -> the authorizer


def authorizer_from(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Rules:
    """The peer options, checked now (a usage error when no rule is given or one is bad), as a
    function of our own trust domain, known once the credential is read.

    That function raises ValueError when a workload rule without a trust domain meets a
    credential that carries no SPIFFE ID (no trust domain of our own to mean).
    """
    fixed: list[Authorizer] = []
    workloads: list[tuple[str | None, str, str]] = []
    try:
        if args.ids:
            fixed.append(allow_ids(args.ids))
        fixed += [allow_trust_domain(td) for td in args.trust_domains]
        for pattern in args.workloads:
            *trust_domain, namespace, service_account = pattern.split("/")
            if len(trust_domain) > 1 or not namespace or not service_account:
                parser.error(f"{pattern!r} is not [TRUST_DOMAIN/]NAMESPACE/SERVICEACCOUNT")
            td = trust_domain[0] if trust_domain else None
            if td is not None and td != ANY_TRUST_DOMAIN:
                td = parse_trust_domain(td)
            workloads.append((td, namespace, service_account))
    except ValueError as exc:
        parser.error(str(exc))
    if not fixed and not workloads:
        parser.error("no peer rule: nobody could talk to us")

    def build(local_trust_domain: str | None) -> Authorizer:
        rules = list(fixed)
        for td, namespace, service_account in workloads:
            td = td or local_trust_domain
            if td is None:
                raise ValueError(
                    f"workload rule {namespace}/{service_account} means our own trust domain, "
                    "and our certificate carries no SPIFFE ID; write "
                    "TRUST_DOMAIN/NAMESPACE/SERVICEACCOUNT"
                )
            rules.append(allow_workloads(namespace, service_account, trust_domain=td))
        return rules[0] if len(rules) == 1 else allow_any_of(*rules)

    return build


def serial_of(certificate: x509.Certificate) -> str:
    """Lowercase hex, as the signer's audit log writes it."""
    return f"{certificate.serial_number:x}"


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def stop_on_signals(stop: asyncio.Event, signals: Sequence[signal.Signals] = ()) -> None:
    """Set `stop` on SIGTERM/SIGINT (the kubelet stops a pod with SIGTERM)."""
    loop = asyncio.get_running_loop()
    for sig in signals or (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
