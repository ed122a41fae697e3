"""Reading what a kubeconfig names, as client-go would read it and no further: bounded,
non-blocking reads of regular files only, the YAML document, base64 fields decoded as Go
decodes them, a token checked to be one header-safe line. Messages name the field and file,
never a secret.
"""

from __future__ import annotations

import binascii
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from podcert.client.loadingrules import ClientConfigError, string_field

MAX_FILE_BYTES: Final = 4 << 20  # a kubeconfig, token or certificate file larger is not one


def parse(path: Path) -> dict[str, Any]:
    """The kubeconfig document at `path`: a mapping (an empty file is an empty one)."""
    try:
        text = read(path, "file").decode(errors="replace")
    except ClientConfigError as err:
        raise ClientConfigError(str(err).split(": ", 1)[-1]) from None
    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or type(err).__name__
        at = f"line {mark.line + 1}: " if mark is not None else ""
        raise ClientConfigError(f"not valid YAML ({at}{problem})") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ClientConfigError("not a kubeconfig (a YAML mapping)")
    return doc


def decoded(entry: Mapping[str, Any], key: str, what: str) -> bytes | None:
    """`entry[key]` base64-decoded as Go decodes it, None when unset."""
    value = string_field(entry, key, what)
    if value is None:
        return None
    # Go's decoder, which kubectl uses, skips line breaks; nothing else. Padding is checked
    # before CPython's strict mode, which alone takes padding after a whole quantum (AAAA==).
    text = value.replace("\n", "").replace("\r", "").encode("ascii", errors="replace")
    padding = len(text) - len(text.rstrip(b"="))
    try:
        if len(text) % 4 or padding > 2 or (padding and (len(text) - padding) % 4 != 4 - padding):
            raise ValueError
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        raise ClientConfigError(f"{what}: {key} is not valid base64") from None


def check_data(doc: Mapping[str, Any]) -> None:
    """Every cluster's and user's base64 fields decode, used or not: client-go decodes the
    whole file as it loads it, so one broken entry makes the file unusable for kubectl too."""
    for section, inner, keys in (
        ("clusters", "cluster", ("certificate-authority-data",)),
        ("users", "user", ("client-certificate-data", "client-key-data")),
    ):
        entries = doc.get(section)
        for entry in entries if isinstance(entries, list) else ():
            found = entry.get(inner) if isinstance(entry, dict) else None
            if isinstance(found, dict):
                for key in keys:
                    decoded(found, key, f"{inner} {entry.get('name')!r}")


def _why(err: OSError) -> str:
    """An OSError as the lower-case phrase every other refusal here uses ("no such file")."""
    if isinstance(err, FileNotFoundError):
        return "no such file"
    return (err.strerror or type(err).__name__).lower()


def read(path: Path, what: str) -> bytes:
    """A regular file's bytes, at most MAX_FILE_BYTES. Opened without blocking and checked to be
    a regular file before any read: a FIFO or a device named as a token or CA file (client-go
    would block on it, or read forever) is refused, naming the field."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as err:
        raise ClientConfigError(f"{what} {path}: {_why(err)}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ClientConfigError(f"{what} {path}: not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise ClientConfigError(f"{what} {path}: {_why(err)}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise ClientConfigError(f"{what} {path}: larger than {MAX_FILE_BYTES >> 20} MiB")
    return data


def token_of(data: bytes, where: str) -> str:
    """The token in `data`, checked to be one header-safe line; `where` names its field."""
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ClientConfigError(f"{where} is not ASCII text") from None
    if not token:
        raise ClientConfigError(f"{where} is empty")
    if not token.isprintable():
        raise ClientConfigError(f"{where} is not one line of text")
    return token
