"""kubelet_shim.certificates' pure readers: what a request's current object means to its
projection (`request_event`: pending, issued, denied, failed, vanished, and an issued chain that is
broken or does not hold the requested key, a failure never written), and which chain a previous
run left in a source's files (`chain_on_disk`: whole and consistent, or nothing to adopt). How the
agent drives them, from request to written files, is test_shim_agent.py's."""

from __future__ import annotations

import datetime as dt

import pytest

from bundles import formats
from kubelet_shim import projection
from kubelet_shim.certificates import chain_on_disk, request_event
from podcert.api import keys
from podcert.api.pods import CertificateSource
from podcert.api.requests import read_request
from podcert.client.rest import JSON
from tests.unit.test_bundles_formats import Authority

CA = Authority("shim test root")
INTERMEDIATE = CA.intermediate("shim test intermediate")
KEY = keys.generate("ECDSAP256")
NOT_BEFORE = dt.datetime(2026, 11, 29, 20, 0, tzinfo=dt.UTC)
NOT_AFTER = NOT_BEFORE + dt.timedelta(hours=24)
LEAF = INTERMEDIATE.leaf(key=KEY, not_before=NOT_BEFORE, not_after=NOT_AFTER)
CHAIN = (LEAF, INTERMEDIATE.cert)
CHAIN_PEM = formats.dump_certificates(CHAIN)


def stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def issued(chain_pem: bytes = CHAIN_PEM, **extra: str) -> JSON:
    return {
        "metadata": {"name": "r"},
        "status": {
            "conditions": [{"type": "Issued", "status": "True"}],
            "certificateChain": chain_pem.decode(),
            "notBefore": stamp(NOT_BEFORE),
            "notAfter": stamp(NOT_AFTER),
            **extra,
        },
    }


# --- request_event --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        pytest.param(None, projection.RequestVanished, id="gone from the cache"),
        pytest.param({}, projection.RequestPending, id="no status yet"),
        pytest.param(
            {"conditions": [{"type": "Denied", "status": "False"}]},
            projection.RequestPending,
            id="a False condition is no answer",
        ),
        pytest.param(
            {"conditions": [{"type": "Failed", "status": "True", "reason": "X", "message": "m"}]},
            projection.RequestFailed,
            id="failed",
        ),
        pytest.param(
            {"conditions": [{"type": "Issued", "status": "True"}]},
            projection.RequestFailed,
            id="issued without a chain",
        ),
        pytest.param(
            {
                "conditions": [{"type": "Issued", "status": "True"}],
                "certificateChain": "not pem",
                "notBefore": "2026-11-29T20:00:00Z",
                "notAfter": "2026-11-30T20:00:00Z",
            },
            projection.RequestFailed,
            id="issued with a chain that does not parse",
        ),
    ],
)
def test_request_objects_read_as_projection_events(status: JSON | None, expected: type) -> None:
    pcr = None if status is None else {"metadata": {"name": "r"}, "status": status}
    assert isinstance(request_event("r", None if pcr is None else read_request(pcr)), expected)


def test_an_issued_chain_holding_the_requested_key_is_the_credential_to_write() -> None:
    refresh = NOT_BEFORE + dt.timedelta(hours=12)
    event = request_event("r", read_request(issued(beginRefreshAt=stamp(refresh))), KEY)
    assert event == projection.RequestIssued(
        "r",
        chain_pem=CHAIN_PEM,
        not_before=NOT_BEFORE,
        not_after=NOT_AFTER,
        begin_refresh_at=refresh,
    )


def test_an_issued_chain_for_another_key_is_a_failure_never_written() -> None:
    other = keys.generate("ECDSAP256")
    event = request_event("r", read_request(issued()), other)
    assert event == projection.RequestFailed(
        "r", "InvalidIssuedStatus", "the leaf certificate does not hold the requested key"
    )


def test_a_denial_carries_the_signers_reason_and_message() -> None:
    denied = {
        "metadata": {"name": "r"},
        "status": {
            "conditions": [
                {"type": "Denied", "status": "True", "reason": "PolicyDenied", "message": "no"}
            ]
        },
    }
    assert request_event("r", read_request(denied)) == projection.RequestDenied(
        "r", "PolicyDenied", "no"
    )


