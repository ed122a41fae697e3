"""The reads behind the report commands: a failed read the command needs is ClusterUnreadable
naming what was read; a read refused for lack of RBAC becomes a line of the report."""

from __future__ import annotations

from typing import Any

import pytest

from podcert.client.rest import ApiError
from podcert.errors import ClusterUnreadable
from signer.report import fetch


class Answers:
    """A Rest whose `get` answers from a table of paths (an ApiError is raised)."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers

    def get(self, path: str) -> Any:
        answer = self.answers.get(path)
        if isinstance(answer, ApiError):
            raise answer
        return answer

    def request(self, method: str, path: str, **_: Any) -> Any:
        return self.get(path)


def test_an_api_failure_names_what_was_being_read() -> None:
    expected = "cannot read the thing: 503 Unavailable: busy"
    with pytest.raises(ClusterUnreadable, match=expected), fetch.reading("the thing"):
        raise ApiError(503, "Unavailable", "busy")


def test_a_lease_the_identity_may_not_read_is_reported_as_unreadable_not_absent() -> None:
    path = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l"
    refused = Answers({path: ApiError(403, "Forbidden", "no")})
    said = fetch.lease(refused, "ns", "l")  # type: ignore[arg-type]
    assert said == "the lease ns/l is not readable by this identity (403 Forbidden)"
    assert fetch.lease(Answers({}), "ns", "l") is None  # type: ignore[arg-type]
    down = Answers({path: ApiError(0, "Unavailable", "cannot reach")})
    with pytest.raises(ClusterUnreadable, match="the signer's lease ns/l"):
        fetch.lease(down, "ns", "l")  # type: ignore[arg-type]


def test_a_deployment_list_refused_is_no_deployment() -> None:
    path = "/apis/apps/v1/namespaces/ns/deployments"
    assert fetch.deployment(Answers({path: ApiError(403, "Forbidden", "")}), "ns") is None  # type: ignore[arg-type]
    assert fetch.deployment(Answers({path: {"items": []}}), "ns") is None  # type: ignore[arg-type]
    found = fetch.deployment(Answers({path: {"items": [{"metadata": {"name": "d"}}]}}), "ns")  # type: ignore[arg-type]
    assert found == {"metadata": {"name": "d"}}
