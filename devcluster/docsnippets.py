"""The docs' snippets, checked so they cannot rot (docs/contributing-docs.md is the convention).

Every fenced block of a page (docs/**/*.md and README.md) has a language. Then, by language:

- `text` (output, diagrams) and the languages in UNCHECKED: nothing;
- `sh`: each command (continuations joined, comments stripped, split at `|`, `&&`, `||`, `;`
  and parentheses) runs a program in PROGRAMS; `podcert ...` and `kubectl podcert ...` parse
  with podcert's own argparse parser; `make T` names a target of the Makefile;
  `helm install|upgrade|template ... charts/podcert` names the chart's folder and every
  `--set key=...` key is in its values.yaml; `kubectl apply|create|diff -f|-k PATH` of a
  repository path names a file that exists;
- `yaml`: every document parses; a block whose first line is `# values.yaml` is valid against
  the chart's values.schema.json, one whose first line is `# policy.yaml` is read by the signer's
  policy reader; documents with `apiVersion` and `kind` are what the integration test
  (tests/integration/test_docs_snippets.py) sends to the API server with a server-side dry run;
- `python`: compiles, and every import resolves (the module, and each name imported from it);
- `json`: parses; `go` and `java`: excerpts of at most EXCERPT_LINES lines (longer code is
  included from examples/ with MyST's `{literalinclude}`, where it is built and tested).

A block right after the line `<!-- docs-test: run -->` is also run, in page order, one shell
per page, by the integration test (`run_script` makes that shell's script).

Pure but for reading the repository's files and importing the modules a snippet names.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import itertools
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Final

import yaml

from devcluster.chartvalues import chart_values, values_problems
from devcluster.docref import ROOT

RUN_MARKER: Final = "<!-- docs-test: run -->"
EXCERPT_LINES: Final = 15
UNCHECKED: Final = frozenset(
    {"text", "hcl", "toml", "ini", "promql", "dockerfile", "diff", "go", "java", "console"}
)
SHELLS: Final = frozenset({"sh", "bash", "shell"})
# What a page may tell a reader to run. A new tool needs a line here, so that a typo
# (`kubetcl`) or a program the reader does not have is a review question, not a surprise.
PROGRAMS: Final = frozenset(
    {
        # podcert and what it runs against
        "podcert", "kubectl", "kubectl-podcert", "helm", "kustomize", "make", "python",
        "python3", "pip", "uvicorn", "go", "java", "javac", "podman", "docker",
        "spire-server", "spire-agent", "softhsm2-util", "pkcs11-tool", "openssl", "curl",
        "git", "jq", "yq", "watch", "sudo", "systemctl", "journalctl", "ctr", "crictl",
        # publishing a release (docs/releasing.md)
        "skopeo", "twine", "gh", "cosign",
        # the shell's own and coreutils
        "cd", "export", "unset", "echo", "printf", "cat", "ls", "grep", "sed", "awk", "head",
        "tail", "cut", "tr", "sort", "uniq", "wc", "tee", "mkdir", "cp", "mv", "rm", "ln",
        "chmod", "touch", "test", "[", "true", "false", "set", "source", ".", "env", "date",
        "base64", "sha256sum", "diff", "find", "xargs", "tar", "kill", "wait", "sleep",
        "read", "while", "until", "for", "if", "then", "else", "elif", "fi", "do", "done",
        "case", "esac", "trap", "exit", "timeout", "mktemp", "dirname", "basename", "realpath",
        "stat", "id", "whoami", "hostname", "nproc", "df", "du", "less",
    }
)  # fmt: skip
# Words that run the command after them: the command checked is what follows.
_KEYWORDS: Final = frozenset(
    {"if", "elif", "while", "until", "then", "else", "do", "!", "time", "sudo", "exec"}
)
_SEPARATORS: Final = frozenset({"|", "||", "&&", ";", "&", "(", ")", ";;", "{", "}"})
_REDIRECTS: Final = frozenset({">", ">>", "<", ">&", "<&", "&>", ">|", "<>"})
_HEREDOC: Final = re.compile(r"<<-?\s*['\"]?(?P<word>\w+)['\"]?")
_FD_REDIRECT: Final = re.compile(r"(?<=\s)\d+(?=[<>])")
_PLACEHOLDER: Final = re.compile(r"(?<![<\w])<([a-zA-Z][\w-]*)>(?!>)")
_FENCE: Final = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: where it opens (1-based line), its info string's first word,
    its body and whether the page asks for it to be run."""

    path: Path
    line: int
    language: str
    body: str
    run: bool

    @property
    def where(self) -> str:
        try:
            shown = self.path.relative_to(ROOT)
        except ValueError:
            shown = self.path
        return f"{shown}:{self.line}"


