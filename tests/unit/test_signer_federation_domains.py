"""Federation: a federated trust domain's bundle as fetched from its endpoint, taken
or refused by a pure function; when to poll again; the policy file's `federation:` section; and
and the poller keeping the last good bundle."""

from __future__ import annotations

import base64
import datetime as dt
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from signer.authority import spiffebundle
from signer.federation import domains
from signer.federation.domains import Bundle, FederatedDomain, Federation, Rejected
from signer.federation.poller import Federator, load_bootstraps
from signer.policy import PolicyError, load_policy

NOW = dt.datetime.now(dt.UTC).replace(microsecond=0)
TD = "spire.test"


def root(ca: trustme.CA) -> x509.Certificate:
    return x509.load_pem_x509_certificate(ca.cert_pem.bytes())


@pytest.fixture(scope="module")
def roots() -> list[x509.Certificate]:
    return [root(trustme.CA()), root(trustme.CA())]


def document(roots: list[x509.Certificate], **extra: Any) -> dict[str, Any]:
    doc = spiffebundle.bundle_document(roots, 7, dt.timedelta(seconds=60))
    doc.update(extra)
    return doc


def body(doc: Any) -> bytes:
    return json.dumps(doc).encode()


# --- the document ---------------------------------------------------------------------------------


def test_a_bundle_as_podcert_serves_it_is_taken(roots: list[x509.Certificate]) -> None:
    got = domains.accept(body(document(roots)), TD, None, NOW)
    assert isinstance(got, Bundle)
    assert list(got.roots) == roots
    assert got.sequence == 7
    assert got.refresh_hint == dt.timedelta(seconds=60)


def test_jwt_authorities_and_unknown_uses_are_skipped(roots: list[x509.Certificate]) -> None:
    doc = document(roots[:1])
    doc["keys"] += [
        {"use": "jwt-svid", "kty": "EC", "kid": "k", "crv": "P-256", "x": "AA", "y": "AA"},
        {"use": "enc", "kty": "oct", "k": "AA"},
    ]
    got = domains.accept(body(doc), TD, None, NOW)
    assert isinstance(got, Bundle) and list(got.roots) == roots[:1]


def _with_key(roots: list[x509.Certificate], **change: Any) -> dict[str, Any]:
    doc = document(roots[:1])
    doc["keys"][0].update(change)
    doc["keys"][0] = {k: v for k, v in doc["keys"][0].items() if v is not None}
    return doc


HOSTILE = [
    pytest.param(lambda r: b"\xff\xfe", "body", id="not UTF-8"),
    pytest.param(lambda r: b"{", "body", id="not JSON"),
    pytest.param(lambda r: b"[" * 100000 + b"]" * 100000, "body", id="nested too deeply"),
    pytest.param(lambda r: b"[]", "body", id="a list, not an object"),
    pytest.param(lambda r: b" " * (domains.MAX_BODY_BYTES + 1) + b"{}", "body", id="a huge body"),
    pytest.param(lambda r: body({}), "keys", id="no keys"),
    pytest.param(lambda r: body({"keys": {}}), "keys", id="keys not a list"),
    pytest.param(lambda r: body({"keys": []}), "keys", id="no key at all"),
    pytest.param(lambda r: body({"keys": [1]}), "keys[0]", id="a key that is no object"),
    pytest.param(lambda r: body({"keys": [{"kty": "EC"}]}), "keys[0].use", id="a key without use"),
    pytest.param(
        lambda r: body(_with_key(r, use="sig")), "keys", id="wrong use: nothing left to trust"
    ),
    pytest.param(lambda r: body(_with_key(r, x5c=None)), "keys[0].x5c", id="missing x5c"),
    pytest.param(lambda r: body(_with_key(r, x5c=[])), "keys[0].x5c", id="empty x5c"),
    pytest.param(
        lambda r: body(_with_key(r, x5c=["AAAA", "AAAA"])), "keys[0].x5c", id="two certificates"
    ),
    pytest.param(lambda r: body(_with_key(r, x5c=["!!"])), "keys[0].x5c[0]", id="x5c not base64"),
    pytest.param(
        lambda r: body(_with_key(r, x5c=[base64.b64encode(b"junk").decode()])),
        "keys[0].x5c[0]",
        id="x5c not DER",
    ),
    pytest.param(
        lambda r: body(_with_key(r, x=spiffebundle.jwk(r[1])["x"])),
        "keys[0].x",
        id="the key does not match its certificate",
    ),
    pytest.param(
        lambda r: body(_with_key(r, kty="RSA")), "keys[0].kty", id="the key type does not match"
    ),
    pytest.param(
        lambda r: body(document(r, spiffe_sequence=-1)), "spiffe_sequence", id="negative sequence"
    ),
    pytest.param(
        lambda r: body(document(r, spiffe_sequence="7")), "spiffe_sequence", id="sequence a string"
    ),
    pytest.param(
        lambda r: body(document(r, spiffe_sequence=1 << 64)),
        "spiffe_sequence",
        id="sequence over 64 bits",
    ),
    pytest.param(
        lambda r: body(document(r, spiffe_refresh_hint=True)),
        "spiffe_refresh_hint",
        id="refresh hint a boolean",
    ),
    pytest.param(
        lambda r: body({"keys": [spiffebundle.jwk(r[0])] * (domains.MAX_KEYS + 1)}),
        "keys",
        id="too many keys",
    ),
]


