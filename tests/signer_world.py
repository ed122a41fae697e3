"""One signer's world for the unit tests of its decisions: a request for pod web/api-0 on node-a,
the facts the cluster holds about it, a policy, and an issuing CA. Each test changes only what it
is about (`make_request(pod_uid=...)`, `make_facts(node=None)`, `policy_with(...)`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, Final, TypeVar

import msgspec
from cryptography.hazmat.primitives.asymmetric import rsa

from podcert.api import keys, requests
from signer import model, policy
from signer.authority import ca
from signer.issue import decide

SIGNER = "example.com/podcert"
NOW = dt.datetime(2026, 11, 29, 12, 0, 0, 500_000, tzinfo=dt.UTC)
BUNDLE = ca.new_ca("decide test", NOW - dt.timedelta(days=1))
ISSUER = ca.issuing_ca(BUNDLE)
KEY = keys.generate("ECDSAP256")
ED_KEY = keys.generate("ED25519")
RSA_2048 = rsa.generate_private_key(65537, 2048)
POLICY = policy.SignerPolicy(name=SIGNER, trust_domain="cluster.local")
ENTITLED = frozenset({"api.web.svc", "api.web.svc.cluster.local"})
DNS_KEY = decide.DNS_NAMES_ANNOTATION
T = TypeVar("T")


_META_FIELDS: Final = frozenset({"namespace", "name", "uid", "resource_version", "generation"})
# The flat names the tests use for the spec's key and annotation fields.
_SPEC_ALIASES: Final = {
    "stub_csr": "stub_pkcs10_request",
    "user_annotations": "unverified_user_annotations",
}
BASE_REQUEST: Final = requests.PodCertificateRequest(
    metadata=requests.Metadata(
        namespace="web", name="api-0-x7k2p", uid="3f1c0a52-1d2e-4b7a-9c1e-6a1f2b3c4d5e"
    ),
    spec=requests.Spec(
        signer_name=SIGNER,
        pod_name="api-0",
        pod_uid="pod-uid-1",
        service_account_name="api",
        service_account_uid="sa-uid-1",
        node_name="node-a",
        node_uid="node-uid-1",
        max_expiration_seconds=86400,
        stub_pkcs10_request=keys.stub_csr(KEY),
    ),
)


def changed(
    request: requests.PodCertificateRequest, **changes: Any
) -> requests.PodCertificateRequest:
    """`request` with fields changed by their flat names: metadata's (`namespace`, `uid`...),
    `created` (a datetime), and the spec's (`pod_uid`, `stub_csr`, `user_annotations`...)."""
    meta = {k: v for k, v in changes.items() if k in _META_FIELDS}
    if "created" in changes:
        meta["creation_timestamp"] = changes["created"]
    spec = {
        _SPEC_ALIASES.get(k, k): v
        for k, v in changes.items()
        if k not in _META_FIELDS and k != "created"
    }
    return msgspec.structs.replace(
        request,
        metadata=msgspec.structs.replace(request.metadata, **meta),
        spec=msgspec.structs.replace(request.spec, **spec),
    )


def make_request(**changes: Any) -> requests.PodCertificateRequest:
    return changed(BASE_REQUEST, **changes)


def request_of(obj: object) -> requests.PodCertificateRequest:
    """The request in an API object as the signer reads it off the wire (its JSON decoded, as
    list pages and watch events are). Raises RequestError when the signer would deny it
    InvalidRequest, with the error as the message."""
    read = requests.decode_request(msgspec.json.encode(obj))
    problem = requests.invalid(read)
    if problem is not None:
        raise problem
    assert isinstance(read, requests.PodCertificateRequest)
    return read


def make_facts(**changes: Any) -> model.Facts:
    base = model.Facts(
        pod=model.Pod(
            namespace="web",
            name="api-0",
            uid="pod-uid-1",
            node_name="node-a",
            service_account_name="api",
            phase="Running",
        ),
        node=model.Node(name="node-a", uid="node-uid-1"),
        service_account=model.ServiceAccount(namespace="web", name="api", uid="sa-uid-1"),
        service_dns_names=ENTITLED,
        ca=ISSUER,
    )
    return dataclasses.replace(base, **changes)


def pod(**changes: Any) -> model.Pod:
    facts_pod = make_facts().pod
    assert facts_pod is not None
    return msgspec.structs.replace(facts_pod, **changes)


def policy_with(**changes: Any) -> policy.SignerPolicy:
    return dataclasses.replace(POLICY, **changes)


OPEN_DNS = policy_with(dns=policy.DNSPolicy(allow_requested=True))
SERVICES_DNS = policy_with(dns=policy.DNSPolicy(services=True))


def assert_api_server_accepts(
    plan: model.LeafPlan, request: requests.PodCertificateRequest, now: dt.datetime
) -> None:
    """The checks kube-apiserver applies to an Issued status (DESIGN.md section 2)."""
    lifetime = plan.not_after - plan.not_before
    assert (
        dt.timedelta(hours=1)
        <= lifetime
        <= dt.timedelta(seconds=request.spec.max_expiration_seconds)
    )
    assert abs(plan.not_before - now) <= dt.timedelta(minutes=5)
    margin = dt.timedelta(minutes=10)
    assert plan.not_before + margin <= plan.begin_refresh_at <= plan.not_after - margin
    for moment in (plan.not_before, plan.not_after, plan.begin_refresh_at):
        assert moment.microsecond == 0


_KINDS: Final = {"pods": "pod", "nodes": "node", "serviceaccounts": "serviceaccount"}


class LiveKube:
    """The API server's live reads for make_request()'s pod, node and ServiceAccount, counted:
    the truth, everything as the request says, unless told that one of them is gone."""

    def __init__(self, *, gone: frozenset[str] = frozenset()) -> None:
        self.reads: list[str] = []
        self.gone = gone

    def get_as(self, resource: str, namespace: str | None, name: str, shape: type[T]) -> T | None:
        """`SignerKube.get_as`: the object's JSON decoded as `shape`, as the API server's
        answer is."""
        kind = _KINDS[resource]
        found = self.objects(resource, namespace, name)
        self.reads.append(kind)
        if kind in self.gone or found is None:
            return None
        return msgspec.json.decode(msgspec.json.encode(found), type=shape)

    def objects(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The live objects, as the API server answers for them."""
        if resource == "pods":
            return {
                "metadata": {"namespace": namespace, "name": name, "uid": "pod-uid-1"},
                "spec": {"nodeName": "node-a", "serviceAccountName": "api"},
                "status": {"phase": "Running"},
            }
        if resource == "nodes":
            return {"metadata": {"name": name, "uid": "node-uid-1"}}
        if resource == "serviceaccounts":
            return {"metadata": {"namespace": namespace, "name": name, "uid": "sa-uid-1"}}
        return None
