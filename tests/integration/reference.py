"""The reference implementations podcert's hand-written plumbing is pinned to, asked through one
long-lived Go process (tests/interop/reference, built by `devcluster.build.ensure_interop`):
client-go for kubeconfigs, apimachinery for label selectors, encoding/pem, go-spiffe's spiffeid,
and golang.org/x/net's httpproxy for the proxy environment.

`Reference.ask(op, **fields)` sends one JSON request line and returns the JSON answer; a refusal
by the reference is an answer holding "error", never an exception. Differential tests run their
generated examples derandomized (the same examples every run, so the test command stays
deterministic) unless PODCERT_FUZZ_EXAMPLES asks for a longer, random exploration.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from hypothesis import HealthCheck, settings

from devcluster import build

_EXPLORE: Final = os.environ.get("PODCERT_FUZZ_EXAMPLES")
DIFFERENTIAL: Final = settings(
    max_examples=int(_EXPLORE) if _EXPLORE else 300,
    derandomize=not _EXPLORE,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


class Reference:
    """One running reference program; ask it questions one line at a time."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    @classmethod
    @contextmanager
    def started(cls) -> Iterator[Reference]:
        binary = build.ensure_interop("reference")
        proc = subprocess.Popen(
            [str(binary)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin"},
        )
        try:
            yield cls(proc)
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def ask(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        request = {"op": op, **fields}
        if isinstance(request.get("data"), bytes):
            request["data"] = base64.b64encode(request["data"]).decode()
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the reference program ended (exit {self.proc.poll()})")
        answer: dict[str, Any] = json.loads(line)
        return answer
