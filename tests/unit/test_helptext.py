"""--help shows a flag's default only when it says something, and keeps examples as written."""

from __future__ import annotations

import argparse

from podcert.helptext import HelpFormatter, examples


def _help(**defaults: object) -> str:
    parser = argparse.ArgumentParser(
        prog="x",
        description="one paragraph " * 12,
        formatter_class=HelpFormatter,
        epilog=examples("x --port 1", "x -o json"),
    )
    for name, default in defaults.items():
        parser.add_argument(f"--{name}", default=default, help=f"the {name}")
    return parser.format_help()


def test_defaults_that_say_nothing_are_not_shown() -> None:
    text = _help(unset=None, switch=False, many=[], port=0, name="podcert-signer")

    assert "default: None" not in text
    assert "default: False" not in text
    assert "default: []" not in text
    assert "the port (default: 0)" in text
    assert "(default: podcert-signer)" in text


def test_examples_keep_their_lines_and_the_description_is_wrapped() -> None:
    text = _help()

    assert "examples:\n  x --port 1\n  x -o json" in text
    assert max(len(line) for line in text.splitlines()) <= 100
