"""The SPIFFE Filesystem Delivery layout (spiffe/spiffe PR 376): a credential folder, its names,
and what its files must hold. Pure: names, bytes and injected lookups in, values out;
`bundles.foldersource` reads the folder.

A credential folder holds `credential-bundle.pem` (one PKCS#8 `PRIVATE KEY` block first, then
the chain, leaf first) and one `<trust-domain>.trust-bundle.pem` per trust domain the workload
may talk to: its own, and each federated one. Anything else in it (the atomic writer's `..data`
and timestamped folders, other projected files) is ignored.

Guarantees:

- `locate` finds the folder as the standard's section 3.1 says: `SPIFFE_CREDENTIAL_FOLDER` when
  it is set and not empty (used as given, present or not: an operator who names a folder means
  it), else the first default folder that holds a `credential-bundle.pem`
  (`/run/secrets/workload-spiffe-credentials`, then `/var/run/secrets/...`), else None.
- `credential_bundle_problem` says what breaks the standard's three rules for the credential
  bundle that `bundles.formats.load_credential` itself lets through: the key block first, and no
  text between or around blocks (line breaks and spaces aside); PEM headers and other block types
  `load_credential` refuses already.
- `trust_domain_of` maps a file name to its trust domain, or None for a file that is not a trust
  bundle or whose name is not a valid trust domain (such a file is never trusted).
- `stale` decides when a reload is due: at most every `MAX_RELOAD_INTERVAL` (five minutes, the
  standard's bound on noticing a new credential or a removed trust domain).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from bundles import pem
from bundles.spiffe import SpiffeIdError, parse_trust_domain

ENV_VAR: Final = "SPIFFE_CREDENTIAL_FOLDER"
DEFAULT_FOLDERS: Final = (
    Path("/run/secrets/workload-spiffe-credentials"),
    Path("/var/run/secrets/workload-spiffe-credentials"),
)
CREDENTIAL_BUNDLE: Final = "credential-bundle.pem"
TRUST_BUNDLE_SUFFIX: Final = ".trust-bundle.pem"
# The standard's bound: a new credential, and a removed trust domain, are noticed within it.
MAX_RELOAD_INTERVAL: Final = dt.timedelta(minutes=5)

_KEY_LABEL: Final = "PRIVATE KEY"
_BEGIN: Final = b"-----BEGIN "
_END: Final = b"-----END "
_BLANK: Final = b" \t\r\n"


def locate(
    environ: Mapping[str, str],
    exists: Callable[[Path], bool],
    defaults: Sequence[Path] = DEFAULT_FOLDERS,
) -> Path | None:
    """The credential folder, or None when the workload has been issued no SPIFFE credential.

    `exists(path)` tells whether a file is there (injected: tests point `defaults` at folders
    of their own).
    """
    named = environ.get(ENV_VAR, "")
    if named and "\0" not in named:
        return Path(named)
    return next((folder for folder in defaults if exists(folder / CREDENTIAL_BUNDLE)), None)


def locate_here(defaults: Sequence[Path] = DEFAULT_FOLDERS) -> Path | None:
    """`locate` with this process's environment and file system."""
    return locate(os.environ, Path.is_file, defaults)


def trust_bundle_name(trust_domain: str) -> str:
    """The file name of a trust domain's bundle; the trust domain is checked first."""
    return parse_trust_domain(trust_domain) + TRUST_BUNDLE_SUFFIX


def trust_domain_of(name: str) -> str | None:
    """The trust domain whose bundle a file of this name holds, or None (not a trust bundle's
    name, a hidden name, or not a valid trust domain)."""
    if name.startswith(".") or not name.endswith(TRUST_BUNDLE_SUFFIX):
        return None
    candidate = name[: -len(TRUST_BUNDLE_SUFFIX)]
    if not candidate or candidate.startswith("spiffe:"):
        return None
    try:
        return parse_trust_domain(candidate)
    except SpiffeIdError:
        return None


def credential_bundle_problem(data: bytes) -> str | None:
    """What in a credential bundle breaks the standard's layout beyond what
    `bundles.formats.load_credential` refuses, or None: the first block must be the private key,
    and nothing but line breaks and spaces may stand before, between or after blocks."""
    try:
        blocks = pem.read(bytes(data), what=CREDENTIAL_BUNDLE)
    except pem.PemError as err:
        return str(err)
    if not blocks:
        return f"{CREDENTIAL_BUNDLE} holds no PEM block"
    if blocks[0].label != _KEY_LABEL:
        return (
            f"{CREDENTIAL_BUNDLE} starts with a {blocks[0].label!r} block; the standard puts "
            "the PRIVATE KEY block first"
        )
    return _between_blocks(data)


def trust_bundle_problem(data: bytes, name: str) -> str | None:
    """Text before, between or after a trust bundle's blocks (the standard forbids it), or None."""
    return _between_blocks(data, what=name)


def _between_blocks(data: bytes, *, what: str = CREDENTIAL_BUNDLE) -> str | None:
    # `pem.read` has accepted the structure: every BEGIN has its END line, so walking from one
    # END line's end to the next BEGIN finds exactly the text outside the blocks.
    position = 0
    while True:
        begin = data.find(_BEGIN, position)
        gap = data[position : begin if begin >= 0 else len(data)]
        if gap.strip(_BLANK):
            where = "after the last block" if begin < 0 else "before or between blocks"
            return f"{what} holds text {where}; the standard allows none"
        if begin < 0:
            return None
        end = data.find(_END, begin)
        newline = data.find(b"\n", end)
        position = len(data) if newline < 0 else newline + 1


def stale(checked_at: dt.datetime | None, now: dt.datetime, interval: dt.timedelta) -> bool:
    """Whether the folder is due for a re-read: never read, or read `interval` ago or longer
    (`interval` is capped at `MAX_RELOAD_INTERVAL`, whatever the caller asks)."""
    if checked_at is None:
        return True
    return now - checked_at >= min(interval, MAX_RELOAD_INTERVAL)


def check_interval(seconds: float) -> float:
    """`seconds` if it is a reload interval the standard allows, else ValueError naming it."""
    if not 0 < seconds <= MAX_RELOAD_INTERVAL.total_seconds():
        raise ValueError(
            f"interval must be above 0 and at most {MAX_RELOAD_INTERVAL.total_seconds():.0f} "
            f"seconds (the standard's reload bound), got {seconds}"
        )
    return seconds
