"""signer.authority.spireupstream: its protobuf messages are the Workload API's and
svid.proto's, and its loop follows SPIRE's bundle, renews through SPIRE, and rides out SPIRE's
absence while the signer keeps its intermediate.

The messages are pinned two ways: the Workload API's against py-spiffe's generated classes
(a differential test, both directions), NewDownstreamX509CA's against wire bytes written out
from svid.proto's field numbers. The loop runs over the CA Secret held in memory with SPIRE's
two calls replaced by a CA made here (the integration test, test_spire_upstream.py, runs the
real SPIRE server and agent)."""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any, cast

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from signer.authority import downstream, spireupstream
from signer.authority.castore import CAStore
from signer.kube import SignerKube
from tests.ca_secrets import SecretKube
from tests.unit.test_signer_offline import make_ca

TD = "spire.test"
NOW = dt.datetime(2026, 12, 5, 12, 0, tzinfo=dt.UTC)
SETTINGS = downstream.RenewalSettings(
    max_leaf_lifetime=dt.timedelta(hours=24), overlap=dt.timedelta(hours=1)
)
ENDPOINTS = downstream.Endpoints(agent_socket="/run/agent.sock", server="127.0.0.1:8081")
DER = serialization.Encoding.DER


def der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(DER)


# --- the messages --------------------------------------------------------------------------------


def test_the_workload_api_response_reads_as_py_spiffes_generated_class_writes_it() -> None:
    workload_pb2: Any = pytest.importorskip("spiffe._proto.workload_pb2")
    theirs = workload_pb2.X509SVIDResponse(
        svids=[
            workload_pb2.X509SVID(
                spiffe_id=f"spiffe://{TD}/podcert",
                x509_svid=b"chain",
                x509_svid_key=b"key",
                bundle=b"roots",
                hint="h",
            )
        ],
        crl=[b"crl"],
        federated_bundles={"spiffe://other": b"x"},
    )
    ours = spireupstream.X509SVIDResponse.FromString(theirs.SerializeToString())
    (svid,) = ours.svids
    assert (svid.spiffe_id, svid.x509_svid, svid.x509_svid_key, svid.bundle, svid.hint) == (
        f"spiffe://{TD}/podcert",
        b"chain",
        b"key",
        b"roots",
        "h",
    )
    back = workload_pb2.X509SVIDResponse.FromString(ours.SerializeToString())
    assert back.svids[0].x509_svid_key == b"key" and back.svids[0].bundle == b"roots"
    assert spireupstream.X509SVIDRequest().SerializeToString() == (
        workload_pb2.X509SVIDRequest().SerializeToString()
    )


def test_new_downstream_x509_ca_request_is_svid_protos_wire_form() -> None:
    request = spireupstream.NewDownstreamX509CARequest(csr=b"\x30\x01", preferred_ttl=300)
    # field 1 (csr), length-delimited: tag 0x0a; field 2 (preferred_ttl), varint: tag 0x10.
    assert request.SerializeToString() == b"\x0a\x02\x30\x01\x10\xac\x02"


def test_new_downstream_x509_ca_response_reads_svid_protos_wire_form() -> None:
    # ca_cert_chain (field 1) twice, x509_authorities (field 2) once.
    wire = b"\x0a\x01A\x0a\x01B\x12\x01R"
    answer = spireupstream.NewDownstreamX509CAResponse.FromString(wire)
    assert list(answer.ca_cert_chain) == [b"A", b"B"]
    assert list(answer.x509_authorities) == [b"R"]


# --- the loop ------------------------------------------------------------------------------------


