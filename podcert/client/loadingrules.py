"""client-go's loading rules, as kubectl applies them: which kubeconfig files a command a person
runs reads, how several merge, which context, cluster and user are used, the namespace, and
whom requests impersonate. Pure: files are read and parsed by `podcert.client.kubeconfig`.

Guaranteed, as clientcmd does it (tests/integration/test_reference_kubeconfig.py pins it):
- `--kubeconfig` alone is read (it must exist); else every file of `KUBECONFIG` (split on
  `os.pathsep`, empty entries and repeats dropped, missing files skipped); else
  `$HOME/.kube/config`.
- Merging: a cluster, user or context name is taken whole from the first file that defines it;
  `current-context` from the first file that sets it. Within one file a repeated name is taken
  from its last entry. Relative file names in an entry are read from its own file's folder.
- `--context` replaces `current-context`; the context's `namespace` is the default namespace,
  else "default".
- Impersonation: `--as` replaces the user's `as`, `--as-group` (when given) the user's
  `as-groups`; groups or a UID without a user to impersonate are refused, as client-go's
  validation refuses them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podcert.errors import ConfigError


class ClientConfigError(ConfigError):
    """The kubeconfig (or the pod's in-cluster credentials) cannot be used; says which and why."""


@dataclass(frozen=True)
class Entry:
    """One cluster, user or context: its own mapping and the file it came from."""

    value: Mapping[str, Any]
    origin: Path

    @property
    def base(self) -> Path:
        """The folder relative file names in this entry are read from."""
        return self.origin.parent


@dataclass(frozen=True)
class Merged:
    """Several kubeconfig files as one, as clientcmd merges them."""

    clusters: Mapping[str, Entry]
    users: Mapping[str, Entry]
    contexts: Mapping[str, Entry]
    current_context: str | None


@dataclass(frozen=True)
class Impersonation:
    """Whom requests act as (`Impersonate-User`, `-Uid`, `-Group` headers)."""

    user: str
    groups: tuple[str, ...] = ()
    uid: str | None = None

    def describe(self) -> str:
        groups = f" in groups {', '.join(self.groups)}" if self.groups else ""
        return f"impersonating {self.user!r}{groups}"


@dataclass(frozen=True)
class Selected:
    """What one context names: its cluster and user (None: no credentials) and namespace."""

    context: str
    cluster_name: str
    cluster: Entry
    user_name: str | None
    user: Entry | None
    namespace: str | None  # the context's own; None when it sets none


def kubeconfig_files(environ: Mapping[str, str], home: Path) -> tuple[Path, ...]:
    """The files kubectl reads without `--kubeconfig`: KUBECONFIG's, else ~/.kube/config."""
    listed = environ.get("KUBECONFIG", "")
    if listed:
        unique = dict.fromkeys(p for p in listed.split(os.pathsep) if p)
        return tuple(Path(p) for p in unique)
    return (home / ".kube" / "config",)


def _entries(doc: Mapping[str, Any], section: str, origin: Path) -> dict[str, Entry]:
    """The named entries of `section` (clusters, users, contexts) of one file."""
    inner = section[:-1]
    entries = doc.get(section) or []
    if not isinstance(entries, list):
        raise ClientConfigError(f"{section}: not a list")
    found: dict[str, Entry] = {}
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            continue
        value = entry.get(inner) or {}
        if not isinstance(value, dict):
            raise ClientConfigError(f"{section} {entry['name']!r}: {inner} is not a mapping")
        found[entry["name"]] = Entry(value, origin)  # a repeated name: the last one (client-go)
    return found


def merge(documents: Sequence[tuple[Path, Mapping[str, Any]]]) -> Merged:
    """The files (path, parsed document), first to last, merged: first definition wins."""
    sections: dict[str, dict[str, Entry]] = {"clusters": {}, "users": {}, "contexts": {}}
    current: str | None = None
    for origin, doc in documents:
        for section, merged in sections.items():
            try:
                entries = _entries(doc, section, origin)
            except ClientConfigError as err:
                raise ClientConfigError(f"kubeconfig {origin}: {err}") from None
            for name, entry in entries.items():
                merged.setdefault(name, entry)
        value = doc.get("current-context")
        if current is None and isinstance(value, str) and value:
            current = value
    return Merged(sections["clusters"], sections["users"], sections["contexts"], current)


def string_field(entry: Mapping[str, Any], key: str, what: str) -> str | None:
    """`entry[key]` when it is a non-empty string, None when unset or empty; else refused."""
    value = entry.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ClientConfigError(f"{what}: {key} is not a string")
    return value


def select(merged: Merged, context: str | None = None) -> Selected:
    """The context `context` (else the current one) and the cluster and user it names."""
    name = context or merged.current_context
    if not name:
        raise ClientConfigError("current-context is not set (give --context)")
    if name not in merged.contexts:
        flag = "--context" if context else "current-context"
        raise ClientConfigError(f"{flag}: no context named {name!r} in contexts")
    chosen = merged.contexts[name].value
    what = f"context {name!r}"
    cluster_name = string_field(chosen, "cluster", what)
    if cluster_name is None:
        raise ClientConfigError(f"{what}: cluster is not set")
    if cluster_name not in merged.clusters:
        raise ClientConfigError(f"no cluster named {cluster_name!r} in clusters")
    user_name = string_field(chosen, "user", what)
    if user_name is not None and user_name not in merged.users:
        # client-go goes on without credentials; a typo is likelier than a wish for none.
        raise ClientConfigError(f"no user named {user_name!r} in users")
    return Selected(
        context=name,
        cluster_name=cluster_name,
        cluster=merged.clusters[cluster_name],
        user_name=user_name,
        user=merged.users[user_name] if user_name is not None else None,
        namespace=string_field(chosen, "namespace", what),
    )


def namespace_of(selected: Selected) -> str:
    """The namespace a command uses when none is given: the context's, else "default"."""
    return selected.namespace or "default"


def _header_value(value: str, what: str) -> str:
    if not value.isprintable():
        raise ClientConfigError(f"{what} is not one line of printable text")
    return value


def impersonation(
    user: Mapping[str, Any],
    what: str,
    as_user: str | None = None,
    as_groups: Sequence[str] = (),
) -> Impersonation | None:
    """Whom to impersonate: the flags over the kubeconfig user's `as`, `as-groups`, `as-uid`."""
    name = as_user or string_field(user, "as", what)
    groups: Any = list(as_groups) or user.get("as-groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, str) and g for g in groups):
        raise ClientConfigError(f"{what}: as-groups is not a list of group names")
    uid = string_field(user, "as-uid", what)
    if user.get("as-user-extra"):
        raise ClientConfigError(f"{what}: as-user-extra: impersonating extra fields is not done")
    if name is None:
        if groups or uid:
            flag = "--as-group" if as_groups else "as-groups or as-uid"
            raise ClientConfigError(f"{what}: {flag} given without a user to impersonate (--as)")
        return None
    return Impersonation(
        user=_header_value(name, "--as" if as_user else f"{what}: as"),
        groups=tuple(_header_value(g, "--as-group") for g in groups),
        uid=_header_value(uid, f"{what}: as-uid") if uid else None,
    )
