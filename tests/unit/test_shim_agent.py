"""The node agent's decisions, driven by hand: a fake API, MemoryStorage, a settable clock and a
seeded RNG. No API server: each test feeds watch events and calls `reconcile`. Only the tests at
the end start threads: they run the agent on the runtime, as `podcert shim` does, and wait for
conditions with a deadline."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import http.client
import os
import random
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bundles import formats
from bundles.formats import dump_private_key
from kubelet_shim import projection
from kubelet_shim.agent import Agent, Settings
from kubelet_shim.atomic import AtomicDirStorage
from kubelet_shim.build import Config, Shim
from kubelet_shim.kube import ROTATE_ANNOTATION, ForeignRequest, PodRef, same_request
from kubelet_shim.projection import ProjectionState
from kubelet_shim.storage import FileSpec, MemoryStorage
from podcert.api import keys
from podcert.api.pods import WorkKey
from podcert.api.requests import STUB_CSR, KeyForm, read_request
from podcert.client.rest import JSON, ApiError
from podcert.reconcile.runtime import Runtime
from tests.objects import pod_object

T0 = dt.datetime(2026, 11, 29, 20, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)
MIN = dt.timedelta(minutes=1)
SIGNER = "example.com/podcert"
UID = "0b7c6a1e-6f5e-4a57-9a3c-2d7b0c1f9e11"
NS = "prod"
# Refresh exactly at beginRefreshAt, so the tests can name the instant.
NO_JITTER = projection.Settings(jitter=dt.timedelta(0))


# --- a tiny CA that signs whatever key a request's stub CSR holds ---------------------------------


class CA:
    def __init__(self, name: str = "test root") -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(T0 - 24 * HOUR)
            .not_valid_after(T0 + 1000 * HOUR)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    @property
    def pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def leaf(self, public_key: Any, not_before: dt.datetime, not_after: dt.datetime) -> bytes:
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(self.cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier("spiffe://td/x")]),
                critical=True,
            )
            .sign(self.key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM) + self.pem


def stamp(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# --- the fake API ---------------------------------------------------------------------------------


@dataclass
class FakeKube:
    node_name: str = "node-a"
    key_form: KeyForm = STUB_CSR
    created: list[JSON] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    events: list[tuple[str, str, str, str]] = field(default_factory=list)
    fail_create: ApiError | None = None
    lose_answers: int = 0  # creates applied whose answer then never comes
    names: list[str] = field(default_factory=list)  # the name of every create asked for
    may_delete: bool = True

    def list_pods(self) -> tuple[list[JSON], str]:
        return [], "1"

    def watch_pods(self, resource_version: str) -> Iterator[JSON]:
        return iter(())

    list_pcrs = list_trust_bundles = list_pods
    watch_pcrs = watch_trust_bundles = watch_pods

    def node_uid(self) -> str:
        return "node-uid"

    def service_account_uid(self, namespace: str, name: str) -> str:
        return f"sa-uid-{name}"

    def create_pcr(self, namespace: str, body: JSON) -> JSON:
        """As ShimKube's: a name already taken is adopted when the request there is the same
        (`same_request`), refused (ForeignRequest) when it is not."""
        name = body["metadata"]["name"]
        self.names.append(name)
        if self.fail_create is not None:
            raise self.fail_create
        for existing in self.created:
            if existing["metadata"]["name"] == name:
                if same_request(existing, body):
                    return existing
                raise ForeignRequest(409, "AlreadyExists", f"{name} is another's")
        obj = {
            **body,
            "metadata": {
                **body["metadata"],
                "namespace": namespace,
                "uid": f"pcr-uid-{len(self.created)}",
            },
        }
        self.created.append(obj)
        if self.lose_answers:
            self.lose_answers -= 1
            raise ApiError(0, "Unavailable", "the connection broke before the answer")
        return obj

    def delete_pcr(self, namespace: str, name: str, uid: str) -> bool:
        if self.may_delete:
            self.deleted.append(name)
        return self.may_delete

    def record_event(
        self, pod: PodRef, kind: str, reason: str, message: str, now: dt.datetime
    ) -> None:
        self.events.append((pod.name, kind, reason, message))

    def reasons(self) -> list[str]:
        return [reason for _, _, reason, _ in self.events]


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now


def cert_volume(name: str = "identity", **source: Any) -> JSON:
    cert = {"signerName": SIGNER, "keyType": "ECDSAP256", "credentialBundlePath": "bundle.pem"}
    cert.update(source)
    cert = {k: v for k, v in cert.items() if v is not None}
    return {"name": name, "projected": {"sources": [{"podCertificate": cert}]}}


def make_pod(
    volumes: list[JSON],
    *,
    uid: str = UID,
    name: str = "web",
    annotations: dict[str, str] | None = None,
    phase: str = "Pending",
) -> JSON:
    return pod_object(
        name,
        volumes,
        namespace=NS,
        uid=uid,
        service_account="api",
        annotations=annotations or {},
        phase=phase,
    )


@dataclass
class Rig:
    kube: FakeKube
    storage: MemoryStorage
    clock: Clock
    ca: CA
    agent: Agent = field(init=False)
    settings: projection.Settings = field(default_factory=lambda: NO_JITTER)

    def __post_init__(self) -> None:
        self.agent = self.fresh_agent()

    def fresh_agent(self, stop: threading.Event | None = None) -> Agent:
        """A new agent process over the same disk (a restart)."""
        return Agent(
            self.kube,
            self.storage,
            settings=Settings(projection=self.settings),
            clock=self.clock,
            rng=random.Random(7),
            stop=stop,
        )

    def apply(self, pod: JSON, kind: str = "ADDED") -> projection.State:
        self.agent.on_pod_event(kind, pod)
        self.agent.reconcile(pod["metadata"]["uid"])
        return self.state(pod)

    def state(self, pod: JSON, volume: str = "identity", index: int = 0) -> projection.State:
        return self.agent.state_of(WorkKey(pod["metadata"]["uid"], volume, index))

    def answer(self, pcr: JSON, status: JSON) -> None:
        self.agent.on_pcr_event("MODIFIED", read_request({**pcr, "status": status}))
        self.agent.reconcile(pcr["spec"]["podUID"])

    def issue(
        self,
        pcr: JSON,
        lifetime: dt.timedelta = 24 * HOUR,
        refresh_after: dt.timedelta = 12 * HOUR,
    ) -> None:
        csr = x509.load_der_x509_csr(base64.b64decode(pcr["spec"]["stubPKCS10Request"]))
        not_before = self.clock.now - MIN
        chain = self.ca.leaf(csr.public_key(), not_before, not_before + lifetime)
        self.answer(
            pcr,
            {
                "conditions": [{"type": "Issued", "status": "True", "reason": "Issued"}],
                "certificateChain": chain.decode(),
                "notBefore": stamp(not_before),
                "notAfter": stamp(not_before + lifetime),
                "beginRefreshAt": stamp(not_before + refresh_after),
            },
        )

    def deny(self, pcr: JSON, reason: str = "PolicyDenied") -> None:
        self.answer(
            pcr,
            {
                "conditions": [
                    {"type": "Denied", "status": "True", "reason": reason, "message": "no"}
                ]
            },
        )

    def files(self, uid: str = UID, volume: str = "identity") -> dict[str, bytes]:
        return dict(self.storage.read_volume(uid, volume) or {})


@pytest.fixture
def rig() -> Rig:
    return Rig(FakeKube(), MemoryStorage(), Clock(), CA())


def issued_pod(rig: Rig, pod: JSON | None = None) -> JSON:
    pod = pod or make_pod([cert_volume()])
    rig.apply(pod)
    rig.issue(rig.kube.created[-1])
    return pod


# --- issuance -------------------------------------------------------------------------------------


def test_first_reconcile_requests_a_certificate_as_the_node_for_the_pod(rig: Rig) -> None:
    pod = make_pod([cert_volume(userAnnotations={"example.com/x": "y"}, maxExpirationSeconds=7200)])
    state = rig.apply(pod)
    assert isinstance(state, projection.Pending)
    [pcr] = rig.kube.created
    assert pcr["metadata"]["name"].startswith("web-")
    assert pcr["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": UID}
    ]
    spec = pcr["spec"]
    assert (spec["signerName"], spec["podName"], spec["podUID"]) == (SIGNER, "web", UID)
    assert (spec["serviceAccountName"], spec["serviceAccountUID"]) == ("api", "sa-uid-api")
    assert (spec["nodeName"], spec["nodeUID"]) == ("node-a", "node-uid")
    assert spec["maxExpirationSeconds"] == 7200
    assert spec["unverifiedUserAnnotations"] == {"example.com/x": "y"}
    csr = x509.load_der_x509_csr(base64.b64decode(spec["stubPKCS10Request"]))
    assert csr.is_signature_valid and csr.subject == x509.Name([])
    assert rig.files() == {}  # nothing to write before the answer


def test_an_issued_request_becomes_a_credential_bundle_with_exact_modes(rig: Rig) -> None:
    issued_pod(rig)
    files = rig.storage.files(UID, "identity")
    assert files is not None and set(files) == {"bundle.pem"}
    assert files["bundle.pem"].mode == 0o600
    credential = formats.load_credential(files["bundle.pem"].data)  # key matches leaf
    assert files["bundle.pem"].data.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert credential.chain[1] == rig.ca.cert
    assert isinstance(rig.state(make_pod([])), projection.Fresh)


def test_separate_key_and_chain_files_follow_default_mode(rig: Rig) -> None:
    volume = cert_volume(
        credentialBundlePath=None, keyPath="tls.key", certificateChainPath="tls.crt"
    )
    volume["projected"]["defaultMode"] = 0o440
    issued_pod(rig, make_pod([volume]))
    files = rig.storage.files(UID, "identity")
    assert files is not None
    # Key-bearing files keep to the owner bits of defaultMode; the chain takes it whole.
    assert (files["tls.key"].mode, files["tls.crt"].mode) == (0o400, 0o440)
    formats.load_credential_files(files["tls.key"].data, files["tls.crt"].data)


@pytest.mark.parametrize("key_type", keys.KEY_TYPES)
def test_every_api_key_type_is_generated_and_written(rig: Rig, key_type: str) -> None:
    issued_pod(rig, make_pod([cert_volume(keyType=key_type)]))
    formats.load_credential(rig.files()["bundle.pem"])


def test_a_chain_that_does_not_hold_the_requested_key_is_never_written(rig: Rig) -> None:
    pod = make_pod([cert_volume()])
    rig.apply(pod)
    pcr = rig.kube.created[-1]
    other = keys.generate("ECDSAP256").public_key()
    chain = rig.ca.leaf(other, T0, T0 + 24 * HOUR)
    rig.answer(
        pcr,
        {
            "conditions": [{"type": "Issued", "status": "True"}],
            "certificateChain": chain.decode(),
            "notBefore": stamp(T0),
            "notAfter": stamp(T0 + 24 * HOUR),
        },
    )
    assert isinstance(rig.state(pod), projection.Failed)
    assert rig.files() == {}
    assert rig.kube.reasons() == ["CertificateFailed"]


# --- refresh and rotation -------------------------------------------------------------------------


def test_past_begin_refresh_at_it_rekeys_and_serves_the_old_files_until_then(rig: Rig) -> None:
    issued_pod(rig)
    first = rig.files()["bundle.pem"]
    rig.clock.now = T0 + 11 * HOUR
    rig.agent.reconcile(UID)
    assert len(rig.kube.created) == 1, "not due before beginRefreshAt"

    rig.clock.now = T0 + 12 * HOUR  # past beginRefreshAt (issued at T0 - 1 min, +12 h)
    rig.agent.reconcile(UID)
    assert len(rig.kube.created) == 2
    assert rig.files()["bundle.pem"] == first, "old credential served while the new is pending"
    rig.issue(rig.kube.created[-1])
    second = rig.files()["bundle.pem"]
    old, new = formats.load_credential(first), formats.load_credential(second)
    assert keys.public_der(new.key) != keys.public_der(old.key), "a refresh uses a new key"


def test_rotate_annotation_rekeys_credentials_issued_before_it_once(rig: Rig) -> None:
    issued_pod(rig)
    rig.clock.now = T0 + MIN
    forced = make_pod([cert_volume()], annotations={ROTATE_ANNOTATION: "2026-11-29T20:00:30.5Z"})
    rig.apply(forced, "MODIFIED")
    assert len(rig.kube.created) == 2
    rig.issue(rig.kube.created[-1])
    rig.clock.now = T0 + 2 * MIN
    rig.apply(forced, "MODIFIED")
    assert len(rig.kube.created) == 2, "the new credential was issued after the instant"
    assert rig.agent.metrics.requests.labels(signer_name=SIGNER, reason="forced")._value.get() == 1


def test_a_future_rotate_instant_schedules_the_rotation(rig: Rig) -> None:
    issued_pod(rig)
    later = make_pod([cert_volume()], annotations={ROTATE_ANNOTATION: "2026-11-29T22:00:00Z"})
    rig.agent.on_pod_event("MODIFIED", later)
    requeue = rig.agent.reconcile(UID)
    assert len(rig.kube.created) == 1
    assert requeue.wake_at == T0 + 2 * HOUR
    rig.clock.now = T0 + 2 * HOUR
    rig.agent.reconcile(UID)
    assert len(rig.kube.created) == 2


def test_a_malformed_rotate_annotation_is_ignored(rig: Rig) -> None:
    issued_pod(rig)
    rig.apply(make_pod([cert_volume()], annotations={ROTATE_ANNOTATION: "yesterday"}), "MODIFIED")
    assert len(rig.kube.created) == 1


def test_a_vanished_request_is_replaced_after_the_abandon_delay(rig: Rig) -> None:
    pod = make_pod([cert_volume()])
    rig.apply(pod)
    pcr = rig.kube.created[-1]
    rig.agent.on_pcr_event("ADDED", read_request(pcr))
    rig.agent.on_pcr_event("DELETED", read_request(pcr))  # the 15-minute cleaner, or a person
    rig.agent.reconcile(UID)
    rig.clock.now = T0 + 9 * MIN
    rig.agent.reconcile(UID)
    assert len(rig.kube.created) == 1
    rig.clock.now = T0 + 10 * MIN
    rig.agent.reconcile(UID)
    assert len(rig.kube.created) == 2
    assert "CertificateRequestAbandoned" in rig.kube.reasons()


def test_a_request_not_yet_seen_by_the_watch_is_not_abandoned(rig: Rig) -> None:
    pod = make_pod([cert_volume()])
    rig.apply(pod)  # created; the watch has not delivered it yet
    rig.agent.reconcile(UID)  # looks vanished for a moment
    rig.agent.on_pcr_event("ADDED", read_request(rig.kube.created[-1]))
    rig.agent.reconcile(UID)
    rig.clock.now = T0 + 11 * MIN
    rig.agent.reconcile(UID)
    assert len(rig.kube.created) == 1
    assert rig.kube.reasons() == ["CertificateRequestUnanswered"]


def test_overdue_and_expired_credentials_raise_one_event_each(rig: Rig) -> None:
    issued_pod(rig)
    rig.kube.fail_create = ApiError(503, "ServiceUnavailable", "down")
    for minutes in (12 * 60, 12 * 60 + 11, 12 * 60 + 30, 24 * 60, 24 * 60 + 5):
        rig.clock.now = T0 + minutes * MIN
        rig.agent.reconcile(UID)
    assert rig.kube.reasons() == ["CertificateOverdueForRefresh", "CertificateExpired"]
    states = dict(rig.agent.projection_states())
    assert states == {SIGNER: ProjectionState.EXPIRED}


# --- terminal answers -----------------------------------------------------------------------------


def test_denied_keeps_the_older_credential_records_an_event_and_never_asks_again(
    rig: Rig,
) -> None:
    issued_pod(rig)
    before = rig.files()
    rig.clock.now = T0 + 12 * HOUR
    rig.agent.reconcile(UID)
    rig.deny(rig.kube.created[-1])
    assert isinstance(rig.state(make_pod([])), projection.Denied)
    assert rig.kube.reasons() == ["CertificateDenied"]
    assert rig.files() == before
    for hours in (13, 20, 30):
        rig.clock.now = T0 + hours * HOUR
        rig.apply(
            make_pod([cert_volume()], annotations={ROTATE_ANNOTATION: stamp(rig.clock.now)}),
            "MODIFIED",
        )
    assert len(rig.kube.created) == 2
    assert rig.files() == before
    assert dict(rig.agent.projection_states()) == {SIGNER: ProjectionState.DENIED}


def test_api_refusal_to_create_is_retried_and_told_once(rig: Rig) -> None:
    rig.kube.fail_create = ApiError(403, "Forbidden", "pod not bound to this node")
    pod = make_pod([cert_volume()])
    rig.agent.on_pod_event("ADDED", pod)
    assert rig.agent.reconcile(UID).retry
    assert rig.agent.reconcile(UID).retry
    assert rig.kube.reasons() == ["CertificateRequestRefused"]
    rig.kube.fail_create = None
    assert not rig.agent.reconcile(UID).retry
    assert len(rig.kube.created) == 1


def test_a_create_whose_answer_was_lost_is_adopted_on_the_retry_not_doubled(rig: Rig) -> None:
    """The API server applied the create; the answer never came (a proxy dropped it). The retry
    asks again for the same key under the same name, meets the first, and adopts it."""
    rig.kube.lose_answers = 1
    pod = make_pod([cert_volume()])
    rig.agent.on_pod_event("ADDED", pod)
    assert rig.agent.reconcile(UID).retry
    assert isinstance(rig.state(pod), projection.NotYetIssued)
    assert not rig.agent.reconcile(UID).retry

    [pcr] = rig.kube.created
    state = rig.state(pod)
    assert isinstance(state, projection.Pending)
    assert state.request_name == pcr["metadata"]["name"]
    rig.issue(pcr)
    credential = formats.load_credential(rig.files()["bundle.pem"])
    assert keys.public_der(credential.key) == keys.spki_der(credential.leaf.public_key())


@pytest.mark.parametrize(
    ("error", "same"),
    [
        pytest.param(ApiError(0, "Unavailable", "no answer"), True, id="no answer: same key"),
        pytest.param(ApiError(503, "ServiceUnavailable", "etcd"), True, id="a 503: same key"),
        pytest.param(ForeignRequest(409, "AlreadyExists", "x"), False, id="a namesake: new key"),
    ],
)
def test_a_create_is_retried_under_its_name_unless_the_name_is_anothers(
    rig: Rig, error: ApiError, same: bool
) -> None:
    rig.kube.fail_create = error
    rig.agent.on_pod_event("ADDED", make_pod([cert_volume()]))
    assert rig.agent.reconcile(UID).retry
    rig.kube.fail_create = None
    assert not rig.agent.reconcile(UID).retry
    first, second = rig.kube.names
    assert (first == second) is same


def test_a_failed_write_keeps_the_key_for_the_retry_without_a_new_request(rig: Rig) -> None:
    pod = make_pod([cert_volume()])
    rig.apply(pod)
    rig.storage.fail_next_write(OSError(28, "No space left on device"))
    rig.issue(rig.kube.created[-1])
    assert rig.files() == {}
    assert rig.agent.reconcile(UID).retry is False
    assert len(rig.kube.created) == 1
    formats.load_credential(rig.files()["bundle.pem"])


def test_a_finished_pod_gets_no_request(rig: Rig) -> None:
    rig.apply(make_pod([cert_volume()], phase="Succeeded"))
    assert rig.kube.created == []


# --- restarts and deletion ------------------------------------------------------------------------


def test_a_restart_adopts_fresh_credentials_from_disk_without_new_requests(rig: Rig) -> None:
    pods = [make_pod([cert_volume()], uid=f"uid-{i}", name=f"p{i}") for i in range(5)]
    for pod in pods:
        issued_pod(rig, pod)
    issued = list(rig.kube.created)
    written = rig.storage.writes

    rig.clock.now = T0 + HOUR
    rig.agent = rig.fresh_agent()
    rig.agent.on_pcr_list([read_request({**p, "status": _status_of(rig, p)}) for p in issued])
    rig.agent.on_pod_list(pods)
    for pod in pods:
        rig.agent.reconcile(pod["metadata"]["uid"])
    assert rig.kube.created == issued
    assert rig.storage.writes == written
    state = rig.state(pods[0])
    assert isinstance(state, projection.Fresh)
    # The refresh point comes from the request's beginRefreshAt, which is still there.
    assert state.credential.refresh_at == T0 - MIN + 12 * HOUR


def _status_of(rig: Rig, pcr: JSON) -> JSON:
    """What the API would hold for a request the rig issued (read back from the pod's file)."""
    credential = formats.load_credential(rig.files(pcr["spec"]["podUID"])["bundle.pem"])
    return {
        "conditions": [{"type": "Issued", "status": "True"}],
        "certificateChain": formats.dump_certificates(credential.chain).decode(),
        "beginRefreshAt": stamp(credential.not_before + 12 * HOUR),
    }


def test_a_restart_replaces_an_expired_credential_on_disk(rig: Rig) -> None:
    issued_pod(rig)
    rig.clock.now = T0 + 25 * HOUR
    rig.agent = rig.fresh_agent()
    rig.apply(make_pod([cert_volume()]))
    assert len(rig.kube.created) == 2


def test_a_restart_does_not_trust_a_key_that_does_not_match_its_chain(rig: Rig) -> None:
    issued_pod(rig)
    bundle = rig.files()["bundle.pem"]
    chain = bundle[bundle.index(b"-----BEGIN CERTIFICATE-----") :]
    forged = dump_private_key(keys.generate("ECDSAP256")) + chain
    rig.storage.write_volume(UID, "identity", {"bundle.pem": FileSpec(forged, 0o600)}, None)
    rig.agent = rig.fresh_agent()
    rig.apply(make_pod([cert_volume()]))
    assert len(rig.kube.created) == 2


def test_a_deleted_pod_loses_its_files_and_pending_requests(rig: Rig) -> None:
    pod = make_pod([cert_volume(), cert_volume("waiting", signerName="other.example/none")])
    rig.apply(pod)
    issued, waiting = rig.kube.created
    rig.agent.on_pcr_event("ADDED", read_request(waiting))
    rig.issue(issued)
    assert rig.storage.list_pods() == [UID]
    rig.agent.on_pod_event("DELETED", pod)
    rig.agent.reconcile(UID)
    assert rig.storage.list_pods() == []
    assert rig.kube.deleted == [waiting["metadata"]["name"]]
    assert list(rig.agent.projection_states()) == []


def test_files_left_by_a_pod_deleted_while_the_shim_was_away_are_removed(rig: Rig) -> None:
    issued_pod(rig)
    rig.agent = rig.fresh_agent()
    rig.agent.on_pod_list([])
    rig.agent.sweep()
    uid = rig.agent.queue.get(timeout=0)
    assert uid == UID
    rig.agent.reconcile(uid)
    assert rig.storage.list_pods() == []


# --- trust bundles --------------------------------------------------------------------------------


def bundle_obj(name: str, pem: bytes, signer: str | None = None, **labels: str) -> JSON:
    spec: JSON = {"trustBundle": pem.decode()}
    if signer:
        spec["signerName"] = signer
    return {"metadata": {"name": name, "labels": labels}, "spec": spec}


def trust_pod(*sources: JSON) -> JSON:
    volume = {
        "name": "trust",
        "projected": {
            "sources": [
                {"clusterTrustBundle": {**source, "path": f"t{i}.pem"}}
                for i, source in enumerate(sources)
            ]
        },
    }
    return make_pod([volume])


def test_trust_files_follow_bundles_by_signer_and_by_name(rig: Rig) -> None:
    one, two = CA("one"), CA("two")
    signer = "example.com/roots"
    rig.agent.on_bundle_list(
        [
            bundle_obj("example.com:roots:a", one.pem, signer, tier="gold"),
            bundle_obj("example.com:roots:b", two.pem + one.pem, signer, tier="gold"),
            bundle_obj("example.com:roots:c", CA("silver").pem, signer, tier="silver"),
        ]
    )
    pod = trust_pod(
        {"signerName": signer, "labelSelector": {"matchLabels": {"tier": "gold"}}},
        {"name": "example.com:roots:b"},
        {"name": "missing", "optional": True},
        {"signerName": signer},  # no selector: matches nothing, and is not optional
    )
    rig.apply(pod)
    files = rig.files(volume="trust")
    assert files["t0.pem"] == one.pem + two.pem, "distinct roots, ordered by bundle name"
    assert files["t1.pem"] == two.pem + one.pem
    assert files["t2.pem"] == b""
    assert "t3.pem" not in files
    assert rig.kube.reasons() == ["TrustBundleUnavailable"]
    assert rig.storage.files(UID, "trust")["t0.pem"].mode == 0o644  # type: ignore[index]

    rig.agent.on_bundle_event("DELETED", bundle_obj("example.com:roots:a", b""))
    rig.agent.reconcile(UID)
    assert rig.files(volume="trust")["t0.pem"] == two.pem + one.pem


def test_an_unrelated_bundle_change_does_not_rewrite_the_volume(rig: Rig) -> None:
    rig.agent.on_bundle_list([bundle_obj("a", CA().pem)])
    rig.apply(trust_pod({"name": "a"}))
    writes = rig.storage.writes
    rig.agent.on_bundle_event("ADDED", bundle_obj("b", CA().pem))
    rig.agent.reconcile(UID)
    assert rig.storage.writes == writes


def test_credential_and_trust_sources_share_one_volume_write(rig: Rig) -> None:
    rig.agent.on_bundle_list([bundle_obj("a", rig.ca.pem)])
    volume = cert_volume()
    volume["projected"]["sources"].append({"clusterTrustBundle": {"name": "a", "path": "ca.pem"}})
    issued_pod(rig, make_pod([volume]))
    files = rig.files()
    assert files["ca.pem"] == rig.ca.pem
    credential = formats.load_credential(files["bundle.pem"])
    formats.verify_chain(credential, formats.load_trust_bundle(files["ca.pem"]), T0)

    # A new root reaches the file; the credential is carried over byte for byte.
    extra = CA("next")
    rig.agent.on_bundle_event("MODIFIED", bundle_obj("a", rig.ca.pem + extra.pem))
    rig.agent.reconcile(UID)
    assert rig.files()["ca.pem"] == rig.ca.pem + extra.pem
    assert rig.files()["bundle.pem"] == files["bundle.pem"]


# --- what leaves the process ----------------------------------------------------------------------


def test_metrics_and_events_hold_no_key_material(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    issued_pod(rig)
    rig.clock.now = T0 + 12 * HOUR
    rig.agent.reconcile(UID)
    rig.deny(rig.kube.created[-1])
    key_lines = rig.files()["bundle.pem"].split(b"-----END PRIVATE KEY-----")[0].splitlines()[1:]
    text = rig.agent.metrics.render().decode()
    assert f'podcert_shim_projections{{signer_name="{SIGNER}",state="denied"}} 1.0' in text
    outside = text + repr(rig.kube.events) + caplog.text + repr(rig.state(make_pod([])))
    assert "PRIVATE KEY" not in outside
    assert not any(line.decode() in outside for line in key_lines)


# --- links planted under the root -----------------------------------------------------------------


def unsafe_events(rig: Rig) -> list[str]:
    return [m for _, _, reason, m in rig.kube.events if reason == "UnsafeVolumeDirectory"]


def test_a_volume_behind_a_link_gets_no_request_one_event_and_retries(rig: Rig) -> None:
    rig.storage.plant_link(UID, "identity")
    pod = make_pod([cert_volume(), cert_volume("other", credentialBundlePath="b.pem")])
    rig.agent.on_pod_event("ADDED", pod)
    requeue = rig.agent.reconcile(UID)
    assert requeue.retry, "looked at again with backoff"
    [asked] = rig.kube.created
    assert asked["spec"]["stubPKCS10Request"]
    assert rig.kube.names == [asked["metadata"]["name"]], "only 'other' asked"
    assert rig.agent.reconcile(UID).retry
    [message] = unsafe_events(rig)
    assert "identity" in message and "symbolic link" in message

    # The pod's other volume and other pods are served meanwhile.
    rig.issue(rig.kube.created[0])
    formats.load_credential(rig.files(volume="other")["b.pem"])
    other = make_pod([cert_volume()], uid="other-uid", name="neighbour")
    rig.apply(other)
    rig.issue(rig.kube.created[-1])
    formats.load_credential(rig.files("other-uid")["bundle.pem"])

    # Once the directory is put right the volume is served; a new link is told again.
    rig.storage.remove_link(UID, "identity")
    rig.agent.reconcile(UID)
    rig.issue(rig.kube.created[-1])
    formats.load_credential(rig.files()["bundle.pem"])
    rig.storage.plant_link(UID, "identity")
    rig.clock.now = T0 + 12 * HOUR  # both refreshes are due; one write is refused
    before = len(rig.kube.created)
    rig.agent.reconcile(UID)
    for pcr in rig.kube.created[before:]:
        rig.issue(pcr)
    assert len(unsafe_events(rig)) == 2
    assert (
        formats.load_credential(rig.files(volume="other")["b.pem"]).leaf.not_valid_before_utc > T0
    )


def test_a_link_planted_after_issuance_keeps_the_new_key_for_after_the_repair(rig: Rig) -> None:
    issued_pod(rig)
    first = rig.files()["bundle.pem"]
    rig.storage.plant_link(UID, "identity")
    forced = make_pod([cert_volume()], annotations={ROTATE_ANNOTATION: stamp(T0 + MIN)})
    rig.clock.now = T0 + 2 * MIN
    rig.apply(forced, "MODIFIED")  # `podcert shim rotate`
    assert len(rig.kube.created) == 2
    rig.issue(rig.kube.created[-1])
    assert len(unsafe_events(rig)) == 1
    assert rig.agent.reconcile(UID).retry
    assert len(unsafe_events(rig)) == 1, "told once, not on every retry"
    assert rig.agent.metrics.writes.labels(result="error")._value.get() >= 2

    rig.storage.remove_link(UID, "identity")
    assert rig.storage.read_volume(UID, "identity") is not None
    assert not rig.agent.reconcile(UID).retry
    assert len(rig.kube.created) == 2, "the issued key is written, no new request"
    second = rig.files()["bundle.pem"]
    assert second != first
    assert rig.kube.created[-1]["spec"]["stubPKCS10Request"]  # the new key's request
    formats.load_credential(second)


def disk_rig(tmp_path: Path) -> Rig:
    return Rig(FakeKube(), AtomicDirStorage(tmp_path / "root"), Clock(), CA())  # type: ignore[arg-type]


def snapshot(folder: Path) -> dict[str, bytes | str]:
    return {
        str(p.relative_to(folder)): "dir" if p.is_dir() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
    }


@pytest.mark.parametrize(
    "where",
    [
        pytest.param(("pods", UID), id="the pod directory"),
        pytest.param(("pods", UID, "volumes"), id="the volumes directory"),
        pytest.param(
            ("pods", UID, "volumes", "kubernetes.io~projected", "identity"),
            id="the volume directory",
        ),
    ],
)
def test_on_disk_a_link_to_an_outside_folder_gets_nothing_written_through_it(
    tmp_path: Path, where: tuple[str, ...]
) -> None:
    rig = disk_rig(tmp_path)
    issued_pod(rig)
    outside = tmp_path / "outside"
    outside.mkdir()
    spot = rig.storage.root.joinpath(*where)
    shutil.rmtree(spot)
    spot.symlink_to(outside, target_is_directory=True)

    rig.agent = rig.fresh_agent()  # a restart: adopts from disk, finds the link
    assert rig.apply(make_pod([cert_volume()])) == projection.NotYetIssued()
    assert rig.kube.created[1:] == []
    forced = make_pod([cert_volume()], annotations={ROTATE_ANNOTATION: stamp(T0 + MIN)})
    rig.clock.now = T0 + 12 * HOUR
    rig.apply(forced, "MODIFIED")
    assert snapshot(outside) == {}
    assert len(unsafe_events(rig)) == 1

    rig.agent.on_pod_event("DELETED", forced)
    requeue = rig.agent.reconcile(UID)
    if where[-1] != "identity":
        assert not requeue.retry, "a link on the way is left to the operator, not retried"
        assert spot.is_symlink()
    else:
        assert not os.path.lexists(spot), "inside the plugin directory the link itself goes"
    assert snapshot(outside) == {}


# --- on the runtime -------------------------------------------------------------------------------

DEADLINE = 10.0  # seconds a condition may take before the test fails


def test_a_turn_that_asks_for_a_retry_backs_off_as_the_queue_does(rig: Rig) -> None:
    rig.kube.fail_create = ApiError(403, "Forbidden", "pod not bound to this node")
    rig.agent.on_pod_event("ADDED", make_pod([cert_volume()]))
    turn = rig.agent.pool().reconcile
    first, second = turn(UID), turn(UID)
    # base 0.2 s, doubled per failure, +-25% jitter: the queue's own backoff
    assert first is not None and 0.15 <= first <= 0.25
    assert second is not None and 0.3 <= second <= 0.5
    assert rig.agent.queue.failures(UID) == 2
    rig.kube.fail_create = None
    turn(UID)
    assert rig.agent.queue.failures(UID) == 0, "a turn that needs no retry forgets the backoff"


def test_a_settled_turn_sleeps_until_the_next_wake_capped_by_the_resync(rig: Rig) -> None:
    pod = issued_pod(rig)
    assert rig.agent.pool().reconcile(UID) == rig.agent.settings.resync.total_seconds()
    rig.agent.settings = Settings(projection=rig.settings, resync=dt.timedelta(days=1))
    # issued a minute ago with beginRefreshAt 12 h after notBefore, no jitter
    assert rig.agent.pool().reconcile(UID) == (12 * HOUR - MIN).total_seconds()
    rig.agent.on_pod_event("DELETED", pod)
    assert rig.agent.pool().reconcile(UID) is None


@dataclass
class QuietKube(FakeKube):
    """A fake API whose watches stay open until the process stops (as a real watch blocks) and
    whose trust bundle list answers only once `bundles_open` is set."""

    stop: threading.Event = field(default_factory=threading.Event)
    pods: list[JSON] = field(default_factory=list)
    bundles_open: threading.Event = field(default_factory=threading.Event)
    asked: threading.Event = field(default_factory=threading.Event)

    def list_pods(self) -> tuple[list[JSON], str]:
        return list(self.pods), "1"

    def list_pcrs(self) -> tuple[list[JSON], str]:
        return [], "1"

    def list_trust_bundles(self) -> tuple[list[JSON], str]:
        while not self.bundles_open.wait(DEADLINE):
            if self.stop.is_set():
                break
        return [], "1"

    def watch_pods(self, resource_version: str) -> Iterator[JSON]:
        self.stop.wait()
        return iter(())

    watch_pcrs = watch_trust_bundles = watch_pods

    def create_pcr(self, namespace: str, body: JSON) -> JSON:
        created = super().create_pcr(namespace, body)
        self.asked.set()
        return created


@contextlib.contextmanager
def running(rig: Rig, runtime: Runtime) -> Iterator[Shim]:
    """The agent as `podcert shim` runs it (`kubelet_shim.build`): its reflectors and workers on
    `runtime`, /readyz and /healthz on a free port; stopped when the block ends."""
    shim = Shim(
        Config(node_name=rig.kube.node_name, metrics_port=0),
        runtime,
        rig.fresh_agent(stop=runtime.stopping),
    )
    shim.start()
    try:
        yield shim
    finally:
        runtime.stop(timeout=DEADLINE)


def probe(shim: Shim, path: str) -> int:
    assert shim.server is not None
    host, port = shim.server.server_address[:2]
    connection = http.client.HTTPConnection(str(host), port, timeout=DEADLINE)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    finally:
        connection.close()


def eventually(condition: Callable[[], bool]) -> bool:
    """Poll `condition` until it holds or the deadline passes."""
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_on_the_runtime_nothing_is_decided_before_every_cache_has_listed() -> None:
    runtime = Runtime("shim")
    kube = QuietKube(stop=runtime.stopping, pods=[make_pod([cert_volume()])])
    rig = Rig(kube, MemoryStorage(), Clock(), CA())
    with running(rig, runtime) as shim:
        pods, pcrs, bundles = shim.agent.reflectors
        assert pods.synced.wait(DEADLINE) and pcrs.synced.wait(DEADLINE)
        assert not bundles.synced.is_set()
        # However long the last list takes (no timeout): not ready, and no request yet.
        assert not runtime.ready() and probe(shim, "/readyz") == 503
        assert kube.created == []
        assert probe(shim, "/healthz") == 200

        kube.bundles_open.set()
        assert eventually(runtime.ready)
        assert probe(shim, "/readyz") == 200
        assert kube.asked.wait(DEADLINE), "the sweep after the sync queued the listed pod"
        assert [p["spec"]["podUID"] for p in kube.created] == [UID]
    workers = [t for t in runtime.threads() if t.name.startswith("worker-")]
    # One thread per worker the settings ask for, and the one that waited for the caches.
    wanted = [f"worker-{i}" for i in range(Settings().workers)] + ["worker-start"]
    assert sorted(t.name for t in workers) == sorted(wanted)
    assert not any(t.is_alive() for t in workers), "the stop joins every worker"
    assert not runtime.healthy()
