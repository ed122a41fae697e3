"""The watched caches vouch for a request exactly when decide's binding checks pass on them.

The controller trusts its pod/node/ServiceAccount caches only when they agree with the request on
every point of the node restriction; otherwise it reads live, so a lagging cache never denies a
request. Both sides use one rule (`decide.binding_problem`); these properties pin that, for any
facts: a cache that vouches is never one decide would deny on, and one that does not vouch is
always read again."""

from __future__ import annotations

import math
from typing import Any, cast

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st

from signer import model
from signer.authority.castore import CAStore
from signer.issue.controller import Controller, utcnow
from signer.issue.decide import binding_problem, decide
from signer.kube import SignerKube
from signer.metrics import Metrics
from signer.policy import default_policy
from tests.signer_world import ISSUER, NOW, POLICY, SIGNER, LiveKube, make_request

# The node's stub CSR: empty subject, signed with the subject key.
STUB_CSR = (
    x509.CertificateSigningRequestBuilder()
    .subject_name(x509.Name([]))
    .sign(ec.generate_private_key(ec.SECP256R1()), hashes.SHA256())
    .public_bytes(serialization.Encoding.DER)
)
REQUEST = make_request(stub_csr=STUB_CSR)


def one_of_or(right: str, *wrong: str) -> st.SearchStrategy[str]:
    """Mostly the value the request names, sometimes another."""
    return st.sampled_from([right, right, *wrong])


pods = st.none() | st.builds(
    model.Pod,
    namespace=st.just("web"),
    name=st.just("api-0"),
    uid=one_of_or("pod-uid-1", "pod-uid-2"),
    node_name=one_of_or("node-a", "node-b", ""),
    service_account_name=one_of_or("api", "default"),
    phase=st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"]),
    deleting=st.booleans(),
)
nodes = st.none() | st.builds(
    model.Node, name=st.just("node-a"), uid=one_of_or("node-uid-1", "node-uid-2")
)
accounts = st.none() | st.builds(
    model.ServiceAccount,
    namespace=st.just("web"),
    name=st.just("api"),
    uid=one_of_or("sa-uid-1", "sa-uid-2"),
)
facts = st.builds(model.Facts, pod=pods, node=nodes, service_account=accounts, ca=st.just(ISSUER))


def binding_denied(decision: model.Decision) -> bool:
    return isinstance(decision, model.Deny) and decision.reason in model.BINDING_REASONS


@settings(max_examples=300, deadline=None)
@given(facts)
def test_no_binding_problem_iff_decide_passes_its_binding_checks(found: model.Facts) -> None:
    decision = decide(REQUEST, found, POLICY, NOW)
    assert (binding_problem(REQUEST, found) is None) == (not binding_denied(decision))
    if not binding_denied(decision):
        assert isinstance(decision, model.Issue), "an allow-all policy issues once bound"


class Cached:
    """A cache holding one value, whatever the key, listed after every request was seen."""

    listed_at = math.inf

    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self, key: object) -> Any:
        return self.value


@settings(max_examples=300, deadline=None)
@given(facts)
def test_the_controller_reads_live_iff_decide_would_deny_on_the_cached_facts(
    cached: model.Facts,
) -> None:
    live = LiveKube()
    kube = cast(SignerKube, live)
    cas = CAStore(kube, "podcert-system", "podcert-ca", utcnow)
    ctrl = Controller(kube, [SIGNER], default_policy([SIGNER], "cluster.local"), cas, Metrics())
    ctrl.bindings.fresh_pods.cache = Cached(cached.pod)
    ctrl.bindings.fresh_nodes.cache = Cached(cached.node)
    ctrl.bindings.fresh_service_accounts.cache = Cached(cached.service_account)
    used = ctrl.facts(REQUEST, seen_at=0.0)
    denied_on_cache = binding_denied(decide(REQUEST, cached, POLICY, NOW))
    assert bool(live.reads) == denied_on_cache
    if denied_on_cache:
        assert live.reads == ["pod", "node", "serviceaccount"]
        assert binding_problem(REQUEST, used) is None, "the live facts are the truth"
    else:
        assert (used.pod, used.node, used.service_account) == (
            cached.pod,
            cached.node,
            cached.service_account,
        )
