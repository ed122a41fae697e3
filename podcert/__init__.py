"""podcert: workload identity certificates on the Kubernetes Pod Certificates API.

`__version__` is podcert's one version: the build backend reads it from here (pyproject's
dynamic version), `podcert --version` prints it and the API client's User-Agent carries it.
`KUBERNETES_TESTED` names the Kubernetes releases this version is tested against, by minor (the
devcluster builds exactly these; a unit test holds the two tables equal).
"""

from typing import Final

__version__: Final = "0.2.0.dev0"

KUBERNETES_TESTED: Final = {"1.35": "v1.35.4", "1.36": "v1.36.3", "1.37": "v1.37.2"}


def version_line() -> str:
    """What `podcert --version` prints: the version and the Kubernetes releases tested."""
    tested = ", ".join(KUBERNETES_TESTED.values())
    return (
        f"podcert {__version__} (Kubernetes {', '.join(KUBERNETES_TESTED)}; tested with {tested})"
    )
