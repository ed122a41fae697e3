"""The docs' snippets hold (every page of docs/ and the README), and each check catches what it
is for: a block without a language, a program nobody has, a podcert flag that does not parse, a
make target, a chart value or a repository file that does not exist, a values or policy file
the chart or the signer refuses, Python that does not compile or imports what is not there."""

from __future__ import annotations

from pathlib import Path

import pytest

from devcluster import docsnippets
from devcluster.docsnippets import Block

ROOT = Path(__file__).resolve().parents[2]


def block(language: str, body: str, run: bool = False) -> Block:
    return Block(ROOT / "docs" / "x.md", 1, language, body, run)


@pytest.mark.parametrize("page", docsnippets.pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_snippet_of_the_page_holds(page: Path) -> None:
    problems = [p for b in docsnippets.blocks(page) for p in docsnippets.check(b)]
    assert problems == []


def test_the_checks_cover_the_readme_and_every_page_of_the_site() -> None:
    pages = docsnippets.pages()
    assert ROOT / "README.md" in pages
    assert ROOT / "docs" / "runbooks" / "PodcertNoLeader.md" in pages


@pytest.mark.parametrize(
    "language, body",
    [
        pytest.param("sh", "podcert status -o table\n", id="podcert with a valid flag"),
        pytest.param("sh", "kubectl podcert explain pod shop/api\n", id="the kubectl plugin"),
        pytest.param("sh", ".venv/bin/podcert devcluster up --dir dc\n", id="the venv's podcert"),
        pytest.param(
            "sh",
            "podcert shim --node-name a --metrics-port 0 > shim.log 2>&1 &\n",
            id="a redirection after an argument that is a digit",
        ),
        pytest.param("sh", "make demo\nmake test\n", id="make targets that exist"),
        pytest.param(
            "sh",
            "helm install podcert charts/podcert \\\n  --namespace x \\\n"
            "  --set trustDomain=prod.example.com --set replicas=3,image.tag=x\n",
            id="helm with keys of values.yaml, continued lines",
        ),
        pytest.param("sh", "kubectl apply -k manifests/monitoring\n", id="a repository path"),
        pytest.param(
            "sh",
            'kubectl apply -f "$PODCERT_CHECKOUT/manifests/monitoring/podmonitor.yaml"\n',
            id="a path under the checkout's variable",
        ),
        pytest.param("sh", "# just a comment\n\nexport A=b  # trailing\n", id="comments"),
        pytest.param(
            "sh",
            "cat > f.yaml <<EOF\nnot: [a command\nEOF\nkubectl apply -f f.yaml\n",
            id="a here-document's body is not commands",
        ),
        pytest.param("sh", 'NS=shop kubectl get pods -n "$NS" | grep api\n', id="assignments"),
        pytest.param("sh", "timeout 60 podcert status\n", id="timeout runs a command"),
        pytest.param("text", "anything <at> all | ok\n", id="text is not checked"),
        pytest.param("python", "from bundles import TLSSource\nawait x()\n", id="python"),
        pytest.param("yaml", "# values.yaml\ntrustDomain: prod.example.com\n", id="values"),
        pytest.param(
            "yaml",
            "# policy.yaml\nsigners:\n  - name: example.com/podcert\n"
            "    maxLifetimeSeconds: 3600\n",
            id="a policy the signer reads",
        ),
        pytest.param("json", '{"a": 1}\n', id="json"),
        pytest.param("go", "x := 1\n", id="a short go excerpt"),
    ],
)
def test_a_good_snippet_holds(language: str, body: str) -> None:
    assert docsnippets.check(block(language, body)) == []


@pytest.mark.parametrize(
    "language, body, said",
    [
        pytest.param("", "ls\n", "needs a language", id="no language"),
        pytest.param("sh", "kubetcl get pods\n", "'kubetcl' is not a program", id="a typo"),
        pytest.param("sh", "podcert signer --no-such-flag\n", "no-such-flag", id="a bad flag"),
        pytest.param("sh", "podcert frobnicate\n", "frobnicate", id="a bad command"),
        pytest.param("sh", "kubectl podcert status -o xml\n", "invalid choice", id="a bad choice"),
        pytest.param("sh", "make nope\n", "no target 'nope'", id="a make target"),
        pytest.param(
            "sh",
            "if ! podcert status --bogus; then echo no; fi\n",
            "bogus",
            id="a command under if and ! is checked",
        ),
        pytest.param(
            "sh", "timeout --signal=KILL 60 podcert status --bogus\n", "bogus", id="under timeout"
        ),
        pytest.param(
            "sh",
            "helm upgrade --install p charts/podcert --set image.nope=1\n",
            "image.nope",
            id="a chart value that does not exist",
        ),
        pytest.param(
            "sh", "helm install p charts/podcrt\n", "", id="helm of a mistyped chart is not ours"
        ),
        pytest.param(
            "sh", "kubectl apply -f manifests/nope.yaml\n", "no such file", id="a missing file"
        ),
        pytest.param(
            "sh", "kubectl logs <pod>\n", "shell variable", id="a placeholder in angle brackets"
        ),
        pytest.param("yaml", "a: [\n", "not valid YAML", id="yaml that does not parse"),
        pytest.param("yaml", "# values.yaml\nimage:\n  tag: 3\n", "image.tag", id="a bad value"),
        pytest.param(
            "yaml",
            "# policy.yaml\nsigners:\n  - name: example.com/p\n    maxLifetime: 1\n",
            "maxLifetime",
            id="a policy key the signer refuses",
        ),
        pytest.param("python", "def f(:\n", "does not compile", id="python that does not compile"),
        pytest.param("python", "import no_such_module\n", "no_such_module", id="a module"),
        pytest.param(
            "python", "from bundles import NoSuchName\n", "NoSuchName", id="a name of a module"
        ),
        pytest.param("json", "{a: 1}\n", "not valid JSON", id="json"),
        pytest.param("java", "x;\n" * 16, "literalinclude", id="a long java block"),
    ],
)
def test_a_bad_snippet_is_refused_naming_the_problem(language: str, body: str, said: str) -> None:
    problems = docsnippets.check(block(language, body))
    if language == "sh" and "podcrt" in body:  # not charts/podcert: nothing to check
        assert problems == []
        return
    assert problems, body
    assert said in " ".join(problems)


def test_a_problem_names_the_line_of_the_command() -> None:
    b = Block(ROOT / "docs" / "x.md", 10, "sh", "ls\n\nkubetcl get pods\n", False)
    assert docsnippets.check(b)[0].startswith("docs/x.md:13: ")


def test_commands_join_continuations_and_skip_comments() -> None:
    assert docsnippets.commands("# c\nhelm install \\\n  x charts/podcert\n\nls # d\n") == [
        (1, "helm install    x charts/podcert"),
        (4, "ls # d"),
    ]
    assert docsnippets.words("A=1 sudo kubectl get x 2>/dev/null | tail -1 && echo ok") == [
        ["kubectl", "get", "x"],
        ["tail", "-1"],
        ["echo", "ok"],
    ]


def test_blocks_know_their_language_line_and_run_marker() -> None:
    text = (
        "# T\n\n<!-- docs-test: run -->\n```sh\nls\n```\n\n```text\nout\n```\n\n"
        "````text\n```{literalinclude} x\n```\n````\n- item\n\n  ```yaml\n  a: 1\n  ```\n"
    )
    found = docsnippets.blocks(ROOT / "docs" / "x.md", text)
    assert [(b.line, b.language, b.run) for b in found] == [
        (4, "sh", True),
        (8, "text", False),
        (12, "text", False),
        (18, "yaml", False),
    ]
    assert found[-1].body == "a: 1\n"


def test_the_run_script_holds_the_marked_blocks_in_page_order(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "<!-- docs-test: run -->\n```sh\necho one\n```\n\n```sh\necho no\n```\n\n"
        "<!-- docs-test: run -->\n\n```sh\necho two\n```\n"
    )
    script = docsnippets.run_script(page)
    assert script is not None
    assert script.index("echo one") < script.index("echo two")
    assert "echo no" not in script
    assert script.startswith("set -euo pipefail\n")
    (tmp_path / "none.md").write_text("```sh\necho\n```\n")
    assert docsnippets.run_script(tmp_path / "none.md") is None


def test_only_shell_blocks_can_be_run(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("<!-- docs-test: run -->\n```python\nprint(1)\n```\n")
    with pytest.raises(docsnippets.SnippetError, match="only sh blocks"):
        docsnippets.run_script(page)


def test_api_objects_are_the_documents_with_api_version_and_kind() -> None:
    b = block("yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\nb: 1\n")
    assert [o["kind"] for o in docsnippets.api_objects(b)] == ["Namespace"]
