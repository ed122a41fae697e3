"""The upstreams' flags. `podcert signer ca`: `prepare --upstream offline` writes the next
intermediate's CSR, `import` takes the chain the upstream signed (docs/upstream-ca.md), and
`prepare --upstream spire` asks the leader for a new intermediate from SPIRE at its next look.
`podcert signer --upstream spire --spire-agent-socket PATH --spire-server HOST:PORT` runs the
signer under SPIRE (docs/spire-upstream.md).

The decisions are `signer.authority.offline`'s and `signer.authority.downstream`'s and the
Secret's writes `CAStore`'s; this module only reads the flags and the files and says what
happened.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from podcert.errors import CommandError, ConfigError
from signer.authority import downstream, offline
from signer.authority.castore import CAStore, describe
from signer.policy import Policy
from signer.policyfile import trust_domain_problem


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--upstream",
        choices=["self", "offline", "spire"],
        default="self",
        help="prepare: who signs the next intermediate: podcert's own root (self), any CA "
        "outside the cluster (offline: writes a CSR to --csr-out; then `ca import`), or SPIRE "
        "(spire: the leader of a signer run with --upstream spire asks SPIRE at its next look)",
    )
    parser.add_argument(
        "--trust-domain",
        dest="offline_trust_domain",
        default=None,
        help="prepare --upstream offline: the trust domain the CSR names (spiffe://TD)",
    )
    parser.add_argument(
        "--csr-out", default=None, help="prepare --upstream offline: where to write the CSR (PEM)"
    )
    parser.add_argument(
        "--chain",
        default=None,
        help="import: the signed intermediate then the upstream's chain up to its root (PEM)",
    )


def problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the offline upstream's flags of `podcert signer ca`, or None."""
    offline_prepare = args.action == "prepare" and args.upstream == "offline"
    if args.upstream != "self" and args.action != "prepare":
        return f"--upstream goes with `ca prepare` only, not `ca {args.action}`"
    if args.upstream != "self" and args.preview:
        return "--preview goes with --upstream self only (an upstream's CA is live at once)"
    if (args.offline_trust_domain is not None or args.csr_out is not None) and not offline_prepare:
        return "--trust-domain and --csr-out go with `ca prepare --upstream offline` only"
    if offline_prepare and (not args.offline_trust_domain or not args.csr_out):
        return "`ca prepare --upstream offline` needs --trust-domain and --csr-out"
    if offline_prepare and (said := trust_domain_problem(args.offline_trust_domain)):
        return f"--trust-domain {args.offline_trust_domain!r}: {said}"
    if (args.chain is not None) != (args.action == "import"):
        return "`ca import` needs --chain FILE (and --chain goes with `ca import` only)"
    if args.action == "import" and not args.id:
        return "`ca import` needs --id GEN (the generation `ca status` shows awaiting its chain)"
    return None


def run(args: argparse.Namespace, cas: CAStore) -> int | None:
    """Carry out `ca prepare --upstream offline` or `ca import`; None for any other action."""
    if args.action == "prepare" and args.upstream == "offline":
        pending = cas.prepare_offline(args.offline_trust_domain)
        try:
            Path(args.csr_out).write_bytes(offline.csr_pem(pending.csr))
        except OSError as err:
            raise CommandError(
                f"--csr-out {args.csr_out}: {err.strerror}; {pending.id} awaits its signed chain "
                f"all the same, its CSR is {offline.PENDING_PREFIX}{pending.id}.csr in {cas.ref}"
            ) from None
        print(
            f"{pending.id} awaits its signed chain: CSR written to {args.csr_out}; have it "
            f"signed, then `podcert signer ca import --id {pending.id} --chain FILE`"
        )
        return 0
    spire_signs = bool(cas.upstream_authorities)
    if args.action == "prepare" and args.upstream == "self" and spire_signs and not args.force:
        raise CommandError(
            "ca prepare: SPIRE signs this CA's intermediates; `ca prepare --upstream spire` "
            "asks it for the next one (--force makes a root of podcert's own instead)"
        )
    if args.action == "prepare" and args.upstream == "spire":
        cas.rewrite(downstream.with_request())
        when = cas.renewal_requested or cas.clock()
        print(
            f"renewal requested at {when:%Y-%m-%dT%H:%M:%SZ}: the leader asks SPIRE for a new "
            "intermediate at its next look (`ca status` shows it prepared, then active)"
        )
        return 0
    if args.action == "import":
        try:
            chain_pem = Path(args.chain).read_bytes()
        except OSError as err:
            raise ConfigError(f"--chain {args.chain}: {err.strerror}") from None
        print(describe(cas.import_chain(args.id, chain_pem)))
        return 0
    return None


# --- the running signer's flags ------------------------------------------------------------------

SPIRE_SOCKET_ENV = "SPIFFE_ENDPOINT_SOCKET"  # the Workload API's address, as SPIFFE names it


def add_signer_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--upstream",
        dest="signer_upstream",
        choices=["self", "spire"],
        default="self",
        help="who signs the signer's intermediates: its own root (self; or an operator's "
        "offline CA, `ca import`), or a SPIRE server (spire: the signer is a downstream "
        "workload of SPIRE, docs/spire-upstream.md)",
    )
    parser.add_argument(
        "--spire-agent-socket",
        default=os.environ.get(SPIRE_SOCKET_ENV, ""),
        metavar="PATH",
        help=f"--upstream spire: the SPIRE agent's Workload API socket (default: "
        f"${SPIRE_SOCKET_ENV}), where the signer fetches its own X509-SVID",
    )
    parser.add_argument(
        "--spire-server",
        default="",
        metavar="HOST:PORT",
        help="--upstream spire: the SPIRE server's API (its bind_address:bind_port), asked "
        "for the intermediate (NewDownstreamX509CA) over mutual TLS with that SVID",
    )
    parser.add_argument(
        "--spire-check-seconds",
        type=float,
        default=downstream.Endpoints.interval,
        help="--upstream spire: seconds between the leader's looks at SPIRE's bundle and at "
        "the intermediate's renewal point (a failure is retried after 5 s, doubling up to 5 min)",
    )


def signer_problem(args: argparse.Namespace, pol: Policy) -> str | None:
    """What is wrong with the running signer's upstream flags, or None."""
    trust_domains = {pol.for_signer(s).trust_domain for s in args.signer_names}
    spire = args.signer_upstream == "spire"
    if not spire:
        if args.spire_server:
            return "--spire-server goes with --upstream spire only"
        return None
    if not args.spire_agent_socket:
        return f"--upstream spire needs --spire-agent-socket PATH (or ${SPIRE_SOCKET_ENV})"
    host, _, port = args.spire_server.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"--spire-server {args.spire_server!r}: expected HOST:PORT (SPIRE's bind_port)"
    if not 1 <= args.spire_check_seconds <= 3600:
        return f"--spire-check-seconds must be between 1 and 3600, got {args.spire_check_seconds}"
    if len(trust_domains) != 1:
        return (
            "--upstream spire: every signer name must issue in one trust domain, SPIRE's; "
            f"the policy names {', '.join(sorted(trust_domains))}"
        )
    return None


def spire_endpoints(args: argparse.Namespace) -> downstream.Endpoints | None:
    if args.signer_upstream != "spire":
        return None
    return downstream.Endpoints(
        agent_socket=args.spire_agent_socket.removeprefix("unix://"),
        server=args.spire_server,
        interval=args.spire_check_seconds,
    )