@pytest.mark.parametrize(("make", "field"), HOSTILE)
def test_hostile_bundles_are_refused_naming_the_field(
    roots: list[x509.Certificate], make: Any, field: str
) -> None:
    previous = Bundle(TD, tuple(roots), sequence=3)
    got = domains.accept(make(roots), TD, previous, NOW)
    assert isinstance(got, Rejected)
    assert got.field == field, got


def test_a_sequence_going_back_is_refused(roots: list[x509.Certificate]) -> None:
    previous = Bundle(TD, tuple(roots), sequence=8)
    got = domains.accept(body(document(roots)), TD, previous, NOW)
    assert got == Rejected("spiffe_sequence", "went back from 8 to 7")
    same = domains.accept(body(document(roots)), TD, Bundle(TD, tuple(roots), 7), NOW)
    assert isinstance(same, Bundle)


def test_expired_roots_are_left_out_and_a_bundle_of_only_expired_ones_is_refused(
    roots: list[x509.Certificate],
) -> None:
    later = roots[0].not_valid_after_utc + dt.timedelta(days=1)
    got = domains.accept(body(document(roots)), TD, None, later)
    assert isinstance(got, Rejected) and got.field == "keys"
    assert "valid now" in got.reason


def test_bootstrap_bundles_are_pem_or_the_spiffe_document(roots: list[x509.Certificate]) -> None:
    pem = b"".join(r.public_bytes(serialization.Encoding.PEM) for r in roots)
    from_pem = domains.bootstrap_roots(pem, TD, NOW)
    from_json = domains.bootstrap_roots(b"\n " + body(document(roots)), TD, NOW)
    assert isinstance(from_pem, Bundle) and isinstance(from_json, Bundle)
    assert from_pem.ders() == from_json.ders()
    bad = domains.bootstrap_roots(b"hello", TD, NOW)
    assert isinstance(bad, Rejected) and bad.field == "bootstrapBundle"


def test_a_root_listed_twice_is_published_once(roots: list[x509.Certificate]) -> None:
    pem = b"".join(r.public_bytes(serialization.Encoding.PEM) for r in [*roots, roots[0]])
    bundle = domains.bootstrap_roots(pem, TD, NOW)
    assert isinstance(bundle, Bundle)
    (first, *_) = domains.desired("example.com/federated", bundle, {}, ["cluster.local"])
    published = first["spec"]["trustBundle"]
    assert published.count("BEGIN CERTIFICATE") == 2
    assert x509.load_pem_x509_certificates(published.encode()) == roots


