"""One request followed through the signer's reconcile, from the stored request to its status
write: the product files it visits, counted by tracing an issuance (podcert's own modules
only; the API adapter is the test's, so `signer/kube.py` and `podcert/client/` are not among
them). At most 12: the request's type and its key (`podcert/api/requests.py`, `keys.py`), the
facts and their cache (`signer/issue/facts.py`, `podcert/reconcile/cache.py`), the policy, the
decision, the CA, the leaf, the settlement and its audit entry (`signer/auditlog/trail.py`,
`podcert/auditlog/lines.py`), and the controller. The pod, node and ServiceAccount are read live
here (empty caches, as for a request made after the caches listed)."""

from __future__ import annotations

import base64
import datetime as dt
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any, cast

from podcert.api import requests
from signer.authority import ca, schedule
from signer.authority.castore import CAStore
from signer.issue.controller import Controller
from signer.kube import SignerKube
from signer.metrics import Metrics
from signer.policy import Policy
from tests.signer_world import NOW, POLICY, SIGNER, LiveKube, make_request

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("podcert", "signer", "kubelet_shim", "bundles", "audit")
MOST_FILES = 12
# The process's log handler runs for the INFO line of an issuance only where some test (or the
# process) installed it: not part of the request's path, and not counted either way.
LOG_HANDLER = str(REPO / "podcert" / "logs.py")


class PathKube(LiveKube):
    """The live reads of `LiveKube`, and the status write recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[dict[str, Any]] = []

    def write_status(self, target: requests.Metadata, status: dict[str, Any]) -> None:
        self.written.append(status)


def visited(run: Any) -> set[str]:
    """The product files (relative to the checkout) whose code runs in `run()`."""
    files: set[str] = set()
    roots = tuple(str(REPO / package) + "/" for package in PRODUCT)

    def trace(frame: FrameType, event: str, arg: object) -> None:
        name = frame.f_code.co_filename
        if name.startswith(roots) and name != LOG_HANDLER:
            files.add(str(Path(name).relative_to(REPO)))

    sys.setprofile(trace)
    threading.setprofile(trace)  # type: ignore[arg-type]
    try:
        run()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return files


def test_an_issuance_visits_no_more_product_files_than_it_did() -> None:
    kube = PathKube()
    signer_kube = cast(SignerKube, kube)
    cas = CAStore(signer_kube, "podcert-system", "podcert-ca", lambda: NOW)
    bundle = ca.new_ca("path", NOW - dt.timedelta(days=1))
    active = schedule.Generation("g1", bundle, "active", NOW - dt.timedelta(days=1))
    secret = {k: base64.b64encode(v).decode() for k, v in schedule.to_secret([active]).items()}
    cas.on_secret({"metadata": {"resourceVersion": "1"}, "data": secret})
    assert cas.issuing() is not None
    ctrl = Controller(
        signer_kube,
        [SIGNER],
        Policy({SIGNER: POLICY}),
        cas,
        Metrics(),
        clock=lambda: NOW,
    )
    request = make_request(created=NOW - dt.timedelta(seconds=1))
    key = (request.namespace, request.name)
    # Once untraced, so that neither a first import nor a first-use cache counts: the path
    # traced is the steady one, whichever tests ran before in this process.
    ctrl._store[key] = request
    ctrl.reconcile(key)
    ctrl._store[key] = request
    files = visited(lambda: ctrl.reconcile(key))
    [_, status] = kube.written
    assert requests.parse_status(status).outcome == "Issued", "the path is an issuance"
    assert len(files) <= MOST_FILES, " ".join(sorted(files))
