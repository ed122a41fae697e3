"""`podcert completion bash|zsh|fish`: shell completion generated from the argparse parsers
themselves, so a new command, flag or choice completes with no edit here.

`tree` walks the parsers (pure: the same parser gives the same tree) into one `Node` per command
path: its subcommands (completion descends into them), its positional choices, its flags and
each flag's choices. Each shell's script is that table plus a small fixed function: the words
typed so far pick the node; after a flag with choices its choices complete, a word starting with
`-` completes flags, otherwise subcommands or choices, and where there are none, file names.
The scripts register for `podcert` and `kubectl-podcert`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

Shell = Literal["bash", "zsh", "fish"]
SHELLS: Final[tuple[Shell, ...]] = get_args(Shell)
COMMANDS: Final = ("podcert", "kubectl-podcert")


@dataclass(frozen=True)
class Node:
    path: tuple[str, ...]  # () is the top-level command, ("signer", "ca") a nested one
    subcommands: tuple[str, ...]
    arguments: tuple[str, ...]  # the choices of its positional arguments
    options: tuple[str, ...]
    choices: dict[str, tuple[str, ...]] = field(default_factory=dict)  # option -> its choices


def tree(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[Node]:
    """Every command path of `parser`, parents first."""
    subcommands: list[str] = []
    arguments: list[str] = []
    options: list[str] = []
    choices: dict[str, tuple[str, ...]] = {}
    children: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                subcommands.append(name)
                children.append((name, child))
        elif action.option_strings:
            if action.help == argparse.SUPPRESS:
                continue
            options += action.option_strings
            if action.choices is not None:
                for option in action.option_strings:
                    choices[option] = tuple(str(c) for c in action.choices)
        elif action.choices is not None:
            arguments += [str(c) for c in action.choices]
    yield Node(path, tuple(subcommands), tuple(arguments), tuple(options), choices)
    for name, child in children:
        yield from tree(child, (*path, name))


def _key(path: tuple[str, ...]) -> str:
    """The node's key in the scripts' tables: `root`, `root/signer`, `root/signer/ca` (bash
    refuses an empty key)."""
    return "/".join(("root", *path))


def _words(items: tuple[str, ...]) -> str:
    return shlex.quote(" ".join(items))


def bash(nodes: list[Node]) -> str:
    lines = [
        "# podcert completion for bash: `source <(podcert completion bash)`",
        "declare -A _podcert_sub _podcert_arg _podcert_opt _podcert_choice",
    ]
    for node in nodes:
        key = shlex.quote(_key(node.path))
        # `+=(key value)`, not `[key]=value`: zsh keeps quotes in an assignment's subscript
        # as part of the key, so a quoted key (any with a `|`) would never be found.
        lines += [
            f"_podcert_sub+=({key} {_words(node.subcommands)})",
            f"_podcert_arg+=({key} {_words(node.arguments)})",
            f"_podcert_opt+=({key} {_words(node.options)})",
        ]
        for option, values in node.choices.items():
            lines.append(
                f"_podcert_choice+=({shlex.quote(_key(node.path) + '|' + option)} {_words(values)})"
            )
    lines.append(
        """_podcert() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    local path=root i w
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${COMP_WORDS[i]}"
        [[ "$w" == -* ]] && continue
        if [[ " ${_podcert_sub[$path]} " == *" $w "* ]]; then
            path="$path/$w"
        fi
    done
    if [[ -n "${_podcert_choice[$path|$prev]+set}" ]]; then
        COMPREPLY=($(compgen -W "${_podcert_choice[$path|$prev]}" -- "$cur"))
    elif [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "${_podcert_opt[$path]}" -- "$cur"))
    elif [[ -n "${_podcert_sub[$path]}${_podcert_arg[$path]}" ]]; then
        COMPREPLY=($(compgen -W "${_podcert_sub[$path]} ${_podcert_arg[$path]}" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}
complete -o filenames -F _podcert podcert kubectl-podcert"""
    )
    return "\n".join(lines) + "\n"


def zsh(nodes: list[Node]) -> str:
    lines = [
        "#compdef podcert kubectl-podcert",
        "# podcert completion for zsh: `source <(podcert completion zsh)` after compinit",
        "typeset -gA _podcert_sub _podcert_arg _podcert_opt _podcert_choice",
    ]
    for node in nodes:
        key = shlex.quote(_key(node.path))
        # `+=(key value)`, not `[key]=value`: zsh keeps quotes in an assignment's subscript
        # as part of the key, so a quoted key (any with a `|`) would never be found.
        lines += [
            f"_podcert_sub+=({key} {_words(node.subcommands)})",
            f"_podcert_arg+=({key} {_words(node.arguments)})",
            f"_podcert_opt+=({key} {_words(node.options)})",
        ]
        for option, values in node.choices.items():
            lines.append(
                f"_podcert_choice+=({shlex.quote(_key(node.path) + '|' + option)} {_words(values)})"
            )
    lines.append(
        """_podcert() {
    local cur="${words[CURRENT]}" prev="${words[CURRENT-1]}" node=root w i
    for ((i = 2; i < CURRENT; i++)); do
        w="${words[i]}"
        [[ "$w" == -* ]] && continue
        if [[ " ${_podcert_sub[$node]} " == *" $w "* ]]; then
            node="$node/$w"
        fi
    done
    if (( ${+_podcert_choice[$node|$prev]} )); then
        compadd -- ${=_podcert_choice[$node|$prev]}
    elif [[ "$cur" == -* ]]; then
        compadd -- ${=_podcert_opt[$node]}
    elif [[ -n "${_podcert_sub[$node]}${_podcert_arg[$node]}" ]]; then
        compadd -- ${=_podcert_sub[$node]} ${=_podcert_arg[$node]}
    else
        _files
    fi
}
compdef _podcert podcert kubectl-podcert"""
    )
    return "\n".join(lines) + "\n"


def fish(nodes: list[Node]) -> str:
    lines = ["# podcert completion for fish: `podcert completion fish | source`"]
    for node in nodes:
        # On this node: each word of its path seen, and none of its subcommands yet. (fish
        # matches words anywhere on the line: a choice spelled as a command name may also
        # offer that command's flags.)
        seen = [f"__fish_seen_subcommand_from {name}" for name in node.path]
        if not node.path:
            seen = ["__fish_use_subcommand"]
        elif node.subcommands:
            seen.append(f"not __fish_seen_subcommand_from {' '.join(node.subcommands)}")
        condition = shlex.quote("; and ".join(seen))
        for command in COMMANDS:
            if node.subcommands or node.arguments:
                words = _words((*node.subcommands, *node.arguments))
                lines.append(f"complete -c {command} -n {condition} -f -a {words}")
            for option in node.options:
                flag = f"-l {option[2:]}" if option.startswith("--") else f"-s {option[1:]}"
                values = node.choices.get(option)
                extra = f" -x -a {_words(values)}" if values else ""
                lines.append(f"complete -c {command} -n {condition} {flag}{extra}")
    return "\n".join(lines) + "\n"


def script(shell: Shell, parser: argparse.ArgumentParser) -> str:
    nodes = list(tree(parser))
    return {"bash": bash, "zsh": zsh, "fish": fish}[shell](nodes)


def register(subparsers: Any) -> None:
    from podcert.helptext import HelpFormatter, examples

    p: argparse.ArgumentParser = subparsers.add_parser(
        "completion",
        help="shell completion for bash, zsh or fish",
        description="Print a completion script for podcert and kubectl-podcert.",
        formatter_class=HelpFormatter,
        epilog=examples(
            "source <(podcert completion bash)",
            'podcert completion zsh > "${fpath[1]}/_podcert"',
            "podcert completion fish > ~/.config/fish/completions/podcert.fish",
        ),
    )
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from podcert.cli import build_parser

    sys.stdout.write(script(args.shell, build_parser(every=True)))
    return 0
