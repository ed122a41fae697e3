"""The signer with its CA keys (root and intermediate) in a real SoftHSM2 token: leaves, the
webhook's serving certificate and the audit checkpoints' certificate chain to the token's root,
through a rotation (prepare, activate, retire) made in the token too, and no API object holds
any private key of the CA; a token that goes away leaves requests pending (counted in
podcert_signer_token_errors_total) until it is back, none Failed; a wrong PIN stops start-up
with one line.

The token's keys cannot be exported, so their absence is shown by their public halves: every
private key found in any Secret, ConfigMap, ClusterTrustBundle, PodCertificateRequest or Event
(a PEM block, or the DER of a PKCS#8 or SEC1 EC key anywhere in the bytes) is loaded and its
public key compared with the CA's.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import re
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from devcluster import processes
from devcluster.identities import Paths
from devcluster.supervise import free_port
from devcluster.testing import DevCluster, eventually
from podcert.auditlog import verify
from podcert.client.rest import Rest, path_of
from tests import softhsm
from tests.integration.helpers import PCRS, condition, make_pod, request_as_node, settled

pytestmark = pytest.mark.integration

SIGNER = "hsm.podcert.dev/main"
NAMESPACE = "podcert-hsm"
TOKEN = "podcert-it"
PEM_KEY = re.compile(
    rb"-----BEGIN [A-Z ]*PRIVATE KEY-----.+?-----END [A-Z ]*PRIVATE KEY-----", re.S
)
SPKI = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
# Where a DER EC private key starts: PKCS#8 (P-256's, and longer curves') and SEC1 (RFC 5915).
DER_KEY = re.compile(
    rb"\x30\x81[\x80-\xff]\x02\x01\x00\x30"  # PKCS#8, a length of one byte
    rb"|\x30\x82..\x02\x01\x00\x30"  # PKCS#8, two bytes
    rb"|\x30[\x70-\x7f]\x02\x01\x01\x04",  # SEC1 ECPrivateKey, version 1
    re.S,
)
ERRORS = "podcert_signer_token_errors_total"


def _signer(
    devcluster: DevCluster,
    tmp_path: Path,
    tokens: softhsm.Tokens,
    pin: Path,
    extra: tuple[str, ...] = (),
    namespace: str = NAMESPACE,
) -> Any:
    proc = processes.signer(
        devcluster.root,
        tmp_path,
        [SIGNER],
        namespace=namespace,
        extra=[*_token_flags(pin), *extra],
    )
    proc.env.update(tokens.env)
    return proc.start()


def _token_flags(pin: Path) -> list[str]:
    return [f"--ca-key-uri=pkcs11:token={TOKEN};object=podcert-ca", f"--ca-key-pin-file={pin}"]


def _texts(obj: Any) -> list[bytes]:
    """Every string in an API object, and the base64-decoded form of a Secret's data and a
    ConfigMap's binaryData."""
    found = [json.dumps(obj).encode()]
    if obj.get("kind") == "Secret" or "type" in obj:
        for value in (obj.get("data") or {}).values():
            found.append(base64.b64decode(value))
    for value in (obj.get("binaryData") or {}).values():
        found.append(base64.b64decode(value))
    return found


def _private_keys(text: bytes) -> list[Any]:
    """Every private key in `text`: PEM blocks, and DER keys wherever one parses."""
    found = [serialization.load_pem_private_key(b, password=None) for b in PEM_KEY.findall(text)]
    for match in DER_KEY.finditer(text):
        at, second = match.start(), text[match.start() + 1]
        if second == 0x81:
            end = at + 3 + text[at + 2]
        elif second == 0x82:
            end = at + 4 + int.from_bytes(text[at + 2 : at + 4])
        else:
            end = at + 2 + second
        try:
            found.append(serialization.load_der_private_key(text[at:end], None))
        except (ValueError, TypeError):
            continue  # bytes that only look like the start of a key
    return found


def _metric(signer: Any, name: str) -> float:
    for line in signer.metrics().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _served_certificate(port: int) -> x509.Certificate:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # what is served, not trust
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _ca(args: list[str], devcluster: DevCluster, tokens: softhsm.Tokens) -> str:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "podcert", "signer", "ca", *args),
            f"--kubeconfig={Paths(devcluster.root.resolve()).admin_kubeconfig}",
            f"--namespace={NAMESPACE}",
            *_token_flags(tokens.pin_file),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **tokens.env},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _every_object(rest: Rest) -> list[Any]:
    out: list[Any] = []
    for version, resource in (
        ("v1", "secrets"),
        ("v1", "configmaps"),
        ("v1", "events"),
        ("certificates.k8s.io/v1beta1", "clustertrustbundles"),
        (PCRS, "podcertificaterequests"),
    ):
        out += rest.request("GET", path_of(version, resource))["items"]
    return out


