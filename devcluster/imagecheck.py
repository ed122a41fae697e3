"""What podcert's image must and must not hold, judged from its files. Pure: each
check takes the members of an archive (`podman export` for the flattened file system, `podman
save` for each layer) and returns findings, one line each; `devcluster.imagebuild` feeds them.

- no development code: devcluster, examples, tests or bench as installed packages;
- no compilers or assemblers (nothing in the image should build code at run time);
- nothing world-writable but sticky folders (/tmp), whose files only their owner may replace;
- the user it runs as exists, with that primary group, and the group exists too;
- no build leftovers in ANY layer: a wheel, /wheels, the lock, pip's cache, a bind mount's
  empty mount point. A file deleted in a later layer still ships in the earlier one;
- podcert's modules as the checkout has them: a build cache that reused an older layer shows.
"""

from __future__ import annotations

import re
import stat
import tarfile
from collections.abc import Iterable

DEVELOPMENT_PACKAGES = ("devcluster", "examples", "tests", "bench")

_SITE = r"usr/(?:local/)?lib/python3[^/]*/(?:site|dist)-packages"
_DEV_PACKAGE = re.compile(rf"^{_SITE}/({'|'.join(DEVELOPMENT_PACKAGES)})(?:/|\.py$)")
_BIN = r"(?:usr/)?(?:local/)?s?bin"
_COMPILER = re.compile(
    rf"^{_BIN}/(?:\w+-linux-gnu-)?(?:(?:gcc|g\+\+|cc|c\+\+|cpp|gfortran)(?:-\d[\w.]*)?"
    r"|as|ld(?:\.bfd|\.gold)?|clang(?:\+\+)?(?:-\d+)?|tcc|rustc|go|javac)$"
)
_LEFTOVER = re.compile(
    r"^(?:wheels(?:/|$)|mnt/.|tmp/.|root/\.cache/pip(?:/|$)|etc/pip\.conf$)|\.whl$|"
    r"(?:^|/)runtime\.txt$"
)
# Debian's python3-venv keeps pip's and setuptools' wheels here for `python -m venv`: part of
# the base, as in the official images, not something a build left behind.
_ENSUREPIP = "usr/share/python-wheels/"


def normalized(name: str) -> str:
    """A member's path without a leading ./ or / (archives write either)."""
    return name.removeprefix("./").lstrip("/").rstrip("/")


def development_packages(members: Iterable[tarfile.TarInfo]) -> list[str]:
    found = {match.group(1) for m in members if (match := _DEV_PACKAGE.match(normalized(m.name)))}
    return [f"development package {name!r} is installed" for name in sorted(found)]


def compilers(members: Iterable[tarfile.TarInfo]) -> list[str]:
    return [
        f"compiler /{path}"
        for m in members
        if _COMPILER.match(path := normalized(m.name)) and not m.isdir()
    ]


def world_writable(members: Iterable[tarfile.TarInfo]) -> list[str]:
    found = []
    for m in members:
        if m.issym() or m.islnk() or not m.mode & stat.S_IWOTH:
            continue
        if m.isdir() and m.mode & stat.S_ISVTX:
            continue  # /tmp: anyone may add a file, only its owner replace or remove it
        found.append(f"world-writable /{normalized(m.name)} (mode {stat.S_IMODE(m.mode):04o})")
    return found


def leftovers(members: Iterable[tarfile.TarInfo], layer: str) -> list[str]:
    return [
        f"build leftover /{path} in layer {layer}"
        for m in members
        if _LEFTOVER.search(path := normalized(m.name)) and not path.startswith(_ENSUREPIP)
    ]


# The packages the image installs from this checkout (the Dockerfile copies exactly these).
PRODUCT_PACKAGES = ("podcert", "signer", "kubelet_shim", "audit", "bundles")
_PRODUCT_MODULE = re.compile(rf"^{_SITE}/((?:{'|'.join(PRODUCT_PACKAGES)})/.*\.py)$")


def product_module(name: str) -> str | None:
    """`signer/cli.py` for an installed module of podcert's, else None."""
    match = _PRODUCT_MODULE.match(normalized(name))
    return match.group(1) if match else None


def stale(installed: dict[str, str], checkout: dict[str, str]) -> list[str]:
    """Modules (path -> digest) whose installed copy differs from the checkout's, or that only
    one side has."""
    findings = [
        f"/{path} in the image differs from the checkout"
        for path in sorted(installed.keys() & checkout.keys())
        if installed[path] != checkout[path]
    ]
    findings += [f"{path} is not in the image" for path in sorted(checkout.keys() - installed)]
    findings += [f"{path} is in the image only" for path in sorted(installed.keys() - checkout)]
    return findings


def _table(text: str) -> list[list[str]]:
    return [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]


def account(user: str, passwd: str, group: str) -> list[str]:
    """The image's USER (`uid:gid`, numeric as Kubernetes' runAsNonRoot needs) names a non-root
    user of /etc/passwd whose primary group is that gid, and a group of /etc/group."""
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or not gid.isdigit():
        return [f"USER {user!r} is not a numeric uid:gid (runAsNonRoot cannot verify a name)"]
    findings = []
    if int(uid) == 0:
        findings.append("USER is root")
    users = [row for row in _table(passwd) if len(row) >= 4 and row[2] == uid]
    if not users:
        findings.append(f"uid {uid} has no entry in /etc/passwd")
    elif users[0][3] != gid:
        findings.append(
            f"uid {uid} ({users[0][0]}) has primary gid {users[0][3]} in /etc/passwd, "
            f"but the image runs with gid {gid}"
        )
    if not any(len(row) >= 3 and row[2] == gid for row in _table(group)):
        findings.append(f"gid {gid} has no entry in /etc/group")
    return findings


def filesystem(members: list[tarfile.TarInfo]) -> list[str]:
    """Every check on the flattened file system (`podman export`)."""
    return [*development_packages(members), *compilers(members), *world_writable(members)]
