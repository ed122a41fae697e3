"""The v1beta1 form of a request's key (1.35 has no other): `pkixPublicKey` plus
`proofOfPossession`, a signature over the pod UID. The shim signs it
(`podcert.api.requests.key_fields`), the signer checks it again (`podcert.api.keys`, through
`signer.issue.decide`), for every key type; a wrong UID, another key or broken bytes end in a
typed denial naming the field.
Which form a server takes is read from its schema (`podcert.api.versions.key_form`), and a server
that serves no requests at all is one line at start-up, for the signer, the shim and the audit
alike.

`data/kubelet_1.35_proofs.json` holds proofs made by Go with the calls the 1.35 kubelet makes
(pkg/kubelet/podcertificate, generateKeyAndProof: rsa.SignPSS with nil options over SHA-256 of
the UID, ecdsa.SignASN1 over it, ed25519.Sign over the UID), so the signer is shown to accept
what the real kubelet sends, not only what our own code makes.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa

from kubelet_shim import build as shim_build
from kubelet_shim.kube import PodRef, pcr_body
from kubelet_shim.storage import MemoryStorage
from podcert.api import keys, requests, versions
from podcert.cli import main
from podcert.client import discovery
from podcert.client.discovery import Unserved
from podcert.client.rest import ApiError
from podcert.errors import EXIT_FINDINGS
from signer import build as signer_build
from signer import model
from signer.issue import decide
from signer.policy import load_policy
from tests.signer_world import request_of
from tests.unit.test_shim_agent import CA, SIGNER, UID, Clock, FakeKube, Rig, cert_volume, make_pod

NOW = dt.datetime(2026, 11, 29, 20, 0, tzinfo=dt.UTC)
POD_UID = "1f0c9a52-7d2e-4b7a-9c1e-6a1f2b3c4d5e"
KEYS = {key_type: keys.generate(key_type) for key_type in keys.KEY_TYPES}
KUBELET = json.loads((Path(__file__).parent / "data" / "kubelet_1.35_proofs.json").read_text())
POLICY_TEXT = f"""
signers:
  - name: {SIGNER}
    trustDomain: proofs.test
    keyTypes: [RSA3072, RSA4096, ECDSAP256, ECDSAP384, ECDSAP521, ED25519]
    allow:
      - namespaces: ["*"]
        serviceAccounts: ["*"]
