"""The examples' build keys and refusals: a jar is rebuilt exactly when its sources change, and a
machine without a JDK or a folder without sources is told so before anything runs."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from devcluster import build, examplebuild


def _sources(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / "src" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_jar_key_changes_with_an_edit_a_new_file_or_a_rename(tmp_path: Path) -> None:
    _sources(tmp_path, {"a/A.java": "class A {}\n"})
    first = examplebuild.java_digest(tmp_path)
    assert examplebuild.java_digest(tmp_path) == first, "the same sources keep their key"
    (tmp_path / "src" / "a" / "A.java").write_text("class A { }\n")
    edited = examplebuild.java_digest(tmp_path)
    _sources(tmp_path, {"a/B.java": "class B {}\n"})
    added = examplebuild.java_digest(tmp_path)
    (tmp_path / "src" / "a" / "B.java").rename(tmp_path / "src" / "a" / "C.java")
    renamed = examplebuild.java_digest(tmp_path)
    assert len({first, edited, added, renamed}) == 4
    # What is not a Java source does not count.
    (tmp_path / "src" / "notes.txt").write_text("x")
    assert examplebuild.java_digest(tmp_path) == renamed


def test_the_examples_are_found_where_the_repository_keeps_them() -> None:
    assert (examplebuild.EXAMPLES_ROOT / "go" / "go.mod").is_file()
    assert "go-spiffe/v2 v2.9.0" in (examplebuild.EXAMPLES_ROOT / "go" / "go.mod").read_text()
    sources = examplebuild.java_sources(examplebuild.EXAMPLES_ROOT / "java")
    main = examplebuild.JAVA_MAIN_CLASS.replace(".", "/") + ".java"
    assert any(path.as_posix().endswith(main) for path in sources)


def test_a_folder_without_java_sources_is_refused_before_javac_runs(tmp_path: Path) -> None:
    with pytest.raises(build.BuildError, match=r"holds no \.java file"):
        examplebuild.ensure_java_program(tmp_path, "x", "x.Main")


def test_a_machine_without_javac_is_told_which_package_brings_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PODCERT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    _sources(tmp_path, {"x/Main.java": "package x; class Main {}\n"})
    with pytest.raises(build.BuildError, match="default-jdk-headless"):
        examplebuild.ensure_java_program(tmp_path, "x", "x.Main")
    with pytest.raises(build.BuildError, match="`java` on PATH"):
        examplebuild.java_command(tmp_path / "x.jar")


def test_a_cached_jar_is_used_without_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PODCERT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # javac could not run
    _sources(tmp_path, {"x/Main.java": "package x; class Main {}\n"})
    cached = tmp_path / "cache" / "bin" / f"x-{examplebuild.java_digest(tmp_path)}.jar"
    cached.parent.mkdir(parents=True)
    with zipfile.ZipFile(cached, "w") as jar:
        jar.writestr("META-INF/MANIFEST.MF", examplebuild.jar_manifest("x.Main"))
    assert examplebuild.ensure_java_program(tmp_path, "x", "x.Main") == cached


def test_the_manifest_names_the_main_class() -> None:
    manifest = examplebuild.jar_manifest("podcert.example.Main")
    assert manifest.startswith("Manifest-Version: 1.0\n")
    assert "\nMain-Class: podcert.example.Main\n" in manifest
    assert manifest.endswith("\n\n")
