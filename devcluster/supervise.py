"""Child processes of the devcluster: started detached, probed, waited on with deadlines, and
stopped by process group. A pid counts as ours only while it still runs the binary we started."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

Progress = Callable[[str], None]
T = TypeVar("T")


class ClusterError(RuntimeError):
    """The control plane did not come up (or down); the message says which process and why."""


class NodeError(RuntimeError):
    """A kubelet did not start or stop; the message says why, with its log tail."""


# Ports handed out lie below both the kernel's ephemeral range (an outgoing connection's local
# port) and Kubernetes' NodePort range (30000-32767), and above the components' default ports
# (10248-10259), so nothing but another free_port caller can take one between the check and
# the caller's bind.
FIRST_PORT = 12_000
LAST_PORT = 29_999
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def port_stretch(
    environ: Mapping[str, str], pid: int, first: int = FIRST_PORT, last: int = LAST_PORT
) -> tuple[int, int, int]:
    """(low, high, start) of the stretch of ports this process walks, and where it begins.

    Each pytest-xdist worker gets its own stretch (PYTEST_XDIST_WORKER `gwN` of
    PYTEST_XDIST_WORKER_COUNT), so two workers never hand out one port; a process started by a
    worker inherits its stretch and begins at a pid-derived place in it, far from its parent."""
    worker, count = environ.get("PYTEST_XDIST_WORKER", ""), environ.get("PYTEST_XDIST_WORKER_COUNT")
    low, high = first, last
    if worker.startswith("gw") and worker[2:].isdigit() and count and count.isdigit():
        index, workers = int(worker[2:]), max(int(count), 1)
        size = (last - first + 1) // workers
        if index < workers and size > 0:
            low = first + index * size
            high = low + size - 1
    return low, high, low + (pid * 7919) % (high - low + 1)


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


class _PortWalk:
    """This process's place in its stretch; a forked child starts its own walk."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        below_ephemeral = _ephemeral_low() - 1
        last = below_ephemeral if FIRST_PORT + 999 < below_ephemeral < LAST_PORT else LAST_PORT
        self.low, self.high, self.next = port_stretch(os.environ, self.pid, last=last)

    def take(self) -> int:
        port = self.next
        self.next = self.low if port >= self.high else port + 1
        return port


_walk: _PortWalk | None = None


def free_port() -> int:
    """A TCP port nothing is bound to now, on any address, never handed out twice by this
    process until its stretch of ports wraps.

    A port the kernel picks for bind(0) is an ephemeral one, which any outgoing connection may
    take as its local port before the caller binds it (EADDRINUSE at a server's start); these
    ports lie outside that range, so the only contenders are other callers, kept apart by
    port_stretch."""
    global _walk
    if _walk is None or _walk.pid != os.getpid():
        _walk = _PortWalk()
    for _ in range(_walk.high - _walk.low + 1):
        port = _walk.take()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free TCP port in {_walk.low}-{_walk.high}")


def spawn(
    args: list[str], log: Path, *, preexec: Callable[[], None] | None = None
) -> subprocess.Popen[bytes]:
    """Start `args` detached (it survives the caller, in its own process group), its output
    appended to `log`; `preexec` runs in the child before it execs."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec,
        )


def exited(proc: subprocess.Popen[bytes], log: Path) -> Callable[[], str | None]:
    """A `failed` probe for wait_until: the process ended, with its log tail as the reason."""
    return lambda: (
        None
        if proc.poll() is None
        else (f"exited with code {proc.returncode}; log tail:\n{log_tail(log)}")
    )


def alive(pid: int, binary: str) -> bool:
    """True when `pid` runs `binary` (a recycled pid of another program does not count)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] == "Z":
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return cmdline.split(b"\0", 1)[0].decode(errors="replace") == binary


def log_tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_until(
    check: Callable[[], bool],
    deadline: float,
    what: str,
    *,
    interval: float = 0.1,
    failed: Callable[[], str | None] = lambda: None,
) -> None:
    """Poll `check` until it holds, `failed` reports a reason, or the monotonic deadline passes."""
    while True:
        if check():
            return
        reason = failed()
        if reason:
            raise ClusterError(f"{what}: {reason}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{what}: not ready before the deadline")
        time.sleep(interval)


def wait_until_value(
    probe: Callable[[], T | None],
    deadline: float,
    what: str,
    *,
    interval: float = 0.1,
    failed: Callable[[], str | None] = lambda: None,
) -> T:
    """Like wait_until, for a probe that returns what it found (None until then)."""
    found: list[T] = []

    def check() -> bool:
        value = probe()
        if value is not None:
            found.append(value)
        return value is not None

    wait_until(check, deadline, what, interval=interval, failed=failed)
    return found[0]


def get_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:  # noqa: S310 (own URL)
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def end(proc: subprocess.Popen[bytes], grace: float) -> int:
    """SIGTERM a child still running, SIGKILL it after `grace` seconds; its exit status."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def stop(pid: int, binary: str, grace: float) -> None:
    if not pid or not alive(pid, binary):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive(pid, binary) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid, binary):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        hard = time.monotonic() + 5
        while alive(pid, binary) and time.monotonic() < hard:
            time.sleep(0.05)
    if alive(pid, binary):
        raise ClusterError(f"{Path(binary).name} (pid {pid}) did not stop")
