"""SPIRE as podcert's upstream: one trust domain, SPIRE's roots, podcert's intermediate.

A SPIRE server and agent (devcluster.spire; the agent attested with a join token, workloads
with the unix attestor and its `unix:path` selector) hold trust domain one.test. podcert's
signer is registered in SPIRE as a downstream workload (an entry with `-downstream`, selected
by this Python's path and user) and runs with `--upstream spire`: it fetches its X509-SVID from
the agent's Workload API and has SPIRE's server sign its intermediate (NewDownstreamX509CA).
No federation: a SPIRE workload (go-spiffe, an SVID from the agent) and a podcert pod (shim
node, the Python example pair) verify each other against SPIRE's roots alone.

Under traffic both ways, SPIRE rotates its CA (`localauthority x509 prepare`, `activate`, and
`taint` of the old one, which re-issues every SVID it signed) and podcert renews its
intermediate under SPIRE's new CA (`podcert signer ca prepare --upstream spire`, the schedule
activating it after the overlap); no call fails and `podcert audit` is clean. Last, with SPIRE's
server stopped, the signer keeps issuing from its current intermediate while its renewal
attempts fail, are counted and show as pending (the PodcertUpstreamRenewalFailing condition).
"""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kubernetes import client

from devcluster import build, kube, processes
from devcluster.identities import Paths
from devcluster.spire import SpireDomain, ensure_spire
from devcluster.testing import DevCluster, eventually
from podcert.cli import main
from signer.authority import schedule, spireupstream
from signer.authority.downstream import UpstreamUnavailable
from tests.integration.conftest import StartShim, StartSigner
from tests.integration.interop_helpers import (
    Files,
    GoSpiffe,
    GoSpiffeRefused,
    Operator,
    last_json,
    python_client,
    python_client_flags,
    python_server,
)

TD = "one.test"
SIGNER = "spire-upstream.podcert.dev/workload"
NAMESPACE = "podcert-spire-upstream"
NODE = "spire-up-node"
SIGNER_ID = f"spiffe://{TD}/podcert/signer"
SPIRE_WORKLOAD = f"spiffe://{TD}/ns/shop/sa/web"
TIMEOUT = 180  # the agent syncs entries every 5 s; the rotation loop looks every 30 s
DER = serialization.Encoding.DER


@pytest.fixture(scope="module")
def gospiffe() -> GoSpiffe:
    return GoSpiffe(build.ensure_interop("gospiffe"))


@pytest.fixture(scope="module")
def spire(tmp_path_factory: pytest.TempPathFactory, gospiffe: GoSpiffe) -> Iterator[SpireDomain]:
    """SPIRE for one.test; its CA lasts 10 days, so an intermediate it signs covers a day's
    leaf and the overlap even just before SPIRE activates its next CA (at 5/6 of its life)."""
    domain = SpireDomain.start(
        ensure_spire(), TD, tmp_path_factory.mktemp("spire-upstream"), ca_ttl="240h"
    )
    try:
        domain.start_agent()
        uid = f"unix:uid:{os.getuid()}"
        # The signer: a downstream workload, this Python as this user (the signer runs as
        # `python -m podcert`; the unix attestor reports the interpreter's resolved path).
        python = f"unix:path:{os.path.realpath(sys.executable)}"
        domain.server(
            *("entry", "create", "-parentID", domain.agent_id, "-spiffeID", SIGNER_ID),
            *("-selector", uid, "-selector", python, "-downstream"),
        )
        workload = f"unix:path:{os.path.realpath(gospiffe.binary)}"
        domain.server(
            *("entry", "create", "-parentID", domain.agent_id, "-spiffeID", SPIRE_WORKLOAD),
            *("-selector", uid, "-selector", workload),
        )
        yield domain
    finally:
        domain.stop()


def agent_socket(spire: SpireDomain) -> str:
    return str(spire.sockets / "agent.sock")


