"""The one `podcert` console script: a thin dispatcher to each package's own subcommand."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from podcert import version_line
from podcert.errors import (
    EXIT_CLUSTER_UNREADABLE,
    EXIT_FINDINGS,
    EXIT_USAGE,
    ClusterUnreadable,
    CommandError,
    ConfigError,
    one_line,
)
from podcert.helptext import HelpFormatter, examples

# subcommand -> (`module` exposing `register(subparsers)`, or `module:function` naming another
# register function, and a one-line help). Only the module of the command being run is imported:
# `podcert audit` does not pay for the signer's imports, and a broken piece cannot break the
# other commands.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "status": ("signer.report.cli:register_status", "how the signer stands: leader, CA, requests"),
    "explain": ("signer.report.cli:register_explain", "why a pod has (or lacks) its certificate"),
    "inspect": ("audit.cli:register_inspect", "what a credential or trust bundle file holds"),
    "version": ("signer.report.cli:register_version", "client, server and signer versions"),
    "signer": ("signer.cli", "issue and deny PodCertificateRequests for our signer names"),
    "shim": ("kubelet_shim.cli", "the kubelet's half of Pod Certificates, for one node"),
    "audit": ("audit.cli", "audit projected credentials, requests and the audit log"),
    "devcluster": ("devcluster.cli", "a real local etcd + kube-apiserver"),
    "demo": ("devcluster.demo", "run the end-to-end demo on a local devcluster"),
    "completion": ("podcert.completion", "shell completion for bash, zsh or fish"),
}

# What the `server` extra brings (pyproject's optional-dependencies), by import name. A wheel
# installed without it runs `bundles` but not the commands; each says which extra it lacks.
SERVER_EXTRA_MODULES = frozenset({"aiohttp", "yaml", "jwt", "prometheus_client", "rich", "msgspec"})
# Never in the wheel: they run from a checkout, installed by the README's commands.
DEVELOPMENT_ONLY = frozenset({"devcluster", "examples", "bench"})


def missing_module(command: str, module: str) -> str | None:
    """The one line a command says when importing it found `module` missing, or None when the
    module is neither an extra's nor a development-only one (a broken install: re-raised)."""
    top = module.split(".")[0]
    if top in SERVER_EXTRA_MODULES:
        return (
            f"'{command}' needs podcert's server extra (module {top} is missing): "
            "pip install 'podcert[server]'"
        )
    if module in DEVELOPMENT_ONLY:  # the package itself, not a module missing inside it
        return (
            f"'{command}' is a development tool, not in the installed package: "
            "run it from a checkout (see the README)"
        )
    return None


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line naming the problem, then exit 2: every subcommand's parser is
    one of these (argparse makes subparsers of their parent's class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n")


class VersionAction(argparse.Action):
    """`--version`: one line on stdout, as written (argparse's own would wrap it), exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help=str(kwargs.get("help")))

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> NoReturn:
        print(version_line())
        parser.exit(0)


def build_parser(
    command: str | None = None, *, prog: str = "podcert", every: bool = False
) -> argparse.ArgumentParser:
    """The parser, with `command`'s own arguments (every command's with `every`: what shell
    completion reads; a command that cannot be imported here keeps its bare name)."""
    parser = OneLineParser(
        prog=prog,
        description="Workload identity certificates for Kubernetes (Pod Certificates API).",
        formatter_class=HelpFormatter,
        epilog=examples(
            f"{prog} status",
            f"{prog} explain pod shop/api-7d9c",
            f"{prog} inspect credential-bundle.pem --trust-bundle td.trust-bundle.pem",
            f"{prog} completion bash > /etc/bash_completion.d/podcert",
        ),
    )
    parser.add_argument(
        "--version",
        action=VersionAction,
        help="print podcert's version, and the Kubernetes releases it is tested with, then exit",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (spec, help_text) in SUBCOMMANDS.items():
        if name == command or every:
            module, _, function = spec.partition(":")
            try:
                loaded = importlib.import_module(module)
            except ModuleNotFoundError as err:
                said = missing_module(name, err.name or "")
                if said is None:
                    raise
                if not every:
                    parser.error(said)
                sub.add_parser(name, help=help_text, add_help=False)
                continue
            getattr(loaded, function or "register")(sub)
        else:
            sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "podcert") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command if command in SUBCOMMANDS else None, prog=prog).parse_args(argv)
    try:
        code: int = args.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except ConfigError as err:
        print(f"podcert {args.command}: {one_line(str(err))}", file=sys.stderr)
        return EXIT_USAGE
    except ClusterUnreadable as err:
        print(f"podcert {args.command}: {one_line(str(err))}", file=sys.stderr)
        return EXIT_CLUSTER_UNREADABLE
    except (CommandError, OSError) as err:
        print(f"podcert {args.command}: {one_line(str(err))}", file=sys.stderr)
        return EXIT_FINDINGS
    except Exception as err:
        # An API answer no command expected (a 403 mid-way...) is still one line, not a
        # traceback; the client module is looked up, not imported, so that commands which
        # never load it do not pay for it here.
        rest = sys.modules.get("podcert.client.rest")
        if rest is None or not isinstance(err, rest.ApiError):
            raise
        print(f"podcert {args.command}: {one_line(str(err))}", file=sys.stderr)
        return EXIT_FINDINGS
    return code


def kubectl_main() -> int:
    """`kubectl-podcert`: the same commands as a kubectl plugin (`kubectl podcert status`)."""
    return main(prog="kubectl podcert")


if __name__ == "__main__":
    sys.exit(main())
