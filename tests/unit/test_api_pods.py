"""Reading pods into projections: field names as the API serves them, and bad input as data."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from podcert.api.pods import (
    CertificateSource,
    PodVolumes,
    ProjectedVolume,
    TrustBundleSource,
    UnsupportedSource,
    VolumeError,
    WorkKey,
    parse_pod,
)
from podcert.api.selectors import LabelSelector, Requirement, matches_selector
from tests import strategies
from tests.objects import pod_object

UID = "5d1b7a52-3c1e-4a8e-9a0c-6b0f7a0e2c11"
SIGNER = "example.com/podcert"


def pod(*sources: Any, volume: dict[str, Any] | None = None) -> dict[str, Any]:
    projected: dict[str, Any] = {"sources": list(sources)}
    projected.update(volume or {})
    volumes = [
        {"name": "config", "configMap": {"name": "cart"}},
        {"name": "identity", "projected": projected},
    ]
    return pod_object("cart-0", volumes, namespace="shop", uid=UID, service_account="cart")


def cert(**fields: Any) -> dict[str, Any]:
    body = {"signerName": SIGNER, "keyType": "ECDSAP256", "credentialBundlePath": "bundle.pem"}
    body.update(fields)
    return {"podCertificate": {k: v for k, v in body.items() if v is not None}}


def trust(**fields: Any) -> dict[str, Any]:
    body = {"signerName": SIGNER, "labelSelector": {}, "path": "trust.pem"}
    body.update(fields)
    return {"clusterTrustBundle": {k: v for k, v in body.items() if v is not None}}


def test_a_full_pod_reads_into_typed_sources() -> None:
    parsed = parse_pod(
        pod(
            cert(
                keyType="ED25519",
                maxExpirationSeconds=3600,
                credentialBundlePath="creds/bundle.pem",
                keyPath="creds/tls.key",
                certificateChainPath="creds/tls.crt",
                userAnnotations={"example.com/role": "cart"},
            ),
            {"configMap": {"name": "extra"}},
            trust(name="example.com:podcert:2026-11", signerName=None, labelSelector=None),
            trust(
                path="ca/all.pem",
                optional=True,
                labelSelector={
                    "matchLabels": {"tier": "prod"},
                    "matchExpressions": [
                        {"key": "retired", "operator": "DoesNotExist"},
                        {"key": "zone", "operator": "In", "values": ["a", "b"]},
                    ],
                },
            ),
            volume={"defaultMode": 0o440},
        )
    )
    assert parsed == PodVolumes(
        namespace="shop",
        name="cart-0",
        uid=UID,
        node_name="node-a",
        service_account="cart",
        volumes=(
            ProjectedVolume(
                name="identity",
                default_mode=0o440,
                sources=(
                    CertificateSource(
                        volume="identity",
                        index=0,
                        signer_name=SIGNER,
                        key_type="ED25519",
                        max_expiration_seconds=3600,
                        credential_bundle_path="creds/bundle.pem",
                        key_path="creds/tls.key",
                        chain_path="creds/tls.crt",
                        user_annotations={"example.com/role": "cart"},
                    ),
                    UnsupportedSource("identity", 1, "configMap"),
                    TrustBundleSource(
                        "identity", 2, "example.com:podcert:2026-11", None, None, False, "trust.pem"
                    ),
                    TrustBundleSource(
                        volume="identity",
                        index=3,
                        name=None,
                        signer_name=SIGNER,
                        label_selector=LabelSelector(
                            match_labels=(("tier", "prod"),),
                            match_expressions=(
                                Requirement("retired", "DoesNotExist"),
                                Requirement("zone", "In", ("a", "b")),
                            ),
                        ),
                        optional=True,
                        path="ca/all.pem",
                    ),
                ),
            ),
        ),
        errors=(),
    )


def test_defaults_the_api_server_would_have_applied() -> None:
    raw = pod(cert())
    del raw["spec"]["serviceAccountName"]
    parsed = parse_pod(raw)
    [volume] = parsed.volumes
    [source] = volume.sources
    assert isinstance(source, CertificateSource)
    assert source.max_expiration_seconds == 86400
    assert source.user_annotations == {}
    assert volume.default_mode == 0o644
    assert parsed.service_account == "default"


def test_work_items_are_keyed_by_pod_volume_and_source_index() -> None:
    parsed = parse_pod(pod({"configMap": {"name": "x"}}, cert(), trust()))
    assert [key for key, _ in parsed.work_items()] == [
        WorkKey(UID, "identity", 1),
        WorkKey(UID, "identity", 2),
    ]


def test_file_owner_comes_from_the_source_then_the_volume() -> None:
    parsed = parse_pod(pod(cert(user=1001), trust(), volume={"defaultUser": 2000}))
    [volume] = parsed.volumes
    owned, defaulted = volume.sources
    assert isinstance(owned, CertificateSource)
    assert isinstance(defaulted, TrustBundleSource)
    assert volume.owner_of(owned) == 1001
    assert volume.owner_of(defaulted) == 2000


def test_pods_without_projected_volumes_have_no_work() -> None:
    raw = pod()
    raw["spec"]["volumes"] = [{"name": "config", "configMap": {"name": "cart"}}]
    parsed = parse_pod(raw)
    assert parsed.volumes == ()
    assert list(parsed.work_items()) == []
    assert parsed.errors == ()


def test_an_unscheduled_pod_has_an_empty_node_name() -> None:
    raw = pod(cert())
    del raw["spec"]["nodeName"]
    assert parse_pod(raw).node_name == ""


BASE = "spec.volumes[1].projected.sources[1]"
PC = f"{BASE}.podCertificate"
CTB = f"{BASE}.clusterTrustBundle"


@pytest.mark.parametrize(
    ("broken", "kind", "field_path"),
    [
        pytest.param(cert(keyType="DSA"), "NotSupported", f"{PC}.keyType", id="unknown key type"),
        pytest.param(cert(keyType=None), "Required", f"{PC}.keyType", id="missing key type"),
        pytest.param(cert(signerName=None), "Required", f"{PC}.signerName", id="missing signer"),
        pytest.param(cert(signerName=7), "Invalid", f"{PC}.signerName", id="signer not a string"),
        pytest.param(
            cert(signerName="podcert"), "Invalid", f"{PC}.signerName", id="signer without domain"
        ),
        pytest.param(
            cert(maxExpirationSeconds="3600"),
            "Invalid",
            f"{PC}.maxExpirationSeconds",
            id="lifetime as a string",
        ),
        pytest.param(
            cert(maxExpirationSeconds=60),
            "Invalid",
            f"{PC}.maxExpirationSeconds",
            id="lifetime under an hour",
        ),
        pytest.param(
            cert(maxExpirationSeconds=True),
            "Invalid",
            f"{PC}.maxExpirationSeconds",
            id="lifetime as a boolean",
        ),
        pytest.param(
            cert(credentialBundlePath="../../etc/shadow"),
            "Invalid",
            f"{PC}.credentialBundlePath",
            id="bundle path escaping the volume",
        ),
        pytest.param(
            cert(credentialBundlePath="/etc/shadow"),
            "Invalid",
            f"{PC}.credentialBundlePath",
            id="absolute bundle path",
        ),
        pytest.param(
            cert(credentialBundlePath=None, keyPath="..data"),
            "Invalid",
            f"{PC}.keyPath",
            id="key path over the writer's data link",
        ),
        pytest.param(
            cert(credentialBundlePath="x" * 256),
            "Invalid",
            f"{PC}.credentialBundlePath",
            id="file name over 255 bytes, which no file system holds",
        ),
        pytest.param(
            cert(credentialBundlePath="é" * 128),
            "Invalid",
            f"{PC}.credentialBundlePath",
            id="file name of 128 characters but 256 bytes",
        ),
        pytest.param(
            cert(credentialBundlePath="d/" * 2048 + "b"),
            "Invalid",
            f"{PC}.credentialBundlePath",
            id="path over 4096 bytes",
        ),
        pytest.param(
            cert(credentialBundlePath="d/" * 128 + "b"),
            "Invalid",
            f"{PC}.credentialBundlePath",
            id="path nested 129 levels deep, too deep to remove again",
        ),
        pytest.param(
            cert(credentialBundlePath="a\ud800.pem"),
            "Invalid",
            f"{PC}.credentialBundlePath",
            id="path that is not valid UTF-8",
        ),
        pytest.param(cert(credentialBundlePath=None), "Required", PC, id="no file to write"),
        pytest.param(
            cert(keyPath="same.pem", certificateChainPath="same.pem"),
            "Duplicate",
            PC,
            id="key and chain at one path",
        ),
        pytest.param(
            cert(userAnnotations=["a"]),
            "Invalid",
            f"{PC}.userAnnotations",
            id="annotations as a list",
        ),
        pytest.param(
            cert(userAnnotations={"example.com/a": 1}),
            "Invalid",
            f"{PC}.userAnnotations",
            id="annotation value not a string",
        ),
        pytest.param(cert(user=-1), "Invalid", f"{PC}.user", id="negative owner"),
        pytest.param({"podCertificate": "yes"}, "Invalid", PC, id="podCertificate not an object"),
        pytest.param(
            {"podCertificate": cert()["podCertificate"], "configMap": {"name": "x"}},
            "Invalid",
            BASE,
            id="two source types in one entry",
        ),
        pytest.param("podCertificate", "Invalid", BASE, id="source not an object"),
        pytest.param(
            trust(signerName=None, labelSelector=None),
            "Required",
            CTB,
            id="trust bundle without name or signer",
        ),
        pytest.param(
            trust(name="example.com:podcert:x"), "Invalid", CTB, id="trust bundle name and signer"
        ),
        pytest.param(trust(path=None), "Required", f"{CTB}.path", id="trust bundle without path"),
        pytest.param(trust(optional="yes"), "Invalid", f"{CTB}.optional", id="optional not a bool"),
        pytest.param(
            trust(labelSelector={"matchExpressions": [{"key": "a", "operator": "Near"}]}),
            "NotSupported",
            f"{CTB}.labelSelector.matchExpressions[0].operator",
            id="unknown selector operator",
        ),
        pytest.param(
            trust(labelSelector={"matchExpressions": [{"key": "a", "operator": "In"}]}),
            "Required",
            f"{CTB}.labelSelector.matchExpressions[0].values",
            id="In without values",
        ),
        pytest.param(
            trust(
                labelSelector={
                    "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]
                }
            ),
            "Forbidden",
            f"{CTB}.labelSelector.matchExpressions[0].values",
            id="Exists with values",
        ),
        pytest.param(
            trust(labelSelector={"matchLabels": {"a": None}}),
            "Invalid",
            f"{CTB}.labelSelector.matchLabels",
            id="label value not a string",
        ),
        pytest.param(trust(path="bundle.pem"), "Duplicate", BASE, id="second writer of one path"),
        pytest.param(
            trust(path="bundle.pem/ca.pem"),
            "Duplicate",
            BASE,
            id="path under another source's file",
        ),
    ],
)
def test_a_broken_source_is_reported_and_its_neighbours_still_served(
    broken: Any, kind: str, field_path: str
) -> None:
    parsed = parse_pod(pod(cert(), broken, trust(path="ca.pem")))
    [volume] = parsed.volumes
    assert [source.index for source in volume.sources] == [0, 2]
    assert len(parsed.errors) == 1, parsed.errors
    [error] = parsed.errors
    assert (error.kind, error.field_path) == (kind, field_path)
    assert (error.volume, error.index) == ("identity", 1)
    assert parsed.errors_for("identity") == (error,)


def test_a_second_volume_of_the_same_name_is_reported_not_served() -> None:
    raw = pod(cert())
    twin = {"name": "identity", "projected": {"sources": [cert(keyType="ED25519")]}}
    raw["spec"]["volumes"].append(twin)
    parsed = parse_pod(raw)
    assert [v.name for v in parsed.volumes] == ["identity"]
    [(_, source)] = parsed.work_items()
    assert isinstance(source, CertificateSource) and source.key_type == "ECDSAP256"
    [error] = parsed.errors
    assert (error.kind, error.field_path) == ("Duplicate", "spec.volumes[2].name")


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("x" * 255, id="a 255-byte file name"),
        pytest.param("d/" * 127 + "b", id="128 levels"),
        pytest.param("/".join(["n" * 255] * 16), id="4095 bytes"),
        pytest.param("ключи/証明書/🔐.pem", id="unicode"),
    ],
)
def test_paths_at_the_limits_are_served(path: str) -> None:
    parsed = parse_pod(pod(cert(credentialBundlePath=path)))
    assert not parsed.errors
    [(_, source)] = parsed.work_items()
    assert isinstance(source, CertificateSource)
    assert source.credential_bundle_path == path


@pytest.mark.parametrize(
    ("mutate", "kind", "field_path"),
    [
        pytest.param(
            lambda p: p["metadata"].pop("uid"), "Required", "metadata.uid", id="pod without a UID"
        ),
        pytest.param(
            lambda p: p.update(metadata="x"), "Required", "metadata", id="metadata not an object"
        ),
        pytest.param(
            lambda p: p["spec"].update(volumes={"a": 1}),
            "Invalid",
            "spec.volumes",
            id="volumes not a list",
        ),
        pytest.param(
            lambda p: p["spec"]["volumes"].append(3),
            "Invalid",
            "spec.volumes[2]",
            id="volume not an object",
        ),
        pytest.param(
            lambda p: p["spec"]["volumes"][1]["projected"].update(sources="all"),
            "Invalid",
            "spec.volumes[1].projected.sources",
            id="sources not a list",
        ),
        pytest.param(
            lambda p: p["spec"]["volumes"][1]["projected"].update(defaultMode=0o1777),
            "Invalid",
            "spec.volumes[1].projected.defaultMode",
            id="default mode beyond permission bits",
        ),
    ],
)
def test_pod_level_damage_is_reported_not_raised(mutate: Any, kind: str, field_path: str) -> None:
    raw = pod(cert())
    mutate(raw)
    errors = parse_pod(raw).errors
    assert (kind, field_path) in [(e.kind, e.field_path) for e in errors], errors


@pytest.mark.parametrize(
    "projected",
    [
        pytest.param("yes", id="projected not an object"),
        pytest.param(None, id="projected null"),
    ],
)
def test_a_broken_volume_does_not_hide_the_others(projected: Any) -> None:
    raw = pod(cert())
    raw["spec"]["volumes"].insert(0, {"name": "broken", "projected": projected})
    parsed = parse_pod(raw)
    assert [v.name for v in parsed.volumes] == ["identity"]
    assert [e.field_path for e in parsed.errors] == ["spec.volumes[0].projected"]


def test_a_pod_that_is_not_an_object_is_one_error() -> None:
    parsed = parse_pod(["not", "a", "pod"])
    assert parsed.volumes == ()
    assert parsed.errors == (VolumeError("Invalid", "", "pod must be an object"),)


def test_errors_read_like_api_validation_messages() -> None:
    [error] = parse_pod(pod(cert(keyType="DSA"))).errors
    assert str(error) == (
        "spec.volumes[1].projected.sources[0].podCertificate.keyType: NotSupported: 'DSA'; "
        "supported: RSA3072, RSA4096, ECDSAP256, ECDSAP384, ECDSAP521, ED25519"
    )


def test_parsing_does_not_modify_the_pod() -> None:
    raw = pod(cert(userAnnotations={"example.com/a": "b"}), trust())
    before = copy.deepcopy(raw)
    parse_pod(raw)
    assert raw == before


json_values = strategies.json_trees()
field_names = st.sampled_from(
    [
        "podCertificate",
        "clusterTrustBundle",
        "signerName",
        "keyType",
        "path",
        "keyPath",
        "labelSelector",
        "matchExpressions",
        "userAnnotations",
        "maxExpirationSeconds",
    ]
)
api_like = strategies.json_trees(keys=field_names, max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(sources=api_like, volume_extra=st.dictionaries(st.text(max_size=12), json_values))
def test_arbitrary_json_never_raises(sources: Any, volume_extra: dict[str, Any]) -> None:
    raw = pod()
    raw["spec"]["volumes"][1]["projected"] = {**volume_extra, "sources": sources}
    parsed = parse_pod(raw)
    for _, source in parsed.work_items():
        assert source.volume == "identity"


# -- label selectors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "selector", "expected"),
    [
        pytest.param({"a": "1"}, None, False, id="unset selector matches nothing"),
        pytest.param({"a": "1"}, {}, True, id="empty selector matches everything"),
        pytest.param(
            {"a": "1", "b": "2"}, {"matchLabels": {"a": "1"}}, True, id="matchLabels subset"
        ),
        pytest.param({"a": "2"}, {"matchLabels": {"a": "1"}}, False, id="matchLabels wrong value"),
        pytest.param({}, {"matchLabels": {"a": "1"}}, False, id="matchLabels missing label"),
        pytest.param(
            {"a": "x"},
            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["x", "y"]}]},
            True,
            id="In matches a listed value",
        ),
        pytest.param(
            {},
            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["x"]}]},
            False,
            id="In needs the label",
        ),
        pytest.param(
            {"a": "x"},
            {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]},
            False,
            id="NotIn excludes a listed value",
        ),
        pytest.param(
            {},
            {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]},
            True,
            id="NotIn matches a missing label",
        ),
        pytest.param(
            {"a": ""}, {"matchExpressions": [{"key": "a", "operator": "Exists"}]}, True, id="Exists"
        ),
        pytest.param(
            {},
            {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
            False,
            id="Exists missing",
        ),
        pytest.param(
            {},
            {"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]},
            True,
            id="DoesNotExist",
        ),
        pytest.param(
            {"a": "1", "b": "x"},
            {
                "matchLabels": {"a": "1"},
                "matchExpressions": [{"key": "b", "operator": "NotIn", "values": ["x"]}],
            },
            False,
            id="labels and expressions are ANDed",
        ),
        pytest.param(
            {"tier": "prod"},
            LabelSelector(match_labels=(("tier", "prod"),)),
            True,
            id="parsed selector",
        ),
    ],
)
def test_matches_selector(
    labels: dict[str, str], selector: dict[str, Any] | LabelSelector | None, expected: bool
) -> None:
    assert matches_selector(labels, selector) is expected


def test_a_malformed_selector_is_an_error_not_a_guess() -> None:
    with pytest.raises(ValueError, match="operator"):
        matches_selector({"a": "1"}, {"matchExpressions": [{"key": "a", "operator": "Near"}]})


def test_sources_are_hashable_for_change_detection() -> None:
    parsed = parse_pod(pod(cert(userAnnotations={"example.com/a": "b"}), trust()))
    assert len({source for _, source in parsed.work_items()}) == 2
