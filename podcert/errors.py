"""Errors every podcert command answers the same way, and the exit codes they map to: one line
naming what is wrong, then exit 2 (the command was told something it cannot use), 3 (it could not
read the cluster) or 1 (it could not do its job, or what it read shows findings).

Kept free of podcert's and the client's imports so the dispatcher can catch them without loading
any command's packages.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Final, TypeVar

T = TypeVar("T")

# Every read command's exit codes, in one place: scripts tell "fix your flags" (2) from "the
# cluster did not answer, try again" (3) from "it answered, and something is wrong" (1).
EXIT_OK: Final = 0
EXIT_FINDINGS: Final = 1  # what was read shows a problem, or the command could not do its job
EXIT_USAGE: Final = 2  # a flag, an argument or a file the command was pointed at is unusable
EXIT_CLUSTER_UNREADABLE: Final = 3  # the API server could not be reached or refused the reads


class ConfigError(Exception):
    """A command's configuration (a kubeconfig, credentials, a file it was pointed at, a flag's
    value) cannot be used. The message says which and why, in one line, and never quotes a
    credential. Exit 2."""


class CommandError(Exception):
    """The command ran and could not do its job for a reason it names in one line (the API
    server refused its credentials, a state folder holds no cluster), a reason no waiting
    fixes. Exit 1."""


class ClusterUnreadable(CommandError):
    """A read command could not read the cluster: the API server did not answer, refused the
    identity, or answered what is not the API. The message names what was being read. Exit 3."""


def one_line(text: str, limit: int = 500) -> str:
    """`text` as one line of at most `limit` characters: what a command prints about an error
    whose message it does not control (a server's answer, an OS error)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def show(text: str, limit: int = 100) -> str:
    """`text` quoted for a message: control characters escaped, absurd lengths cut."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


class Refused(CommandError):
    """The API server refused a command's credentials (401) or what they may do (403): waiting
    does not change that, so a process that is starting says so and exits instead."""


# Start-up retries 0.5 s, 1 s, 2 s... apart: four refusals in a row take about 4 s.
REFUSALS_BEFORE_GIVING_UP = 4
REFUSED_HINTS = {
    401: "the credentials are not valid for this API server (check the kubeconfig's user)",
    403: "the identity lacks a permission (check its RBAC against manifests/)",
}


def refusal_is_final(
    attempt: Callable[[], T], tries: int = REFUSALS_BEFORE_GIVING_UP
) -> Callable[[], T]:
    """`attempt` with the `tries`-th refusal in a row by the API server (an error whose `status`
    is 401 or 403) turned into Refused, so that a retry loop over the API's errors stops on it.
    The first few pass through as they are: a binding created just before the process started
    can take a moment to reach the API server's authorizer."""
    refusals = 0

    @functools.wraps(attempt)
    def checked() -> T:
        nonlocal refusals
        try:
            result = attempt()
        except Exception as err:
            hint = REFUSED_HINTS.get(getattr(err, "status", None))  # type: ignore[arg-type]
            if hint is None:
                refusals = 0
                raise
            refusals += 1
            if refusals < tries:
                raise
            raise Refused(f"{hint}: {one_line(str(err))}") from None
        refusals = 0
        return result

    return checked
