"""Idle connections: the signer's memory and threads with N idle connections on each port it
serves, and whether its probes keep answering meanwhile.

    .venv/bin/python -m bench.bench_idle_connections [--connections 5000] [--settle 3]

On a fresh devcluster, one signer (its ServiceAccount, the shipped RBAC) serves the metrics
port (/metrics, /healthz, /readyz), the admission webhook and the SPIFFE bundle endpoint, with
the default limits. For each port in turn, from one client: `--connections` TCP connections that
send nothing (no TLS ClientHello, no request), as fast as the port accepts them; then, after
`--settle` seconds, the signer's RSS (VmRSS) and thread count, how many of the connections the
signer holds open (at once, and then), and whether /readyz and /healthz answer (and how fast);
then all are closed and RSS is read again. The numbers before the fix come from the same script
run in a tree of the commit before it (`git archive <commit> | tar -x -C DIR`, copy this file
in).
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench.bench_time_to_credential import devcluster, pid_of, rss_mib
from devcluster import processes
from devcluster.supervise import free_port

SIGNER = "idle.podcert.dev/workload"
NAMESPACE = "podcert-idle"
PORTS = ("metrics", "webhook", "bundle-endpoint")


def raise_file_limit() -> None:
    """The client holds every connection open: lift its descriptor limit to the hard one."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def open_idle(port: int, count: int, host: str = "127.0.0.1") -> list[socket.socket]:
    """`count` TCP connections to `port` that never send a byte."""
    conns = []
    try:
        for _ in range(count):
            conns.append(socket.create_connection((host, port), timeout=10))
    except BaseException:
        close_all(conns)
        raise
    return conns


def still_open(conns: list[socket.socket]) -> int:
    """How many of these client sockets the server has neither closed nor reset."""
    count = 0
    for conn in conns:
        conn.setblocking(False)  # a peek that never waits (a timeout would wait, then raise)
        try:
            count += conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            count += 1
        except OSError:
            pass
    return count


def close_all(conns: list[socket.socket]) -> None:
    for conn in conns:
        conn.close()


def get(url: str, timeout: float = 2.0) -> tuple[int, float]:
    """(HTTP status or 0 when no answer, seconds taken); TLS without checking the peer (the
    question is whether the port answers, not who it is)."""
    context = ssl._create_unverified_context()  # noqa: S323 (see above)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:  # noqa: S310
            status = int(resp.status)
    except urllib.error.HTTPError as err:
        status = err.code
    except OSError:
        status = 0
    return status, time.monotonic() - started


def threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise RuntimeError(f"no Threads in /proc/{pid}/status")


def flood(
    signer: processes.Signer, name: str, port: int, count: int, settle: float
) -> dict[str, Any]:
    pid = pid_of(signer)
    before, threads_before = rss_mib(pid), threads(pid)
    started = time.monotonic()
    conns = open_idle(port, count)
    opened = time.monotonic() - started
    held_at_once = still_open(conns)
    try:
        time.sleep(settle)  # a measurement's settling time, not a wait for a condition
        probes = [
            get(f"http://127.0.0.1:{signer.metrics_port}{p}") for p in ("/readyz", "/healthz")
        ]
        row = {
            "port": name,
            "connections": count,
            "opened_s": round(opened, 2),
            "rss_before_mib": round(before, 1),
            "rss_idle_mib": round(rss_mib(pid), 1),
            "threads_before": threads_before,
            "threads_idle": threads(pid),
            "held_open_at_once": held_at_once,
            "held_open": still_open(conns),
            "probes": [status for status, _ in probes],
            "probe_s": round(max(seconds for _, seconds in probes), 3),
        }
    finally:
        close_all(conns)
    time.sleep(settle)
    row["rss_after_close_mib"] = round(rss_mib(pid), 1)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=5000)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument(
        "--ports", nargs="+", default=list(PORTS), choices=PORTS, help="the ports to flood"
    )
    args = parser.parse_args()
    raise_file_limit()
    with devcluster("podcert-idle-") as (root, work):
        webhook, bundle = free_port(), free_port()
        signer = processes.signer(
            root,
            work,
            [SIGNER],
            namespace=NAMESPACE,
            extra=[
                "--trust-domain=idle.test",
                f"--webhook-port={webhook}",
                "--webhook-host=127.0.0.1",
                f"--bundle-endpoint-port={bundle}",
                "--bundle-endpoint-host=127.0.0.1",
            ],
        )
        with processes.running(signer.start()):
            signer.wait_ready(timeout=120)
            ports = {"metrics": signer.metrics_port, "webhook": webhook, "bundle-endpoint": bundle}
            for name in args.ports:
                row = flood(signer, name, ports[name], args.connections, args.settle)
                print(json.dumps(row), flush=True)
            print(json.dumps({"rss_peak_mib": round(rss_mib(pid_of(signer), "VmHWM"), 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