def blocks(path: Path, text: str | None = None) -> list[Block]:
    """Every fenced block of the Markdown file `path` (MyST directives like ```{toctree} are
    blocks too: their language starts with `{`), in page order."""
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    out: list[Block] = []
    index = 0
    while index < len(lines):
        opened = _FENCE.match(lines[index])
        if not opened:
            index += 1
            continue
        fence, info = opened["fence"], opened["info"].strip()
        if fence[0] == "`" and "`" in info:  # an inline span, not a fence
            index += 1
            continue
        before = next((x.strip() for x in reversed(lines[:index]) if x.strip()), "")
        end = index + 1
        while end < len(lines) and not re.match(
            rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[end]
        ):
            end += 1
        # A fence inside a list item: its lines lose the fence's indent, as CommonMark reads them.
        indent = len(opened["indent"])
        body = "\n".join(
            x[indent:] if not x[:indent].strip() else x.lstrip() for x in lines[index + 1 : end]
        )
        language = info.split()[0] if info else ""
        out.append(Block(path, index + 1, language, body + "\n", before == RUN_MARKER))
        index = end + 1
    return out


def commands(body: str) -> list[tuple[int, str]]:
    """The commands of a shell block with the index of the line each starts on: continuation
    lines joined, comment-only lines and here-documents' bodies dropped."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    lines = iter(enumerate(body.splitlines()))
    for number, line in lines:
        if not pending:
            start = number
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        command, pending = pending.strip(), ""
        if not command or command.startswith("#"):
            continue
        out.append((start, command))
        if heredoc := _HEREDOC.search(command):
            for _, rest in lines:
                if rest.strip() == heredoc["word"]:
                    break
    return out


def words(command: str) -> list[list[str]]:
    """The simple commands of `command`, each its words (without redirections, leading
    `VAR=value` assignments and keywords like `then`/`do`/`sudo`)."""
    if placeholder := _PLACEHOLDER.search(command):
        raise SnippetError(
            f"{placeholder[0]} reads as a redirection: write a placeholder as a shell variable "
            f'("${placeholder[1].upper().replace("-", "_")}") set above the command'
        )
    # `2>&1`, `2>/dev/null`: the descriptor is part of the redirection only when it touches it.
    command = _FD_REDIRECT.sub("", command)
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError as err:
        raise SnippetError(f"the shell cannot read {command!r}: {err}") from err
    out: list[list[str]] = []
    current: list[str] = []
    skip = False
    for token in tokens:
        if skip:
            skip = False
            continue
        if token in _REDIRECTS or (token.startswith(("<", ">")) and set(token) <= set("<>&|")):
            skip = not token.startswith("<<")
            continue
        if token in _SEPARATORS or set(token) <= set(";&|()"):
            out.append(current)
            current = []
            continue
        current.append(token)
    out.append(current)
    simple = []
    for argv in out:
        while argv and (argv[0] in _KEYWORDS or re.match(r"^\w+=", argv[0]) or argv[0] == "$"):
            argv = argv[1:]
        if argv[:1] == ["timeout"]:  # timeout [OPTION]... DURATION COMMAND: check COMMAND
            rest = list(itertools.dropwhile(lambda w: w.startswith("-"), argv[1:]))
            argv = rest[1:] if len(rest) > 1 else argv
        if argv and argv[-1] == "$":
            argv = argv[:-1]
        if argv:
            simple.append(argv)
    return simple


class SnippetError(ValueError):
    """A snippet that does not hold: its message names what is wrong."""


def _program(word: str) -> str:
    """`.venv/bin/podcert` is `podcert`: the checkout's own tools count as their names."""
    return word.rsplit("/", 1)[-1] if word.startswith((".venv/", "./.venv/")) else word


