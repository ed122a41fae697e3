"""`helm upgrade` from release 0.1.0's chart to the working tree's, on the real node, credentials
kept (as cert-manager's upgrade test installs its last release, then upgrades to the tree).

The 0.1.0 chart (releases/0.1.0/podcert-0.1.0.tgz, as released) is installed with default
values, so its signer runs `ghcr.io/podcert/podcert:0.1.0`, the image its appVersion names: that
image is release 0.1.0's kept wheel installed as the tree's Dockerfile installs the tree (the
same base, user and runtime lock; the lock has not changed since 0.1.0), built here with podman
beside the tree's own image, and both are imported into the node's containerd. A pod on the
real node gets its credential from 0.1.0's signer. Then `helm upgrade` to charts/podcert (with
0.1.0's NetworkPolicy peers, which the tree's chart requires to be given):

- the release is at revision 2 at the tree's chart version and appVersion, deployed;
- both replicas are replaced by ones running the tree's image, and one of them leads;
- the CA Secret 0.1.0 created is kept: the same issuing CA, the same trusted roots;
- the pod's credential 0.1.0 issued is what the kubelet still serves, unexpired, chaining to
  that CA; and once every 0.1.0 pod is gone, the kubelet restarted (it asks again for every
  projection, with a new key: how a refresh is brought inside a test, as in
  test_real_kubelet_rotation) gets the pod a new leaf from the upgraded signer, the same CA.

test_helm_install and test_in_cluster apply the same objects (same names, podcert-system), so
this module, like them, starts from none of them and leaves none behind.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from devcluster import build, imagebuild, incluster, podman
from devcluster.testing import DevCluster, Kubelet, eventually
from podcert import __version__
from podcert.client.rest import ApiError, Rest, path_of
from signer.authority import schedule
from tests.integration.kubelet_helpers import BUNDLE, certificates_in
from tests.integration.test_chart import CHART, helm, render, run, sets
from tests.integration.test_helm_install import RELEASE, chart_node, cluster_helm, issuing_ca
from tests.integration.test_in_cluster import (
    NAMESPACE,
    credential_pod,
    issued_to,
    leader,
    ready,
    signer_pods,
)

__all__ = ["cluster_helm", "helm"]  # the fixtures, shared with test_helm_install

ROOT = Path(__file__).resolve().parents[2]
KEPT = ROOT / "releases" / "0.1.0"
RELEASE_CHART = KEPT / "podcert-0.1.0.tgz"
RELEASE_WHEEL = KEPT / "podcert-0.1.0-py3-none-any.whl"
RELEASE_IMAGE = "ghcr.io/podcert/podcert:0.1.0"  # what the 0.1.0 chart's appVersion names
# Release 0.1.0's image: the tree's Dockerfile with the kept wheel in place of the checkout's
# build (the deps stage and the final one are the tree's, line for line, so podman reuses them).
RELEASE_DOCKERFILE = """\
FROM python:3.11-slim AS deps
COPY locks/runtime.txt /tmp/
RUN pip install --no-cache-dir --require-hashes --root=/install -r /tmp/runtime.txt

FROM python:3.11-slim AS build
COPY {wheel} /wheels/
RUN pip install --no-cache-dir --no-deps --root=/install /wheels/{wheel}

FROM python:3.11-slim
RUN groupadd --gid 65532 podcert \\
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \\
        --shell /usr/sbin/nologin podcert
COPY --from=deps /install/usr/local /usr/local
COPY --from=build /install/usr/local /usr/local
USER 65532:65532
ENTRYPOINT ["podcert"]
CMD ["--help"]
"""

pytestmark = pytest.mark.timeout(900)  # the setup also builds or loads both images


def say(line: str) -> None:
    print(line, flush=True)


def build_release_image(folder: Path) -> None:
    """RELEASE_IMAGE from the kept wheel, in a build context of its own."""
    (folder / "locks").mkdir(parents=True)
    shutil.copy(ROOT / "locks" / "runtime.txt", folder / "locks" / "runtime.txt")
    shutil.copy(RELEASE_WHEEL, folder / RELEASE_WHEEL.name)
    dockerfile = folder / "Dockerfile"
    dockerfile.write_text(RELEASE_DOCKERFILE.format(wheel=RELEASE_WHEEL.name))
    mounts = []
    if podman.CA_BUNDLE.is_file():
        mounts = [f"--volume={podman.CA_BUNDLE}:{podman.CA_BUNDLE}:ro"]
    with podman.locked():
        podman.ensure_base(say)
        say(f"building {RELEASE_IMAGE} from {RELEASE_WHEEL.name}")
        podman.run_logged(
            [
                *("podman", "build", "--pull=never", "--layers", "--network=host", *mounts),
                *(f"--file={dockerfile}", f"--tag={RELEASE_IMAGE}", str(folder)),
            ],
            say,
            cwd=folder,
        )


def load_images(kubelet: Kubelet, folder: Path) -> None:
    """The tree's image and 0.1.0's, built and imported into the node's containerd."""
    imagebuild.build(say, examples=False)
    build_release_image(folder / "release")
    for image, name in ((imagebuild.IMAGE, "tree"), (RELEASE_IMAGE, "release")):
        archive = imagebuild.save(image, folder / f"{name}.tar")
        incluster.load_image(kubelet.state, archive)
        archive.unlink()