@pytest.mark.parametrize(
    ("obj", "reason", "field"),
    [
        pytest.param(
            {"metadata": {"name": "r"}, "status": {"conditions": "junk"}},
            "InvalidStatus",
            "status.conditions",
            id="a status of the wrong shape",
        ),
        pytest.param(
            {"metadata": {"name": "r"}, "spec": {"podName": 5}},
            "InvalidRequest",
            "spec.podName",
            id="a spec of the wrong shape",
        ),
    ],
)
def test_an_object_that_is_no_request_fails_naming_the_field(
    obj: JSON, reason: str, field: str
) -> None:
    event = request_event("r", read_request(obj), KEY)
    assert isinstance(event, projection.RequestFailed)
    assert (event.request_name, event.reason) == ("r", reason)
    assert event.message.startswith(field)


# --- chain_on_disk --------------------------------------------------------------------------------


def source(
    bundle: str | None = None, key: str | None = None, chain: str | None = None
) -> CertificateSource:
    return CertificateSource(
        volume="identity",
        index=0,
        signer_name="example.com/podcert",
        key_type="ECDSAP256",
        max_expiration_seconds=86400,
        credential_bundle_path=bundle,
        key_path=key,
        chain_path=chain,
    )


KEY_PEM = formats.dump_private_key(KEY)
BUNDLE = KEY_PEM + CHAIN_PEM


@pytest.mark.parametrize(
    ("paths", "files"),
    [
        pytest.param({"bundle": "b.pem"}, {"b.pem": BUNDLE}, id="a credential bundle"),
        pytest.param(
            {"key": "tls.key", "chain": "tls.crt"},
            {"tls.key": KEY_PEM, "tls.crt": CHAIN_PEM},
            id="a key file and a chain file",
        ),
        pytest.param({"chain": "tls.crt"}, {"tls.crt": CHAIN_PEM}, id="a chain file alone"),
        pytest.param(
            {"bundle": "b.pem", "key": "tls.key", "chain": "tls.crt"},
            {"b.pem": BUNDLE, "tls.key": b"ignored", "tls.crt": b"ignored"},
            id="the bundle wins over the other files",
        ),
    ],
)
def test_a_whole_credential_on_disk_gives_its_chain_leaf_first(
    paths: dict[str, str], files: dict[str, bytes]
) -> None:
    assert chain_on_disk(source(**paths), files) == CHAIN


@pytest.mark.parametrize(
    ("paths", "files"),
    [
        pytest.param({"bundle": "b.pem"}, {}, id="no bundle yet"),
        pytest.param({"key": "tls.key", "chain": "tls.crt"}, {"tls.key": KEY_PEM}, id="key only"),
        pytest.param(
            {"key": "tls.key", "chain": "tls.crt"}, {"tls.crt": CHAIN_PEM}, id="chain only"
        ),
        pytest.param({"key": "tls.key"}, {"tls.key": KEY_PEM}, id="a key says nothing of expiry"),
    ],
)
def test_nothing_is_adopted_without_a_chain_to_go_by(
    paths: dict[str, str], files: dict[str, bytes]
) -> None:
    assert chain_on_disk(source(**paths), files) is None


@pytest.mark.parametrize(
    ("paths", "files", "error"),
    [
        pytest.param(
            {"bundle": "b.pem"},
            {"b.pem": formats.dump_private_key(keys.generate("ECDSAP256")) + CHAIN_PEM},
            formats.KeyMismatchError,
            id="a bundle whose key is not the leaf's",
        ),
        pytest.param(
            {"key": "tls.key", "chain": "tls.crt"},
            {"tls.key": formats.dump_private_key(keys.generate("ECDSAP256")), "tls.crt": CHAIN_PEM},
            formats.KeyMismatchError,
            id="a key file that is not the chain's",
        ),
        pytest.param(
            {"chain": "tls.crt"},
            {"tls.crt": b"-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"},
            formats.MalformedCertificateError,
            id="a chain file that does not parse",
        ),
        pytest.param(
            {"chain": "tls.crt"},
            {"tls.crt": b""},
            formats.MalformedCertificateError,
            id="an empty chain file",
        ),
    ],
)
def test_a_damaged_credential_on_disk_is_a_bundle_error(
    paths: dict[str, str], files: dict[str, bytes], error: type[formats.BundleError]
) -> None:
    with pytest.raises(error):
        chain_on_disk(source(**paths), files)