def parse_podcert(args: Sequence[str]) -> str | None:
    """None when podcert's own parser takes `args`, else what it said."""
    from podcert.cli import SUBCOMMANDS, build_parser

    command = next((a for a in args if not a.startswith("-")), None)
    parser = build_parser(command if command in SUBCOMMANDS else None)
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(list(args))
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            return said.getvalue().strip() or f"exit {exit_.code}"
    return None


@cache
def make_targets(makefile: Path = ROOT / "Makefile") -> frozenset[str]:
    text = makefile.read_text(encoding="utf-8")
    return frozenset(re.findall(r"^([A-Za-z0-9_./-]+)\s*:(?!=)", text, re.M))


def _has_key(values: Any, dotted: str) -> bool:
    node = values
    for part in re.split(r"(?<!\\)\.", dotted):
        part = part.replace("\\.", ".")
        name, _, index = part.partition("[")
        if not isinstance(node, dict) or name not in node:
            return False
        node = node[name]
        if index:
            if not isinstance(node, list):
                return False
            node = node[0] if node else {}
    return True


def check_command(argv: Sequence[str], root: Path = ROOT) -> list[str]:
    """What is wrong with one simple command (empty: nothing)."""
    program, args = _program(argv[0]), list(argv[1:])
    if program not in PROGRAMS:
        return [f"{argv[0]!r} is not a program the docs may use (devcluster.docsnippets.PROGRAMS)"]
    if program == "kubectl" and args[:1] == ["podcert"]:
        program, args = "podcert", args[1:]
    if program in ("podcert", "kubectl-podcert"):
        said = parse_podcert(args)
        return [f"podcert {' '.join(args)}: {said}"] if said else []
    if program == "make":
        targets = [a for a in args if not a.startswith("-") and "=" not in a]
        return [
            f"make: no target {t!r} in the Makefile" for t in targets if t not in make_targets()
        ]
    if program == "helm" and args[:1] and args[0] in ("install", "upgrade", "template"):
        return _check_helm(args, root)
    if program == "kubectl" and args[:1] and args[0] in ("apply", "create", "diff", "delete"):
        problems = []
        for flag, value in itertools.pairwise(args):
            path = _repo_path(value, root)
            named = flag in ("-f", "--filename", "-k", "--kustomize") and path is not None
            if named and not (root / str(path)).exists():
                problems.append(f"kubectl {args[0]} {flag} {value}: no such file")
        return problems
    return []


def _repo_path(value: str, root: Path) -> str | None:
    """The repository path `value` names (relative to the checkout), or None when it names a
    file of the page's own (`f.yaml`, `-`, a URL): a path under `$PODCERT_CHECKOUT`, or one
    whose first folder is a folder of the checkout (`manifests/...`, `examples/...`)."""
    for prefix in ("$PODCERT_CHECKOUT/", "${PODCERT_CHECKOUT}/"):
        if value.startswith(prefix):
            return value.removeprefix(prefix)
    first, slash, _ = value.partition("/")
    return value if slash and first not in ("", ".", "..") and (root / first).is_dir() else None


def _check_helm(args: Sequence[str], root: Path) -> list[str]:
    problems = []
    charts = [a for a in args if a.rstrip("/").endswith("charts/podcert")]
    for chart in charts:
        if not (root / chart).is_dir():
            problems.append(f"helm: no chart at {chart}")
    if not charts:
        return problems
    for flag, value in itertools.pairwise(args):
        if flag in ("--set", "--set-string", "--set-file", "--set-json"):
            for item in re.split(r",(?=[\w.\\\[\]]+=)", value):
                key = item.split("=", 1)[0]
                if not _has_key(chart_values(), key):
                    problems.append(f"helm {flag} {key}: no such key in charts/podcert/values.yaml")
    return problems


def check_shell(block: Block) -> list[str]:
    problems = []
    for offset, command in commands(block.body):
        where = f"{block.where.rsplit(':', 1)[0]}:{block.line + 1 + offset}"
        try:
            for argv in words(command):
                problems += [f"{where}: {p}" for p in check_command(argv)]
        except SnippetError as err:
            problems.append(f"{where}: {err}")
    return problems


