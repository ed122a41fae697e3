"""The image checks judge archive members; each finds what it is for and nothing else.
(tests/integration/test_image.py runs them on the real image, and on one broken on purpose.)"""

from __future__ import annotations

import tarfile

import pytest

from devcluster import imagebuild, imagecheck
from podcert.cli import SUBCOMMANDS

SITE = "usr/local/lib/python3.11/dist-packages"


def member(name: str, mode: int = 0o644, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = mode
    info.type = kind
    return info


@pytest.mark.parametrize(
    ("name", "found"),
    [
        pytest.param(f"{SITE}/devcluster/cli.py", "devcluster", id="devcluster package"),
        pytest.param(f"./{SITE}/examples/mtls/server.py", "examples", id="examples, ./ prefix"),
        pytest.param("usr/lib/python3/dist-packages/tests/__init__.py", "tests", id="tests"),
        pytest.param(f"{SITE}/bench.py", "bench", id="a bench module"),
        pytest.param(f"{SITE}/aiohttp/tests/test_x.py", None, id="a dependency's own tests"),
        pytest.param(f"{SITE}/signer/cli.py", None, id="podcert's signer"),
        pytest.param("src/devcluster/cli.py", None, id="outside site-packages"),
    ],
)
def test_development_packages(name: str, found: str | None) -> None:
    expected = [f"development package {found!r} is installed"] if found else []
    assert imagecheck.development_packages([member(name)]) == expected


@pytest.mark.parametrize(
    ("name", "compiler"),
    [
        pytest.param("usr/bin/gcc-12", True, id="gcc-12"),
        pytest.param("usr/bin/x86_64-linux-gnu-gcc-12", True, id="triplet gcc"),
        pytest.param("usr/local/bin/cc", True, id="cc"),
        pytest.param("usr/bin/as", True, id="assembler"),
        pytest.param("usr/bin/ld.bfd", True, id="linker"),
        pytest.param("usr/bin/ld.so", False, id="the dynamic loader"),
        pytest.param("usr/bin/ldd", False, id="ldd"),
        pytest.param("usr/bin/python3.11", False, id="python"),
        pytest.param("usr/share/doc/gcc-12", False, id="documentation folder"),
    ],
)
def test_compilers(name: str, compiler: bool) -> None:
    assert bool(imagecheck.compilers([member(name)])) is compiler


def test_world_writable_spares_sticky_folders_and_links_only() -> None:
    members = [
        member("tmp", 0o1777, tarfile.DIRTYPE),
        member("bin", 0o777, tarfile.SYMTYPE),
        member("var/spool", 0o777, tarfile.DIRTYPE),
        member("etc/podcert.conf", 0o100666),  # archives may carry the file type bits
        member("usr/bin/podcert", 0o755),
    ]
    assert imagecheck.world_writable(members) == [
        "world-writable /var/spool (mode 0777)",
        "world-writable /etc/podcert.conf (mode 0666)",
    ]


def test_leftovers_in_a_layer() -> None:
    members = [
        member("wheels/podcert-0.1.0-py3-none-any.whl"),
        member("tmp/runtime.txt"),
        member("etc/pip.conf", 0o755),
        member("mnt", 0o755, tarfile.DIRTYPE),  # the folder alone is the base's
        member("usr/share/python-wheels/pip-23.0.1-py3-none-any.whl"),  # venv's ensurepip
        member(f"{SITE}/pip/_internal/wheel_builder.py"),
    ]
    assert imagecheck.leftovers(members, "abc") == [
        "build leftover /wheels/podcert-0.1.0-py3-none-any.whl in layer abc",
        "build leftover /tmp/runtime.txt in layer abc",
        "build leftover /etc/pip.conf in layer abc",
    ]


PASSWD = "root:x:0:0:root:/root:/bin/bash\npodcert:x:65532:{gid}::/nonexistent:/usr/sbin/nologin\n"
GROUP = "root:x:0:\n{group}"


@pytest.mark.parametrize(
    ("user", "gid", "group", "findings"),
    [
        pytest.param("65532:65532", 65532, "podcert:x:65532:\n", [], id="named uid and gid"),
        pytest.param(
            "65532:65532",
            1000,
            "podcert:x:1000:\n",
            [
                "uid 65532 (podcert) has primary gid 1000 in /etc/passwd, but the image runs "
                "with gid 65532",
                "gid 65532 has no entry in /etc/group",
            ],
            id="useradd --user-group picked gid 1000 (the issue's finding)",
        ),
        pytest.param(
            "podcert",
            65532,
            "podcert:x:65532:\n",
            ["USER 'podcert' is not a numeric uid:gid (runAsNonRoot cannot verify a name)"],
            id="a user name",
        ),
        pytest.param("0:0", 65532, "", ["USER is root"], id="root"),
        pytest.param(
            "70000:70000",
            65532,
            "",
            ["uid 70000 has no entry in /etc/passwd", "gid 70000 has no entry in /etc/group"],
            id="ids the image does not name",
        ),
    ],
)
def test_account(user: str, gid: int, group: str, findings: list[str]) -> None:
    passwd = PASSWD.format(gid=gid)
    assert imagecheck.account(user, passwd, GROUP.format(group=group)) == findings


def test_stale_modules_are_named() -> None:
    checkout = {"signer/cli.py": "a", "signer/new.py": "b", "podcert/client/rest.py": "c"}
    installed = {"signer/cli.py": "old", "podcert/client/rest.py": "c", "signer/gone.py": "d"}
    assert imagecheck.stale(installed, checkout) == [
        "/signer/cli.py in the image differs from the checkout",
        "signer/new.py is not in the image",
        "signer/gone.py is in the image only",
    ]
    assert imagecheck.stale(checkout, dict(checkout)) == []


def test_product_module_paths() -> None:
    assert imagecheck.product_module(f"{SITE}/signer/issue/decide.py") == "signer/issue/decide.py"
    assert imagecheck.product_module(f"{SITE}/signer/__pycache__/x.pyc") is None
    assert imagecheck.product_module(f"{SITE}/kubernetes/client/api.py") is None


def test_every_subcommand_is_either_in_the_image_or_a_development_tool() -> None:
    """A new subcommand must be placed: the image's --help check covers the first kind, the
    'a development tool' refusal the second."""
    assert set(imagebuild.IMAGE_COMMANDS) | set(imagebuild.DEVELOPMENT_COMMANDS) == set(SUBCOMMANDS)
    assert {"signer", "shim", "audit"} <= set(imagebuild.IMAGE_COMMANDS)
    assert {"devcluster", "demo"} <= set(imagebuild.DEVELOPMENT_COMMANDS)


def test_the_checkout_modules_are_what_the_dockerfile_copies() -> None:
    modules = imagebuild.checkout_modules()
    assert "signer/cli.py" in modules and "bundles/formats.py" in modules
    assert not any(path.startswith(("devcluster/", "examples/", "tests/")) for path in modules)
    copied = {
        line.split()[1]
        for line in (imagebuild.REPO / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and "--from" not in line and line.split()[1].isidentifier()
    }
    assert copied == set(imagecheck.PRODUCT_PACKAGES)
