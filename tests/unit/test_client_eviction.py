"""podcert.client.eviction: the policy/v1 Eviction body names the pod; an eviction a disruption
budget refuses (429) is asked for again until accepted or the deadline passes; a pod already
gone counts as evicted. The API's answers are recorded in order (no server: the retry is the
logic under test)."""

from __future__ import annotations

import datetime as dt
from typing import Any, cast

import pytest

from podcert.client import eviction
from podcert.client.rest import ApiError, Rest
from podcert.errors import CommandError

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class Answers:
    """Recorded answers to the eviction POST, in order; records the paths asked."""

    def __init__(self, *answers: ApiError | None) -> None:
        self.answers = list(answers)
        self.paths: list[str] = []

    def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        assert method == "POST"
        self.paths.append(path)
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer
        return {}


def test_an_eviction_names_the_pod() -> None:
    body = eviction.body("ns", "a")
    assert body["kind"] == "Eviction" and body["apiVersion"] == "policy/v1"
    assert body["metadata"] == {"name": "a", "namespace": "ns"}


def test_an_eviction_refused_by_a_budget_is_asked_again() -> None:
    answers = Answers(ApiError(429, "TooManyRequests", "pdb"), None)
    slept: list[float] = []
    deadline = T0 + dt.timedelta(minutes=1)
    refused = eviction.evict(
        cast(Rest, answers), "ns", "a", deadline, lambda: T0, slept.append, 5.0
    )
    assert answers.paths == ["/api/v1/namespaces/ns/pods/a/eviction"] * 2 and slept == [5.0]
    assert refused == 1


def test_an_eviction_names_the_pods_uid_and_a_replaced_pod_counts_as_evicted() -> None:
    body = eviction.body("ns", "a", "uid-1")
    assert body["deleteOptions"] == {"preconditions": {"uid": "uid-1"}}
    answers = Answers(ApiError(409, "Conflict", "uid precondition"))
    eviction.evict(cast(Rest, answers), "ns", "a", T0, lambda: T0, lambda _: None, 5.0, "uid-1")
    assert len(answers.paths) == 1


def test_a_pod_already_gone_counts_as_evicted() -> None:
    answers = Answers(ApiError(404, "NotFound", "gone"))
    eviction.evict(cast(Rest, answers), "ns", "a", T0, lambda: T0, lambda _: None, 5.0)
    assert len(answers.paths) == 1


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(ApiError(429, "TooManyRequests", "pdb"), id="refused past the deadline"),
        pytest.param(ApiError(403, "Forbidden", "no"), id="forbidden"),
    ],
)
def test_an_eviction_that_cannot_happen_fails_naming_the_pod(error: ApiError) -> None:
    with pytest.raises(CommandError, match="ns/a"):
        eviction.evict(cast(Rest, Answers(error)), "ns", "a", T0, lambda: T0, lambda _: None, 5.0)
