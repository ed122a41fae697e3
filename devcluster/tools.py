"""Client tools the tests run against the devcluster, built from Go modules into the same cache as
the control plane (`devcluster.build`): helm, to lint and render the chart (charts/podcert). It
is not taken from the machine: a fresh one has none, or another version.
"""

from __future__ import annotations

from pathlib import Path

from devcluster import build
from devcluster.build import Component, Progress

HELM_VERSION = "v3.22.0"
HELM = Component(
    binary="helm",
    module="helm.sh/helm/v3",
    version=HELM_VERSION,
    package="helm.sh/helm/v3/cmd/helm",
    replace_version="",  # helm's go.mod replaces nothing
    # Without them `helm version` says v3.22+unreleased, and charts' kubeVersion checks use it.
    stamps=(
        f"helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
        "helm.sh/helm/v3/internal/version.gitTreeState=clean",
    ),
)


def ensure_helm(progress: Progress | None = None) -> Path:
    """helm, built once into the cache: about 3.5 minutes of CPU with empty Go caches (8 on a
    2-core machine shared with other builds), about 680 MB of modules."""
    return build.ensure_component(HELM, progress)
