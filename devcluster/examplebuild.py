"""Build the examples of Go and Java workloads (examples/go, examples/java) once per content of
their sources, into the cache the devcluster's other programs use (`build.cache_root`).

The Go example is a module with its go.sum, built as the tests' own Go programs are
(`build.ensure_module_program`). The Java example needs no build tool and downloads nothing:
javac compiles its sources for JAVA_RELEASE, and the classes are zipped here, with a manifest
naming the main class, into a jar that `java -jar` runs. A cached jar or binary is renamed into
place whole, so a build cut short leaves nothing that looks finished.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from devcluster.build import RECIPE, BuildError, Progress, cache_root, ensure_module_program

EXAMPLES_ROOT = Path(__file__).resolve().parent.parent / "examples"
EXAMPLE_GO = "example-go-mtls"
EXAMPLE_JAVA = "example-java-mtls"
# The Java example's main class, and the release its classes are compiled for: the oldest JDK
# with EdDSA in TLS and the records, switch expressions and HexFormat the sources use.
JAVA_MAIN_CLASS = "podcert.example.Main"
JAVA_RELEASE = "17"


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ensure_example_go(progress: Progress | None = None) -> Path:
    """examples/go (go-spiffe over a credential folder): its binary, built first if needed."""
    return ensure_module_program(EXAMPLES_ROOT / "go", EXAMPLE_GO, ".", progress)


def ensure_example_java(progress: Progress | None = None) -> Path:
    """examples/java (the JDK alone): its jar, built first if needed; run it with
    `java_command`."""
    return ensure_java_program(EXAMPLES_ROOT / "java", EXAMPLE_JAVA, JAVA_MAIN_CLASS, progress)


def java_sources(folder: Path) -> list[Path]:
    """Every .java file under `folder/src`, in a stable order."""
    return sorted(path for path in (folder / "src").rglob("*.java") if path.is_file())


def java_digest(folder: Path) -> str:
    """A short hash of the recipe, the Java release and every source (by its path under
    `folder`): the cache key of the jar, so an edit, a new file or a rename rebuilds it."""
    digest = hashlib.sha256(f"{RECIPE}\0java {JAVA_RELEASE}\0".encode())
    for path in java_sources(folder):
        name = path.relative_to(folder).as_posix()
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def jar_manifest(main_class: str) -> str:
    """META-INF/MANIFEST.MF of a jar that `java -jar` runs."""
    return f"Manifest-Version: 1.0\nMain-Class: {main_class}\nCreated-By: podcert devcluster\n\n"


def ensure_java_program(
    folder: Path, name: str, main_class: str, progress: Progress | None = None
) -> Path:
    """The cached jar of the sources under `folder/src`, made first when the cache lacks it.
    BuildError, carrying javac's own message, when there is no JDK or javac refuses (every
    lint warning is an error)."""
    sources = java_sources(folder)
    if not sources:
        raise BuildError(f"{folder / 'src'} holds no .java file")
    dest = cache_root() / "bin" / f"{name}-{java_digest(folder)}.jar"
    if dest.is_file():
        return dest
    javac = shutil.which("javac")
    if javac is None:
        raise BuildError(
            f"building {name} needs a JDK {JAVA_RELEASE} or newer and `javac` is not on PATH "
            "(Debian: apt-get install default-jdk-headless)"
        )
    say: Progress = progress or _say
    say(f"building {name} from {folder} with javac --release {JAVA_RELEASE}")
    work = cache_root() / "build" / f"{name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    classes = work / "classes"
    classes.mkdir(parents=True)
    try:
        done = subprocess.run(
            [
                javac,
                "--release",
                JAVA_RELEASE,
                "-encoding",
                "UTF-8",
                "-Xlint:all",
                "-Werror",
                "-d",
                str(classes),
                *map(str, sources),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
            raise BuildError(f"javac failed for {folder}:\n{tail}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(dest.name + ".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", jar_manifest(main_class))
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, path.relative_to(classes).as_posix())
        partial.replace(dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def java_command(jar: Path) -> list[str]:
    """The command that runs a jar `ensure_java_program` made, with the `java` on PATH."""
    java = shutil.which("java")
    if java is None:
        raise BuildError("running the Java example needs `java` on PATH")
    return [java, "-jar", str(jar)]
