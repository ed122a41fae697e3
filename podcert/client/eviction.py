"""Evicting a pod through the policy/v1 Eviction subresource, as `kubectl drain` does: the API
server checks the pod's PodDisruptionBudgets, and a 429 (a budget says not now) is asked again
after `retry` seconds until `deadline`. A pod already gone (404), or replaced by another of its
name (409: the eviction names the pod's UID), counts as evicted."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from podcert.client.rest import ApiError, Rest, path_of
from podcert.errors import CommandError, one_line


def body(namespace: str, name: str, uid: str | None = None) -> dict[str, object]:
    """The policy/v1 Eviction of one pod (of that UID only, when given)."""
    out: dict[str, object] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    if uid:
        out["deleteOptions"] = {"preconditions": {"uid": uid}}
    return out


def evict(
    rest: Rest,
    namespace: str,
    name: str,
    deadline: dt.datetime,
    now: Callable[[], dt.datetime],
    sleep: Callable[[float], None],
    retry: float,
    uid: str | None = None,
) -> int:
    """Evict one pod, asking again while a PodDisruptionBudget refuses, until `deadline`;
    CommandError naming the pod otherwise. Returns how many times a budget refused."""
    path = path_of("v1", "pods", namespace, name) + "/eviction"
    refused = 0
    while True:
        try:
            rest.request("POST", path, body=body(namespace, name, uid))
            return refused
        except ApiError as err:
            if err.status == 404 or (err.status == 409 and uid):
                return refused
            if err.status != 429 or now() >= deadline:
                raise CommandError(
                    f"evicting pod {namespace}/{name}: {one_line(str(err))}"
                ) from None
        refused += 1
        sleep(retry)
