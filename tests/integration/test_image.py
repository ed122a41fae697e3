"""podcert's image, built here by podman from the Dockerfile (cached by its layers; the
first build makes the base image too, about 3 minutes) and checked: every subcommand's --help,
read-only and unprivileged; a named non-root uid and gid; no development code, compiler,
world-writable file or build leftover in any layer; podcert's modules as checked out. The checks
also run on an image broken on purpose, to show each one can fail."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster import imagebuild, podman

BROKEN = "localhost/podcert-broken:test"
SITE = "/usr/local/lib/python3.11/dist-packages"


@pytest.fixture(scope="module")
def images() -> None:
    if os.geteuid() != 0:
        pytest.fail("building images needs root (podman's storage, Debian's packages)")
    imagebuild.build(lambda line: print(line, flush=True))


def test_the_image_passes_every_check(images: None) -> None:
    report = imagebuild.check()
    print("\n".join(report.lines()))
    assert report.findings == []
    assert report.size > 50_000_000, "the size reported is the image's, not a layer's"
    for name in imagebuild.IMAGE_COMMANDS:
        assert f"podcert {name} --help" in report.passed
    for name in imagebuild.DEVELOPMENT_COMMANDS:
        assert f"podcert {name}: not installed here" in report.passed


def test_the_examples_image_runs_both_halves_of_the_pair(images: None) -> None:
    report = imagebuild.check_examples()
    print("\n".join(report.lines()))
    assert report.findings == []
    assert len(report.passed) == 2


@pytest.fixture
def broken(images: None, tmp_path: Path) -> Iterator[str]:
    """The image with one of each fault the checks look for; the wheel is removed in a later
    layer, as the old Dockerfile did with /wheels."""
    (tmp_path / "Containerfile").write_text(
        f"FROM {imagebuild.IMAGE}\n"
        "USER 0\n"
        "RUN mkdir /wheels && touch /wheels/podcert-0.1.0-py3-none-any.whl\n"
        "RUN rm -r /wheels\n"
        f"RUN mkdir {SITE}/devcluster && touch {SITE}/devcluster/__init__.py"
        " && install -m 0666 /dev/null /etc/open.conf"
        " && ln -s /usr/bin/python3 /usr/local/bin/gcc"
        f" && echo '# edited' >> {SITE}/signer/cli.py\n"
        "USER 65532:1000\n"
    )
    podman.run("build", "--pull=never", "--network=none", f"--tag={BROKEN}", str(tmp_path))
    yield BROKEN
    podman.run("rmi", "--force", BROKEN, check=False)


def test_the_checks_find_each_fault_of_a_broken_image(broken: str) -> None:
    report = imagebuild.check(broken)
    print("\n".join(report.lines()))
    findings = "\n".join(report.findings)
    for expected in (
        "USER is '65532:1000', not 65532:65532",
        "uid 65532 (podcert) has primary gid 65532 in /etc/passwd, but the image runs with "
        "gid 1000",
        "gid 1000 has no entry in /etc/group",
        "development package 'devcluster' is installed",
        "compiler /usr/local/bin/gcc",
        "world-writable /etc/open.conf (mode 0666)",
        "/signer/cli.py in the image differs from the checkout",
        "build leftover /wheels/podcert-0.1.0-py3-none-any.whl in layer",
        "id in the image says 'uid=65532(podcert) gid=1000",
    ):
        assert expected in findings
    # What was not broken still passes.
    assert "podcert signer --help" in report.passed