"""
POLICY = load_policy(POLICY_TEXT, "test", [SIGNER], "proofs.test")


def shim_request(key: keys.PrivateKey, pod_uid: str = POD_UID, **spec: Any) -> dict[str, Any]:
    """The API object of a request the shim makes on 1.35, as the API server returns it."""
    body = pcr_body(
        PodRef("web", "web-0", POD_UID),
        name="web-0-x1",
        signer_name=SIGNER,
        service_account="default",
        service_account_uid="sa-uid",
        node_name="node-a",
        node_uid="node-uid",
        max_expiration_seconds=86400,
        key_fields=requests.key_fields(requests.PROOF_OF_POSSESSION, key, pod_uid),
        user_annotations={},
    )
    body["metadata"].update(name="web-0-x1", uid="req-uid")
    for name, value in spec.items():  # None: left out, as the API server leaves empty fields
        if value is None:
            body["spec"].pop(name, None)
        else:
            body["spec"][name] = value
    return body


def parsed(pcr: dict[str, Any]) -> keys.RequestedKey:
    return decide.parse_public_key(request_of(pcr))


def denial(pcr: dict[str, Any]) -> decide.CSRError:
    with pytest.raises(decide.CSRError) as caught:
        parsed(pcr)
    return caught.value


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# --- the proof, made by the shim or the kubelet, checked by the signer ---------------------------


@pytest.mark.parametrize("key_type", keys.KEY_TYPES)
def test_the_shims_proof_verifies_with_the_signers_check(key_type: keys.KeyType) -> None:
    key = KEYS[key_type]
    pcr = shim_request(key)
    assert "stubPKCS10Request" not in pcr["spec"]
    found = parsed(pcr)
    assert (found.key_type, keys.spki_der(found.public_key)) == (key_type, keys.public_der(key))


@pytest.mark.parametrize("key_type", keys.KEY_TYPES)
def test_a_proof_the_1_35_kubelet_made_verifies(key_type: keys.KeyType) -> None:
    vector = KUBELET["vectors"][key_type]
    pcr = shim_request(KEYS["ED25519"], **vector)  # the kubelet's key and proof replace ours
    pcr["spec"]["podUID"] = KUBELET["podUID"]
    found = parsed(pcr)
    assert found.key_type == key_type
    assert b64(keys.spki_der(found.public_key)) == vector["pkixPublicKey"]


@pytest.mark.parametrize("key_type", keys.KEY_TYPES)
def test_a_v1beta1_request_with_the_shims_proof_is_issued(key_type: keys.KeyType) -> None:
    request = request_of(shim_request(KEYS[key_type]))
    facts = model.Facts(
        pod=model.Pod("web", "web-0", POD_UID, "node-a", "default", phase="Running"),
        node=model.Node("node-a", "node-uid"),
        service_account=model.ServiceAccount("web", "default", "sa-uid"),
    )
    # No CA in the facts: everything about the request passed, and only our side waits.
    assert decide.decide(request, facts, POLICY.for_signer(SIGNER), NOW) == model.Retry(
        dt.timedelta(seconds=5), decide.CA_NOT_LOADED
    )


def _flip(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0x01
    return bytes(out)


BAD_PROOFS = [
    pytest.param(lambda key: keys.sign_proof(key, "another-pod-uid"), id="proof over another UID"),
    pytest.param(
        lambda key: keys.sign_proof(keys.generate(keys.key_type_of(key.public_key())), POD_UID),  # type: ignore[arg-type]
        id="proof by another key of the same type",
    ),
    pytest.param(lambda key: keys.sign_proof(key, POD_UID)[:-1], id="proof truncated"),
    pytest.param(lambda key: keys.sign_proof(key, POD_UID) + b"\x00", id="trailing byte"),
    pytest.param(lambda key: _flip(keys.sign_proof(key, POD_UID), -3), id="a bit flipped"),
    pytest.param(lambda key: b"\x30\x00", id="an empty DER sequence"),
    pytest.param(lambda key: keys.public_der(key), id="the public key given as proof"),
]


@pytest.mark.parametrize("key_type", keys.KEY_TYPES)
@pytest.mark.parametrize("bad_proof", BAD_PROOFS)
def test_a_proof_that_does_not_verify_is_denied_naming_the_field(
    key_type: keys.KeyType, bad_proof: Any
) -> None:
    key = KEYS[key_type]
    proof = bad_proof(key)
    error = denial(shim_request(key, proofOfPossession=b64(proof)))
    assert error.reason == model.INVALID_PROOF_OF_POSSESSION == "InvalidProofOfPossession"
    assert error.message.startswith("spec.proofOfPossession does not verify")
    assert b64(proof)[:16] not in error.message  # the bytes are never echoed


@pytest.mark.parametrize(
    ("spec", "field", "fragment"),
    [
        pytest.param(
            {"proofOfPossession": None},
            "spec.proofOfPossession",
            "is required with pkixPublicKey",
            id="key without proof",
        ),
        pytest.param(
            {"pkixPublicKey": None},
            "spec.pkixPublicKey",
            "is required with proofOfPossession",
            id="proof without key",
        ),
        pytest.param(
            {"stubPKCS10Request": b64(keys.stub_csr(KEYS["ECDSAP256"]))},
            "spec.pkixPublicKey",
            "must be empty when stubPKCS10Request is set",
            id="both forms at once",
        ),
        pytest.param(
            {"pkixPublicKey": b64(b"\x30\x03\x02\x01")},
            "spec.pkixPublicKey",
            "not a valid DER SubjectPublicKeyInfo",
            id="key not DER",
        ),
    ],
)
def test_a_broken_form_is_an_invalid_request_naming_the_field(
    spec: dict[str, Any], field: str, fragment: str
) -> None:
    error = denial(shim_request(KEYS["ECDSAP256"], **spec))
    assert error.reason == model.INVALID_REQUEST
    assert error.message.startswith(field) and fragment in error.message


def test_a_proof_that_is_not_base64_is_an_invalid_request_naming_the_field() -> None:
    # The controller denies it InvalidRequest with this message.
    with pytest.raises(requests.RequestError, match=r"^spec\.proofOfPossession: not valid base64"):
        request_of(shim_request(KEYS["ED25519"], proofOfPossession="!!not base64"))


# --- the scheme, as the API server checks it (pkg/apis/certificates/validation, 1.35/1.36) -------


def _pss(key: rsa.RSAPrivateKey, salt_length: int) -> bytes:
    pss = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=salt_length)
    return key.sign(POD_UID.encode(), pss, hashes.SHA256())


def _rsa_key() -> rsa.RSAPrivateKey:
    key = KEYS["RSA3072"]
    assert isinstance(key, rsa.RSAPrivateKey)
    return key


def _ec_key(key_type: keys.KeyType) -> ec.EllipticCurvePrivateKey:
    key = KEYS[key_type]
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


@pytest.mark.parametrize(
    ("key_type", "proof", "verifies"),
    [
        pytest.param("RSA3072", lambda: _pss(_rsa_key(), 32), True, id="RSA PSS salt = hash size"),
        pytest.param("RSA3072", lambda: _pss(_rsa_key(), 0), True, id="RSA PSS without salt"),
        pytest.param(
            "RSA3072",
            lambda: _rsa_key().sign(POD_UID.encode(), padding.PKCS1v15(), hashes.SHA256()),
            False,
            id="RSA PKCS#1 v1.5 (the alpha's scheme) is not PSS",
        ),
        pytest.param(
            "ECDSAP384",
            lambda: _ec_key("ECDSAP384").sign(POD_UID.encode(), ec.ECDSA(hashes.SHA384())),
            False,
            id="ECDSA P-384 over SHA-384 (the stub CSR's digest): the proof is SHA-256",
        ),
        pytest.param(
            "ECDSAP521",
            lambda: _ec_key("ECDSAP521").sign(POD_UID.encode(), ec.ECDSA(hashes.SHA256())),
            True,
            id="ECDSA P-521 over SHA-256",
        ),
    ],
)
def test_the_scheme_is_the_api_servers(key_type: keys.KeyType, proof: Any, verifies: bool) -> None:
    assert keys.proof_verifies(KEYS[key_type].public_key(), POD_UID, proof()) is verifies


def test_the_shim_signs_rsa_with_the_longest_salt_as_the_kubelet_does() -> None:
    # Go's rsa.SignPSS with nil options: salt = modulus bytes - hash size - 2.
    proof = keys.sign_proof(_rsa_key(), POD_UID)
    public = _rsa_key().public_key()
    longest = (public.key_size + 7) // 8 - 32 - 2
    pss = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=longest)
    public.verify(proof, POD_UID.encode(), pss, hashes.SHA256())  # raises if another length


# --- the shim on 1.35: the agent asks in the form the server takes -----------------------------


def test_the_shim_on_1_35_asks_with_key_and_proof_and_writes_the_credential() -> None:
    rig = Rig(FakeKube(key_form=requests.PROOF_OF_POSSESSION), MemoryStorage(), Clock(), CA())
    rig.apply(make_pod([cert_volume()]))
    [pcr] = rig.kube.created
    spec = pcr["spec"]
    assert "stubPKCS10Request" not in spec
    public = serialization.load_der_public_key(base64.b64decode(spec["pkixPublicKey"]))
    proof = base64.b64decode(spec["proofOfPossession"])
    assert keys.proof_verifies(public, UID, proof)
    # Issued for that key (as the signer would), the credential is written.
    lifetime = dt.timedelta(hours=24)
    not_before = rig.clock.now - dt.timedelta(minutes=1)
    chain = rig.ca.leaf(public, not_before, not_before + lifetime)
    rig.answer(
        pcr,
        {
            "conditions": [{"type": "Issued", "status": "True", "reason": "Issued"}],
            "certificateChain": chain.decode(),
            "notBefore": _stamp(not_before),
            "notAfter": _stamp(not_before + lifetime),
            "beginRefreshAt": _stamp(not_before + lifetime / 2),
        },
    )
    assert set(rig.files()) == {"bundle.pem"}


def _stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# --- which form a server takes, from its schema ---------------------------------------------------

SPEC_1_35 = {
    "signerName", "podName", "podUID", "serviceAccountName", "serviceAccountUID", "nodeName",
    "nodeUID", "maxExpirationSeconds", "pkixPublicKey", "proofOfPossession",
    "unverifiedUserAnnotations",
}  # fmt: skip
SPEC_1_36 = SPEC_1_35 | {"stubPKCS10Request"}
SPEC_1_37_V1 = (SPEC_1_35 - {"pkixPublicKey", "proofOfPossession"}) | {"stubPKCS10Request"}


@pytest.mark.parametrize(
    ("version", "fields", "form"),
    [
        pytest.param("v1beta1", SPEC_1_35, "proofOfPossession", id="1.35: key and proof only"),
        pytest.param("v1beta1", SPEC_1_36, "stubPKCS10Request", id="1.36: both, stub preferred"),
        pytest.param("v1", SPEC_1_37_V1, "stubPKCS10Request", id="1.37 v1: stub only"),
        pytest.param("v1", None, "stubPKCS10Request", id="no schema, v1: stub"),
        pytest.param("v1beta1", None, "proofOfPossession", id="no schema, v1beta1: key and proof"),
        pytest.param("v1beta1", {"podUID", "pkixPublicKey"}, None, id="neither form: unserved"),
    ],
)
def test_the_form_a_node_sends_follows_the_servers_schema(
    version: str, fields: set[str] | None, form: str | None
) -> None:
    assert versions.key_form(version, fields) == form


def test_the_spec_fields_are_read_from_the_openapi_document() -> None:
    name = "io.k8s.api.certificates.v1beta1.PodCertificateRequestSpec"
    properties = {key: {"type": "string"} for key in SPEC_1_35}
    document = {"components": {"schemas": {name: {"properties": properties}}}}
    assert versions.spec_fields(document, "v1beta1") == SPEC_1_35
    assert versions.spec_fields(document, "v1") is None
    assert versions.spec_fields({"components": []}, "v1beta1") is None


# --- a server that serves no requests: one line at start-up ---------------------------------------


class NoPodCertificates:
    """What an API server of 1.34 (or 1.35 without the feature gates) answers to discovery."""

    def __init__(self, *args: object) -> None:
        pass

    def get(self, path: str, **query: object) -> dict[str, Any] | None:
        if path == "/version":
            return {"gitVersion": "v1.34.2"}
        if path == "/apis/certificates.k8s.io/v1":
            return {"resources": [{"name": "certificatesigningrequests"}]}
        return None

    def request(self, method: str, path: str, **kwargs: object) -> dict[str, Any]:
        found = self.get(path)
        if found is None:
            raise ApiError(404, "NotFound", path)
        return found


def test_discovery_names_the_server_version_and_what_it_lacks() -> None:
    with pytest.raises(Unserved) as caught:
        discovery.certificates_versions(NoPodCertificates())  # type: ignore[arg-type]
    message = str(caught.value)
    assert message.startswith("Kubernetes v1.34.2 serves no certificates.k8s.io")
    assert "podcertificaterequests" in message and "\n" not in message


def _one_error_line(caplog: pytest.LogCaptureFixture) -> str:
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert errors[0].exc_info is None  # no traceback
    line = errors[0].getMessage()
    assert "v1.34.2" in line and "\n" not in line
    return line


@pytest.fixture
def no_pod_certificates(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (signer_build, shim_build):
        monkeypatch.setattr(module, "Rest", NoPodCertificates)
        monkeypatch.setattr(module, "load_client", lambda path: None)
        monkeypatch.setattr(module.Runtime, "handle_signals", lambda self: None)


def test_the_signer_says_it_cannot_run_in_one_line(
    no_pod_certificates: None, caplog: pytest.LogCaptureFixture
) -> None:
    config = signer_build.Config(signer_names=(SIGNER,), policy=POLICY, namespace="podcert")
    assert signer_build.run(config) == 1
    line = _one_error_line(caplog)
    assert line.startswith("the signer cannot run here: Kubernetes v1.34.2 serves no")


def test_the_shim_says_it_cannot_run_in_one_line(
    no_pod_certificates: None, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    assert shim_build.run(shim_build.Config(node_name="node-a", root=tmp_path)) == 1
    assert _one_error_line(caplog).startswith("the shim cannot run here: Kubernetes v1.34.2")


def test_the_audit_says_it_cannot_read_the_cluster_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import podcert.client.commandline
    import podcert.client.rest

    monkeypatch.setattr(podcert.client.rest, "Rest", NoPodCertificates)
    monkeypatch.setattr(podcert.client.commandline, "from_args", lambda args, **_: None)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("")
    # It answered, and cannot hold Pod Certificates: a finding (1), not an outage (3).
    assert main(["audit", "--kubeconfig", str(kubeconfig)]) == EXIT_FINDINGS
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("podcert audit: cannot audit the cluster: Kubernetes v1.34.2 serves no")
