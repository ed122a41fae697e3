"""Fault injection for tests/integration/test_faults.py: etcd compaction through its gRPC gateway,
pods created straight through an API server outage, a SIGKILL that fires while a volume is being
written, and a size-limited file system to run out of space on."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bundles import formats
from devcluster import processes
from devcluster.planestate import State
from podcert.api.requests import certificates, parse_status
from podcert.api.requests import outcome as outcome
from podcert.api.volumes import DATA_DIR, DATA_TMP
from podcert.client.rest import JSON, ApiError, Rest, path_of
from tests.objects import pod_object

PCRS = "certificates.k8s.io/v1"

# --- etcd ----------------------------------------------------------------------------------


def _etcd(state: State, path: str, body: JSON) -> JSON:
    request = urllib.request.Request(  # loopback etcd started by the test
        f"http://127.0.0.1:{state.etcd_port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310
        answer: JSON = json.loads(resp.read())
        return answer


def etcd_revision(state: State) -> int:
    """etcd's current revision (any range answer carries it in its header)."""
    return int(_etcd(state, "/v3/kv/range", {"key": "AA=="})["header"]["revision"])


def compact_etcd(state: State, revision: int) -> None:
    """Discard every revision older than `revision` (what the API server does every 5 min)."""
    _etcd(state, "/v3/kv/compaction", {"revision": str(revision), "physical": True})


def compacted(state: State, revision: int) -> bool:
    """True when etcd can no longer serve reads at `revision`."""
    try:
        _etcd(state, "/v3/kv/range", {"key": "AA==", "revision": str(revision)})
    except urllib.error.HTTPError as err:
        return "compacted" in err.read().decode(errors="replace")
    return False


# --- API objects ---------------------------------------------------------------------------


def pod_body(namespace: str, name: str, node: str, volumes: list[dict[str, Any]]) -> JSON:
    """A pod bound to `node` with the `default` ServiceAccount (create it first)."""
    return pod_object(name, volumes, namespace=namespace, node=node)


def create_through_outage(rest: Rest, body: JSON, deadline: float) -> int:
    """POST a pod, retrying while the API server is away; returns the failed attempts.

    A retried POST whose first attempt did land answers 409, which counts as created.
    """
    namespace = body["metadata"]["namespace"]
    failures = 0
    while True:
        try:
            rest.request("POST", path_of("v1", "pods", namespace), body=body, timeout=5)
            return failures
        except ApiError as err:
            if err.status == 409:
                return failures
            if not err.retryable or time.monotonic() > deadline:
                raise
            failures += 1
        # The API server is restarting: a short pause before the next attempt.
        threading.Event().wait(0.05)


def requests_of(rest: Rest, namespace: str) -> list[JSON]:
    items: list[JSON] = rest.request("GET", path_of(PCRS, "podcertificaterequests", namespace))[
        "items"
    ]
    return items


def issued_leaf(pcr: JSON) -> x509.Certificate | None:
    status = parse_status(pcr.get("status"))
    return certificates(status)[0] if status.certificate_chain else None


def server_now(rest: Rest, namespace: str, name: str) -> str:
    """The API server's clock (to the second): the creationTimestamp of a new ConfigMap."""
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}
    made = rest.request("POST", path_of("v1", "configmaps", namespace), body=body)
    return str(made["metadata"]["creationTimestamp"])


# --- files ---------------------------------------------------------------------------------


def read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def credential(path: Path) -> formats.Credential | None:
    """The credential bundle at `path`, checked whole (key matches leaf), or None if absent."""
    data = read(path)
    return formats.load_credential(data) if data else None


def leaf_of(path: Path) -> x509.Certificate | None:
    found = credential(path)
    return found.leaf if found else None


def spki(cert: x509.Certificate) -> bytes:
    return cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@dataclass(frozen=True)
class VolumeLayout:
    """The atomic writer's hidden entries in one volume directory."""

    versions: tuple[str, ...]  # `..<timestamp>` directories
    live: str | None  # the one `..data` names
    data_tmp: bool  # a `..data_tmp` link exists (a swap was under way)

    @property
    def writing(self) -> bool:
        """A write is (or was, when its writer died) in progress."""
        return len(self.versions) > 1 or self.data_tmp

    @property
    def clean(self) -> bool:
        return self.versions == (self.live,) and not self.data_tmp


def layout(volume: Path) -> VolumeLayout:
    versions: list[str] = []
    data_tmp = False
    try:
        entries = list(os.scandir(volume))
    except FileNotFoundError:
        return VolumeLayout((), None, False)
    for entry in entries:
        if entry.name.startswith(DATA_TMP):  # also the `..data_tmp.<name>` links made aside
            data_tmp = True
        elif entry.name.startswith("..") and entry.is_dir(follow_symlinks=False):
            versions.append(entry.name)
    try:
        live: str | None = str((volume / DATA_DIR).readlink())
    except OSError:
        live = None
    return VolumeLayout(tuple(sorted(versions)), live, data_tmp)


