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
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

Progress = Callable[[str], None]
T = TypeVar("T")


class ClusterError(RuntimeError):
    """The control plane did not come up (or down); the message says which process and why."""


class NodeError(RuntimeError):
    """A kubelet did not start or stop; the message says why, with its log tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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
