"""Hostile input: oversized and odd objects through the real API server, to the real signer
and shim. Every request ends in a clear outcome within a bounded time (Issued, or Denied with a
reason naming the field), the processes keep serving everyone else (a normal pod is served
promptly after each test), and their memory stays bounded.

The API server's own limits, measured here against kube-apiserver 1.37 + etcd 3.7, bound what a
hostile user can send: userAnnotations (on a projection and on a request alike) hold at most
256 KiB (len(key) + len(value), summed), keys are domain-prefixed label keys of at most 317
characters, a projected volume may hold any number of sources (3,000 are accepted), file paths
may be any relative path without "..", however long or deep, and a whole object must fit etcd's
request limit of about 1.5 MiB.

Everything here uses its own signer name, signer namespace and nodes, so other modules' signers
and shims never see these objects.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from kubernetes import client

from bundles import formats
from devcluster import kube, processes
from devcluster.testing import DevCluster, eventually
from podcert.api import keys
from podcert.client.rest import JSON, ApiError
from tests.integration.conftest import StartSigner
from tests.integration.helpers import condition, create_pcr, make_pod, pcr_spec, settled
from tests.integration.shim_helpers import (
    Shim,
    certificate_volume,
    outcome,
    pod_events,
    requests_of,
    shim,
)

SIGNER = "hostile.podcert.dev/test"
SIGNER_NAMESPACE = "podcert-hostile"
NODE = "hostile-node-a"  # served by this module's shim
DIRECT_NODE = "hostile-node-direct"  # no shim: requests are made by hand as this node
UNSERVED_NODE = "hostile-node-unserved"  # nobody serves it: for probing the API server only
DNS_KEY = "podcert.dev/dns-names"
POLICY = f"""
signers:
  - name: {SIGNER}
    dnsNames:
      services: true
      allowRequested: true