def rendered(helm: list[str], chart: Path) -> list[dict[str, Any]]:
    """`helm template` of a chart with default values (test_chart's render, any chart)."""
    version = build.KUBERNETES_VERSIONS[build.DEFAULT_KUBE_VERSION]
    out = run(helm, "template", RELEASE, str(chart), f"--kube-version={version}").stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module")
def cluster(
    devcluster: DevCluster,
    real_kubelet: Kubelet,
    helm: list[str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Rest]:
    """test_helm_install's chart node holding both images, with no object of either chart."""
    folder = tmp_path_factory.mktemp("images")
    docs = [*rendered(helm, RELEASE_CHART), *render(helm)]
    load = functools.partial(load_images, real_kubelet, folder)
    with chart_node(devcluster, real_kubelet, docs, load) as rest:
        yield rest


@pytest.fixture
def release_0_1_0(cluster: Rest, cluster_helm: list[str]) -> Iterator[Rest]:
    """The 0.1.0 chart installed; uninstalled after the test, whatever it upgraded it to."""
    run(cluster_helm, "install", RELEASE, str(RELEASE_CHART))
    try:
        yield cluster
    finally:
        run(cluster_helm, "uninstall", RELEASE, check=False)


def replicas_of(rest: Rest, image: str) -> list[dict[str, Any]]:
    """The signer's 2 pods once both run `image` and are Ready (and no other is left)."""

    def probe() -> list[dict[str, Any]] | None:
        pods = signer_pods(rest)
        images = {c["image"] for p in pods for c in p["spec"]["containers"]}
        if len(pods) != 2 or images != {image} or not all(ready(p) for p in pods):
            return None
        return pods

    found: list[dict[str, Any]] = eventually(
        probe, timeout=240, interval=0.5, what=f"2 ready signer replicas of {image}"
    )
    return found


def names(pods: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["name"] for p in pods}


def gone(rest: Rest, pods: set[str]) -> bool:
    """None of these pods exists any more, not even terminating."""
    for name in pods:
        try:
            rest.request("GET", path_of("v1", "pods", NAMESPACE, name))
        except ApiError as err:
            if err.status != 404:
                raise
        else:
            return False
    return True


def listed(cluster_helm: list[str]) -> dict[str, Any]:
    """The release as `helm list` shows it (chart, app_version, revision, status)."""
    [found] = yaml.safe_load(
        run(cluster_helm, "list", "--output=json", f"--filter=^{RELEASE}$").stdout
    )
    return dict(found)


def at(release: dict[str, Any]) -> tuple[str, str, str, str]:
    return release["chart"], release["app_version"], release["revision"], release["status"]


def chart_version(chart: Path) -> str:
    return str(yaml.safe_load((chart / "Chart.yaml").read_text())["version"])


def trusted_roots(rest: Rest) -> list[x509.Certificate]:
    secret = rest.request("GET", path_of("v1", "secrets", NAMESPACE, "podcert-ca"))
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    return schedule.trusted_roots(schedule.from_secret(data, dt.datetime.now(dt.UTC)))


def public_key(leaf: x509.Certificate) -> bytes:
    return leaf.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)


def test_helm_upgrade_from_0_1_0_keeps_the_ca_and_the_credentials_it_issued(
    release_0_1_0: Rest, devcluster: DevCluster, real_kubelet: Kubelet, cluster_helm: list[str]
) -> None:
    rest = release_0_1_0
    assert at(listed(cluster_helm)) == ("podcert-0.1.0", "0.1.0", "1", "deployed")
    old = names(replicas_of(rest, RELEASE_IMAGE))
    eventually(lambda: leader(rest) in old, timeout=60, what="a 0.1.0 leader")
    ca, roots = issuing_ca(rest), trusted_roots(rest)
    namespace, uid = credential_pod(devcluster, "from-0-1-0")
    leaf = issued_to(real_kubelet, uid, namespace)[0]
    leaf.verify_directly_issued_by(ca)

    # 0.1.0's NetworkPolicy had the placeholder peers the tree's chart no longer defaults to
    # (it refuses to render without peers): the same ones, given, so that only the chart changes.
    run(cluster_helm, "upgrade", RELEASE, str(CHART), *sets({}))

    tree = f"podcert-{chart_version(CHART)}"
    assert at(listed(cluster_helm)) == (tree, __version__, "2", "deployed")
    new = names(replicas_of(rest, imagebuild.IMAGE))
    assert not new & old
    eventually(lambda: leader(rest) in new, timeout=90, interval=0.5, what="a new leader")
    assert issuing_ca(rest) == ca, "the upgrade replaced the issuing CA"
    assert trusted_roots(rest) == roots, "the upgrade changed the trusted roots"
    # What 0.1.0 issued is still served, and valid.
    assert certificates_in(real_kubelet, uid, BUNDLE)[0] == leaf
    leaf.verify_directly_issued_by(issuing_ca(rest))
    assert leaf.not_valid_after_utc > dt.datetime.now(dt.UTC) + dt.timedelta(hours=23)

    # Refreshed by the upgraded signer: 0.1.0's pods gone, the kubelet asks again.
    eventually(lambda: gone(rest, old), timeout=60, interval=0.5, what="0.1.0's pods gone")
    real_kubelet.restart()
    refreshed = eventually(
        lambda: next(
            (c[0] for c in [certificates_in(real_kubelet, uid, BUNDLE)] if c and c[0] != leaf),
            None,
        ),
        timeout=120,
        interval=0.5,
        what="the restarted kubelet's new leaf",
    )
    assert public_key(refreshed) != public_key(leaf), "a refresh has a new key"
    refreshed.verify_directly_issued_by(ca)
