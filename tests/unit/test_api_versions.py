"""podcert.api.versions: choosing from discovery's answers which certificates.k8s.io version
serves each resource (the newest, asked per resource: v1 may serve requests on a server whose
trust bundles are still v1beta1), naming what a component lacks, and reading resource names
from an answer of any shape. (The key's form from the OpenAPI schema is
test_proof_of_possession.py's; the version a key falls back to, test_signer_skewed_forms.py's.)"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import pytest

from podcert.api.versions import (
    CTBS,
    GROUP,
    PCRS,
    Served,
    choose,
    group_version,
    missing,
    resource_names,
)

CSRS = "certificatesigningrequests"


@pytest.mark.parametrize(
    ("listing", "names"),
    [
        pytest.param(
            {"resources": [{"name": PCRS}, {"name": f"{PCRS}/status"}, {"name": CTBS}]},
            {PCRS, f"{PCRS}/status", CTBS},
            id="an APIResourceList",
        ),
        pytest.param(None, set(), id="a version not served (404: no answer)"),
        pytest.param({"resources": "junk"}, set(), id="resources not a list"),
        pytest.param(
            {"resources": [{"name": PCRS}, "junk", {"name": 5}, {}]},
            {PCRS},
            id="entries of the wrong shape skipped",
        ),
        pytest.param(["not", "a", "map"], set(), id="not an object"),
    ],
)
def test_resource_names_are_read_from_an_answer_of_any_shape(
    listing: object, names: set[str]
) -> None:
    assert resource_names(listing) == names


@pytest.mark.parametrize(
    ("served", "chosen"),
    [
        pytest.param({"v1": {PCRS, CTBS, CSRS}}, Served("v1", "v1"), id="1.37: v1"),
        pytest.param(
            {"v1": {CSRS}, "v1beta1": {PCRS, CTBS}}, Served("v1beta1", "v1beta1"), id="1.35"
        ),
        pytest.param(
            {"v1": {PCRS, CTBS}, "v1beta1": {PCRS, CTBS}},
            Served("v1", "v1"),
            id="both: the newest",
        ),
        pytest.param(
            {"v1": {PCRS}, "v1beta1": {CTBS}},
            Served("v1", "v1beta1"),
            id="per resource",
        ),
        pytest.param({"v1": {CSRS}}, Served(None, None), id="1.34: neither"),
        pytest.param(
            {"v2": {PCRS, CTBS}}, Served(None, None), id="a version podcert does not know"
        ),
    ],
)
def test_the_newest_version_serving_each_resource_is_chosen(
    served: Mapping[str, Collection[str]], chosen: Served
) -> None:
    assert choose(served) == chosen


@pytest.mark.parametrize(
    ("served", "trust_bundles", "lacks"),
    [
        (Served("v1", "v1"), True, None),
        (Served("v1", None), False, None),
        (Served("v1", None), True, CTBS),
        (Served(None, "v1"), False, PCRS),
        (Served(None, None), False, PCRS),
        (Served(None, None), True, f"{PCRS} and {CTBS}"),
    ],
)
def test_missing_names_what_a_component_needs_and_no_version_serves(
    served: Served, trust_bundles: bool, lacks: str | None
) -> None:
    assert missing(served, trust_bundles=trust_bundles) == lacks


def test_a_group_version_is_the_group_and_the_version() -> None:
    assert GROUP == "certificates.k8s.io"
    assert group_version("v1beta1") == "certificates.k8s.io/v1beta1"