"""

# Measured below (test_the_api_server_limits_hostile_objects_run_into).
ANNOTATIONS_LIMIT = 256 * 1024
MAX_KEY = "a" * 253 + "/" + "b" * 63  # the longest domain-prefixed key: 317 characters

# Generous bounds: this runs on shared CI machines next to other control planes.
OUTCOME_DEADLINE = 30.0  # seconds from creation to Issued/Denied for one hostile object
PROMPT = 5.0  # seconds for a normal pod's credential, after the hostile input
MEMORY_LIMIT_MB = 250.0


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile")


@pytest.fixture(scope="module")
def signer(start_signer: StartSigner, work: Path) -> processes.Signer:
    (work / "policy.yaml").write_text(POLICY)
    return start_signer(
        SIGNER, namespace=SIGNER_NAMESPACE, workdir=work, policy=work / "policy.yaml"
    )


@pytest.fixture(scope="module")
def node_shim(devcluster: DevCluster, work: Path, signer: processes.Signer) -> Iterator[Shim]:
    proc = shim(devcluster, work, NODE, root=work / "root").start()
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def canary_namespace(devcluster: DevCluster) -> str:
    return devcluster.namespace("hostile-canary")


@pytest.fixture
def ns(devcluster: DevCluster) -> str:
    return devcluster.namespace("hostile")


def rss_mb(process: processes.Process) -> float:
    """Resident memory of a child process, from /proc/<pid>/status (VmRSS, in kB)."""
    assert process.proc is not None
    for line in Path(f"/proc/{process.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {process.proc.pid}")


def read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None


def credential_at(path: Path) -> formats.Credential | None:
    data = read(path)
    return formats.load_credential(data) if data else None


def credentials_at(volume: Path, paths: list[str]) -> list[formats.Credential] | None:
    """The credential at each of `paths`, once all are written."""
    found = [credential_at(volume / p) for p in paths]
    return [c for c in found if c] if all(found) else None


@pytest.fixture(autouse=True)
def still_serving(
    devcluster: DevCluster,
    signer: processes.Signer,
    node_shim: Shim,
    canary_namespace: str,
) -> Iterator[None]:
    """After each hostile test: both processes run, a normal pod gets its credential promptly,
    and neither process has grown past the memory bound."""
    before = {"signer": rss_mb(signer), "shim": rss_mb(node_shim)}
    yield
    assert signer.running, signer.output()[-3000:]
    assert node_shim.running, node_shim.output()[-3000:]
    name = f"canary-{time.monotonic_ns() % 10**9}"
    started = time.monotonic()
    pod = devcluster.pod(canary_namespace, name, node=NODE, volumes=[certificate_volume(SIGNER)])
    bundle = node_shim.volume_dir(pod.metadata.uid) / "credentialbundle.pem"
    eventually(lambda: credential_at(bundle), timeout=PROMPT, what="the canary's credential")
    elapsed = time.monotonic() - started
    after = {"signer": rss_mb(signer), "shim": rss_mb(node_shim)}
    print(
        f"\ncanary served in {elapsed:.2f}s; RSS MB before/after: "
        + ", ".join(f"{k} {before[k]:.0f}/{after[k]:.0f}" for k in before)
    )
    for process, mb in after.items():
        assert mb < MEMORY_LIMIT_MB, f"{process} RSS {mb:.0f} MB"
    client.CoreV1Api(devcluster.admin).delete_namespaced_pod(name, canary_namespace)


def pod_with(
    devcluster: DevCluster, ns: str, name: str, volumes: list[dict[str, Any]], **kwargs: Any
) -> Any:
    return devcluster.pod(ns, name, node=NODE, volumes=volumes, **kwargs)


def cert_source(path: str, key_type: str = "ECDSAP256", **extra: Any) -> dict[str, Any]:
    return {
        "podCertificate": {
            "signerName": SIGNER,
            "keyType": key_type,
            "credentialBundlePath": path,
            **extra,
        }
    }


def settled_requests(
    devcluster: DevCluster, ns: str, pod_uid: str, count: int, timeout: float
) -> list[JSON]:
    """The pod's `count` requests, once every one has an outcome."""

    def probe() -> list[JSON] | None:
        found = requests_of(devcluster, ns, pod_uid)
        return found if len(found) == count and all(outcome(p) for p in found) else None

    return eventually(probe, timeout=timeout, interval=0.2, what=f"{count} settled requests")


def annotations_of_size(total: int, make: Callable[[int], dict[str, str]]) -> dict[str, str]:
    """`make(n)` for the n that brings len(key) + len(value) summed (in bytes) to `total`."""
    annotations = make(0)
    size = _size(annotations)
    annotations = make(total - size)
    assert _size(annotations) == total, _size(annotations)
    return annotations


def _size(annotations: dict[str, str]) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())


# Annotations of exactly the largest size the API server allows, each shaped differently.
def _dns_list(pad: int) -> dict[str, str]:
    names = ",".join(f"n{i}.web.svc" for i in range(17_000))
    return {DNS_KEY: (names + "," + "x" * (pad - 1)) if pad else names}


def _one_unknown_key(pad: int) -> dict[str, str]:
    return {MAX_KEY: "v" * (10 + pad)}


def _many_unknown_keys(pad: int) -> dict[str, str]:
    many = {f"k{i:04d}.hostile.dev/" + "k" * 40: "v" * 200 for i in range(900)}
    many["z.hostile.dev/pad"] = "p" * (10 + pad)
    return many


