"""The offline upstream's part of `podcert signer ca`: `prepare --upstream offline` writes the
next intermediate's CSR, `import` takes the chain the upstream signed (docs/upstream-ca.md).

The decisions are `signer.authority.offline`'s and the Secret's writes `CAStore`'s; this module
only reads the flags and the files and says what happened.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from podcert.errors import CommandError, ConfigError
from signer.authority import offline
from signer.authority.castore import CAStore, describe
from signer.policyfile import trust_domain_problem


def add_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--upstream",
        choices=["self", "offline"],
        default="self",
        help="prepare: who signs the next intermediate: podcert's own root (self), or any CA "
        "outside the cluster (offline: writes a CSR to --csr-out; then `ca import`)",
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
    if offline_prepare and args.preview:
        return "--preview goes with --upstream self only (an offline CA is imported, then live)"
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
    if args.action == "import":
        try:
            chain_pem = Path(args.chain).read_bytes()
        except OSError as err:
            raise ConfigError(f"--chain {args.chain}: {err.strerror}") from None
        print(describe(cas.import_chain(args.id, chain_pem)))
        return 0
    return None