class FakeSpire:
    """SPIRE's two calls: a CA of its own (rotated by `rotate`), away while `away` is set."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.active = make_ca("spire 1", self.key, uris=(f"spiffe://{TD}",))
        self.authorities = [self.active]
        self.away = False
        self.signed = 0

    def rotate(self) -> None:
        """SPIRE prepares a new authority (in the bundle at once) and activates it."""
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.active = make_ca("spire 2", self.key, uris=(f"spiffe://{TD}",))
        self.authorities = [*self.authorities, self.active]

    def fetch_svid(self, socket_path: str, timeout: float = 0) -> spireupstream.WorkloadSVID:
        return spireupstream.WorkloadSVID(
            f"spiffe://{TD}/podcert/signer",
            (self.active,),
            self.key,
            tuple(self.authorities),
        )

    def new_downstream_ca(
        self,
        server: str,
        svid: spireupstream.WorkloadSVID,
        csr_der: bytes,
        preferred_ttl: dt.timedelta,
        timeout: float = 0,
    ) -> tuple[list[bytes], list[bytes]]:
        if self.away:
            raise downstream.UpstreamUnavailable(f"SPIRE server {server}: UNAVAILABLE: down")
        public = x509.load_der_x509_csr(csr_der).public_key()
        assert isinstance(public, ec.EllipticCurvePublicKey)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(self.active.subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(NOW - dt.timedelta(minutes=5))
            .not_valid_after(NOW + min(preferred_ttl, dt.timedelta(days=5)))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                critical=True,
            )
            .add_extension(
                x509.SubjectAlternativeName([x509.UniformResourceIdentifier(f"spiffe://{TD}")]),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        self.signed += 1
        return [der(cert)], [der(a) for a in self.authorities]


class Counts(spireupstream.Observer):
    def __init__(self) -> None:
        self.failures = 0
        self.renewals = 0
        self.due: list[bool] = []

    def renewed(self, bundle: Any) -> None:
        self.renewals += 1

    def failed(self) -> None:
        self.failures += 1

    def pending(self, due: bool) -> None:
        self.due.append(due)


@pytest.fixture
def spire(monkeypatch: pytest.MonkeyPatch) -> FakeSpire:
    fake = FakeSpire()
    monkeypatch.setattr(spireupstream, "fetch_svid", fake.fetch_svid)
    monkeypatch.setattr(spireupstream, "new_downstream_ca", fake.new_downstream_ca)
    return fake


def upstream(
    spire: FakeSpire, clock: list[dt.datetime]
) -> tuple[spireupstream.SpireUpstream, Counts]:
    secret = SecretKube(None)
    cas = CAStore(cast(SignerKube, secret), "podcert", "podcert-ca", lambda: clock[0])
    cas.first_ca = spireupstream.first_ca(
        ENDPOINTS, TD, SETTINGS, dt.timedelta(days=90), lambda: clock[0], cas
    )
    cas.upstream_prepares = True
    assert cas.load() is not None
    counts = Counts()
    loop = spireupstream.SpireUpstream(
        cas,
        ENDPOINTS,
        TD,
        SETTINGS,
        dt.timedelta(days=90),
        lambda: True,
        threading.Event(),
        lambda: clock[0],
        observer=counts,
    )
    return loop, counts


def signs_with(cas: CAStore, cert: x509.Certificate) -> bool:
    issuing = cas.issuing()
    return issuing is not None and issuing.certificate == cert


def test_a_new_ca_secret_starts_from_spires_intermediate(spire: FakeSpire) -> None:
    loop, _ = upstream(spire, [NOW])
    cas = loop.cas
    (gen,) = cas.generations
    assert gen.state == "active" and gen.root == spire.active and gen.bundle.root_key is None
    assert cas.trusted_roots() == [spire.active]
    assert cas.due() is None  # the schedule prepares nothing of its own


def test_the_loop_follows_spires_rotation_rides_out_its_absence_and_renews(
    spire: FakeSpire,
) -> None:
    clock = [NOW]
    loop, counts = upstream(spire, clock)
    cas = loop.cas
    signing = cas.issuing()
    assert signing is not None
    assert loop.step() and counts.due == [False] and spire.signed == 1

    spire.rotate()  # SPIRE's next authority: in every trust bundle before it signs for us
    assert loop.step()
    assert [der(r) for r in cas.live_roots()] == [der(a) for a in spire.authorities]
    assert signs_with(cas, signing.certificate)

    spire.away = True
    clock[0] = NOW + dt.timedelta(seconds=30)
    cas.rewrite(downstream.with_request())  # `podcert signer ca prepare --upstream spire`
    for attempt in (1, 2):
        assert not loop.step()
        assert loop.failures == attempt == counts.failures
    assert loop.last_error is not None and "UNAVAILABLE" in loop.last_error
    assert (
        signs_with(cas, signing.certificate) and len(cas.generations) == 1
    )  # still issuing, unchanged
    assert counts.due[-1] is True

    spire.away = False
    clock[0] = NOW + dt.timedelta(minutes=1)
    assert loop.step() and loop.failures == 0 and counts.renewals == 1
    states = {g.state: g for g in cas.generations}
    assert set(states) == {"active", "prepared"}
    assert states["prepared"].root == spire.active  # under SPIRE's new authority
    assert states["prepared"].id.endswith("-spire")
    assert signs_with(cas, signing.certificate)  # the schedule activates it after the overlap


def test_an_svid_of_another_trust_domain_is_refused_and_counted(
    spire: FakeSpire, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop, counts = upstream(spire, [NOW])
    other = spireupstream.WorkloadSVID("spiffe://other.test/x", (), spire.key, ())
    monkeypatch.setattr(spireupstream, "fetch_svid", lambda *a, **k: other)
    assert not loop.step()
    assert counts.failures == 1 and loop.last_error is not None
    assert "trust domain 'other.test'" in loop.last_error


def test_workload_svid_names_its_trust_domain() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    svid = spireupstream.WorkloadSVID(f"spiffe://{TD}/a/b", (), key, ())
    assert svid.trust_domain == TD
    assert "key=" not in repr(svid)  # the SVID's private key is never shown
    assert spireupstream.server_id(TD) == f"spiffe://{TD}/spire/server"


def test_one_key_serves_every_attempt_until_spire_signs_it(
    spire: FakeSpire, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key made in a PKCS#11 token stays there: a new one per failed attempt would fill the
    token while SPIRE is away."""
    clock = [NOW]
    loop, _ = upstream(spire, clock)
    made: list[Any] = []
    real = spireupstream.new_key

    def counting(cas: CAStore, now: dt.datetime) -> Any:
        made.append(real(cas, now))
        return made[-1]

    monkeypatch.setattr(spireupstream, "new_key", counting)
    spire.away = True
    clock[0] = NOW + dt.timedelta(seconds=30)
    loop.cas.rewrite(downstream.with_request())
    for _ in range(3):
        assert not loop.step()
    spire.away = False
    assert loop.step()
    assert len(made) == 1
    prepared = next(g for g in loop.cas.generations if g.state == "prepared")
    assert prepared.bundle.intermediate.public_key() == made[0].public_key()
