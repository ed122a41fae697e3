"""The one `podcert` console script: a thin dispatcher to each package's own subcommand."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> module exposing `register(subparsers)`; imported lazily so that `podcert audit`
# does not pay for the signer's imports and a broken optional piece cannot break the others.
SUBCOMMANDS: dict[str, str] = {
    "signer": "signer.cli",
    "devcluster": "devcluster.cli",
    "demo": "podcert.demo",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="podcert",
        description="Workload identity certificates for Kubernetes (Pod Certificates API).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS.values():
        importlib.import_module(module).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
