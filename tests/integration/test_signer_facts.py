"""The binding denials that depend on how the signer learns the cluster's state,
against the real API server. A node deleted (NodeNotFound), a ServiceAccount deleted or
re-created under the pod (ServiceAccountMismatch: gone, or a new UID), a pod being deleted (a
finalizer holds it) or Failed (PodNotRunnable).

The signer decides from watched caches of pods, nodes and ServiceAccounts, and reads live
whenever a cache does not vouch for a request (`Controller.facts`): a denial is only ever
written on live facts, and a lagging cache can only delay it. Each case runs both ways the
facts reach it:
- the request is pending from before the change, and the signer starts after it: its caches
  list the changed state before any worker runs;
- the signer runs through the change, its caches follow by watch, and the request comes after.
And the other side of the rule: a cache that lags behind a re-created object (new UID) never
denies a request made for the new one, because the live read is what decides.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from devcluster.testing import DevCluster, eventually
from podcert.api import keys
from podcert.client.rest import JSON, Rest, path_of
from signer import model
from tests.integration.conftest import StartSigner
from tests.integration.helpers import (
    condition,
    create_pcr,
    events_for,
    make_pod,
    pcr_spec,
    request_as_node,
    settled,
)

RUNNING = "facts.podcert.dev/running"  # served by a signer that runs through every change
LATE = "facts.podcert.dev/late"  # served only once every change is made
NODE = "facts-node"
SA = "app"
HOLD = "podcert.dev/test-hold"

# case -> (the reason, what the message must say)
CASES: dict[str, tuple[model.BindingReason, str]] = {
    "node deleted": (model.NODE_NOT_FOUND, "does not exist"),
    "service account deleted": (model.SERVICE_ACCOUNT_MISMATCH, "does not exist"),
    "service account re-created": (model.SERVICE_ACCOUNT_MISMATCH, "it was re-created"),
    "pod being deleted": (model.POD_NOT_RUNNABLE, "being deleted"),
    "pod failed": (model.POD_NOT_RUNNABLE, "phase Failed"),
}


class Held:
    """Pods a finalizer holds in deletion, released when the module is done."""

    def __init__(self, devcluster: DevCluster) -> None:
        self.core = client.CoreV1Api(devcluster.admin)
        self.pods: list[tuple[str, str]] = []

    def hold(self, namespace: str, name: str) -> None:
        self.core.patch_namespaced_pod(name, namespace, {"metadata": {"finalizers": [HOLD]}})
        self.pods.append((namespace, name))

    def release(self) -> None:
        for namespace, name in self.pods:
            self.core.patch_namespaced_pod(name, namespace, {"metadata": {"finalizers": None}})


@pytest.fixture(scope="module")
def held(devcluster: DevCluster) -> Iterator[Held]:
    pods = Held(devcluster)
    yield pods
    pods.release()


def prepare(devcluster: DevCluster, held: Held, case: str, signer: str) -> tuple[Any, JSON]:
    """A pod for `case` and the spec of a request for it, both as they are before the change:
    the pod's node, its own node for the case that deletes it."""
    ns = devcluster.namespace("facts")
    node = f"facts-gone-{ns}" if case == "node deleted" else NODE
    pod = make_pod(devcluster, ns, "app", signer, node=node, service_account=SA)
    if case == "pod being deleted":
        held.hold(ns, "app")
    return pod, pcr_spec(devcluster, pod, signer, keys.generate("ECDSAP256"))


def change(devcluster: DevCluster, case: str, pod: Any) -> None:
    """Make `case` happen, and wait until the API server shows it."""
    core = client.CoreV1Api(devcluster.admin)
    ns, name = pod.metadata.namespace, pod.metadata.name
    rest = Rest(devcluster.admin)
    if case == "node deleted":
        core.delete_node(pod.spec.node_name)
        node_path = path_of("v1", "nodes", None, pod.spec.node_name)
        eventually(lambda: rest.get(node_path) is None, what="the node to be gone")
    elif case == "service account deleted":
        core.delete_namespaced_service_account(SA, ns)
    elif case == "service account re-created":
        old = core.read_namespaced_service_account(SA, ns).metadata.uid
        core.delete_namespaced_service_account(SA, ns)
        core.create_namespaced_service_account(ns, {"metadata": {"name": SA}})
        assert core.read_namespaced_service_account(SA, ns).metadata.uid != old
    elif case == "pod being deleted":
        core.delete_namespaced_pod(name, ns)
        assert core.read_namespaced_pod(name, ns).metadata.deletion_timestamp is not None
    elif case == "pod failed":
        current = core.read_namespaced_pod(name, ns)
        current.status.phase = "Failed"
        core.replace_namespaced_pod_status(name, ns, current)
    else:
        raise AssertionError(case)