def test_ca_signatures_are_made_in_the_token_through_a_rotation_and_no_object_holds_a_ca_key(
    devcluster: DevCluster, tmp_path: Path
) -> None:
    tokens = softhsm.make(tmp_path / "softhsm")
    tokens.init_token(TOKEN)
    ns = devcluster.namespace("hsm-pods")
    rest = Rest(devcluster.admin)
    secret_path = path_of("v1", "secrets", NAMESPACE, "podcert-ca")
    webhook = free_port()
    audit = tmp_path / "audit.jsonl"
    signer = _signer(
        devcluster,
        tmp_path,
        tokens,
        tokens.pin_file,
        (
            f"--webhook-port={webhook}",
            "--webhook-host=127.0.0.1",
            "--webhook-dns-name=localhost",
            f"--audit-log={audit}",
        ),
    )
    ca_publics: set[bytes] = set()

    def issue(count: int, prefix: str) -> tuple[x509.Certificate, x509.Certificate]:
        """`count` leaves, all Issued, chaining through the Secret's active intermediate to its
        root: the (intermediate, root) they chain to."""
        pods = [make_pod(devcluster, ns, f"{prefix}{i}", SIGNER) for i in range(count)]
        done = [settled(devcluster, request_as_node(devcluster, p, SIGNER)[1]) for p in pods]
        secret = rest.request("GET", secret_path)["data"]
        assert not [name for name in secret if name.endswith(".key") or name == "tls.key"]
        index = json.loads(base64.b64decode(secret["generations.json"]))
        [active] = [g["id"] for g in index if g["state"] == "active"]
        [root] = x509.load_pem_x509_certificates(base64.b64decode(secret[f"{active}.ca.crt"]))
        for pcr in done:
            assert condition(pcr).type == "Issued"
            leaf, intermediate = x509.load_pem_x509_certificates(
                pcr["status"]["certificateChain"].encode()
            )
            leaf.verify_directly_issued_by(intermediate)
            intermediate.verify_directly_issued_by(root)
            assert intermediate.public_bytes(serialization.Encoding.PEM) == base64.b64decode(
                secret["tls.crt"]
            )
        for name in ("tls.key-uri", "ca.key-uri"):
            uri = base64.b64decode(secret[f"{active}.{name}"]).decode()
            assert uri.startswith(f"pkcs11:token={TOKEN};object=podcert-ca-"), uri
        ca_publics.update(c.public_key().public_bytes(*SPKI) for c in (intermediate, root))
        return intermediate, root

    try:
        signer.wait_ready()
        first, first_root = issue(3, "a")
        served = _served_certificate(webhook)
        served.verify_directly_issued_by(first)

        # A rotation, each step by hand: the new generation's keys are made in the token.
        _ca(["prepare"], devcluster, tokens)
        _ca(["activate"], devcluster, tokens)
        eventually(
            lambda: _served_certificate(webhook).issuer != first.subject or None,
            timeout=30,
            what="the webhook serving a certificate from the new intermediate",
        )
        second, second_root = issue(3, "b")
        assert second_root != first_root and second != first
        _served_certificate(webhook).verify_directly_issued_by(second)
        _ca(["retire", "--force"], devcluster, tokens)
        secret = rest.request("GET", secret_path)["data"]
        assert base64.b64decode(secret["ca.crt"]) == second_root.public_bytes(
            serialization.Encoding.PEM
        )
        # The audit checkpoints' certificates came from both intermediates: anchored in the roots.
        eventually(
            lambda: (
                verify(audit.read_bytes().splitlines(), [first_root, second_root], now()).anchored
                or None
            ),
            timeout=90,
            what="an anchored audit checkpoint",
        )
    finally:
        signer.stop()
    result = verify(audit.read_bytes().splitlines(), [first_root, second_root], now())
    assert result.ok and result.anchored, result.problems
    x5c = [
        x509.load_der_x509_certificate(base64.b64decode(c))
        for line in audit.read_bytes().splitlines()
        for c in _x5c(line)
    ]
    assert {c.issuer for c in x5c if c.subject != c.issuer} >= {first.subject, second.subject}

    # The scan's control: keys planted in every form it looks for are found.
    planted = [ec.generate_private_key(ec.SECP256R1()) for _ in range(3)]
    forms = [
        (serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8),
        (serialization.Encoding.DER, serialization.PrivateFormat.PKCS8),
        (serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL),
    ]
    rest.request(
        "POST",
        path_of("v1", "secrets", ns),
        body={
            "metadata": {"name": "scan-control"},
            "data": {
                f"k{n}": base64.b64encode(
                    key.private_bytes(*form, serialization.NoEncryption())
                ).decode()
                for n, (key, form) in enumerate(zip(planted, forms, strict=True))
            },
        },
    )
    seen: set[bytes] = set()
    for obj in _every_object(rest):
        for text in _texts(obj):
            for key in _private_keys(text):
                public = key.public_key().public_bytes(*SPKI)
                seen.add(public)
                assert public not in ca_publics, obj["metadata"]
    assert {k.public_key().public_bytes(*SPKI) for k in planted} <= seen
    assert len(ca_publics) == 4  # two generations' roots and intermediates, none found


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _x5c(line: bytes) -> list[str]:
    """The x5c of a checkpoint line's JWS header."""
    record = json.loads(line)
    token = record.get("jwt") or ""
    if not isinstance(token, str) or "." not in token:
        return []
    header = token.split(".", 1)[0]
    found = json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))
    return list(found.get("x5c") or [])