def yaml_documents(block: Block) -> list[Any]:
    return [d for d in yaml.safe_load_all(block.body) if d is not None]


def api_objects(block: Block) -> list[dict[str, Any]]:
    """The documents of a yaml block that are Kubernetes objects (apiVersion and kind)."""
    return [
        d
        for d in yaml_documents(block)
        if isinstance(d, dict) and "apiVersion" in d and "kind" in d
    ]


def check_yaml(block: Block) -> list[str]:
    try:
        documents = yaml_documents(block)
    except yaml.YAMLError as err:
        return [f"{block.where}: not valid YAML: {' '.join(str(err).split())}"]
    first = block.body.split("\n", 1)[0].strip()
    if first == "# values.yaml":
        return [f"{block.where}: {p}" for d in documents for p in values_problems(d)]
    if first == "# policy.yaml":
        return [f"{block.where}: {p}" for p in policy_problems(block.body)]
    return []


def policy_problems(text: str) -> list[str]:
    """What the signer's policy reader refuses in a policy file (the signers it names served)."""
    from signer.policy import PolicyError, load_policy

    try:
        document = yaml.safe_load(text) or {}
        served = [s["name"] for s in document.get("signers", []) if isinstance(s, dict)]
        load_policy(text, "policy.yaml", served or ["example.com/podcert"], "cluster.local")
    except (PolicyError, yaml.YAMLError, AttributeError, KeyError, TypeError) as err:
        return [" ".join(str(err).split())]
    return []


def check_python(block: Block) -> list[str]:
    import ast

    try:
        tree = ast.parse(block.body, filename=block.where)
        # An excerpt may `await` at its top level, as in an asyncio REPL.
        compile(block.body, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as err:
        return [f"{block.where}: does not compile: {err.msg} (line {err.lineno})"]
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            problems += [_missing_module(a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if said := _missing_module(node.module):
                problems.append(said)
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                missing = alias.name != "*" and not hasattr(module, alias.name)
                if missing and importlib.util.find_spec(f"{node.module}.{alias.name}") is None:
                    problems.append(f"cannot import {alias.name} from {node.module}")
    return [f"{block.where}: {p}" for p in problems if p]


def _missing_module(name: str) -> str:
    try:
        found = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        found = None
    return "" if found is not None else f"no module named {name}"


def check(block: Block) -> list[str]:
    """Every problem of one block (empty: it holds)."""
    language = block.language.lower()
    if not language:
        return [f"{block.where}: a fenced block needs a language (`text` for output)"]
    if language.startswith("{"):
        return []  # a MyST directive: Sphinx checks it (a missing literalinclude fails the build)
    if language in SHELLS:
        return check_shell(block)
    if language == "yaml":
        return check_yaml(block)
    if language == "python":
        return check_python(block)
    if language == "json":
        try:
            json.loads(block.body)
        except ValueError as err:
            return [f"{block.where}: not valid JSON: {err}"]
        return []
    if language in ("go", "java") and block.body.count("\n") > EXCERPT_LINES:
        return [
            f"{block.where}: {language} longer than {EXCERPT_LINES} lines: include it from "
            "examples/ with {literalinclude}"
        ]
    return []


def pages(root: Path = ROOT) -> list[Path]:
    """Every page the checks cover: the site's Markdown and the README."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def run_script(page: Path) -> str | None:
    """The shell script of `page`'s `docs-test: run` blocks in page order (None: it has none):
    stop at the first failing command, and say each command before running it."""
    chosen = [b for b in blocks(page) if b.run]
    if not chosen:
        return None
    parts = ["set -euo pipefail", "set -x"]
    for block in chosen:
        if block.language.lower() not in SHELLS:
            raise SnippetError(f"{block.where}: only sh blocks can be run")
        parts += [f"# {block.where}", block.body]
    return "\n".join(parts)


def all_problems(root: Path = ROOT) -> list[str]:
    return [p for page in pages(root) for block in blocks(page) for p in check(block)]


def main() -> int:  # pragma: no cover  (python -m devcluster.docsnippets: the list, for a writer)
    problems = all_problems()
    print("\n".join(problems) or "every snippet holds")
    return 1 if problems else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
