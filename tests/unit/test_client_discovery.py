"""podcert.client.discovery: the start-up questions to the API server. Which certificates.k8s.io
versions serve requests and trust bundles (a server lacking what a component needs is `Unserved`,
one message naming the server's version and what it lacks), and in which form a node sends its
key, read from the OpenAPI schema, decided by the version alone where the schema is not published
to us, and never guessed past a server that is unwell. (A 1.34 server's one line is
test_proof_of_possession.py's.)"""

from __future__ import annotations

from typing import Any, cast

import pytest

from podcert.api.requests import PROOF_OF_POSSESSION, STUB_CSR
from podcert.client import discovery
from podcert.client.discovery import Unserved
from podcert.client.rest import ApiError, Rest

PCRS, CTBS, CSRS = "podcertificaterequests", "clustertrustbundles", "certificatesigningrequests"
SCHEMA = "io.k8s.api.certificates.{}.PodCertificateRequestSpec"


class Server:
    """`get` over fixed answers: a path missing is a 404 (None), an ApiError is raised."""

    def __init__(self, answers: dict[str, Any]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def get(self, path: str, **query: object) -> Any:
        self.asked.append(path)
        found = self.answers.get(path)
        if isinstance(found, ApiError):
            raise found
        return found


def serving(version: str = "v1.37.0", **versions: set[str]) -> Rest:
    answers: dict[str, Any] = {"/version": {"gitVersion": version}}
    for name, resources in versions.items():
        answers[f"/apis/certificates.k8s.io/{name}"] = {
            "resources": [{"name": r} for r in sorted(resources)]
        }
    return cast(Rest, Server(answers))


def schema(version: str, *fields: str) -> dict[str, Any]:
    properties = {name: {"type": "string"} for name in fields}
    return {"components": {"schemas": {SCHEMA.format(version): {"properties": properties}}}}


# --- which versions -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rest", "versions"),
    [
        pytest.param(serving(v1={PCRS, CTBS}, v1beta1={PCRS, CTBS}), ("v1", "v1"), id="1.37"),
        pytest.param(serving(v1={CSRS}, v1beta1={PCRS, CTBS}), ("v1beta1", "v1beta1"), id="1.35"),
        pytest.param(serving(v1={PCRS}), ("v1", None), id="no trust bundles"),
    ],
)
def test_the_newest_serving_versions_are_found(
    rest: Rest, versions: tuple[str, str | None]
) -> None:
    assert discovery.certificates_versions(rest) == versions


def test_a_component_that_needs_trust_bundles_is_unserved_without_them() -> None:
    rest = serving("v1.36.1", v1={CSRS}, v1beta1={PCRS})
    assert discovery.certificates_versions(rest) == ("v1beta1", None)
    with pytest.raises(Unserved) as raised:
        discovery.certificates_versions(rest, trust_bundles=True)
    assert raised.value.missing == CTBS
    assert str(raised.value).startswith(
        f"Kubernetes v1.36.1 serves no certificates.k8s.io {CTBS} (podcert needs"
    )


def test_a_server_serving_neither_names_both() -> None:
    with pytest.raises(Unserved) as raised:
        discovery.certificates_versions(serving(v1={CSRS}), trust_bundles=True)
    assert raised.value.missing == f"{PCRS} and {CTBS}"


def test_a_server_that_will_not_say_its_version_is_named_generically() -> None:
    unwell = Server({"/version": ApiError(503, "ServiceUnavailable", "etcd")})
    assert discovery.server_version(cast(Rest, unwell)) == "this API server"
    odd = Server({"/version": {"gitVersion": 137}})
    assert discovery.server_version(cast(Rest, odd)) == "this API server"
    with pytest.raises(Unserved, match=r"^this API server serves no certificates\.k8s\.io"):
        discovery.certificates_versions(cast(Rest, unwell))


def test_serves_asks_one_version_for_one_resource() -> None:
    rest = serving(v1={PCRS}, v1beta1={CTBS})
    assert discovery.serves(rest, "v1")
    assert not discovery.serves(rest, "v1beta1")
    assert discovery.serves(rest, "v1beta1", CTBS)
    assert cast(Server, rest).asked == [
        "/apis/certificates.k8s.io/v1",
        *["/apis/certificates.k8s.io/v1beta1"] * 2,
    ]


# --- which key form -------------------------------------------------------------------------------

OPENAPI = "/openapi/v3/apis/certificates.k8s.io/{}"


@pytest.mark.parametrize(
    ("version", "document", "form"),
    [
        pytest.param(
            "v1beta1",
            schema("v1beta1", "pkixPublicKey", "proofOfPossession"),
            PROOF_OF_POSSESSION,
            id="1.35's schema",
        ),
        pytest.param(
            "v1beta1",
            schema("v1beta1", "pkixPublicKey", "proofOfPossession", "stubPKCS10Request"),
            STUB_CSR,
            id="1.36's schema",
        ),
        pytest.param(
            "v1beta1",
            ApiError(403, "Forbidden", "no"),
            PROOF_OF_POSSESSION,
            id="not published to us, v1beta1",
        ),
        pytest.param("v1", ApiError(403, "Forbidden", "no"), STUB_CSR, id="not published, v1"),
        pytest.param("v1", None, STUB_CSR, id="no schema at all, v1"),
    ],
)
def test_the_key_form_is_read_from_the_schema_or_the_version(
    version: str, document: Any, form: str
) -> None:
    rest = Server({OPENAPI.format(version): document})
    assert discovery.key_form(cast(Rest, rest), version) == form
    assert rest.asked == [OPENAPI.format(version)]


def test_an_unwell_server_is_asked_again_not_guessed_past() -> None:
    rest = Server({OPENAPI.format("v1beta1"): ApiError(503, "ServiceUnavailable", "etcd")})
    with pytest.raises(ApiError) as raised:
        discovery.key_form(cast(Rest, rest), "v1beta1")
    assert raised.value.status == 503


def test_a_spec_taking_neither_form_is_unserved() -> None:
    rest = Server(
        {
            "/version": {"gitVersion": "v1.35.0"},
            OPENAPI.format("v1beta1"): schema("v1beta1", "podUID", "pkixPublicKey"),
        }
    )
    with pytest.raises(Unserved) as raised:
        discovery.key_form(cast(Rest, rest), "v1beta1")
    assert str(raised.value).startswith(
        "Kubernetes v1.35.0's certificates.k8s.io/v1beta1 PodCertificateRequest takes neither"
    )