def test_a_token_that_goes_away_leaves_requests_pending_until_it_is_back_none_failed(
    devcluster: DevCluster, tmp_path: Path
) -> None:
    tokens = softhsm.make(tmp_path / "softhsm")
    tokens.init_token(TOKEN)
    ns = devcluster.namespace("hsm-away")
    signer = _signer(devcluster, tmp_path, tokens, tokens.pin_file, namespace="podcert-hsm-away")
    rest = Rest(devcluster.admin)
    away = tmp_path / "away"
    away.mkdir()
    token_dirs = [p for p in tokens.directory.iterdir() if p.is_dir()]
    try:
        signer.wait_ready()
        pod = make_pod(devcluster, ns, "before", SIGNER)
        assert condition(settled(devcluster, request_as_node(devcluster, pod, SIGNER)[1])).type == (
            "Issued"
        )
        assert _metric(signer, ERRORS) == 0
        # The token's files go away (an HSM unplugged, a volume lost): signatures fail.
        for found in token_dirs:
            found.rename(away / found.name)
        pods = [make_pod(devcluster, ns, f"away{i}", SIGNER) for i in range(3)]
        pending = [request_as_node(devcluster, p, SIGNER)[1] for p in pods]
        eventually(
            lambda: _metric(signer, ERRORS) >= 2 * len(pending) or None,
            timeout=30,
            what="the token's refusals counted, each request retried",
        )
        for pcr in pending:
            meta = pcr["metadata"]
            now_ = rest.request(
                "GET", path_of(PCRS, "podcertificaterequests", meta["namespace"], meta["name"])
            )
            assert not (now_.get("status") or {}).get("conditions"), now_["status"]
        # Back: each request is Issued, none Failed.
        for found in token_dirs:
            (away / found.name).rename(found)
        done = [settled(devcluster, pcr, timeout=30, explain=signer.output) for pcr in pending]
        assert [condition(pcr).type for pcr in done] == ["Issued"] * len(done)
        assert signer.running
    finally:
        signer.stop()
    assert "PRIVATE KEY" not in signer.output()
    assert "the CA key did not sign, retrying" in signer.output()


def test_a_wrong_pin_stops_start_up_with_one_line(devcluster: DevCluster, tmp_path: Path) -> None:
    tokens = softhsm.make(tmp_path / "softhsm")
    tokens.init_token(TOKEN)
    wrong = tmp_path / "wrong-pin"
    wrong.write_text("not-the-pin\n")
    signer = _signer(devcluster, tmp_path, tokens, wrong)
    assert signer.proc is not None
    try:
        assert signer.proc.wait(timeout=30) == 1
    finally:
        signer.stop()
    lines = [line for line in signer.output().splitlines() if "PIN" in line]
    assert len(lines) == 1, signer.output()
    assert f"--ca-key-uri: token '{TOKEN}': the PIN is wrong" in lines[0]
    assert "not-the-pin" not in signer.output()