def request(devcluster: DevCluster, pod: Any, spec: JSON) -> JSON:
    """The request as spec'd before the change. Made by an admin: NodeRestriction would stop a
    node making some of these now, and the signer must not count on it (it cannot see who
    made a request, and anyone with `create` may)."""
    return create_pcr(devcluster.admin, pod.metadata.namespace, spec)


def assert_denied(devcluster: DevCluster, pcr: JSON, case: str) -> None:
    reason, says = CASES[case]
    done = settled(devcluster, pcr, timeout=30)
    cond = condition(done)
    assert (cond.type, cond.reason) == ("Denied", reason), cond
    assert says in cond.message
    assert "certificateChain" not in done["status"]
    assert [e["reason"] for e in events_for(devcluster, done)] == [reason]


@pytest.fixture(scope="module")
def late(devcluster: DevCluster, start_signer: StartSigner, held: Held) -> dict[str, JSON]:
    """Every case's request pending from before its change, then a signer started after all
    of them: its caches list the changed state before its workers settle anything."""
    pending = {}
    for case in CASES:
        pod, spec = prepare(devcluster, held, case, LATE)
        pending[case] = request(devcluster, pod, spec)
        change(devcluster, case, pod)
    start_signer(LATE, namespace="podcert-facts-late")
    return pending


@pytest.fixture(scope="module")
def running(start_signer: StartSigner) -> Any:
    return start_signer(RUNNING, namespace="podcert-facts")


@pytest.mark.parametrize("case", CASES)
def test_a_request_pending_across_the_change_is_denied_by_a_signer_that_starts_after_it(
    devcluster: DevCluster, late: dict[str, JSON], case: str
) -> None:
    assert_denied(devcluster, late[case], case)


@pytest.mark.parametrize("case", CASES)
def test_a_request_after_the_change_is_denied_by_a_signer_that_ran_through_it(
    devcluster: DevCluster, running: Any, held: Held, case: str
) -> None:
    pod, spec = prepare(devcluster, held, case, RUNNING)
    # Before the change the same facts are good: the signer issues for them.
    _, before = request_as_node(devcluster, pod, RUNNING)
    assert condition(settled(devcluster, before)).type == "Issued"

    change(devcluster, case, pod)

    assert_denied(devcluster, request(devcluster, pod, spec), case)


def test_a_request_for_a_re_created_service_account_is_issued_even_if_the_cache_lags(
    devcluster: DevCluster, running: Any, held: Held
) -> None:
    """The new ServiceAccount's UID reaches the request (the node reads it live) as soon as
    it exists; the signer's cache may still hold the old one, which does not vouch, so the
    signer reads live and issues: a lagging cache delays, never denies."""
    pod, _ = prepare(devcluster, held, "service account re-created", RUNNING)
    change(devcluster, "service account re-created", pod)

    _, pcr = request_as_node(devcluster, pod, RUNNING)

    done = settled(devcluster, pcr, timeout=30)
    assert condition(done).type == "Issued", condition(done)
    assert done["spec"]["serviceAccountUID"] == pcr["spec"]["serviceAccountUID"]


def test_a_request_for_a_pod_re_created_under_its_name_is_issued_even_if_the_cache_lags(
    devcluster: DevCluster, running: Any, held: Held
) -> None:
    pod, _ = prepare(devcluster, held, "pod failed", RUNNING)
    core = client.CoreV1Api(devcluster.admin)
    ns = pod.metadata.namespace
    core.delete_namespaced_pod("app", ns, grace_period_seconds=0)
    eventually(
        lambda: Rest(devcluster.admin).get(path_of("v1", "pods", ns, "app")) is None,
        what="the old pod to be gone",
    )
    again = make_pod(devcluster, ns, "app", RUNNING, node=NODE, service_account=SA)
    assert again.metadata.uid != pod.metadata.uid

    _, pcr = request_as_node(devcluster, again, RUNNING)

    done = settled(devcluster, pcr, timeout=30)
    assert condition(done).type == "Issued", condition(done)
