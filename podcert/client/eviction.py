"""Evicting a pod through the policy/v1 Eviction subresource, as `kubectl drain` does: the API
server checks the pod's PodDisruptionBudgets, and a 429 (a budget says not now) is asked again
after `retry` seconds until `deadline`. A pod already gone (404) counts as evicted."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from podcert.client.rest import ApiError, Rest, path_of
from podcert.errors import CommandError, one_line


def body(namespace: str, name: str) -> dict[str, object]:
    """The policy/v1 Eviction of one pod."""
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }


def evict(
    rest: Rest,
    namespace: str,
    name: str,
    deadline: dt.datetime,
    now: Callable[[], dt.datetime],
    sleep: Callable[[float], None],
    retry: float,
) -> None:
    """Evict one pod, asking again while a PodDisruptionBudget refuses, until `deadline`;
    CommandError naming the pod otherwise."""
    path = path_of("v1", "pods", namespace, name) + "/eviction"
    while True:
        try:
            rest.request("POST", path, body=body(namespace, name))
            return
        except ApiError as err:
            if err.status == 404:
                return
            if err.status != 429 or now() >= deadline:
                raise CommandError(
                    f"evicting pod {namespace}/{name}: {one_line(str(err))}"
                ) from None
        sleep(retry)