def _unicode_names(pad: int) -> dict[str, str]:
    # Three UTF-8 bytes per character; the API counts bytes.
    return {DNS_KEY: "名前.例え" * 100 + "," + "ü" * (pad // 2) + "x" * (pad % 2)}


BIG_ANNOTATIONS = {
    "17001 requested DNS names": (_dns_list, "InvalidAnnotation", DNS_KEY),
    "one 317-character key with a 256 KiB value": (_one_unknown_key, "UnknownAnnotation", "a" * 20),
    "901 unknown keys": (_many_unknown_keys, "UnknownAnnotation", "(and 900 more)"),
    "256 KiB of non-ASCII names": (_unicode_names, "InvalidAnnotation", DNS_KEY),
}


# --- the API server's limits --------------------------------------------------------------------


def _refusal(call: Callable[[], object]) -> tuple[int, str]:
    """(HTTP status, message) of the API server's refusal of `call`."""
    try:
        call()
    except ApiError as err:
        return err.status, str(err)
    except client.ApiException as err:
        return int(err.status or 0), str(err.body)
    raise AssertionError("the API server accepted it")


def _volume(sources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"name": "identity", "projected": {"sources": sources}}]


def _padded(total: int) -> dict[str, str]:
    return annotations_of_size(total, lambda pad: {DNS_KEY: "a" * pad})


def test_the_api_server_limits_hostile_objects_run_into(devcluster: DevCluster, ns: str) -> None:
    def create(name: str, sources: list[dict[str, Any]]) -> None:
        devcluster.pod(ns, name, node=UNSERVED_NODE, volumes=_volume(sources))

    # userAnnotations on a projection: 256 KiB in all, and not one byte more.
    create("annotations-at-limit", [cert_source("a", userAnnotations=_padded(ANNOTATIONS_LIMIT))])
    over = [cert_source("a", userAnnotations=_padded(ANNOTATIONS_LIMIT + 1))]
    status, message = _refusal(lambda: create("annotations-over-limit", over))
    assert status == 422 and "podCertificate.userAnnotations: Too long" in message, message

    # Keys: domain-prefixed label keys, 253 + 1 + 63 characters at most.
    create("longest-key", [cert_source("a", userAnnotations={MAX_KEY: "v"})])
    too_long = [cert_source("a", userAnnotations={MAX_KEY + "b": "v"})]
    status, message = _refusal(lambda: create("too-long-key", too_long))
    assert status == 422 and "userAnnotations: Invalid value" in message, message

    # Paths: anything relative without "..", even names and paths no file system holds (the
    # shim refuses those itself, as the kubelet's atomic writer does).
    create("unwritable-paths", [cert_source("x" * 300), cert_source("d/" * 2100 + "b.pem")])

    # No limit on the number of sources in one projected volume...
    create("3000-sources", [cert_source(f"c{i}.pem") for i in range(3000)])
    # ...only on the whole object: etcd's request limit (1.5 MiB by default).
    big = [cert_source(f"c{i}.pem", userAnnotations=_padded(200_000)) for i in range(8)]
    create("1.4mb", big[:7])
    status, message = _refusal(lambda: create("1.6mb", big))
    assert status == 500 and "request is too large" in message, message


def test_a_request_holds_at_most_256_kib_of_unverified_user_annotations_too(
    devcluster: DevCluster, ns: str
) -> None:
    pod = make_pod(devcluster, ns, "direct", SIGNER, node=DIRECT_NODE)
    node = devcluster.node(DIRECT_NODE)
    key = keys.generate("ECDSAP256")
    at_limit = pcr_spec(
        devcluster, pod, SIGNER, key, unverifiedUserAnnotations=_padded(ANNOTATIONS_LIMIT)
    )
    pcr = create_pcr(node, ns, at_limit)
    over = pcr_spec(
        devcluster, pod, SIGNER, key, unverifiedUserAnnotations=_padded(ANNOTATIONS_LIMIT + 1)
    )
    status, message = _refusal(lambda: create_pcr(node, ns, over))
    assert status == 422 and "spec.unverifiedUserAnnotations: Too long" in message, message
    # The one at the limit asks for one DNS name 262 121 characters long: a typed denial.
    denied = settled(devcluster, pcr, timeout=OUTCOME_DEADLINE)
    assert condition(denied).reason == "InvalidAnnotation"
    assert DNS_KEY in condition(denied).message


# --- hostile objects, through the shim and made by hand ----------------------------------------


@pytest.mark.parametrize(
    ("make", "reason", "named"),
    [pytest.param(*case, id=name) for name, case in BIG_ANNOTATIONS.items()],
)
def test_the_largest_allowed_annotations_on_a_projection_end_in_a_denial_naming_them(
    devcluster: DevCluster,
    node_shim: Shim,
    ns: str,
    make: Callable[[int], dict[str, str]],
    reason: str,
    named: str,
) -> None:
    annotations = annotations_of_size(ANNOTATIONS_LIMIT, make)
    started = time.monotonic()
    pod = pod_with(
        devcluster,
        ns,
        "big-annotations",
        [
            {
                "name": "identity",
                "projected": {
                    "sources": [cert_source("credentialbundle.pem", userAnnotations=annotations)]
                },
            }
        ],
    )
    (pcr,) = settled_requests(devcluster, ns, pod.metadata.uid, 1, OUTCOME_DEADLINE)
    elapsed = time.monotonic() - started
    print(f"\n{reason} {elapsed:.2f}s after the pod was created")
    # The shim copied all of it into the request; the signer denied it, naming the field.
    assert pcr["spec"]["unverifiedUserAnnotations"] == annotations
    found = condition(pcr)
    assert (found.type, found.reason) == ("Denied", reason), found
    assert named in found.message and len(found.message) < 1000, found.message
    assert elapsed < OUTCOME_DEADLINE
    # No credential is written for a denied request.
    assert read(node_shim.volume_dir(pod.metadata.uid) / "credentialbundle.pem") is None


def test_a_burst_of_requests_at_the_size_limit_is_denied_in_bounded_time(
    devcluster: DevCluster, signer: processes.Signer, ns: str
) -> None:
    pod = make_pod(devcluster, ns, "burst", SIGNER, node=DIRECT_NODE)
    node = devcluster.node(DIRECT_NODE)
    key = keys.generate("ECDSAP256")
    shapes = list(BIG_ANNOTATIONS.values())
    rss_before = rss_mb(signer)
    started = time.monotonic()
    created = []
    for i in range(32):  # 8 MiB of annotations in all
        make, reason, named = shapes[i % len(shapes)]
        annotations = annotations_of_size(ANNOTATIONS_LIMIT, make)
        spec = pcr_spec(devcluster, pod, SIGNER, key, unverifiedUserAnnotations=annotations)
        created.append((create_pcr(node, ns, spec), reason, named))
    for pcr, reason, named in created:
        found = condition(settled(devcluster, pcr, timeout=OUTCOME_DEADLINE))
        assert (found.type, found.reason) == ("Denied", reason), found
        assert named in found.message
    elapsed = time.monotonic() - started
    print(
        f"\n32 requests of 256 KiB each settled in {elapsed:.2f}s; "
        f"signer RSS {rss_before:.0f} -> {rss_mb(signer):.0f} MB"
    )
    assert elapsed < OUTCOME_DEADLINE


def test_a_pod_with_100_pod_certificate_sources_gets_100_credentials(
    devcluster: DevCluster, node_shim: Shim, ns: str
) -> None:
    paths = [f"c{i:03d}.pem" for i in range(100)]
    started = time.monotonic()
    pod = pod_with(
        devcluster,
        ns,
        "hundred",
        [{"name": "identity", "projected": {"sources": [cert_source(p) for p in paths]}}],
    )
    volume = node_shim.volume_dir(pod.metadata.uid)

    credentials = eventually(
        lambda: credentials_at(volume, paths), timeout=60, interval=0.2, what="100 credentials"
    )
    elapsed = time.monotonic() - started
    print(f"\n100 credentials in one volume {elapsed:.2f}s after the pod was created")
    assert len({c.leaf.serial_number for c in credentials}) == 100
    assert len({c.leaf.public_key().public_bytes(*_SPKI) for c in credentials}) == 100
    pcrs = requests_of(devcluster, ns, pod.metadata.uid)
    assert len(pcrs) == 100 and all(outcome(p) == "Issued" for p in pcrs)
    assert elapsed < 60


_SPKI = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def test_many_projected_volumes_in_one_pod_are_all_served(
    devcluster: DevCluster, node_shim: Shim, ns: str
) -> None:
    key_types = ["ECDSAP256", "ED25519", "ECDSAP384", "ECDSAP521", "RSA3072"]
    volumes = [
        certificate_volume(SIGNER, name=f"v{i:02d}", key_type=key_types[i % len(key_types)])
        for i in range(40)
    ]
    started = time.monotonic()
    pod = pod_with(devcluster, ns, "many-volumes", volumes)

    def all_written() -> bool:
        return all(
            read(node_shim.volume_dir(pod.metadata.uid, v["name"]) / "credentialbundle.pem")
            for v in volumes
        )

    eventually(all_written, timeout=60, interval=0.2, what="40 volumes")
    elapsed = time.monotonic() - started
    print(f"\n40 projected volumes served {elapsed:.2f}s after the pod was created")
    assert elapsed < 60


def test_the_longest_names_and_unicode_paths_the_api_allows_are_served(
    devcluster: DevCluster, node_shim: Shim
) -> None:
    # A 63-character namespace, a 253-character pod name of many labels, and a 253-character
    # service account: the SPIFFE ID carries them; the request's generated name is cut short.
    namespace = "h" * 56 + f"-{time.monotonic_ns() % 10**6:06d}"
    kube.ensure_namespace(devcluster.admin, namespace)
    pod_name = ".".join(["p"] * 127)
    account = ".".join(["s" * 63] * 3) + "." + "t" * 61
    paths = ["ключи/証明書/🔐.pem", "\u202egnp.pem", "d/" * 100 + "b.pem", "a b\\c.pem"]
    assert (len(namespace), len(pod_name), len(account)) == (63, 253, 253)
    pod = devcluster.pod(
        namespace,
        pod_name,
        node=NODE,
        service_account=account,
        volumes=[{"name": "identity", "projected": {"sources": [cert_source(p) for p in paths]}}],
    )
    volume = node_shim.volume_dir(pod.metadata.uid)
    credentials = eventually(
        lambda: credentials_at(volume, paths), timeout=OUTCOME_DEADLINE, what="unicode paths"
    )
    for credential in credentials:
        assert str(credential.spiffe_id).endswith(f"/ns/{namespace}/sa/{account}")


def test_paths_the_filesystem_cannot_hold_are_reported_and_their_neighbours_served(
    devcluster: DevCluster, node_shim: Shim, ns: str
) -> None:
    # The API accepts any relative path without "..": a 300-byte name (over NAME_MAX) and a
    # 4,205-byte path (over PATH_MAX) are valid to it, but not to any Linux filesystem.
    bad = ["x" * 300, "d/" * 2100 + "b.pem"]
    pod = pod_with(
        devcluster,
        ns,
        "unwritable",
        [
            {
                "name": "mixed",
                "projected": {"sources": [cert_source("ok.pem"), *(cert_source(p) for p in bad)]},
            },
            certificate_volume(SIGNER, name="clean"),
        ],
    )
    # The other volume is served, and so is the good source beside the unwritable ones.
    eventually(
        lambda: read(node_shim.volume_dir(pod.metadata.uid, "clean") / "credentialbundle.pem"),
        timeout=OUTCOME_DEADLINE,
        what="the clean volume",
    )
    eventually(
        lambda: read(node_shim.volume_dir(pod.metadata.uid, "mixed") / "ok.pem"),
        timeout=OUTCOME_DEADLINE,
        what="the good source in the mixed volume",
    )
    # The pod is told which fields cannot be used.
    event = eventually(
        lambda: next(
            (e for e in pod_events(devcluster, pod) if e["reason"] == "InvalidProjectedVolume"),
            None,
        ),
        timeout=OUTCOME_DEADLINE,
        what="an InvalidProjectedVolume event",
    )
    assert "sources[1].podCertificate.credentialBundlePath" in event["message"]
    assert "sources[2].podCertificate.credentialBundlePath" in event["message"]