def policy() -> str:
    return f"""
signers:
  - name: {SIGNER}
    trustDomain: {TD}
    allow:
      - namespaces: ["spu-*"]
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spire-upstream-signer")


@pytest.fixture(scope="module")
def signer(start_signer: StartSigner, spire: SpireDomain, work: Path) -> processes.Signer:
    # The agent holds the signer's entry once it has synced (this process matches it too).
    eventually(
        lambda: svid_or_none(spire),
        timeout=TIMEOUT,
        interval=0.5,
        what="the signer's SVID at the SPIRE agent",
    )
    (work / "policy.yaml").write_text(policy())
    return start_signer(
        SIGNER,
        namespace=NAMESPACE,
        policy=work / "policy.yaml",
        audit_log=work / "audit.jsonl",
        ca_overlap_seconds=4,
        bundle_refresh_hint_seconds=1,
        extra=[
            "--upstream=spire",
            f"--spire-agent-socket={agent_socket(spire)}",
            f"--spire-server=127.0.0.1:{spire.server_port}",
            "--spire-check-seconds=1",
        ],
    )


def svid_or_none(spire: SpireDomain) -> spireupstream.WorkloadSVID | None:
    try:
        return spireupstream.fetch_svid(agent_socket(spire))
    except UpstreamUnavailable:
        return None


@pytest.fixture(scope="module")
def shim(start_shim: StartShim, signer: processes.Signer) -> processes.Shim:
    return start_shim(NODE)


def pod_with_identity(devcluster: DevCluster, shim: processes.Shim, ns: str, name: str) -> Files:
    volume = kube.pod_certificate_volume(SIGNER, trust_bundle_signer=True)
    pod = devcluster.pod(ns, name, node=NODE, service_account=name, volumes=[volume])
    files = Files(shim.volume_dir(pod.metadata.uid))
    eventually(files.ready, timeout=TIMEOUT, what=f"{ns}/{name}'s credential and trust bundle")
    return files


@pytest.fixture(scope="module")
def pod(devcluster: DevCluster, shim: processes.Shim) -> tuple[str, str, Files]:
    ns = devcluster.namespace("spu")
    return ns, f"spiffe://{TD}/ns/{ns}/sa/api", pod_with_identity(devcluster, shim, ns, "api")


def ca_secret(devcluster: DevCluster) -> dict[str, bytes]:
    secret = client.CoreV1Api(devcluster.admin).read_namespaced_secret("podcert-ca", NAMESPACE)
    return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}


def generations(devcluster: DevCluster) -> list[schedule.Generation]:
    import datetime as dt

    return schedule.from_secret(ca_secret(devcluster), dt.datetime.now(dt.UTC))


def ders(certs: list[x509.Certificate]) -> set[bytes]:
    return {c.public_bytes(DER) for c in certs}


def spire_roots(spire: SpireDomain) -> set[bytes]:
    pem = spire.server("bundle", "show", "-format", "pem").encode()
    return ders(x509.load_pem_x509_certificates(pem))


def pem_ders(path: Path) -> set[bytes]:
    return ders(x509.load_pem_x509_certificates(path.read_bytes()))


def chain_of(files: Files) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(files.credential.read_bytes())


def workload_view(gospiffe: GoSpiffe, spire: SpireDomain) -> dict[str, Any]:
    try:
        return gospiffe.run("workload", workload_api=spire.workload_api)
    except GoSpiffeRefused as refused:
        if "no identity issued" not in str(refused):
            raise
        return {"bundles": {}, "serial": None}


def test_the_signer_issues_under_spires_root_in_one_trust_domain(
    devcluster: DevCluster,
    gospiffe: GoSpiffe,
    spire: SpireDomain,
    pod: tuple[str, str, Files],
) -> None:
    _, _, files = pod
    (gen,) = generations(devcluster)
    assert gen.state == "active" and gen.bundle.root_key is None  # no root of podcert's own
    assert gen.root.public_bytes(DER) in spire_roots(spire)
    leaf, intermediate = chain_of(files)[:2]
    assert intermediate == gen.bundle.intermediate
    assert intermediate.issuer == gen.root.subject  # SPIRE's CA signed podcert's intermediate
    assert leaf.issuer == intermediate.subject
    assert pem_ders(files.trust) == spire_roots(spire)  # the pod trusts SPIRE's roots alone

    def holds_roots() -> dict[str, Any] | None:
        view = workload_view(gospiffe, spire)
        return view if TD in view["bundles"] else None

    view = eventually(holds_roots, timeout=TIMEOUT, what="the SPIRE workload's SVID")
    assert view["spiffe_id"] == SPIRE_WORKLOAD
    assert {base64.b64decode(d) for d in view["bundles"][TD]} == pem_ders(files.trust)


def authorities(spire: SpireDomain) -> dict[str, Any]:
    shown: dict[str, Any] = json.loads(
        spire.server("localauthority", "x509", "show", "-output", "json")
    )
    return shown


def test_mutual_tls_both_ways_through_a_spire_ca_rotation_and_an_intermediate_renewal(
    devcluster: DevCluster,
    gospiffe: GoSpiffe,
    spire: SpireDomain,
    pod: tuple[str, str, Files],
    tmp_path: Path,
) -> None:
    ns, pod_id, files = pod
    operator = Operator(Paths(devcluster.root.resolve()).admin_kubeconfig)
    client_flags = {"rate": 5, "reload_interval": 0.5}
    with (
        python_server(files, tmp_path / "server.log", allow_id=SPIRE_WORKLOAD) as url,
        gospiffe.serve(None, client_id=pod_id, workload_api=spire.workload_api) as go_server,
        gospiffe.calling(url, server_id=pod_id, workload_api=spire.workload_api) as go_client,
    ):
        py_client = processes.Process(
            args=python_client_flags(files, go_server.url, SPIRE_WORKLOAD, **client_flags),
            log=tmp_path / "client.log",
            module="examples.mtls.client",
        ).start()
        try:
            first_leaf = gospiffe.verify(files)["serial"]
            first_svid = workload_view(gospiffe, spire)["serial"]
            # SPIRE prepares its next CA: in SPIRE's bundle, so in the pod's trust file.
            spire.server("localauthority", "x509", "prepare")
            eventually(lambda: files.roots() == 2, timeout=TIMEOUT, what="SPIRE's next root")
            assert pem_ders(files.trust) == spire_roots(spire)
            old = authorities(spire)["active"]["authority_id"]
            new = authorities(spire)["prepared"]["authority_id"]
            spire.server("localauthority", "x509", "activate", "-authorityID", new)
            # Tainted, the old CA's SVIDs are re-issued by the new one at once.
            spire.server("localauthority", "x509", "taint", "-authorityID", old)
            eventually(
                lambda: workload_view(gospiffe, spire)["serial"] not in (None, first_svid),
                timeout=TIMEOUT,
                what="the SPIRE workload's SVID from SPIRE's new CA",
            )
            new_root = next(
                c
                for c in x509.load_pem_x509_certificates(files.trust.read_bytes())
                if c.public_bytes(DER) != generations(devcluster)[0].root.public_bytes(DER)
            )
            # podcert renews its intermediate: SPIRE's new CA signs it.
            operator.ca(NAMESPACE, "prepare", "--upstream", "spire")
            renewed = eventually(
                lambda: next(
                    (
                        g
                        for g in generations(devcluster)
                        if g.state == "active" and g.root == new_root
                    ),
                    None,
                ),
                timeout=TIMEOUT,
                what="an intermediate from SPIRE's new CA, prepared then active",
            )
            operator.rotate(ns, "api")
            eventually(
                lambda: chain_of(files)[1] == renewed.bundle.intermediate,
                timeout=TIMEOUT,
                what="the pod's leaf from the renewed intermediate",
            )
            assert gospiffe.verify(files)["serial"] != first_leaf
            # One more round each way beside the running clients.
            after = gospiffe.client(None, url, server_id=pod_id, workload_api=spire.workload_api)
            assert after["ok"] == 3
            again = python_client(files, go_server.url, SPIRE_WORKLOAD, **client_flags)
            assert again["failed"] == 0 and again["ok"] > 0, again
        finally:
            py_client.stop()
    go_summary = go_client.stop()
    py_summary = last_json(py_client.output())
    assert go_summary, "the go-spiffe client printed no summary"
    assert py_summary is not None, py_client.output()[-2000:]
    assert go_summary["failed"] == 0, go_summary["errors"]
    assert py_summary["failed"] == 0, py_summary["errors"]
    assert go_summary["ok"] > 0 and py_summary["ok"] > 0
    assert first_leaf in go_summary["server_serials"] and len(go_summary["server_serials"]) >= 2


def test_podcert_audit_is_clean(
    devcluster: DevCluster,
    shim: processes.Shim,
    pod: tuple[str, str, Files],
    work: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ns, _, _ = pod
    capsys.readouterr()
    code = main(
        [
            "audit",
            f"--kubeconfig={Paths(devcluster.root.resolve()).admin_kubeconfig}",
            f"--root={shim.root}",
            f"--audit-log={work / 'audit.jsonl'}",
            f"--namespace={ns}",
            f"--signer-name={SIGNER}",  # the session's cluster holds other tests' signers
            "-o",
            "json",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report["findings"]
    assert report["findings"] == []
    assert {p["state"] for p in report["projections"]} == {"fresh"}


def sample(signer: processes.Signer, metric: str) -> float:
    for line in signer.metrics().splitlines():
        if line.startswith(f"{metric} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_with_spires_server_away_the_signer_keeps_issuing_and_shows_the_failures(
    devcluster: DevCluster,
    spire: SpireDomain,
    signer: processes.Signer,
    shim: processes.Shim,
    pod: tuple[str, str, Files],
) -> None:
    """Runs last: it stops SPIRE's server for good."""
    import time

    before = sample(signer, "podcert_signer_upstream_renewal_failures_total")
    expiry = sample(signer, "podcert_signer_upstream_intermediate_expiry_timestamp_seconds")
    assert expiry > time.time() + 86400  # covers a day's leaf and more
    spire.stop_server()
    Operator(Paths(devcluster.root.resolve()).admin_kubeconfig).ca(
        NAMESPACE, "prepare", "--upstream", "spire"
    )
    eventually(
        lambda: (
            sample(signer, "podcert_signer_upstream_renewal_failures_total") >= before + 2
            and sample(signer, "podcert_signer_upstream_renewal_pending") == 1
        ),
        timeout=TIMEOUT,
        what="failed renewals counted, the renewal pending (PodcertUpstreamRenewalFailing)",
    )
    # Issuance goes on from the current intermediate: a new pod gets its credential.
    ns, _, _ = pod
    files = pod_with_identity(devcluster, shim, ns, "late")
    assert (
        chain_of(files)[1]
        == next(g for g in generations(devcluster) if g.state == "active").bundle.intermediate
    )
    assert signer.running
    assert "SPIRE upstream (attempt" in signer.output()
