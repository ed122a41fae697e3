"""The signer with its intermediates' keys in a real SoftHSM2 token: leaves chain to the root,
and no API object holds the token's key; a wrong PIN stops start-up with one line.

The root's key still lives in the CA Secret (`ca.key`): what this proves is that the key that
signs every leaf is nowhere but in the token. Each PEM private key found in any Secret,
ConfigMap, ClusterTrustBundle or PodCertificateRequest is loaded and compared, by its public
key, with the token key's (which cannot be exported, so this is how its absence is shown).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from devcluster import processes
from devcluster.identities import Paths
from devcluster.testing import DevCluster
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


def _signer(devcluster: DevCluster, tmp_path: Path, tokens: softhsm.Tokens, pin: Path) -> Any:
    proc = processes.signer(
        devcluster.root,
        tmp_path,
        [SIGNER],
        namespace=NAMESPACE,
        extra=_token_flags(pin),
    )
    proc.env.update(tokens.env)
    return proc.start()


def _token_flags(pin: Path) -> list[str]:
    return [f"--ca-key-uri=pkcs11:token={TOKEN};object=podcert-ca", f"--ca-key-pin-file={pin}"]


def _texts(obj: Any) -> list[bytes]:
    """Every string in an API object, and the base64-decoded form of a Secret's data."""
    found = [json.dumps(obj).encode()]
    if obj.get("kind") == "Secret" or "type" in obj:
        for value in (obj.get("data") or {}).values():
            found.append(base64.b64decode(value))
    return found


def _every_object(rest: Rest) -> list[Any]:
    out: list[Any] = []
    for version, resource in (
        ("v1", "secrets"),
        ("v1", "configmaps"),
        ("certificates.k8s.io/v1beta1", "clustertrustbundles"),
        (PCRS, "podcertificaterequests"),
    ):
        out += rest.request("GET", path_of(version, resource))["items"]
    return out


def test_leaves_are_signed_in_the_token_and_its_key_is_in_no_api_object(
    devcluster: DevCluster, tmp_path: Path
) -> None:
    tokens = softhsm.make(tmp_path / "softhsm")
    tokens.init_token(TOKEN)
    ns = devcluster.namespace("hsm-pods")
    signer = _signer(devcluster, tmp_path, tokens, tokens.pin_file)
    try:
        signer.wait_ready()
        pods = [make_pod(devcluster, ns, f"p{i}", SIGNER) for i in range(5)]
        done = [settled(devcluster, request_as_node(devcluster, p, SIGNER)[1]) for p in pods]
    finally:
        signer.stop()
    rest = Rest(devcluster.admin)
    secret = rest.request("GET", path_of("v1", "secrets", NAMESPACE, "podcert-ca"))["data"]
    [root] = x509.load_pem_x509_certificates(base64.b64decode(secret["ca.crt"]))
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

    # `ca prepare` makes the next generation's key in the token too.
    prepare = subprocess.run(
        [
            *(sys.executable, "-m", "podcert", "signer", "ca", "prepare"),
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
    assert prepare.returncode == 0, prepare.stderr
    secret = rest.request("GET", path_of("v1", "secrets", NAMESPACE, "podcert-ca"))["data"]
    assert not [name for name in secret if name.endswith("tls.key")]
    uris = {base64.b64decode(v).decode() for k, v in secret.items() if k.endswith("tls.key-uri")}
    assert len(uris - {base64.b64decode(secret["tls.key-uri"]).decode()}) == 1, uris
    assert all(u.startswith(f"pkcs11:token={TOKEN};object=podcert-ca-") for u in uris), uris
    token_publics = {
        x509.load_pem_x509_certificate(base64.b64decode(v)).public_key().public_bytes(*SPKI)
        for k, v in secret.items()
        if k.endswith(".tls.crt")
    }
    assert len(token_publics) == 2

    keys_seen = 0
    for obj in _every_object(rest):
        for text in _texts(obj):
            for block in PEM_KEY.findall(text):
                key = serialization.load_pem_private_key(block, password=None)
                keys_seen += 1
                assert key.public_key().public_bytes(*SPKI) not in token_publics, obj["metadata"]
    assert keys_seen >= 1  # the scan sees private keys where they are: the root's ca.key


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
