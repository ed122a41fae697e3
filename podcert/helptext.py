"""How every podcert command's --help reads: a flag's default is shown only when it says
something (never `(default: None)`, `False` or `[]`); a description written as one paragraph is
wrapped to the terminal, and text written in lines (the examples of an epilog) keeps them."""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help with meaningful defaults appended; text with line breaks kept as is."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or default is argparse.SUPPRESS
            or _says_nothing(default)
            or not action.option_strings
        ):
            return text
        return text + " (default: %(default)s)"


def examples(*lines: str) -> str:
    """An epilog of example command lines, one a line, under an `examples:` heading."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def _says_nothing(default: object) -> bool:
    """An unset option, an off switch, an empty list or string (a 0 port says something)."""
    return (
        default is None
        or default is False
        or (isinstance(default, list | tuple | str | dict) and not default)
    )