def test_each_served_trust_domain_gets_a_live_and_a_preview_bundle_of_the_partners_roots(
    roots: list[x509.Certificate],
) -> None:
    bundle = Bundle(TD, tuple(roots))
    wants = domains.desired("example.com/federated", bundle, {"m": "y"}, ["a.test", "b.test"])
    got = {w["metadata"]["name"]: w["metadata"]["labels"] for w in wants}
    base = f"example.com:federated:{TD}"
    assert list(got) == [base, f"{base}:preview", f"{base}:b.test", f"{base}:b.test:preview"]
    # The default trust domain's live bundle keeps the name and label older selectors use.
    assert got[base] == {
        "m": "y",
        domains.FEDERATED_LABEL: "true",
        "podcert.dev/trust-domain": TD,
        "k8s.spiffe.io/canarying": "live",
        "k8s.spiffe.io/workload-trust-domain": "a.test",
        "k8s.spiffe.io/peer-trust-domain": TD,
    }
    assert got[f"{base}:b.test:preview"] == {
        "m": "y",
        domains.FEDERATED_LABEL: "true",
        "k8s.spiffe.io/canarying": "preview",
        "k8s.spiffe.io/workload-trust-domain": "b.test",
        "k8s.spiffe.io/peer-trust-domain": TD,
    }
    assert len({w["spec"]["trustBundle"] for w in wants}) == 1


@pytest.mark.parametrize(
    ("hint", "failures", "seconds"),
    [
        pytest.param(None, 0, 300, id="no hint: five minutes"),
        pytest.param(60, 0, 60, id="the hint"),
        pytest.param(1, 0, 5, id="a tiny hint is raised to the floor"),
        pytest.param(10**9, 0, 3600, id="a huge hint is capped at an hour"),
        pytest.param(60, 1, 5, id="first failure: soon"),
        pytest.param(60, 3, 20, id="doubling"),
        pytest.param(60, 30, 60, id="never later than the hint"),
    ],
)
def test_next_poll(hint: int | None, failures: int, seconds: int) -> None:
    delta = dt.timedelta(seconds=hint) if hint is not None else None
    assert domains.next_poll(delta, failures) == dt.timedelta(seconds=seconds)


# --- the policy file ------------------------------------------------------------------------------

SERVED = ["example.com/podcert"]


def policy(section: str) -> Federation | None:
    return load_policy(section, "policy.yaml", SERVED, "cluster.local").federation


def test_the_federation_section() -> None:
    got = policy(
        """
federation:
  trustDomains:
    - trustDomain: spire.test
      bundleEndpointURL: https://127.0.0.1:8443/
      endpointSPIFFEID: spiffe://spire.test/spire/server
      bootstrapBundle: /etc/podcert/spire.pem
    - trustDomain: web.test
      bundleEndpointURL: https://bundle.web.test/
      bundleEndpointProfile: https_web
"""
    )
    assert got == Federation(
        signer_name="example.com/federated",
        domains=(
            FederatedDomain(
                "spire.test",
                "https://127.0.0.1:8443/",
                "https_spiffe",
                "spiffe://spire.test/spire/server",
                Path("/etc/podcert/spire.pem"),
            ),
            FederatedDomain("web.test", "https://bundle.web.test/", "https_web"),
        ),
    )