# --- processes -----------------------------------------------------------------------------


def log_size(proc: processes.Process) -> int:
    try:
        return proc.log.stat().st_size
    except FileNotFoundError:
        return 0


def log_records(proc: processes.Process, since: int = 0) -> list[JSON]:
    """The JSON log lines a podcert process wrote after byte offset `since`."""
    try:
        with proc.log.open("rb") as f:
            f.seek(since)
            data = f.read()
    except FileNotFoundError:
        return []
    records = []
    for line in data.decode(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                records.append(record)
    return records


def messages(proc: processes.Process, since: int = 0, level: str | None = None) -> list[str]:
    return [
        str(r.get("msg", ""))
        for r in log_records(proc, since)
        if level is None or r.get("level") == level
    ]


def sample(metrics_text: str, metric: str, **labels: str) -> float:
    """Sum of the series of `metric` whose labels include `labels`."""
    total = 0.0
    for line in metrics_text.splitlines():
        name, _, rest = line.partition("{")
        if line.startswith("#") or name != metric:
            continue
        found = dict(
            pair.split("=", 1) for pair in rest.rpartition("}")[0].replace('"', "").split(",")
        )
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def swapped_but_unlinked(volume: Path, name: str) -> bool:
    """A first write past its `..data` swap whose visible name is not linked yet."""
    return (volume / DATA_DIR).is_symlink() and not os.path.lexists(volume / name)


@dataclass
class Kill:
    trigger: str  # "condition" or "timer"
    after: float  # seconds from arming to the kill


class KillSwitch:
    """SIGKILL `victim` from a thread `timer` seconds after arming or, with `when`, as soon as
    `when()` holds if that comes sooner (polled without pause: the windows are a few fsyncs)."""

    def __init__(
        self,
        victim: processes.Process,
        timer: float,
        when: Callable[[], bool] | None = None,
    ) -> None:
        self.victim, self.timer, self.when = victim, timer, when
        self.result: Kill | None = None
        self._started = 0.0
        self._thread = threading.Thread(target=self._run, name="kill-switch", daemon=True)

    def arm(self) -> KillSwitch:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        trigger = "timer"
        if self.when is not None:
            deadline = self._started + self.timer
            while time.monotonic() < deadline:
                if self.when():
                    trigger = "condition"
                    break
        else:
            threading.Event().wait(self.timer)  # the fault's random moment, not a wait for state
        self.victim.kill()
        self.result = Kill(trigger, time.monotonic() - self._started)

    def wait(self, timeout: float = 30.0) -> Kill:
        self._thread.join(timeout)
        if self.result is None:
            raise AssertionError("the kill switch did not fire")
        return self.result


# --- a file system that fills up ------------------------------------------------------------


def _run(command: list[str]) -> str | None:
    """None on success, else the command and why it failed."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
    except OSError as err:
        return f"`{' '.join(command)}`: {err}"
    if done.returncode != 0:
        return f"`{' '.join(command)}` exited {done.returncode}: {done.stderr.strip()}"
    return None


@contextlib.contextmanager
def small_filesystem(mountpoint: Path, size_kib: int = 256) -> Iterator[str]:
    """Mount a `size_kib` file system on `mountpoint` (a tmpfs, else an ext2 loop image) for the
    duration; skips the test, naming the failing commands, when neither can be mounted."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    image = mountpoint.with_name(mountpoint.name + ".img")
    kind = f"tmpfs of {size_kib} KiB"
    problem = _run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(mountpoint)]
    )
    if problem is not None:
        first = problem
        kind = f"ext2 loop image of {size_kib} KiB"
        with image.open("wb") as f:
            f.truncate(size_kib * 1024)
        for step in (
            ["mkfs.ext2", "-q", "-F", "-m", "0", str(image)],
            ["mount", "-o", "loop", str(image), str(mountpoint)],
        ):
            problem = _run(step)
            if problem is not None:
                image.unlink(missing_ok=True)
                pytest.skip(f"cannot mount a small file system: {first}; {problem}")
    try:
        yield kind
    finally:
        if _run(["umount", str(mountpoint)]) is not None:
            _run(["umount", "-l", str(mountpoint)])  # busy: detach now, freed when released
        image.unlink(missing_ok=True)


def fill(directory: Path) -> Path:
    """Write a file in `directory` until the file system is full; returns its path."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    chunk = b"\0" * 4096
    try:
        while True:
            try:
                if os.write(fd, chunk) < len(chunk):
                    chunk = chunk[:1]  # the last partial page
            except OSError as err:
                if err.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    break
                chunk = chunk[:1]
    finally:
        os.close(fd)
    return filler
