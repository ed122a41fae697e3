"""The signer's own log lines and the Events it writes carry no key material.

A signer logging at DEBUG, with an audit log (so it holds an audit key too), issues, denies and
goes through a whole CA rotation (prepare, activate: a second CA key, a new audit key). Then its
log and every Event it wrote are scanned for a PEM private-key block, for any line or the whole
base64 body of each CA key its Secret holds, and for any base64 run that decodes to a private
key at all (which covers the keys it never writes down, such as its audit key).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import subprocess
import sys
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from devcluster.identities import Paths
from devcluster.testing import DevCluster, eventually
from podcert.api import keys
from podcert.client.rest import JSON, Rest, path_of
from tests.integration.conftest import StartSigner
from tests.integration.helpers import (
    condition,
    create_pcr,
    events_for,
    make_pod,
    pcr_spec,
    request_as_node,
    settled,
)

SIGNER = "keys.podcert.dev/main"
NAMESPACE = "podcert-keys"
NODE = "keys-node"
PEM_KEY = re.compile(
    rb"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----\n(.*?)\n-----END (?:[A-Z]+ )?PRIVATE KEY-----",
    re.S,
)
BASE64_RUN = re.compile(r"[A-Za-z0-9+/]{40,}={0,2}")


@pytest.fixture(scope="module")
def signer(start_signer: StartSigner, tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("keys")
    return start_signer(
        SIGNER,
        namespace=NAMESPACE,
        workdir=work,
        log_level="DEBUG",
        audit_log=work / "audit.jsonl",
        audit_checkpoint_every=1,
    )


def ca_command(devcluster: DevCluster, action: str) -> str:
    """`podcert signer ca ACTION` as the operating guide writes it (flags after the action)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "podcert",
            "signer",
            "ca",
            action,
            f"--kubeconfig={Paths(devcluster.root.resolve()).admin_kubeconfig}",
            f"--namespace={NAMESPACE}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def ca_keys(devcluster: DevCluster) -> list[bytes]:
    """The base64 bodies of every private key in the signer's CA Secret (all generations)."""
    secret = Rest(devcluster.admin).request(
        "GET", path_of("v1", "secrets", NAMESPACE, "podcert-ca")
    )
    found = []
    for value in secret["data"].values():
        found += [m.group(1) for m in PEM_KEY.finditer(base64.b64decode(value))]
    return found


def signer_events(devcluster: DevCluster) -> list[str]:
    """Every Event our signer wrote (its component), as JSON text."""
    items = Rest(devcluster.admin).request("GET", path_of("v1", "events"))["items"]
    return [
        json.dumps(e)
        for e in items
        if e.get("reportingComponent") == "podcert-signer"
        or (e.get("source") or {}).get("component") == "podcert-signer"
    ]


def holds_a_private_key(text: str) -> list[str]:
    """The base64 runs in `text` that decode to a DER private key."""
    hits = []
    for run in BASE64_RUN.findall(text):
        try:
            der = base64.b64decode(run + "=" * (-len(run) % 4))
            serialization.load_der_private_key(der, password=None)
        except (binascii.Error, ValueError, TypeError):
            continue
        hits.append(run[:16] + "...")
    return hits


def issuer_key_id(pcr: JSON) -> bytes:
    """The key identifier of the CA that signed `pcr`'s leaf."""
    leaf = x509.load_pem_x509_certificates(pcr["status"]["certificateChain"].encode())[0]
    aki = leaf.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier is not None
    return aki.key_identifier


def test_the_log_and_events_hold_no_key_material_through_issuance_denial_and_rotation(
    devcluster: DevCluster, signer: Any
) -> None:
    ns = devcluster.namespace("keys")
    pod = make_pod(devcluster, ns, "app", SIGNER, node=NODE)
    first = settled(devcluster, request_as_node(devcluster, pod, SIGNER)[1])
    assert condition(first).type == "Issued"
    hostile = pcr_spec(
        devcluster,
        pod,
        SIGNER,
        keys.generate("ECDSAP256"),
        unverifiedUserAnnotations={"evil.example/escalate": "yes"},
    )
    denied = settled(devcluster, create_pcr(devcluster.admin, ns, hostile))
    assert condition(denied).type == "Denied"
    events_for(devcluster, denied)

    # A whole rotation: the signer makes, publishes and switches to a second CA key, and
    # re-keys its audit trail under it.
    ca_command(devcluster, "prepare")
    ca_command(devcluster, "activate")
    assert len(ca_keys(devcluster)) >= 2

    def issued_by_the_new_ca() -> bool:
        done = settled(devcluster, request_as_node(devcluster, pod, SIGNER)[1])
        return issuer_key_id(done) != issuer_key_id(first)

    eventually(issued_by_the_new_ca, timeout=30, interval=0.5, what="a leaf from the new CA")

    log = signer.output()
    events = signer_events(devcluster)
    assert events, "the signer wrote no Event to scan"
    # The log covers what the signer did: issuance, the denial, and the CA's changes.
    assert "issued serial" in log and "denied (UnknownAnnotation)" in log
    assert log.count('"logger": "podcert.signer.ca"') >= 2
    bodies = ca_keys(devcluster)
    for name, text in [("the signer's log", log), *(("an Event", e) for e in events)]:
        assert "PRIVATE KEY" not in text, name
        flat = text.replace("\\n", "")
        for body in bodies:
            lines = body.decode().splitlines()
            assert "".join(lines) not in flat, f"a CA key in {name}"
            assert not [line for line in lines if len(line) >= 16 and line in text], name
        assert holds_a_private_key(text) == [], f"a private key in {name}"