ENTRY = "federation:\n  trustDomains:\n    - "


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "federation:\n  signerName: example.com/podcert\n",
            "policy.yaml:2: federation.signerName: must differ from the signer names served",
            id="our own signer name",
        ),
        pytest.param(
            "federation:\n  signerName: nope\n",
            "policy.yaml:2: federation.signerName: must be a domain and a path",
            id="not a signer name",
        ),
        pytest.param(
            ENTRY + "bundleEndpointURL: https://x/\n",
            "policy.yaml:3: federation.trustDomains[0].trustDomain: required",
            id="no trust domain",
        ),
        pytest.param(
            ENTRY + "trustDomain: cluster.local\n      bundleEndpointURL: https://x/\n"
            "      bundleEndpointProfile: https_web\n",
            "federation.trustDomains[0].trustDomain: is one of our own trust domains",
            id="our own trust domain",
        ),
        pytest.param(
            ENTRY + "trustDomain: a.test\n      bundleEndpointURL: http://x/\n",
            "federation.trustDomains[0].bundleEndpointURL: must be an https:// URL",
            id="plain http",
        ),
        pytest.param(
            ENTRY + "trustDomain: a.test\n      bundleEndpointURL: https://x/\n",
            "federation.trustDomains[0].endpointSPIFFEID: required with https_spiffe",
            id="https_spiffe without the endpoint's ID",
        ),
        pytest.param(
            ENTRY + "trustDomain: a.test\n      bundleEndpointURL: https://x/\n"
            "      endpointSPIFFEID: spiffe://b.test/server\n      bootstrapBundle: /x\n",
            "endpointSPIFFEID: must be a workload ID in trust domain a.test",
            id="the endpoint's ID in another trust domain",
        ),
        pytest.param(
            ENTRY + "trustDomain: a.test\n      bundleEndpointURL: https://x/\n"
            "      endpointSPIFFEID: spiffe://a.test/x?y\n      bootstrapBundle: /x\n",
            "endpointSPIFFEID: 'spiffe://a.test/x?y' has a query",
            id="the endpoint's ID malformed",
        ),
        pytest.param(
            ENTRY + "trustDomain: a.test\n      bundleEndpointURL: https://x/\n"
            "      bundleEndpointProfile: https_web\n      bootstrapBundle: /x\n",
            "federation.trustDomains[0].bootstrapBundle: only with https_spiffe",
            id="a bootstrap bundle with https_web",
        ),
        pytest.param(
            ENTRY + "trustDomain: a.test\n      bundleEndpointURL: https://x/\n"
            "      bundleEndpointProfile: ftp\n",
            "bundleEndpointProfile: must be one of https_spiffe, https_web",
            id="unknown profile",
        ),
        pytest.param(
            ENTRY + "trustDomain: a.test\n      bundleEndpointURL: https://x/\n"
            "      bundleEndpointProfile: https_web\n"
            "    - trustDomain: a.test\n      bundleEndpointURL: https://y/\n"
            "      bundleEndpointProfile: https_web\n",
            "federation.trustDomains[1].trustDomain: is listed twice",
            id="a trust domain twice",
        ),
    ],
)
def test_bad_federation_sections_name_the_field(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        policy(text)
    assert message in str(caught.value)


def test_bootstrap_bundles_are_read_at_start_up(
    tmp_path: Path, roots: list[x509.Certificate]
) -> None:
    good = tmp_path / "good.pem"
    good.write_bytes(roots[0].public_bytes(serialization.Encoding.PEM))
    (tmp_path / "bad.pem").write_text("nothing")
    config = Federation(
        "example.com/federated",
        (FederatedDomain("a.test", "https://x/", "https_spiffe", "spiffe://a.test/s", good),),
    )
    found = load_bootstraps(config, NOW)
    assert isinstance(found, dict) and list(found["a.test"].roots) == roots[:1]
    for name, problem in (("bad.pem", "neither PEM"), ("gone.pem", "No such file")):
        broken = Federation(
            config.signer_name,
            (FederatedDomain("a.test", "https://x/", "https_spiffe", "s", tmp_path / name),),
        )
        message = load_bootstraps(broken, NOW)
        assert isinstance(message, str) and "a.test" in message and problem in message


# --- the poller's decisions (the fetch injected; publishing is queued, not done here) -------------


def test_the_poller_keeps_the_last_good_bundle_and_backs_off(roots: list[x509.Certificate]) -> None:
    answers = [body(document(roots)), b"{", body(document(roots[:1], spiffe_sequence=9))]
    trusted: list[tuple[bytes, ...]] = []

    def fetch(domain: FederatedDomain, roots_: Any) -> bytes:
        trusted.append(tuple(r.public_bytes(serialization.Encoding.DER) for r in roots_))
        return answers.pop(0)

    domain = FederatedDomain(TD, "https://x/", "https_spiffe", f"spiffe://{TD}/s")
    bootstrap = Bundle(TD, tuple(roots[1:]))
    poller = Federator(
        None,  # type: ignore[arg-type]  # polling does not touch the API; publishing does
        Federation("example.com/federated", (domain,)),
        {TD: bootstrap},
        lambda: True,
        threading.Event(),
        lambda: NOW,
        fetch=fetch,
    )
    assert poller.poll(TD) == 60  # the refresh hint
    assert trusted[0] == tuple(bootstrap.ders())
    assert poller.bundles[TD].sequence == 7
    assert poller.poll(TD) == 5  # refused: the last good bundle stays, a retry soon
    assert poller.bundles[TD].sequence == 7
    assert set(trusted[1]) == set(poller.bundles[TD].ders())  # authenticated with what it took
    poller.poll(TD)
    assert poller.bundles[TD].sequence == 9 and len(poller.bundles[TD].roots) == 1
